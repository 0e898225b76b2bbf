"""The admission ledger's steps for one retry, compiled by mypyc beside the same code in pure Python.

No broker: a worker process drives an :class:`~pulsar_nack.consumer.admission.AdmissionLedger`
as a Shared subscription's consumer does (the demo's batches of 10, one member of each
failing entry nacked), through the steps a retry costs it:

- ``nack``: the nack's note (:meth:`~AdmissionLedger.note_nack`), on a copy the ledger screened;
- ``complete``: the ack of the member that completes the entry (the C table records the
  others), by its serialized id (:meth:`~AdmissionLedger.note_ack_data`);
- ``handoff``: the handoff of the due keys, 50 per burst (:meth:`~AdmissionLedger.hand_off`);
- ``screen``: the returning copy's screen (:meth:`~AdmissionLedger.screen`);
- ``ack``: the ack of that copy (:meth:`~AdmissionLedger.note_ack_data`).

Each step is timed with ``time.perf_counter_ns`` around the call, in a process with the
garbage collector off. The *compiled* worker imports the package as installed (CI checks it
is compiled); the *pure* worker imports a copy of it without the ledger's compiled modules,
so the same ``.py`` sources run in the interpreter. The two alternate, each repetition in
fresh processes. Run: ``python -m bench.ledger_steps [--quick] [--repeats N]``; writes
``bench/results/ledger-steps.json``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import REPO, finish, md_table, parser, run_worker, start_context, varint

STEPS = ("nack", "complete", "handoff", "screen", "ack")
"""The ledger's steps for one retry, in the order it takes them."""
VARIANTS = ("compiled", "pure")
BATCH = 10
"""Members per entry, as in the demo."""
BURST = 50
"""Due keys per handoff."""
LEDGER_ID = 77
TOPIC = "persistent://public/default/ledger-steps"


def id_data(ledger: int, entry: int, index: int, size: int) -> bytes:
    """A serialized ``MessageIdData`` (ledger, entry, partition 0, batch index, batch size), as the client's."""
    fields = ((1, ledger), (2, entry), (3, 0), (4, index), (6, size))
    return b"".join(varint(number << 3) + varint(value) for number, value in fields)


def _ledger() -> Any:
    from pulsar_nack.consumer.admission import AdmissionLedger

    # lead_ms=0: every returning copy comes after its handoff's lead (none is a reconnect's early copy)
    return AdmissionLedger(None, lead_ms=0, always_guard=False, guard_messages=1_000, start_guard=0,
                           wait_for_last=True, recheck_ms=300)


def _nack_and_complete(ledger: Any, items: list[tuple[int, int, int]], spent: dict[str, int]) -> None:
    """Each item's first copy screened, its nack noted, its siblings acked (the last one through the ledger)."""
    clock = time.perf_counter_ns
    for item in items:
        ledger.screen(None, id_data(item[0], item[1], item[2], BATCH))  # the first copy: opens the entry's record
        start = clock()
        ledger.note_nack(item, BATCH, None, None)
        spent["nack"] += clock() - start
        siblings = [index for index in range(BATCH) if index != item[2]]
        for index in siblings[:-1]:
            ledger.entries.ack(item[0], item[1], index, BATCH)  # what the C table records alone
        last = id_data(item[0], item[1], siblings[-1], BATCH)
        start = clock()
        ledger.note_ack_data(last)
        spent["complete"] += clock() - start


def _return(ledger: Any, items: list[tuple[int, int, int]], spent: dict[str, int]) -> None:
    """The items handed off in bursts, then each returning copy screened and acked."""
    from pulsar_nack.consumer.msgid import DELIVER

    clock = time.perf_counter_ns
    for first in range(0, len(items), BURST):
        due = {TOPIC: [(TOPIC, *item) for item in items[first : first + BURST]]}
        start = clock()
        ledger.hand_off(due, None)
        spent["handoff"] += clock() - start
    for item in items:
        data = id_data(item[0], item[1], item[2], BATCH)
        start = clock()
        verdict, _ = ledger.screen(None, data)
        spent["screen"] += clock() - start
        if verdict != DELIVER:  # the copy its handoff brought is the application's
            raise RuntimeError(f"the returning copy of {item} was not delivered (verdict {verdict})")
        start = clock()
        ledger.note_ack_data(data)
        spent["ack"] += clock() - start


