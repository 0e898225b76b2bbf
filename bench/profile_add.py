"""Where ``tracker.add`` spends its time on a memory case: a py-spy profile, summarised.

For the cases where ``add`` has the least margin over its target (``bench/memory.py``'s
``add >= 1.5x baseline``), it runs, in a child process under ``py-spy record --native
--format raw``, the case's keys through ``NegativeAcksTracker.add`` with the C hot path,
called as the docs show (``bench.memory.drive``), then summarises the samples taken inside
``add``: the share of each function (inclusive and self), by name. Needs ``py-spy``
(``pip install py-spy``; the bench extra has it).

Run ``python -m bench.profile_add [--cases y0-x1,rand10-x1-y8] [--messages 200000]``;
writes ``bench/results/profile_add.json``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from ._common import REPO, finish, parser, start_context


def child(case_name: str, n: int) -> None:
    """Add the case's keys to a fresh tracker (the profiled part)."""
    from pulsar_nack import MultiplierRedeliveryBackoff, NegativeAcksTracker

    from .memory import CASES, DELAY_MS, T0_MS, drive

    case, cell = CASES[case_name], [T0_MS]
    backoff = MultiplierRedeliveryBackoff(1000, 60_000, 2) if case.pattern == "backoff" else None
    clock = functools.partial(cell.__getitem__, 0)
    tracker = NegativeAcksTracker(delay_ms=DELAY_MS, precision_bits=case.y, backoff=backoff, clock=clock)
    start = time.perf_counter()
    drive(case, n, tracker.add, cell)
    print(f"adds_per_s={n / (time.perf_counter() - start):.0f}")


def summarise(raw: str, top: int = 25) -> dict[str, Any]:
    """Inclusive and self shares of each function among the samples inside ``add``."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        inside = [i for i, f in enumerate(frames) if "FastAdd_add" in f or "BaseTracker.add" in f]
        if inside:
            frames, samples = frames[inside[0] :], int(count)
            total += samples
            own[frames[-1]] += samples
            for frame in set(frames):
                inclusive[frame] += samples
    rows = [{"function": f, "inclusive": n / total, "self": own[f] / total} for f, n in inclusive.most_common(top)]
    return {"samples_in_add": total, "functions": rows}


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.profile_add")
    args_parser.add_argument("--cases", default="y0-x1,rand10-x1-y8")
    args_parser.add_argument("--messages", type=int, default=200_000)
    args_parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = args_parser.parse_args(argv)
    if args.child:
        child(args.child, args.messages)
        return 0
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    context, cases = start_context(), {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    for name in args.cases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "raw.txt")
            cmd = [py_spy, "record", "--native", "-r", "500", "-f", "raw", "-o", out, "--", sys.executable, "-m",
                   "bench.profile_add", "--child", name, "--messages", str(args.messages)]
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            rate = re.search(r"adds_per_s=(\d+)", proc.stdout)
            if proc.returncode or rate is None:
                raise RuntimeError(f"py-spy failed on {name} (exit {proc.returncode}): {proc.stdout[-200:]!r}")
            with open(out, encoding="utf-8") as f:
                cases[name] = {**summarise(f.read()), "adds_per_s_under_profiler": float(rate.group(1))}
        print(f"\n{name}: {cases[name]['adds_per_s_under_profiler']:,.0f} adds/s under py-spy")
        for row in cases[name]["functions"][:15]:
            print(f"  {row['inclusive']:6.1%} incl {row['self']:6.1%} self  {row['function'][:90]}")
    payload = {"method": __doc__, "parameters": {"messages": args.messages, "rate_hz": 500}, "cases": cases}
    finish(args, "profile_add", payload, context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
