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

``--ab COMMIT`` (issue 36) runs the demo of an older commit beside the current code and
the built-in nack, rotating (A, B, built-in; B, built-in, A; ...), ``--repeats`` rounds,
on each of ``--masters`` (``local``: ``local[2]``; ``cluster``: a Spark standalone
cluster of two one-core workers started for the run). The older commit is checked out as a
``git worktree`` (under the system's temp directory, its C extensions built in place) and
its demo runs from there (``PYTHONPATH``, also given to the cluster's executors through
``spark.executorEnv.PYTHONPATH``), so a lateness regression shows in one run. Results go
to ``bench/results/demo-ab.json``: per run the code (``a``: the commit, ``b``: the current
code, ``builtin``: the current code's ``--tracker builtin``), the master, p50 / p99
lateness, duplicates and messages per second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
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
    size: str, tracker: str, receiver_queue_size: int | None = None, extra: list[str] | None = None,
    code: Path = REPO, master: str | None = None,
) -> dict[str, Any]:
    """One demo process (of the package in *code*, on *master*); its summary, exit code, wall time and stderr line count."""
    command = [sys.executable, "-m", "pulsar_nack.cli", "demo", *(extra or ["--tracker", tracker])]
    command += ["--messages", size, "--json"]
    if receiver_queue_size is not None:
        command += ["--receiver-queue-size", str(receiver_queue_size)]
    env = {**os.environ, "PYTHONPATH": str(code)}  # its package first, ahead of the installed (editable) one
    if master is not None:  # a cluster's executors are the workers' children: they get the path through Spark
        command += ["--master", master]
        env["PYSPARK_SUBMIT_ARGS"] = f"--conf spark.executorEnv.PYTHONPATH={code} pyspark-shell"
    start = time.monotonic()
    out = subprocess.run(command, cwd=code, capture_output=True, text=True, timeout=3600, env=env)
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
    args_parser.add_argument("--ab", default=None, metavar="COMMIT", help="an older commit's demo beside this code's")
    args_parser.add_argument("--masters", default="local", help="with --ab: local, cluster or both, comma-separated")
    args = args_parser.parse_args(argv)
    if args.retries:
        return retries_side_by_side(args)
    if args.ab:
        return a_b(args)
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


def checkout(commit: str) -> Path:
    """A ``git worktree`` of *commit* (reused if there), its C extensions built in place."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"pulsar-nack-ab-{full[:12]}"
    if not (path / "pyproject.toml").is_file():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), full], cwd=REPO, check=True,
                       capture_output=True)
    with tempfile.TemporaryDirectory() as wheels:  # its own build (its pyproject's extensions), then the .so files in place
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, str(path)], check=True,
                       capture_output=True)
        for wheel in Path(wheels).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                for name in archive.namelist():
                    if name.endswith((".so", ".pyd")):
                        archive.extract(name, path)
    return path


AB_SIDES = ("a", "b", "builtin")
"""``--ab``: the older commit's demo, this code's, and this code's with the built-in nack."""


def a_b(args: argparse.Namespace) -> dict[str, Any]:
    """``--ab``: the sides of :data:`AB_SIDES` rotating, ``--repeats`` rounds, on each of ``--masters``."""
    masters = args.masters.split(",")
    if set(masters) - {"local", "cluster"}:
        raise SystemExit(f"--masters takes local and cluster, got {args.masters!r}")
    older = checkout(args.ab)
    older_args = _older_demo_args(older)
    start, runs = start_context(), []
    for master in masters:
        if master == "cluster":
            from pulsar_nack.testing.spark_cluster import SparkStandaloneCluster

            with SparkStandaloneCluster(workers=2) as cluster:
                runs += _ab_rounds(args, (older, older_args), master, cluster.master_url)
        else:
            runs += _ab_rounds(args, (older, older_args), master, None)
    from .report import demo_ab_table

    finish(args, "demo-ab", {"a": args.ab, "a_worktree": str(older), "runs": runs}, start, demo_ab_table)
    return {"runs": runs}


def _older_demo_args(older: Path) -> list[str]:
    """The older demo's options for what this one does: Apache Pulsar standalone (it once defaulted to another broker)."""
    out = subprocess.run([sys.executable, "-m", "pulsar_nack.cli", "demo", "--help"], cwd=older, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(older)})  # fmt: skip
    return ["--tracker", "ours", "--broker", "apache"] if "--broker" in out.stdout else ["--tracker", "ours"]


def _ab_rounds(
    args: argparse.Namespace, older: tuple[Path, list[str]], master: str, url: str | None
) -> list[dict[str, Any]]:
    """``--repeats`` rounds of the three sides on one master, the order rotating each round."""
    runs = []
    for repeat in range(args.repeats):
        for side in AB_SIDES[repeat % 3:] + AB_SIDES[: repeat % 3]:
            for size in ["small"] if args.quick else args.sizes.split(","):
                tracker = "builtin" if side == "builtin" else "ours"
                run = run_demo(size, tracker, args.receiver_queue_size, extra=older[1] if side == "a" else None,
                               code=older[0] if side == "a" else REPO, master=url)  # fmt: skip
                runs.append({**run, "code": side, "master": master,
                             "commit": args.ab if side == "a" else "current", "repeat": repeat})  # fmt: skip
                s, late = run["summary"], run["summary"]["redelivery_lateness_ms"]
                print(f"{master} {side} {size} repeat {repeat}: p50 {late['p50']:.0f} ms, p99 {late['p99']:.0f} ms, "
                      f"duplicates {s['duplicates']}, lost {s['lost']}, {s['messages_per_s']:,.0f} msg/s", flush=True)
    return runs

if __name__ == "__main__":
    main()
