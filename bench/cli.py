"""``pulsar-nack bench``: every benchmark, side by side with its baselines, in one command.

Parts (each writes ``bench/results/<part>.json``; with ``--quick``, ``<part>-quick.json``
in ``~/.cache/pulsar-nack/bench``, outside the checkout; ``--out DIR`` puts either there):

* ``memory``    paper grid + patterns, tracker vs hash-map baseline (bench/memory.py)
* ``core``      add / pop / find-due / timer wakeups and lateness (bench/core_perf.py)
* ``client``    built-in pulsar-client tracker: memory per id and call cost (bench/client.py)
* ``e2e``       redelivery lateness on Apache Pulsar standalone, ours vs built-in (bench/e2e.py)
* ``scaling``   memory and add cost from 10^4 to 10^7 pending (bench/scaling.py)
* ``consumer``  NackingConsumer vs plain pulsar.Consumer on Apache Pulsar: receive+ack,
                bytes per pending nack (batched), nack(message) cost (bench/consumer.py)
* ``core-ab``   pop_due and timer lateness of this core beside an earlier commit's core
                in one run (bench/core_ab.py)

``--quick`` runs :data:`QUICK_PARTS` at reduced sizes, in under three minutes: one part
per kind of figure the README states (memory against the baseline, the core's add and
pop costs and the timer's lateness, the built-in client's memory and call cost, lateness
on Apache Pulsar).
``scaling`` (its quick sizes repeat ``memory``'s), ``consumer`` (two brokers, minutes
even at reduced sizes) and ``core-ab`` (a comparison with an earlier commit, for
development) run in the full run, or with ``--quick --only PART``. A quick run starts one
Apache Pulsar standalone for all its parts that need a broker (a full run starts one per
part, as each part's own command does). Quick verdicts are
informational, since the goals are defined for the full sizes, and a quick run exits 0
unless a part fails. The full run takes much longer (10M-message memory cases) and exits
1 when a part misses a goal. ``--plot`` redraws docs/img/ from the committed JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import time
from collections.abc import Iterator

from ._common import BROKER_ENV, OUT_ENV, results_dir

PARTS: dict[str, tuple[str, list[str]]] = {
    "memory": ("bench.memory", []),
    "core": ("bench.core_perf", []),
    "client": ("bench.client", []),
    "e2e": ("bench.e2e", []),
    "scaling": ("bench.scaling", []),
    "consumer": ("bench.consumer", []),
    "core-ab": ("bench.core_ab", []),
}
QUICK_PARTS = ("memory", "core", "client", "e2e")
"""What ``--quick`` runs without ``--only``: a representative subset (see the module notes)."""
# Quick mode: reduced sizes, so that QUICK_PARTS together take under three minutes.
QUICK_ARGS = {
    "memory": ["--quick", "--messages", "200000", "--cases", "consec-x8-y10,rand10-x8-y10,y0-x1"],
    "core": ["--quick", "--reps", "3", "--only", "add,pop,lateness"],  # find-due and idle in the full run
    "client": ["--quick", "--ids", "50000"],
    "e2e": ["--quick", "--modes", "stream"],
    "scaling": ["--quick"],
    "consumer": ["--quick"],
    "core-ab": ["--reps", "2", "--out", "core_ab-quick"],
}


BROKER_PARTS = ("client", "e2e", "consumer")
"""The parts that start Apache Pulsar (with batch-index acks) through :func:`bench._common.standalone`."""


@contextlib.contextmanager
def _shared_broker() -> Iterator[None]:
    """Apache Pulsar standalone for the parts of a quick run (:data:`BROKER_ENV`), stopped at the end."""
    from pulsar_nack.testing import PulsarStandalone

    print("starting Apache Pulsar standalone for the parts that need a broker ...", flush=True)
    with PulsarStandalone(batch_index_ack=True) as broker:
        os.environ[BROKER_ENV] = f"{broker.url} {broker.admin_url}"
        try:
            yield
        finally:
            del os.environ[BROKER_ENV]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true",
        help=f"{', '.join(QUICK_PARTS)} at reduced sizes (under 3 minutes); informational verdicts; "
        "results in ~/.cache/pulsar-nack/bench",
    )
    parser.add_argument("--out", default=None, metavar="DIR", help="write the result files into DIR")
    parser.add_argument("--only", default=None, help=f"comma-separated parts: {','.join(PARTS)}")
    parser.add_argument("--plot", action="store_true", help="redraw docs/img/ from bench/results/*.json")


def run(args: argparse.Namespace) -> int:
    if args.plot:
        from . import plot

        plot.main([])
        return 0
    parts = args.only.split(",") if args.only else list(QUICK_PARTS if args.quick else PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s): {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.out:
        os.environ[OUT_ENV] = os.path.abspath(args.out)
    start = time.monotonic()
    status = 0
    with contextlib.ExitStack() as stack:
        if args.quick and BROKER_ENV not in os.environ and any(p in BROKER_PARTS for p in parts):
            stack.enter_context(_shared_broker())  # one broker start for every part, not one each
        for part in parts:
            module_name, extra = PARTS[part]
            module = importlib.import_module(module_name)
            print(f"\n=== {part} ===", flush=True)
            result = module.main((QUICK_ARGS[part] if args.quick else []) + extra)
            if isinstance(result, int) and result:
                status = result
    where = results_dir("x-quick" if args.quick else "x")
    print(f"\nbench finished in {time.monotonic() - start:.0f} s; results in {where}")
    if args.quick:
        print("quick run: reduced sizes, so the verdicts above are informational; the full run judges the goals")
    elif status:
        print("a part missed a goal (see its targets table); exit code 1")
    return status
