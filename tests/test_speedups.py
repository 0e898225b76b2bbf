"""The C hot path (``pulsar_nack._speedups``): same behaviour as the pure-Python code.

The state machine in test_state_machine.py runs both; these tests cover what it does
not reach: unusual keys and clock values, lock contention, the real clock, garbage
collection, and when the C path is (not) installed. They skip when the extension was
not built (no C compiler); ``.ci/run`` checks that it was.
"""

from __future__ import annotations

import enum
import gc
import threading
import weakref

import pytest

from helpers import FakeClock, PurePythonTracker
from pulsar_nack import MAX_DELAY_MS, MultiplierRedeliveryBackoff, NegativeAcksTracker, _accel
from pulsar_nack.timer import monotonic_ms

pytestmark = pytest.mark.skipif(not _accel.SPEEDUPS, reason="pulsar_nack._speedups is not built")


class Ledger(enum.IntEnum):
    SEVEN = 7


class Topic(str):
    pass


class SneakyTopic(str):
    """A str subclass whose ``str()`` is still a subclass: keys must store an exact str."""

    def __str__(self) -> str:
        return Topic(self)


class ShiftedInt(int):
    """A clock value whose ``+`` is not int's."""

    def __add__(self, other: object) -> int:
        return int(self) + int(other) + 1  # type: ignore[call-overload]


class FailingBitmap:
    """Stands in for a bitmap whose ``add`` fails (out of memory): not reachable otherwise."""

    def __init__(self) -> None:
        self.size = 1

    def __len__(self) -> int:
        return self.size

    def add(self, value: int) -> None:
        raise MemoryError("no room")


def pair(now: object = 10_000, **kwargs):
    """The same tracker twice, each on its own fake clock: with the C hot path and without."""
    fast, pure = NegativeAcksTracker(clock=FakeClock(now), **kwargs), PurePythonTracker(clock=FakeClock(now), **kwargs)
    assert "add" in vars(fast) and "add" not in vars(pure)
    return fast, pure


def outcome(tracker, *args, **kwargs):
    try:
        return tracker.add(*args, **kwargs)
    except Exception as error:
        return type(error), str(error)


UNUSUAL_CALLS = [
    (("t", 7, 2**32 - 1, -1),),
    (("t", 7, 2**32, -1),),
    (("t", 7, 2**63 - 1, -1),),
    (("t", 7, 2**64, -1),),
    (("t", 7, -1, -1),),
    (("t", True, 3, -1),),
    (("t", Ledger.SEVEN, 4, -1),),
    ((Topic("t"), 7, 5, -1),),
    ((SneakyTopic("t"), 7, 5, -1),),
    ((SneakyTopic("s"), 7, 5, -1),),
    (("u", 7, 6, -1),),
    (("t", 8, 6, -1),),
    (("t", 7, 6, 0),),
    (("t", 7, 6, 2**70),),
    (("t", 7, 6.0, -1),),
    ((b"t", 7, 6, -1),),
    (("t", 7, 6),),
    (("t", 7, 6, -1, 0),),
    (["t", 7, 9, -1],),
    ("not a key",),
    (("t", 7, 10, -1), 50),
    (("t", 7, 11, -1), None, None),
    (("t", 7, 12, -1), -5),
]


@pytest.mark.parametrize("call", UNUSUAL_CALLS, ids=repr)
def test_unusual_calls_behave_as_in_pure_python(call):
    fast, pure = pair(delay_ms=100, precision_bits=4)
    for tracker in (fast, pure):
        tracker.add(("t", 7, 1, -1))  # makes (t, 7) the hot slot
        tracker._check()
    assert outcome(fast, *call) == outcome(pure, *call)
    for tracker in (fast, pure):
        tracker._check()
    assert list(fast._buckets) == list(pure._buckets) and len(fast) == len(pure)
    assert outcome(fast, *call, delay_ms=7) == outcome(pure, *call, delay_ms=7)


@pytest.mark.parametrize("now", [-5, 2**62, 2**80, "soon", None, 10.5, ShiftedInt(10_000)])
def test_unusual_clock_values_behave_as_in_pure_python(now):
    fast, pure = pair(now, delay_ms=100)
    assert outcome(fast, ("t", 1, 2, -1)) == outcome(pure, ("t", 1, 2, -1))
    assert list(fast._buckets) == list(pure._buckets)
    # The C path reads the clock once per call, as the Python path does.
    assert fast._clock.calls == pure._clock.calls == 1


def test_stored_topics_are_exact_str():
    fast, pure = pair(delay_ms=100)
    for tracker in (fast, pure):
        for entry in range(3):
            assert tracker.add((SneakyTopic("s"), 7, entry, -1)) == 10_100
        tracker._check()
        assert [type(key[0]) for _, key in tracker._buckets] == [str, str, str]
    assert list(fast._buckets) == list(pure._buckets)


