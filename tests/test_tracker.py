"""NegativeAcksTracker and the hash-map baseline: one interface, tested on both."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import threading
import time

import _pulsar
import pytest

from helpers import FakeClock, PurePythonTracker, wait_for
from pulsar_nack import MultiplierRedeliveryBackoff, NegativeAcksTracker
from pulsar_nack.core import HashMapNegativeAcksTracker

# NegativeAcksTracker uses the C hot path when it is built; PurePythonTracker never does.
TRACKERS = [NegativeAcksTracker, PurePythonTracker, HashMapNegativeAcksTracker]



class Collector:
    """A redeliver callback that records what it gets."""

    def __init__(self) -> None:
        self.keys: list = []
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, due: dict) -> None:
        with self.lock:
            for keys in due.values():
                self.keys.extend(keys)
                self.times.extend([time.monotonic()] * len(keys))


def flat(due: dict) -> list:
    return [k for keys in due.values() for k in keys]


@pytest.mark.parametrize("cls", TRACKERS)
def test_manual_mode_releases_when_due(cls):
    clock = FakeClock()
    kwargs = {"precision_bits": 0} if issubclass(cls, NegativeAcksTracker) else {}
    tracker = cls(delay_ms=500, clock=clock, **kwargs)
    assert tracker.add(("t", 1, 1, -1)) == 10_500
    assert tracker.add(("t", 1, 2, -1), delay_ms=100) == 10_100
    assert len(tracker) == 2
    assert tracker.pop_due() == {}
    clock.now = 10_100
    assert flat(tracker.pop_due()) == [("t", 1, 2, -1)]
    assert flat(tracker.pop_due(10_500)) == [("t", 1, 1, -1)]
    stats = tracker.stats()
    assert stats["pending_messages"] == 0 and stats["redeliveries"] == 2
    assert tracker.close() == {}


@pytest.mark.parametrize("cls", TRACKERS)
def test_backoff_by_redelivery_count_and_per_call_override(cls):
    clock = FakeClock(0)
    tracker = cls(delay_ms=5, clock=clock, backoff=MultiplierRedeliveryBackoff(100, 10_000, 2))
    assert tracker.add(("t", 1, 1, -1)) == 100
    assert tracker.add(("t", 1, 2, -1), redelivery_count=3) == 800
    assert tracker.add(("t", 1, 3, -1), delay_ms=7, redelivery_count=3) == 7
    tracker.close(flush=False)


class StubMessage:
    """Unit-test stand-in for a pulsar message (the core never imports pulsar)."""

    def __init__(self, topic: str, message_id, redelivery_count: int = 0) -> None:
        self._topic, self._id, self._count = topic, message_id, redelivery_count

    def topic_name(self) -> str:
        return self._topic

    def message_id(self):
        return self._id

    def redelivery_count(self) -> int:
        return self._count


@pytest.mark.parametrize("cls", TRACKERS)
def test_accepts_pulsar_ids_and_messages(cls):
    clock = FakeClock(0)
    tracker = cls(delay_ms=10, clock=clock, default_topic="persistent://p/n/t",
                  backoff=MultiplierRedeliveryBackoff(100, 10_000, 2))
    tracker.add(_pulsar.MessageId(-1, 5, 6, -1), delay_ms=0)
    tracker.add(_pulsar.MessageId(2, 5, 7, 3), delay_ms=0)
    assert tracker.add(StubMessage("persistent://p/n/x", _pulsar.MessageId(0, 8, 9, 1), redelivery_count=2)) == 400
    due = tracker.pop_due(1000)
    assert sorted(flat(due)) == [
        ("persistent://p/n/t", 5, 6, -1),
        ("persistent://p/n/t-partition-2", 5, 7, 3),
        ("persistent://p/n/x", 8, 9, 1),
    ]
    assert all(key[0] == topic for topic, keys in due.items() for key in keys)


@pytest.mark.parametrize("cls", TRACKERS)
@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("t", 1, 1, -1), {"delay_ms": -1}, ValueError),
        (("t", 1, 1, -1), {"delay_ms": 1.5}, TypeError),
        (("t", 1, 1, -1), {"redelivery_count": -1}, ValueError),
        (("t", 1, 1, -1), {"redelivery_count": "1"}, TypeError),
        (("t", -1, 1, -1), {}, ValueError),
        (("t", 1, 1), {}, TypeError),
        ("not a key", {}, TypeError),
        (42, {}, TypeError),
        (None, {}, TypeError),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(cls, args, kwargs, error):
    tracker = cls(delay_ms=10, clock=FakeClock())
    tracker.add(("t", 9, 9, -1))
    with pytest.raises(error):
        tracker.add(args, **kwargs)
    assert len(tracker) == 1
    assert flat(tracker.pop_due(10**9)) == [("t", 9, 9, -1)]


@pytest.mark.parametrize("cls", TRACKERS)
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"delay_ms": -1}, ValueError),
        ({"delay_ms": "1"}, TypeError),
        ({"redeliver": 5}, TypeError),
        ({"backoff": object()}, TypeError),
        ({"clock": 5}, TypeError),
        ({"default_topic": 5}, TypeError),
        ({"retry_delay_ms": -1}, ValueError),
    ],
)
def test_bad_configuration(cls, kwargs, error):
    with pytest.raises(error):
        cls(**kwargs)


def test_bad_speedups_flag():
    with pytest.raises(TypeError, match="speedups"):
        NegativeAcksTracker(speedups=1)  # type: ignore[arg-type]


def test_bad_precision_bits():
    with pytest.raises(ValueError):
        NegativeAcksTracker(precision_bits=31)
    with pytest.raises(TypeError):
        NegativeAcksTracker(precision_bits="8")  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", TRACKERS)
def test_timer_redelivers_each_message_once_on_time(cls):
    got = Collector()
    kwargs = {"precision_bits": 4} if issubclass(cls, NegativeAcksTracker) else {"interval_ms": 20}
    tracker = cls(got, delay_ms=100, **kwargs)
    try:
        start = time.monotonic()
        for i in range(200):
            tracker.add(("t", 1, i, -1), delay_ms=50 + i)
        assert wait_for(lambda: len(got.keys) == 200)
        assert sorted(k[2] for k in got.keys) == list(range(200))
        # Never earlier than the trimmed deadline (16 ms buckets), with a generous upper bound.
        for key, at in zip(got.keys, got.times):
            delay_s = (50 + key[2]) / 1000
            assert at - start >= delay_s - 0.016 - 0.005
        assert len(tracker) == 0
        assert tracker.stats()["redeliveries"] == 200
    finally:
        tracker.close()


def test_steady_adds_never_postpone_the_earliest_bucket():
    """The built-in client's timer is re-armed by every nack; ours must not be."""
    got = Collector()
    tracker = NegativeAcksTracker(got, delay_ms=300, precision_bits=0)
    try:
        start = time.monotonic()
        tracker.add(("t", 1, 0, -1))
        i = 1
        while not got.keys and time.monotonic() - start < 10:
            tracker.add(("t", 1, i, -1))  # a later bucket every millisecond or so
            i += 1
            time.sleep(0.001)
        assert got.keys and got.keys[0] == ("t", 1, 0, -1)
        assert got.times[0] - start < 0.3 + 0.25  # on time, not postponed by the stream
    finally:
        tracker.close(flush=False)


