"""``pulsar-nack broker``: start a test broker, print its URLs, run until Ctrl-C, stop it.

For trying the library by hand: Apache Pulsar's own standalone broker
(:class:`~pulsar_nack.testing.PulsarStandalone`, fetched once from Maven Central; the
first run says so on stderr). A missing JDK or Maven is one line on stderr and exit
code 2, before anything starts. Ctrl-C or SIGTERM stops the broker and exits 0; a
broker that dies on its own exits 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from ._prepare import SetupError, check_standalone, fetch_standalone

__all__ = ["add_arguments", "run"]

PROG = "pulsar-nack broker"
_POLL_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the broker is Apache Pulsar standalone on free loopback ports."""


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its URLs (stdout, flushed), wait for Ctrl-C, stop it."""
    from ..errors import BrokerError
    from ..testing import start_broker

    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = None
    try:
        try:
            fetch_standalone(check_standalone(), PROG)
            print(f"{PROG}: starting Apache Pulsar standalone ...", file=sys.stderr, flush=True)
            broker = start_broker()
        except (SetupError, BrokerError) as error:
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
