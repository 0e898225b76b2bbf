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
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from ._common import REPO, finish, parser, start_context

TRACKERS = ("ours", "builtin")


def run_demo(size: str, tracker: str, receiver_queue_size: int | None = None) -> dict[str, Any]:
    """One demo process; its summary, exit code, wall time and stderr line count."""
    command = [sys.executable, "-m", "pulsar_nack.cli", "demo", "--tracker", tracker, "--messages", size, "--json"]
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
    args = args_parser.parse_args(argv)
    start, runs = start_context(), []
    for repeat in range(args.repeats):
        for size in ["small"] if args.quick else args.sizes.split(","):
            for tracker in TRACKERS if repeat % 2 == 0 else TRACKERS[::-1]:  # alternate who goes first
                runs.append({**run_demo(size, tracker, args.receiver_queue_size), "repeat": repeat})
    from .report import demo_table

    print(demo_table({"runs": runs}))
    finish(args, "demo-apache", {"runs": runs}, start)
    return {"runs": runs}


if __name__ == "__main__":
    main()