@pytest.mark.parametrize("cls", TRACKERS)
def test_failing_redeliver_is_logged_and_retried_nothing_lost(cls, caplog):
    calls: list = []

    def flaky(due):
        calls.append(flat(due))
        if len(calls) == 1:
            raise ConnectionError("client down")

    kwargs = {"precision_bits": 0} if issubclass(cls, NegativeAcksTracker) else {"interval_ms": 10}
    tracker = cls(flaky, delay_ms=10, retry_delay_ms=30, **kwargs)
    try:
        with caplog.at_level(logging.ERROR):
            tracker.add(("t", 1, 1, -1))
            assert wait_for(lambda: len(calls) >= 2)
        assert calls[0] == calls[1] == [("t", 1, 1, -1)]
        assert any("client down" in (r.exc_text or "") or r.exc_info for r in caplog.records)
        stats = tracker.stats()
        assert stats["redeliver_errors"] == 1 and stats["redeliveries"] == 1
    finally:
        tracker.close()


@pytest.mark.parametrize("cls", TRACKERS)
def test_close_flush_hands_everything_over(cls):
    got = Collector()
    tracker = cls(got, delay_ms=3_600_000)
    tracker.add(("t", 1, 1, -1))
    tracker.add(("u", 1, 1, 4))
    assert tracker.close() == {}
    assert sorted(got.keys) == [("t", 1, 1, -1), ("u", 1, 1, 4)]
    assert tracker.close() == {}  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        tracker.add(("t", 1, 2, -1))


