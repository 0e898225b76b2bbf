"""``pulsar-nack broker``: start a test broker, print its URLs, run until Ctrl-C, stop it.

For trying the library by hand. One flag per broker of
:data:`pulsar_nack.testing.BROKERS`: ``--apache`` (the default) is Apache Pulsar's own
standalone broker (:class:`~pulsar_nack.testing.PulsarStandalone`, fetched once from
Maven Central); the other is the light look-alike the demo starts by default. Ctrl-C or
SIGTERM stops the broker and exits 0; a broker that dies on its own exits 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

__all__ = ["add_arguments", "run"]

_POLL_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per test broker (``--apache``, the default, and the light one)."""
    from ..testing import BROKER_HELP

    kind = parser.add_mutually_exclusive_group()
    for name, text in BROKER_HELP.items():
        default = " (default)" if name == "apache" else ""
        kind.add_argument(f"--{name}", dest="kind", action="store_const", const=name, help=text + default)
    parser.set_defaults(kind="apache")


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its URLs (stdout, flushed), wait for Ctrl-C, stop it."""
    from ..testing import start_broker

    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = None
    try:
        print(f"starting {args.kind} broker ...", file=sys.stderr, flush=True)
        broker = start_broker(args.kind)
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
