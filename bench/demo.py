"""Record ``pulsar-nack demo --json`` on each test broker, one after the other in one run.

Each run is a fresh ``python -m pulsar_nack.cli demo --broker B --messages default --json``
process; its last stdout line is the summary. Wall time is measured around the whole
process (broker and Spark start included). The results go to
``bench/results/demo-apache.json`` (Apache Pulsar standalone) and
``bench/results/demo-lite.json`` (pulsar-lite), beside each other in docs/spark.md.

Run: ``python -m bench.demo [--quick]`` (quick: the small size, ``-quick`` files).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from ._common import REPO, print_table, start_context, write_result

BROKERS = ("apache", "lite")


def run_demo(size: str, broker: str) -> dict[str, Any]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--broker", broker, "--messages", size, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - start
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {"size": size, "broker": broker, "exit_code": out.returncode, "process_wall_s": wall, "stderr_lines": len(out.stderr.splitlines()), "summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    size = "small" if args.quick else "default"
    start = start_context()
    runs = [run_demo(size, broker) for broker in BROKERS]
    print_table(
        ["broker", "size", "exit", "lost", "duplicates", "nacked", "p50/p99 lateness ms", "wall s", "msg/s"],
        [
            [
                r["broker"],
                r["size"],
                r["exit_code"],
                r["summary"]["lost"],
                f"{r['summary']['duplicates']} ({r['summary']['duplicates_pct']} %)",
                r["summary"]["nacked"],
                f"{r['summary']['redelivery_lateness_ms']['p50']:.0f} / {r['summary']['redelivery_lateness_ms']['p99']:.0f}",
                f"{r['process_wall_s']:.1f}",
                f"{r['summary']['messages_per_s']:.0f}",
            ]
            for r in runs
        ],
        title="pulsar-nack demo",
    )
    for run in runs:
        path = write_result(f"demo-{run['broker']}" + ("-quick" if args.quick else ""), {"runs": [run]}, start)
        print(f"wrote {path}")
    return {"runs": runs}


if __name__ == "__main__":
    main()
