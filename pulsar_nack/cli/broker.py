"""``pulsar-nack broker``: start a test broker, print its URLs, run until Ctrl-C, stop it.

For trying the library by hand: Apache Pulsar's own standalone broker
(:class:`~pulsar_nack.testing.PulsarStandalone`, fetched once from Maven Central; the
first run says so on stderr), on 127.0.0.1. Options: ``--pulsar-version``, ``--port``,
``--http-port``, ``--batch-index-acks`` / ``--no-batch-index-acks`` (on by default).

Exit codes: 0 after Ctrl-C or SIGTERM (the broker is stopped); 1 the broker exited on
its own (its log is named); 2 it could not start (a missing JDK or Maven, a version no
JDK here runs, a port in use: one line on stderr, before anything starts where it can
be checked first).
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from typing import Any

from ._prepare import SetupError, check_standalone, fetch_standalone

__all__ = ["add_arguments", "run"]

PROG = "pulsar-nack broker"
_POLL_S = 1.0


EPILOG = (
    "Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 the broker exited on its own (see its log); "
    "2 it could not start (one line on stderr: a missing JDK or Maven, a version no JDK here runs, a port in use)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The broker's options: its version, ports and batch-index acknowledgement; the exit codes."""
    parser.add_argument(
        "--pulsar-version", default=None, metavar="VERSION",
        help="Apache Pulsar version: 4.0.8, 4.0, 3.x, ... (default: the newest release an installed JDK runs)",
    )
    parser.add_argument("--port", type=_port, default=None, help="the service port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--http-port", type=_port, default=None, metavar="PORT",
        help="the admin REST API's port on 127.0.0.1 (default: a free one)",
    )
    parser.add_argument(
        "--batch-index-acks", action=argparse.BooleanOptionalAction, default=True,
        help="acknowledgmentAtBatchIndexLevelEnabled: acked members of a batch are not redelivered (default: on)",
    )
    parser.epilog = EPILOG


def _check_free(option: str, port: int | None) -> None:
    """SetupError if *port* is taken on 127.0.0.1 (the broker would fail only after its JVM started)."""
    if port is None:
        return
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise SetupError(f"{option} {port}: 127.0.0.1:{port} is not free ({error.strerror})") from None


def _port(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its URLs (stdout, flushed), wait for Ctrl-C, stop it."""
    from ..errors import BrokerError
    from ..testing import PulsarStandalone

    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = None
    try:
        try:
            broker = PulsarStandalone(
                version=args.pulsar_version, batch_index_ack=args.batch_index_acks, port=args.port,
                http_port=args.http_port,
            )
            for option, port in (("--port", args.port), ("--http-port", args.http_port)):
                _check_free(option, port)
            fetch_standalone(check_standalone(args.pulsar_version), PROG)
            print(f"{PROG}: starting Apache Pulsar standalone ...", file=sys.stderr, flush=True)
            broker.start()
        except (SetupError, BrokerError, ValueError) as error:  # ValueError: a version we know nothing of
            print(f"{PROG}: {error}", file=sys.stderr, flush=True)
            return 2
        print(f"service URL: {broker.url}", flush=True)
        if broker.admin_url is not None:
            print(f"admin URL:   {broker.admin_url}", flush=True)
        print(f"broker pid:  {broker.pid}", flush=True)
        print(f"log: {broker.log_path}; Ctrl-C stops it", file=sys.stderr, flush=True)
        while not stop.wait(_POLL_S):
            if not broker.is_running():
                print(f"the broker exited; see {broker.log_path}", file=sys.stderr, flush=True)
                return 1
        return 0
    finally:
        if broker is not None:
            broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
