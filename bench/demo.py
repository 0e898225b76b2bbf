"""Record ``pulsar-nack demo --json``: ours beside pulsar-client's built-in nack, in one run.

Each run is a fresh ``python -m pulsar_nack.cli demo --tracker T --messages S
--json`` process; its last stdout line is the summary. Wall time is measured around the
whole process (broker and Spark start included). One ``python -m bench.demo`` run does,
one after the other: on Apache Pulsar standalone, ``--tracker ours`` and ``--tracker
builtin`` at each size (``default``, then ``large``), each pair back to back, ``--repeats``
times (who goes first alternates; each run records its ``repeat``). The results go to
``bench/results/demo-apache.json``; docs/spark.md shows them side by side.

Run: ``python -m bench.demo [--quick] [--sizes default,large] [--repeats N] [--receiver-queue-size N]``
(quick: the small size, ``-quick`` files).

``--retries`` runs the retry modes side by side instead (issue 25), each demo on its own
broker: ``nack``, ``durable`` (the demo's default: its retries held by the workers'
consumers, ``retry_hold_ms``) and ``builtin`` on a broker with a 100 ms delayed-delivery
tick, ``durable-broker`` (``--retry-hold-ms 0``: every retry held by the broker, as the
Java client's) on the same tick, and that again on the stock 1 s tick
(``durable-stock-tick``), to ``bench/results/demo-retries.json`` (docs/spark.md,
"Durable retries").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from ._common import REPO, finish, parser, start_context

TRACKERS = ("ours", "builtin")


RETRY_MODES: dict[str, list[str]] = {
    "nack": ["--tracker", "ours", "--retries", "nack", "--broker-tick-ms", "100"],
    "durable": ["--tracker", "ours", "--retries", "durable", "--broker-tick-ms", "100"],
    "builtin": ["--tracker", "builtin", "--broker-tick-ms", "100"],
    "durable-broker": ["--tracker", "ours", "--retries", "durable", "--retry-hold-ms", "0", "--broker-tick-ms", "100"],
    "durable-stock-tick": [
        "--tracker", "ours", "--retries", "durable", "--retry-hold-ms", "0", "--broker-tick-ms", "1000"
    ],
}
"""``--retries``: the demo's options per retry mode (each run starts its own broker)."""


def run_demo(
    size: str, tracker: str, receiver_queue_size: int | None = None, extra: list[str] | None = None
) -> dict[str, Any]:
    """One demo process; its summary, exit code, wall time and stderr line count."""
    command = [sys.executable, "-m", "pulsar_nack.cli", "demo", *(extra or ["--tracker", tracker])]
    command += ["--messages", size, "--json"]
    if receiver_queue_size is not None:
        command += ["--receiver-queue-size", str(receiver_queue_size)]
    start = time.monotonic()
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
    return {"size": size, "broker": "apache", "tracker": tracker, "exit_code": out.returncode,
            "process_wall_s": time.monotonic() - start, "stderr_lines": len(out.stderr.splitlines()),
            "summary": json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.demo", "the small size")
    args_parser.add_argument("--sizes", default="default,large", help="Apache Pulsar sizes, comma-separated")
    args_parser.add_argument("--receiver-queue-size", type=int, default=None)
    args_parser.add_argument("--repeats", type=int, default=1, help="pairs per size on Apache Pulsar, order alternating")
    args_parser.add_argument("--retries", action="store_true", help="the retry modes side by side (see the module notes)")
    args_parser.add_argument("--modes", default=None, help="with --retries: comma-separated modes (default: all five)")
    args = args_parser.parse_args(argv)
    if args.retries:
        return retries_side_by_side(args)
    start, runs = start_context(), []
    for repeat in range(args.repeats):
        for size in ["small"] if args.quick else args.sizes.split(","):
            for tracker in TRACKERS if repeat % 2 == 0 else TRACKERS[::-1]:  # alternate who goes first
                runs.append({**run_demo(size, tracker, args.receiver_queue_size), "repeat": repeat})
    from .report import demo_table

    print(demo_table({"runs": runs}))
    finish(args, "demo-apache", {"runs": runs}, start)
    return {"runs": runs}


def retries_side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """The retry modes (see the module notes) per size, order rotating."""
    modes = args.modes.split(",") if args.modes else list(RETRY_MODES)
    unknown = set(modes) - set(RETRY_MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s) {sorted(unknown)}; choose from {', '.join(RETRY_MODES)}")
    start, runs = start_context(), []
    for repeat in range(args.repeats):
        order = modes[repeat % len(modes):] + modes[: repeat % len(modes)]
        for size in ["small"] if args.quick else args.sizes.split(","):
            for mode in order:
                run = run_demo(size, RETRY_MODES[mode][1], args.receiver_queue_size, extra=RETRY_MODES[mode])
                runs.append({**run, "mode": mode, "repeat": repeat})
                s = run["summary"]
                print(mode, size, s["lost"], s["duplicates_pct"], s["redelivery_lateness_ms"], s["messages_per_s"], flush=True)
    from .report import demo_retries_table

    finish(args, "demo-retries", {"runs": runs}, start, demo_retries_table)
    return {"runs": runs}


if __name__ == "__main__":
    main()
