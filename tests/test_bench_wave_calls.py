"""``bench.wave_calls``: its timer, its medians, its table and docs block (no broker)."""

from __future__ import annotations

import time
from typing import Any

from bench import wave_calls
from bench.report import wave_calls_table


def _worker(scale: float, ledger: bool) -> dict[str, Any]:
    calls = {"receive": {"calls": 1000, "cpu_ms": 4.0 * scale}, "acknowledge": {"calls": 900, "cpu_ms": 3.6 * scale},
             "negative_acknowledge": {"calls": 100, "cpu_ms": 1.0 * scale}}  # fmt: skip
    if ledger:
        calls |= {"screen_kept": {"calls": 80, "cpu_ms": 1.6}, "before_ack": {"calls": 90, "cpu_ms": 1.8}}
    return {"received": 1000, "calls": calls, "main_thread_cpu_s": 0.02 * scale, "timer_thread_cpu_s": 0.003 if ledger else 0.0,
            "other_threads_cpu_s": 0.004, "process_cpu_s": 0.02 * scale + 0.007}  # fmt: skip


def _payload() -> dict[str, Any]:
    runs = [{"system": "ours", "repeat": r, "workers": [_worker(1.5, True), _worker(1.5, True)]} for r in range(2)]
    runs += [{"system": "builtin", "repeat": r, "workers": [_worker(1.0, False), _worker(1.0, False)]} for r in range(2)]
    return {"broker": "Apache Pulsar 9.9.9 standalone", "messages": 2000, "repeats": 2, "runs": runs,
            "medians": wave_calls.per_worker(runs)}  # fmt: skip


def test_the_timer_counts_calls_and_thread_cpu_per_method() -> None:
    class Work:
        def spin(self, until: float) -> int:
            while time.thread_time() < until:
                pass
            return 7

    timer = wave_calls.CallTimer()
    timer.wrap(Work, "spin", "spin")
    assert Work().spin(time.thread_time() + 0.02) == 7
    Work().spin(0)
    report = timer.report()
    assert report["spin"]["calls"] == 2
    assert report["spin"]["cpu_ms"] >= 19


def test_medians_per_call_and_per_thread() -> None:
    medians = _payload()["medians"]
    assert medians["ours"]["receive"] == {"calls": 1000, "us_per_call": 6.0, "ms_per_worker": 6.0}
    assert medians["builtin"]["negative_acknowledge"] == {"calls": 100, "us_per_call": 10.0, "ms_per_worker": 1.0}
    assert "screen_kept" not in medians["builtin"]
    assert medians["ours"]["main_thread_cpu_s"] == {"s": 0.03}
    assert medians["ours"]["rest_of_task_cpu_s"] == {"s": 0.017}  # 30 ms less 6 + 5.4 + 1.5 ms in the calls


def test_the_table_and_the_block_state_the_differences() -> None:
    table = wave_calls.table(_payload())
    assert "| `receive` | 1,000 | 6.00 µs | 6 ms | 1,000 | 4.00 µs | 4 ms |" in table
    assert "| `before_ack` (ours only, inside the calls above) | 90 | 20.00 µs | 2 ms | - | - | - |" in table
    assert "| CPU of the task's thread |  |  | 30 ms |  |  | 20 ms |" in table
    assert "| CPU of the task's thread outside the consumer calls |  |  | 17 ms |  |  | 11 ms |" in table
    block = wave_calls_table(_payload())
    assert "ours' task thread spent +10 ms of CPU against the built-in's" in block
    assert "`receive` +2 ms, `acknowledge` +2 ms, `negative_acknowledge` +0 ms" in block
    assert "(3 ms of them in the ledger's" in block
    assert "+6 ms in the rest of the task" in block  # 30 - 12.9 against 20 - 8.6 ms
