"""``bench.demo_wave``'s table and docs block, from a made-up result (no broker)."""

from __future__ import annotations

from typing import Any

from bench import demo_wave
from bench.report import demo_wave_table


def _payload() -> dict[str, Any]:
    wave = {
        "ours": {"workers_cpu_s": 3.0, "broker_cpu_s": 2.2, "first_pass_end_ms": 2500, "last_retry_arrival_ms": 3000, "wall_s": 4.4},
        "builtin": {"workers_cpu_s": 2.0, "broker_cpu_s": 2.0, "first_pass_end_ms": 2000, "last_retry_arrival_ms": 2600, "wall_s": 4.0},
    }
    stream = {
        "ours": {"wall_us": 11.0, "process_cpu_us": 10.0, "main_thread_cpu_us": 9.0},
        "builtin": {"wall_us": 10.0, "process_cpu_us": 8.0, "main_thread_cpu_us": 6.0},
    }
    return {"broker": "Apache Pulsar 9.9.9 standalone", "wave_messages": 1000, "stream_messages": 500, "repeats": 3,
            "wave_medians": wave, "stream_medians": stream}  # fmt: skip


def test_each_row_gives_ours_the_builtin_and_their_ratio() -> None:
    table = demo_wave.table(_payload())
    assert "| wave: CPU time of the two workers | 3.00 s | 2.00 s | 1.50x |" in table
    assert "| wave: first pass done (the last nack), after | 2,500 ms | 2,000 ms | 1.25x |" in table
    assert "| stream: CPU time of the application's thread per message | 9.00 µs | 6.00 µs | 1.50x |" in table
    assert len(table.splitlines()) == 2 + len(demo_wave.WAVE_ROWS) + len(demo_wave.STREAM_ROWS)


def test_the_docs_block_states_the_differences_from_the_medians() -> None:
    block = demo_wave_table(_payload())
    assert "Apache Pulsar 9.9.9 standalone; the wave: 1,000 events" in block
    assert "1.50x the built-in's CPU time and ended their first pass +500 ms" in block
    assert "last retry came +400 ms" in block
    assert "+3.00 µs of CPU per message" in block