@pytest.mark.parametrize("cls", TRACKERS)
def test_close_without_flush_returns_the_pending_keys(cls):
    got = Collector()
    tracker = cls(got, delay_ms=3_600_000)
    tracker.add(("t", 1, 1, -1))
    assert flat(tracker.close(flush=False)) == [("t", 1, 1, -1)]
    assert got.keys == []
    with pytest.raises(TypeError):
        tracker.close(flush="yes")  # type: ignore[arg-type]


def test_close_joins_the_timer_thread():
    before = {t.name for t in threading.enumerate()}
    tracker = NegativeAcksTracker(Collector(), delay_ms=1000)
    baseline = HashMapNegativeAcksTracker(Collector(), delay_ms=1000)
    assert "pulsar-nack-tracker" in {t.name for t in threading.enumerate()}
    tracker.close()
    baseline.close()
    assert {t.name for t in threading.enumerate()} == before


@pytest.mark.parametrize("cls", TRACKERS)
def test_concurrent_adds_from_many_threads(cls):
    tracker = cls(delay_ms=0, clock=FakeClock())

    def worker(n: int) -> None:
        for i in range(5_000):
            tracker.add((f"t{n}", n, i, -1))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tracker) == 20_000
    if issubclass(cls, NegativeAcksTracker):
        tracker._check()
    due = tracker.pop_due(10**9)
    assert {topic: len(keys) for topic, keys in due.items()} == {f"t{n}": 5_000 for n in range(4)}


@pytest.mark.parametrize("cls", [NegativeAcksTracker, PurePythonTracker])
def test_len_never_goes_backwards_while_adds_run(cls):
    """len() from another thread sees a consistent count (counters plus the hot slot's growth)."""
    tracker = cls(delay_ms=3_600_000)
    # Runs of one stream (hot slot) broken by other topics (slow adds that fold the slot).
    keys = [("t" if i % 50 else "u", 1, i, -1) for i in range(100_000)]
    thread = threading.Thread(target=lambda: [tracker.add(key) for key in keys])
    thread.start()
    seen = [0]
    while thread.is_alive():
        seen.append(len(tracker))
    thread.join()
    seen.append(len(tracker))
    assert all(a <= b for a, b in itertools.pairwise(seen)), "len() went backwards"
    assert seen[-1] == len(keys)


def test_stats_and_memory():
    tracker = NegativeAcksTracker(delay_ms=1000, clock=FakeClock())
    for i in range(10_000):
        tracker.add(("t", 1, i // 10, i % 10))
    s = tracker.stats()
    assert s["pending_messages"] == 10_000 and s["pending_entries"] == 1_000 and s["buckets"] == 1
    assert 0 < s["memory_bytes"] < 100_000
    assert s["timer_wakeups"] == 0 and s["last_lateness_ms"] is None


def test_core_imports_neither_pulsar_nor_pyspark():
    code = (
        "import importlib, pkgutil, sys, pulsar_nack, pulsar_nack.core\n"
        "for m in pkgutil.iter_modules(pulsar_nack.core.__path__): importlib.import_module('pulsar_nack.core.' + m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pulsar', '_pulsar', 'pyspark')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
