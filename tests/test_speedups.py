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
    slot.set(0, "t", 1, bitmap)

    def python_path(*args):
        raise AssertionError(f"the key belongs to the slot, not to the Python path: {args}")

    fast = _accel.FastAdd(slot, lock, lambda: 0, 0, 0, False, python_path, python_path)
    with pytest.raises(MemoryError, match="no room"):
        fast.add(("t", 1, 2, -1))
    assert not lock.locked()
    bitmap.size = 0  # shrunk below its size at set(): a negative growth, not an error
    assert slot.growth() == -1 and slot.clear() == -1 and slot.bitmap is None


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
    assert tracker._buckets._hot.growth() == 2  # the first two adds (slow) set the slot up
    assert tracker.pop_due(20_000) == {"t": [("t", 1, e, -1) for e in (1, 2, 3, 4)]}
    assert len(tracker) == 0


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


def test_not_installed_with_backoff_or_an_overridden_add():
    class Counting(NegativeAcksTracker):
        calls = 0

        def add(self, *args, **kwargs):
            Counting.calls += 1
            return super().add(*args, **kwargs)

    assert "add" not in vars(NegativeAcksTracker(backoff=MultiplierRedeliveryBackoff(10, 100, 2)))
    # Every accepted delay fits the C path's 64-bit deadlines; larger ones are refused.
    assert "add" in vars(NegativeAcksTracker(delay_ms=MAX_DELAY_MS))
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
    assert (slot.deadline, slot.topic, slot.ledger, slot.bitmap, slot.growth()) == (-1, None, -1, None, 0)
    bitmap = BitMap([5])
    slot.set(256, "t", 3, bitmap)
    assert (slot.deadline, slot.topic, slot.ledger, slot.bitmap, slot.base) == (256, "t", 3, bitmap, 1)
    bitmap.update([6, 7, 5])
    assert slot.growth() == 2
    assert slot.clear() == 2 and slot.bitmap is None and slot.clear() == 0


def test_c_hot_slot_refuses_bad_arguments():
    from pyroaring import BitMap

    slot = _accel.HotSlot()
    with pytest.raises(TypeError):
        slot.set(1, "t", 2)
    with pytest.raises(TypeError):
        slot.set(1, b"t", 2, BitMap())
    with pytest.raises(TypeError):
        slot.set(1, "t", 2, object())
    with pytest.raises(TypeError):
        _accel.HotSlot(1)
    assert slot.bitmap is None
