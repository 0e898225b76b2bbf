"""``bench.ledger_steps``: its ids, its pure-Python copy, its worker, its medians and docs block (no broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar_nack
from bench import ledger_steps
from bench.report import ledger_steps_table
from pulsar_nack.consumer import admission, msgid


def test_the_ids_it_builds_read_back_as_the_client_serializes_them() -> None:
    ledger, entry, partition, index, size = msgid.parse_id(ledger_steps.id_data(77, 123_456, 7, 10))
    assert (ledger, entry, partition, index, size) == (77, 123_456, 0, 7, 10)


def test_the_pure_copy_has_every_source_and_no_module_that_shadows_one(tmp_path: Path) -> None:
    installed = Path(pulsar_nack.__file__).parent
    root = ledger_steps.pure_copy(tmp_path)
    copied = root / "pulsar_nack"
    sources = {path.relative_to(installed) for path in installed.rglob("*.py") if "__pycache__" not in path.parts}
    assert sources == {path.relative_to(copied) for path in copied.rglob("*.py")}
    for built in copied.rglob("*.so"):  # what is left: C extensions, whose sources are C
        stem = built.name.split(".")[0]
        assert not stem.endswith("__mypyc") and not built.with_name(f"{stem}.py").exists(), built
    if admission.COMPILED:  # so the copy did drop something: the compiled ledger beside its source
        assert any((installed / "consumer").glob("admission.*.so")) and not any((copied / "consumer").glob("admission.*.so"))


def test_the_worker_takes_every_retry_through_every_step() -> None:
    result = ledger_steps._worker(300)  # the returning copies are delivered, and nothing is left (it checks both)
    assert result["compiled"] is admission.COMPILED
    assert set(result["us_per_retry"]) == set(ledger_steps.STEPS)
    assert all(value > 0 for value in result["us_per_retry"].values()), result


def _run(variant: str, repeat: int, scale: float) -> dict[str, Any]:
    steps = dict(zip(ledger_steps.STEPS, (2.0, 3.0, 4.0, 5.0, 6.0)))
    return {"variant": variant, "repeat": repeat, "compiled": variant == "compiled",
            "us_per_retry": {step: value * scale for step, value in steps.items()}}


def test_the_medians_and_the_block_put_compiled_beside_pure() -> None:
    runs = [_run("pure", 0, 1.0), _run("compiled", 0, 0.5), _run("pure", 1, 1.2), _run("compiled", 1, 0.7)]
    payload = {"retries": 1000, "repeats": 2, "runs": runs, "medians": ledger_steps.medians(runs)}
    assert payload["medians"]["pure"]["total"] == 20.0 * 1.1
    assert payload["medians"]["compiled"]["total"] == 20.0 * 0.6
    block = ledger_steps_table(payload)
    assert "| `ack` | 6.60 | 3.60 | 0.55x |" in block, block
    assert "| one retry, every step | 22.00 | 12.00 | 0.55x |" in block, block
    assert "spends 12.00 µs per retry against 22.00 µs in pure Python" in block
