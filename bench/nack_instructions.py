"""Instructions per ``negative_acknowledge(message)``: ours beside the plain client's, counted by Callgrind.

The timed nack row of ``bench/consumer.py`` moves by tens of percent from repetition to
repetition on a shared machine, ours and the plain client's alike. A count of the
instructions executed does not, so it shows what a change to the nack's code did. It is
not a time: it leaves out what the instructions wait for (memory, locks), and it says
nothing about how ours and the built-in compare in microseconds; the timed row does.

Each count comes from a fresh worker process under ``valgrind --tool=callgrind`` with
instrumentation off. The worker subscribes to a topic of ``--messages`` non-batched
messages (Apache Pulsar standalone, the broker's default settings), receives them all,
turns instrumentation on (``callgrind_control``), nacks the first *n* of them (one hour's
delay) and turns it off. Instructions per nack = (count with *n* = all − count with *n*
= 0) / all, so the toggling and the loop's set-up cancel out. For ours, the inclusive
count of each of our compiled steps is given too (Callgrind's own per-function figures).
With ``--ab COMMIT`` ours is also counted on that commit's code (a ``git worktree``
built in place, as ``bench/demo.py --ab`` makes).

Run ``python -m bench.nack_instructions [--messages 20000] [--ab COMMIT] [--repetitions 2]``;
writes ``bench/results/nack-instructions.json``. Needs ``valgrind`` and ``callgrind_control``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from ._common import REPO, finish, parser, start_context
from .consumer import _produce as produce

WORKER = Path(__file__).with_name("nack_worker.py")
"""The worker, run as a script (not ``-m``): an older checkout's ``bench`` package has no such module."""
STEPS = {
    "ledger note_nack": "CPyDef_admission___AdmissionLedger___note_nack",
    "tracker add (C)": "FastAdd_add",
    "key read (C)": "received_key",
}
"""Our steps of a nack: a label -> the C function Callgrind names (the mypyc method's body, our C calls)."""
_LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+\S*?:(\w+)(?:\s|\[|$)")


def _count(source: Path, system: str, url: str, topic: str, count: int, nacks: int) -> tuple[int, dict[str, int]]:
    """One worker under Callgrind: the instructions counted, and the inclusive count of each of :data:`STEPS`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                   sys.executable, str(WORKER), system, url, topic, str(count), str(nacks)]
        env = {**os.environ, "PYTHONPATH": str(source)}  # the pulsar_nack of the code counted
        run = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=1800)
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode or found is None:
            raise RuntimeError(f"the {system} worker failed (exit {run.returncode}): {run.stderr[-2000:]}")
        annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                                   capture_output=True, text=True, check=True).stdout
    return int(found.group(1)), _steps(annotated)


def _steps(annotated: str) -> dict[str, int]:
    """The inclusive count of each of :data:`STEPS` in ``callgrind_annotate --inclusive=yes`` output (0: not seen)."""
    best: dict[str, int] = {}
    for line in annotated.splitlines():
        match = _LINE.match(line)
        if match:
            name = match.group(2)
            best[name] = max(best.get(name, 0), int(match.group(1).replace(",", "")))
    return {label: best.get(function, 0) for label, function in STEPS.items()}


def measure(url: str, sources: dict[str, Path], count: int, repetitions: int) -> list[dict[str, Any]]:
    """Instructions per nack of each code in *sources* (a label -> a checkout) and of the plain client."""
    import pulsar

    topic = f"persistent://public/default/instructions-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    produce(client, topic, count, batched=False)
    client.close()
    sides = [("plain", "plain", REPO), *(("pulsar-nack", label, path) for label, path in sources.items())]
    rows = []
    for repetition in range(repetitions):
        for system, label, source in sides:
            idle, _ = _count(source, system, url, topic, count, 0)
            total, steps = _count(source, system, url, topic, count, count)
            rows.append({
                "system": system, "code": label, "repetition": repetition,
                "instructions_per_nack": (total - idle) / count,
                "steps_per_nack": {name: value / count for name, value in steps.items()} if system != "plain" else {},
            })  # fmt: skip
            print(f"  {label:>24} {system:>12}: {(total - idle) / count:,.0f} instructions per nack", flush=True)
    return rows


def _commit_of(path: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    made = parser(__doc__, "bench.nack_instructions")
    made.add_argument("--messages", type=int, default=20_000)
    made.add_argument("--repetitions", type=int, default=2)
    made.add_argument("--ab", default=None, help="also count ours on this older commit's code")
    args = made.parse_args(sys.argv[1:] if argv is None else argv)
    missing = [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"bench.nack_instructions needs {', '.join(missing)} on PATH")
    start = start_context()
    sources = {f"this code ({_commit_of(REPO)[:7]})": REPO}
    if args.ab:
        from .demo import checkout

        older = checkout(args.ab)
        sources = {f"older ({_commit_of(older)[:7]})": older, **sources}
    from pulsar_nack.testing import PulsarStandalone

    with PulsarStandalone() as broker:
        label = f"Apache Pulsar {broker.version} standalone, broker defaults (batch-index acks off)"
        rows = measure(broker.url, sources, args.messages, args.repetitions)
    payload = {"broker": label, "messages": args.messages, "ab": args.ab, "rows": rows}
    from .report import nack_instructions_table

    finish(args, "nack-instructions", payload, start, nack_instructions_table)
    return payload


if __name__ == "__main__":
    main()
