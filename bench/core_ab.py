"""pop_due and timer lateness: this checkout's core beside an earlier commit's, in one run.

Issue 13 asks that its changes leave ``pop_due``'s cost per released message and the
timer's lateness no worse than 1.1x what they were before. ``bench/core_perf.py`` measures
one core at a time, so figures from different days and machine loads would be compared.
This benchmark measures both cores in one run instead:

* the earlier core (default ``6ac2159``, the last commit before sealed pages) is exported
  with ``git archive`` into a temporary directory and its C extensions are built there;
* every measurement runs in a fresh child process whose ``pulsar_nack`` is one tree or
  the other (checked by the child), the two trees alternating, after a warmup of each;
* the workloads are ``bench/core_perf.py``'s own: *pop all* (1M keys added 8 per ms, so
  489 buckets of 256 ms, then one ``pop_due`` when all are due; ns per released message)
  and *lateness* (one add per ms for 5 s at a 100 ms delay, precision 0 and the default
  8 bits; p99 of callback time - earliest released deadline, per firing). The goal is
  judged as a ratio where the figure is positive; at 8 bits the timer fires early by
  design (negative lateness), so that row reports the difference in ms.

Run ``python -m bench.core_ab [--ref 6ac2159] [--reps 7]`` (or ``pulsar-nack bench --only
core-ab``); writes ``bench/results/core_ab.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import core_perf
from ._common import REPO, dist, finish, interleave, parser, run_worker, start_context, summarize, timed_pop_all

DEFAULT_REF = "6ac2159"
POP_KEYS = 1_000_000
LATENESS_S = 5.0
GOAL = 1.1


def _export(ref: str, root: Path) -> None:
    """The core of *ref* in *root* (``pulsar_nack/``), its C extensions built in place.

    Built with setuptools' default ``build_ext`` flags, as ``pip install`` builds them,
    but without *ref*'s ``pyproject.toml`` (this setuptools may not read an older one).
    """
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "pulsar_nack"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    modules = [".".join(path.relative_to(root).with_suffix("").parts) for path in sorted((root / "pulsar_nack").rglob("_*.c"))]
    build = (
        "import sys; from setuptools import Extension, setup; "
        "setup(name='core-ab', script_args=['build_ext', '--inplace'], ext_modules=["
        "Extension(m, [m.replace('.', '/') + '.c']) for m in sys.argv[1:]])"
    )
    subprocess.run([sys.executable, "-c", build, *modules], cwd=root, check=True, capture_output=True)


def _worker(part: str) -> dict[str, Any]:
    """One measurement, in this process, on whichever ``pulsar_nack`` the path gives."""
    import importlib

    import pulsar_nack
    from pulsar_nack import NegativeAcksTracker

    try:
        speedups = importlib.import_module("pulsar_nack.core.accel").SPEEDUPS
    except ImportError:  # a core from before pulsar_nack/core/
        speedups = importlib.import_module("pulsar_nack._accel").SPEEDUPS
    result: dict[str, Any] = {"package": str(Path(pulsar_nack.__file__).parent), "speedups": bool(speedups)}
    if part == "pop":
        cell = [0]
        tracker = NegativeAcksTracker(delay_ms=core_perf.DELAY_MS, clock=lambda: cell[0])
        core_perf.fill(tracker, cell, core_perf.keys(POP_KEYS), 1_000_000, 8)
        gc.collect()
        result["seconds"] = timed_pop_all(tracker, POP_KEYS, core_perf.END_OF_TIME)
        result["ns_per_message"] = result["seconds"] / POP_KEYS * 1e9
    else:
        precision = int(part.removeprefix("lateness-p"))
        run = core_perf.lateness_run("tracker", precision, LATENESS_S, 100)
        result["p99_per_firing_ms"] = dist(run["per_firing"])["p99"]
        result["released"] = run["released"]
    return result


def _measure(part: str, root: Path) -> dict[str, Any]:
    """Run :func:`_worker` in a fresh process with *root* first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO)]))
    env.pop("PULSAR_NACK_PURE_PYTHON", None)
    with tempfile.TemporaryDirectory() as cwd:  # not REPO: its pulsar_nack must not come first
        result = run_worker("bench.core_ab", part, timeout_s=600, cwd=cwd, env=env)
    if Path(result["package"]) != root / "pulsar_nack" or not result["speedups"]:
        raise RuntimeError(f"the child measured {result['package']} (speedups {result['speedups']}), not {root}")
    return result


def run(ref: str, reps: int) -> dict[str, Any]:
    parts = {"pop": "ns_per_message", "lateness-p0": "p99_per_firing_ms", "lateness-p8": "p99_per_firing_ms"}
    out: dict[str, Any] = {"ref": ref, "repetitions": reps, "parts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        _export(ref, before)
        trees = {"before": before, "now": REPO}
        for part, field in parts.items():
            for name in trees:  # warmup
                _measure(part, trees[name])

            def measure(name: str, part: str = part, field: str = field) -> float:
                return float(_measure(part, trees[name])[field])

            samples = interleave(tuple(trees), reps, measure, warmup=0, progress=part)
            now, then = (summarize(samples[n]) for n in ("now", "before"))
            row: dict[str, Any] = {"field": field, "before": then, "now": now}
            row["difference_now_minus_before"] = now["median"] - then["median"]
            if then["median"] > 0:  # a ratio of an early (negative) lateness would read backwards
                row["ratio_now_over_before"] = now["median"] / then["median"]
                row["goal"] = f"<= {GOAL}x"
                row["pass"] = row["ratio_now_over_before"] <= GOAL
            out["parts"][part] = row
            print(f"{part}: now {now['median']:.2f}, before {then['median']:.2f} ({field})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.core_ab")
    args_parser.add_argument("--ref", default=DEFAULT_REF, help=f"the earlier commit (default {DEFAULT_REF})")
    args_parser.add_argument("--reps", type=int, default=7, help="repetitions of each part (default 7)")
    args_parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = args_parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker)))
        return 0
    context = start_context()
    finish(args, "core_ab", {"method": __doc__, **run(args.ref, args.reps)}, context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