def test_a_failing_bitmap_add_raises_its_own_error_and_releases_the_lock():
    lock, slot, bitmap = threading.Lock(), _accel.HotSlot(), FailingBitmap()
    slot.set(0, "t", 1, 0, bitmap)

    def python_path(*args):
        raise AssertionError(f"the key belongs to the slot, not to the Python path: {args}")

    fast = _accel.FastAdd(slot, lock, lambda: 0, 0, 0, False, python_path, python_path)
    with pytest.raises(MemoryError, match="no room"):
        fast.add(("t", 1, 2, -1))
    assert not lock.locked()
    bitmap.size = 0  # shrunk below its size at set(): a negative growth, not an error
    assert slot.growth() == -1 and slot.clear() == (-1, -1) and slot.slots() == []


def test_a_failing_clock_propagates_and_stores_nothing():
    def broken() -> int:
        raise OSError("clock gone")

    fast = NegativeAcksTracker(clock=broken)
    with pytest.raises(OSError, match="clock gone"):
        fast.add(("t", 1, 2, -1))
    assert len(fast) == 0


def test_the_native_clock_is_monotonic_ms():
    tracker = NegativeAcksTracker(delay_ms=0, precision_bits=0)
    for entry in range(1000):
        before = monotonic_ms()
        deadline = tracker.add(("t", 1, entry, -1))
        assert before <= deadline <= monotonic_ms()
    assert len(tracker) == 1000
    tracker._check()


def test_hot_adds_are_counted_once_and_duplicates_not_at_all():
    tracker = NegativeAcksTracker(delay_ms=10_000, clock=FakeClock())
    for entry in [1, 2, 3, 2, 1, 4]:
        tracker.add(("t", 1, entry, -1))
    assert len(tracker) == 4 and tracker.stats()["pending_entries"] == 4
    tracker._check()
    assert tracker._buckets._hot.growth() == 3  # the first add (slow) set the slot up
    assert tracker.pop_due(20_000) == {"t": [("t", 1, e, -1) for e in (1, 2, 3, 4)]}
    assert len(tracker) == 0


@pytest.mark.parametrize("speedups", [True, False], ids=["c", "python"])
def test_batched_interleaved_and_backoff_adds_go_through_hot_slots(speedups):
    """Batches, 8 interleaved topics and a backoff's few buckets: every add after the first per bitmap is hot."""
    clock = FakeClock(1_000_000)
    tracker = NegativeAcksTracker(
        delay_ms=10_000, clock=clock, backoff=MultiplierRedeliveryBackoff(1000, 8000, 2), speedups=speedups
    )
    slow = []
    buckets = tracker._buckets
    buckets_add = buckets._add_slow
    buckets._add_slow = lambda key, deadline: slow.append(key) or buckets_add(key, deadline)  # type: ignore[method-assign]
    keys = [(f"topic-{t}", 100 + t, entry, index) for entry in range(50) for index in (2, 5, 7) for t in range(8)]
    for key in keys:
        tracker.add(key, None, key[2] % 2)  # two delays: 2 buckets x 8 topics = 16 hot slots
    # One slow add per (topic, bucket) pair: the first.
    assert sorted(slow) == sorted({(k[0], k[1], e, 2) for k in keys for e in (0, 1)})
    tracker._check()
    assert len(tracker) == len(keys) and tracker.stats()["pending_entries"] == 8 * 50
    due = tracker.pop_due(2_000_000)
    assert sorted(k for ks in due.values() for k in ks) == sorted(keys)
    assert len(tracker) == 0 and tracker.stats()["pending_entries"] == 0


@pytest.mark.parametrize("count", [None, 0, 1, 3, 4, 100, 2**70, -1, True, 1.0])
def test_backoff_adds_behave_as_in_pure_python(count):
    fast, pure = pair(backoff=MultiplierRedeliveryBackoff(100, 1000, 2))
    for tracker in (fast, pure):
        tracker.add(("t", 7, 1, -1), None, 2)  # makes (t, 7) hot at the count-2 bucket
    assert outcome(fast, ("t", 7, 2, -1), None, count) == outcome(pure, ("t", 7, 2, -1), None, count)
    for tracker in (fast, pure):
        tracker._check()
    assert list(fast._buckets) == list(pure._buckets) and len(fast) == len(pure)


def test_an_add_waits_while_another_thread_holds_the_lock():
    tracker = NegativeAcksTracker(delay_ms=10_000, clock=FakeClock())
    tracker.add(("t", 1, 1, -1))
    done = threading.Event()

    def add() -> None:
        tracker.add(("t", 1, 2, -1))  # the hot slot's key, but the lock is taken
        done.set()

    with tracker._lock:
        thread = threading.Thread(target=add)
        thread.start()
        assert not done.wait(0.2), "add went past a held lock"
        assert len(tracker._buckets) == 1
    thread.join(10)
    assert done.is_set() and len(tracker) == 2
    tracker._check()