def _worker(retries: int) -> dict[str, Any]:
    """One pass of *retries* retries through a fresh ledger: µs per retry for each step."""
    from pulsar_nack.consumer import admission

    items = [(LEDGER_ID, entry, entry % BATCH) for entry in range(retries)]
    spent = dict.fromkeys(STEPS, 0)
    gc.disable()
    ledger = _ledger()
    _nack_and_complete(ledger, items, spent)
    _return(ledger, items, spent)
    ledger._check(0)  # every retry settled: nothing left in any set
    return {"compiled": admission.COMPILED, "us_per_retry": {step: spent[step] / retries / 1000 for step in STEPS}}


def pure_copy(where: Path) -> Path:
    """A copy of the installed package without its mypyc-compiled modules; the folder to put first on the path.

    Those are the extension modules with their ``.py`` source beside them (the C extensions
    have none) and mypyc's shared library (``*__mypyc``).
    """
    import pulsar_nack

    target = where / "pulsar_nack"
    shutil.copytree(Path(pulsar_nack.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__"))
    for built in target.rglob("*.so"):
        stem = built.name.split(".")[0]
        if stem.endswith("__mypyc") or built.with_name(f"{stem}.py").exists():
            built.unlink()
    return where


def _env(pythonpath: str) -> dict[str, str]:
    """The environment of a worker that imports the package from *pythonpath* first."""
    return dict(os.environ, PYTHONPATH=pythonpath)


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per variant, the median µs per retry of each step and of their sum."""
    summary: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        mine = [run["us_per_retry"] for run in runs if run["variant"] == variant]
        summary[variant] = {step: statistics.median(r[step] for r in mine) for step in STEPS}
        summary[variant]["total"] = statistics.median(sum(r[step] for step in STEPS) for r in mine)
    return summary


def table(payload: dict[str, Any]) -> str:
    """The steps' medians, compiled beside pure Python, and a sentence on the total."""
    summary = payload["medians"]
    rows = [(f"`{step}`" if step != "total" else "one retry, every step", f"{summary['pure'][step]:.2f}",
             f"{summary['compiled'][step]:.2f}", f"{summary['compiled'][step] / summary['pure'][step]:.2f}x")
            for step in (*STEPS, "total")]
    head = md_table(("ledger step (µs per retry, median)", "pure Python", "compiled (mypyc)", "compiled / pure"), rows, "lrrr")
    return (f"{head}\n\nNo broker; {payload['retries']:,} retries per pass in batches of {BATCH}, handoffs of {BURST} keys; "
            f"{payload['repeats']} alternating repetitions, each variant in a fresh process. Compiled, the ledger "
            f"spends {summary['compiled']['total']:.2f} µs per retry against {summary['pure']['total']:.2f} µs in pure Python.")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.ledger_steps", "2,000 retries, two repetitions")
    args_parser.add_argument("--repeats", type=int, default=7, help="pairs, order alternating")
    args = args_parser.parse_args(argv)
    retries, repeats = (2_000, 2) if args.quick else (20_000, args.repeats)
    start = start_context()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pulsar-nack-pure-") as temp:
        # python -m puts its working folder first on the path: the pure worker's is the copy's
        folders = {"compiled": REPO, "pure": pure_copy(Path(temp))}
        for repeat in range(repeats):
            for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                folder = folders[variant]
                result = run_worker("bench.ledger_steps", str(retries), cwd=folder, env=_env(os.pathsep.join((str(folder), str(REPO)))))
                if result["compiled"] != (variant == "compiled"):
                    raise RuntimeError(f"the {variant} worker ran a ledger with COMPILED={result['compiled']}")
                runs.append({"variant": variant, "repeat": repeat, **result})
                print(f"{repeat} {variant}: {sum(result['us_per_retry'].values()):.2f} µs per retry", flush=True)
    payload: dict[str, Any] = {"retries": retries, "repeats": repeats, "runs": runs, "medians": medians(runs)}
    finish(args, "ledger-steps", payload, start, table)
    return payload


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(_worker(int(sys.argv[2]))), flush=True)
    else:
        main()
