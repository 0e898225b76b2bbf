"""Record ``pulsar-nack demo --json`` runs (default and small size) in bench/results/demo.json.

Each run is a fresh ``python -m pulsar_nack.cli demo --json`` process; its last stdout line
is the summary. Wall time is measured around the whole process (Spark start included).

Run: ``python -m bench.demo [--quick]`` (quick: the small size only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from ._common import REPO, print_table, write_result


def run_demo(size: str) -> dict[str, Any]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--messages", size, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - start
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {"size": size, "exit_code": out.returncode, "process_wall_s": wall, "stderr_lines": len(out.stderr.splitlines()), "summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    runs = [run_demo(size) for size in (["small"] if args.quick else ["default", "small"])]
    print_table(
        ["size", "exit", "lost", "acked", "nacked", "p99 lateness ms", "wall s", "msg/s"],
        [
            [
                r["size"],
                r["exit_code"],
                r["summary"]["lost"],
                r["summary"]["acked"],
                r["summary"]["nacked"],
                f"{r['summary']['redelivery_lateness_ms']['p99']:.0f}",
                f"{r['process_wall_s']:.1f}",
                f"{r['summary']['messages_per_s']:.0f}",
            ]
            for r in runs
        ],
        title="pulsar-nack demo",
    )
    path = write_result("demo-quick" if args.quick else "demo", {"runs": runs})
    print(f"wrote {path}")
    return {"runs": runs}


if __name__ == "__main__":
    main()