def test_not_installed_with_another_backoff_or_an_overridden_add():
    class Counting(NegativeAcksTracker):
        calls = 0

        def add(self, *args, **kwargs):
            Counting.calls += 1
            return super().add(*args, **kwargs)

    class Custom:
        def next_delay_ms(self, count: int) -> int:
            return 5

    assert "add" in vars(NegativeAcksTracker(backoff=MultiplierRedeliveryBackoff(10, 100, 2)))
    assert "add" not in vars(NegativeAcksTracker(backoff=Custom()))
    # Every accepted delay fits the C path's 64-bit deadlines; larger ones are refused.
    assert "add" in vars(NegativeAcksTracker(delay_ms=MAX_DELAY_MS))
    assert "add" in vars(NegativeAcksTracker(backoff=MultiplierRedeliveryBackoff(10, MAX_DELAY_MS, 2)))
    with pytest.raises(ValueError):
        NegativeAcksTracker(delay_ms=2**61)
    tracker = Counting(delay_ms=10)
    tracker.add(("t", 1, 1, -1))
    assert "add" not in vars(tracker) and Counting.calls == 1


def test_a_closed_tracker_refuses_adds():
    tracker = NegativeAcksTracker(delay_ms=10_000)
    tracker.add(("t", 1, 1, -1))
    assert tracker.close(flush=False) == {"t": [("t", 1, 1, -1)]}
    with pytest.raises(RuntimeError, match="closed"):
        tracker.add(("t", 1, 2, -1))


def test_a_tracker_with_the_c_path_is_garbage_collected():
    tracker = NegativeAcksTracker(lambda due: None, delay_ms=10_000)
    tracker.add(("t", 1, 1, -1))
    tracker.close(flush=False)
    ref = weakref.ref(tracker)
    del tracker
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("slot_type", [_accel.PyHotSlot, _accel.HotSlot], ids=["python", "c"])
def test_hot_slot_interface(slot_type):
    from pyroaring import BitMap

    slot = slot_type()
    assert (slot.slots(), slot.growth(), slot.entry_growth()) == ([], 0, 0)
    plain, batched = BitMap([5]), BitMap([3 << 10 | 1])
    assert slot.set(256, "t", 3, 0, plain) == (0, 0)
    assert slot.set(256, "t", 3, 1, batched) == (0, 0)
    assert slot.slots() == [(256, "t", 3, 0, plain, 1), (256, "t", 3, 1, batched, 1)]
    assert slot.add(("t", 3, 6, -1), 256) and slot.add(("t", 3, 3, 2), 256) and slot.add(("t", 3, 4, 0), 256)
    assert not slot.add(("t", 3, 6, -1), 512) and not slot.add(("u", 3, 6, -1), 256)
    assert not slot.add(("t", 4, 6, -1), 256) and not slot.add(("t", 3, 2**32, -1), 256)
    assert not slot.add(("t", 3, 2**22, 0), 256) and not slot.add(("t", 3, 1, 1024), 256)
    plain.update([7, 5])
    assert (slot.growth(), slot.entry_growth()) == (4, 3)  # plain 6, 7; batched (3, 2) and entry 4
    assert slot.forget_bitmap(batched) == (2, 1) and slot.forget(512) == (0, 0)
    assert slot.forget(256) == (2, 2) and slot.slots() == [] and slot.clear() == (0, 0)
    # Room for 16: the 17th evicts the oldest and returns its growth.
    bitmaps = [BitMap() for _ in range(17)]
    for i, bitmap in enumerate(bitmaps[:16]):
        assert slot.set(i, "t", 1, 0, bitmap) == (0, 0)
    bitmaps[0].add(1)
    assert slot.set(16, "t", 1, 0, bitmaps[16]) == (1, 1)
    assert [s[0] for s in slot.slots()] == list(range(1, 17))
    assert slot.clear() == (0, 0) and slot.slots() == []


def test_c_hot_slot_refuses_bad_arguments():
    from pyroaring import BitMap

    slot = _accel.HotSlot()
    with pytest.raises(TypeError):
        slot.set(1, "t", 2, 0)
    with pytest.raises(TypeError):
        slot.set(1, b"t", 2, 0, BitMap())
    with pytest.raises(TypeError):
        slot.set(1, "t", 2, 0, object())
    with pytest.raises(ValueError):
        slot.set(1, "t", 2, 2, BitMap())
    with pytest.raises(TypeError):
        slot.add(("t", 1, 2, -1), "256")
    with pytest.raises(TypeError):
        _accel.HotSlot(1)
    with pytest.raises(TypeError):
        _accel.FastAdd(slot, threading.Lock(), None, 0, 0, False, print, print, delays=(1, "2"))
    with pytest.raises(ValueError):
        _accel.FastAdd(slot, threading.Lock(), None, 0, 0, False, print, print, delays=(-1,))
    assert slot.slots() == []
