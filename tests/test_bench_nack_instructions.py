"""``bench.nack_instructions``: reading Callgrind's per-function counts, and its docs table (no broker, no valgrind)."""

from __future__ import annotations

from typing import Any

from bench import nack_instructions
from bench.report import nack_instructions_table

# Lines as callgrind_annotate --inclusive=yes prints them: one function under two file names, the larger kept.
ANNOTATED = """\
--------------------------------------------------------------------------------
288,147,685 (100.0%)  PROGRAM TOTALS
284,330,121 (98.68%)  Python/ceval.c:PyObject_Vectorcall
108,279,263 (37.58%)  /work/build/pulsar_nack/consumer/__native__ledger.c:CPyPy_admission___AdmissionLedger___note_nack
104,515,907 (36.27%)  build/pulsar_nack/consumer/__native__ledger.c:CPyDef_admission___AdmissionLedger___note_nack [/x.so]
 36,666,632 (12.67%)  /work/pulsar_nack/core/_speedups.c:FastAdd_add
 36,505,972 (12.67%)  pulsar_nack/core/_speedups.c:FastAdd_add [/work/pulsar_nack/core/_speedups.so]
"""


def test_it_reads_each_steps_inclusive_count_and_zero_for_a_step_not_seen() -> None:
    steps = nack_instructions._steps(ANNOTATED)
    assert steps == {"ledger note_nack": 104_515_907, "tracker add (C)": 36_666_632, "key read (C)": 0}


def _row(code: str, system: str, repetition: int, count: float) -> dict[str, Any]:
    steps = {} if system == "plain" else dict.fromkeys(nack_instructions.STEPS, count / 4)
    return {"system": system, "code": code, "repetition": repetition, "instructions_per_nack": count,
            "steps_per_nack": steps}  # fmt: skip


def test_the_table_gives_each_sides_median_and_range_and_our_steps() -> None:
    rows = [_row("-", "plain", r, c) for r, c in enumerate((7_000.0, 7_400.0, 7_200.0))]
    rows += [_row("this code (abc1234)", "pulsar-nack", r, c) for r, c in enumerate((11_000.0, 11_600.0, 11_200.0))]
    text = nack_instructions_table({"broker": "a broker", "messages": 20_000, "rows": rows})
    plain = next(line for line in text.splitlines() if line.startswith("| the plain client"))
    ours = next(line for line in text.splitlines() if line.startswith("| ours, this code (abc1234)"))
    assert "7,200 (7,000–7,400)" in plain and plain.count(" - ") == len(nack_instructions.STEPS)
    assert "11,200 (11,000–11,600)" in ours and "2,800" in ours
    assert "20,000 non-batched messages" in text and "3 run(s)" in text
