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
broker: ``nack``, ``durable`` and ``builtin`` on a broker with a 100 ms delayed-delivery
tick, and ``durable`` again on the stock 1 s tick (``durable-stock-tick``), to
``bench/results/demo-retries.json`` (docs/spark.md, "Durable retries").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from ._common import REPO, print_table, start_context, write_result

TRACKERS = ("ours", "builtin")


RETRY_MODES: dict[str, list[str]] = {
    "nack": ["--tracker", "ours", "--retries", "nack", "--broker-tick-ms", "100"],
    "durable": ["--tracker", "ours", "--retries", "durable", "--broker-tick-ms", "100"],
    "builtin": ["--tracker", "builtin", "--broker-tick-ms", "100"],
    "durable-stock-tick": ["--tracker", "ours", "--retries", "durable", "--broker-tick-ms", "1000"],
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
    wall = time.monotonic() - start
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "size": size,
        "broker": "apache",
        "tracker": tracker,
        "exit_code": out.returncode,
        "process_wall_s": wall,
        "stderr_lines": len(out.stderr.splitlines()),
        "summary": summary,
    }


def _row(r: dict[str, Any]) -> list[Any]:
    s = r["summary"]
    late = s["redelivery_lateness_ms"]
    return [
        r["broker"], r["tracker"], r["size"], r["exit_code"], s["lost"],
        f"{s['duplicates']} ({s['duplicates_pct']} %)", s["nacked"],
        f"{late['p50']:.0f} / {late['p99']:.0f} / {late['max']:.0f}",
        f"{r['process_wall_s']:.1f}", f"{s['messages_per_s']:.0f}",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="default,large", help="Apache Pulsar sizes, comma-separated")
    parser.add_argument("--receiver-queue-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="pairs per size on Apache Pulsar, order alternating")
    parser.add_argument("--retries", action="store_true", help="the retry modes side by side (see the module notes)")
    parser.add_argument("--modes", default=None, help="with --retries: comma-separated modes (default: all four)")
    args = parser.parse_args(argv)
    if args.retries:
        modes = args.modes.split(",") if args.modes else list(RETRY_MODES)
        return retries_side_by_side(["small"] if args.quick else args.sizes.split(","), args.repeats, args.quick, modes)
    sizes = ["small"] if args.quick else args.sizes.split(",")
    start = start_context()
    apache = []
    for repeat in range(args.repeats):
        order = TRACKERS if repeat % 2 == 0 else TRACKERS[::-1]  # alternate who goes first
        for size in sizes:
            for tracker in order:
                apache.append({**run_demo(size, tracker, args.receiver_queue_size), "repeat": repeat})
    print_table(
        ["broker", "tracker", "size", "exit", "lost", "duplicates", "nacked", "p50/p99/max lateness ms", "wall s", "msg/s"],
        [_row(r) for r in apache],
        title="pulsar-nack demo",
    )
    suffix = "-quick" if args.quick else ""
    path = write_result(f"demo-apache{suffix}", {"runs": apache}, start)
    print(f"wrote {path}")
    return {"runs": apache}


def retries_side_by_side(sizes: list[str], repeats: int, quick: bool, modes: list[str]) -> dict[str, Any]:
    """The retry modes (nack, durable, builtin on a 100 ms tick, durable on the stock tick) per size, order rotating."""
    unknown = set(modes) - set(RETRY_MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s) {sorted(unknown)}; choose from {', '.join(RETRY_MODES)}")
    start = start_context()
    runs = []
    for repeat in range(repeats):
        order = modes[repeat % len(modes):] + modes[: repeat % len(modes)]
        for size in sizes:
            for mode in order:
                run = run_demo(size, RETRY_MODES[mode][1], extra=RETRY_MODES[mode])
                runs.append({**run, "mode": mode, "repeat": repeat})
                s = run["summary"]
                print(mode, size, s["lost"], s["duplicates_pct"], s["redelivery_lateness_ms"], s["messages_per_s"], flush=True)
    print_table(
        ["broker", "tracker", "size", "exit", "lost", "duplicates", "nacked", "p50/p99/max lateness ms", "wall s", "msg/s"],
        [[r["mode"], *_row(r)[1:]] for r in runs],
        title="pulsar-nack demo: retry modes",
    )
    path = write_result("demo-retries-quick" if quick else "demo-retries", {"runs": runs}, start)
    print(f"wrote {path}")
    return {"runs": runs}


if __name__ == "__main__":
    main()
