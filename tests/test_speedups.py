"""The C hot path (``pulsar_nack.core._speedups``): same behaviour as the pure-Python code.

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
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FakeClock, PurePythonTracker
from pulsar_nack import MAX_DELAY_MS, MultiplierRedeliveryBackoff, NegativeAcksTracker
from pulsar_nack.core import accel as _accel
from pulsar_nack.core.timer import monotonic_ms

pytestmark = pytest.mark.skipif(not _accel.SPEEDUPS, reason="pulsar_nack.core._speedups is not built")


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


KEY = ("t", 7, 20, -1)
CALL_FORMS = [
    ((KEY,), {}),
    ((KEY, 50), {}),
    ((KEY,), {"delay_ms": 50}),
    ((KEY, None, 2), {}),
    ((KEY,), {"redelivery_count": 2}),
    ((KEY, None), {"redelivery_count": 2}),
    ((KEY,), {"delay_ms": None, "redelivery_count": 2}),
    ((KEY, 50), {"redelivery_count": -1}),  # an explicit delay: the count is not looked at
    ((KEY,), {"delay_ms": MAX_DELAY_MS}),
    ((KEY,), {"delay_ms": MAX_DELAY_MS + 1}),
    ((KEY,), {"delay_ms": -1}),
    ((KEY,), {"delay_ms": True}),
    ((KEY,), {"delay_ms": 5.0}),
    ((KEY,), {"redelivery_count": -1}),
    ((KEY,), {"redelivery_count": True}),
    ((KEY,), {"redelivery_count": 2**70}),
    ((KEY, 50), {"delay_ms": 50}),
    ((KEY, None, 2), {"redelivery_count": 2}),
    ((KEY,), {"key_or_message": KEY}),
    ((), {"key_or_message": KEY, "delay_ms": 5}),
    ((KEY,), {"other": 1}),
    ((KEY, None, None, None), {}),
    (("not a key",), {"delay_ms": 5}),
]


@pytest.mark.parametrize("backoff", [None, MultiplierRedeliveryBackoff(100, 1000, 2)], ids=["fixed", "backoff"])
@pytest.mark.parametrize("call", CALL_FORMS, ids=repr)
def test_every_call_form_behaves_as_in_pure_python(call, backoff):
    args, kwargs = call
    fast, pure = pair(delay_ms=100, precision_bits=4, backoff=backoff)
    for tracker in (fast, pure):
        tracker.add(("t", 7, 1, -1), 50)  # makes (t, 7) hot at the 50 ms bucket
    assert outcome(fast, *args, **kwargs) == outcome(pure, *args, **kwargs)
    for tracker in (fast, pure):
        tracker._check()
    assert list(fast._buckets) == list(pure._buckets) and len(fast) == len(pure)


@pytest.mark.parametrize("delays", [None, (10, 20, 40)], ids=["fixed", "backoff"])
def test_every_documented_call_form_stays_in_c(delays):
    """The forms the docs show never call back into Python when a hot slot takes the key."""
    from pyroaring import BitMap

    lock, slot, bitmap = threading.Lock(), _accel.HotSlot(), BitMap()
    slot.set(0, MAX_DELAY_MS + 1000, "t", 1, 0, bitmap)  # one slot for every deadline
    calls = []
    fast = _accel.FastAdd(slot, lock, lambda: 100, 1000, MAX_DELAY_MS, lambda *a, **k: calls.append(a), calls.append, delays)
    add = fast.add
    by_count = 1000 if delays is None else 40
    assert add(("t", 1, 0, -1)) == 100 + (1000 if delays is None else 10)
    assert add(("t", 1, 1, -1), 5) == add(("t", 1, 2, -1), delay_ms=5) == 105
    assert add(("t", 1, 3, -1), None, 2) == add(("t", 1, 4, -1), redelivery_count=2) == 100 + by_count
    assert add(("t", 1, 5, -1), None, redelivery_count=9) == add(("t", 1, 6, -1), delay_ms=None, redelivery_count=2)
    assert add(("t", 1, 7, -1), delay_ms=MAX_DELAY_MS) == 100 + MAX_DELAY_MS
    assert calls == [] and list(bitmap) == list(range(8)) and not lock.locked()


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
    slot.set(0, 0, "t", 1, 0, bitmap)

    def python_path(*args):
        raise AssertionError(f"the key belongs to the slot, not to the Python path: {args}")

    fast = _accel.FastAdd(slot, lock, lambda: 0, 0, MAX_DELAY_MS, python_path, python_path)
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
    assert tracker._buckets.hot_slot.growth() == 3  # the first add (slow) set the slot up
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
    assert slot.set(256, 511, "t", 3, 0, plain) == (0, 0)  # a bucket of 256 ms: deadlines 256..511
    assert slot.set(256, 511, "t", 3, 1, batched) == (0, 0)
    assert slot.slots() == [(256, 511, "t", 3, 0, plain, 1), (256, 511, "t", 3, 1, batched, 1)]
    assert slot.add(("t", 3, 6, -1), 256) and slot.add(("t", 3, 3, 2), 300) and slot.add(("t", 3, 4, 0), 511)
    assert not slot.add(("t", 3, 6, -1), 512) and not slot.add(("t", 3, 6, -1), 255) and not slot.add(("u", 3, 6, -1), 256)
    assert not slot.add(("t", 4, 6, -1), 256) and not slot.add(("t", 3, 2**32, -1), 256)
    assert not slot.add(("t", 3, 2**22, 0), 256) and not slot.add(("t", 3, 1, 1024), 256)
    plain.update([7, 5])
    assert (slot.growth(), slot.entry_growth()) == (4, 3)  # plain 6, 7; batched (3, 2) and entry 4
    assert slot.forget_bitmap(batched) == (2, 1) and slot.forget(512) == (0, 0)
    assert slot.forget(300) == (2, 2) and slot.slots() == [] and slot.clear() == (0, 0)
    # Room for MAX_SLOTS: one more evicts the oldest and returns its growth.
    bitmaps = [BitMap() for _ in range(_accel.MAX_SLOTS + 1)]
    for i, bitmap in enumerate(bitmaps[:-1]):
        assert slot.set(i, i, "t", 1, 0, bitmap) == (0, 0)
    bitmaps[0].add(1)
    assert slot.set(16, 16, "t", 1, 0, bitmaps[-1]) == (1, 1)
    assert [s[0] for s in slot.slots()] == list(range(1, _accel.MAX_SLOTS + 1))
    assert slot.clear() == (0, 0) and slot.slots() == []


def test_c_hot_slot_refuses_bad_arguments():
    from pyroaring import BitMap

    slot = _accel.HotSlot()
    with pytest.raises(TypeError):
        slot.set(1, 1, "t", 2, 0)
    with pytest.raises(TypeError):
        slot.set(1, 1, b"t", 2, 0, BitMap())
    with pytest.raises(TypeError):
        slot.set(1, 1, "t", 2, 0, object())
    with pytest.raises(ValueError):
        slot.set(1, 1, "t", 2, 2, BitMap())
    with pytest.raises(TypeError):
        slot.add(("t", 1, 2, -1), "256")
    with pytest.raises(TypeError):
        _accel.HotSlot(1)
    with pytest.raises(TypeError):
        _accel.FastAdd(slot, threading.Lock(), None, 0, MAX_DELAY_MS, print, print, delays=(1, "2"))
    with pytest.raises(ValueError):
        _accel.FastAdd(slot, threading.Lock(), None, 0, MAX_DELAY_MS, print, print, delays=(-1,))
    assert slot.slots() == []


def test_c_tail_log_interface():
    from pyroaring import BitMap

    from pulsar_nack.core import pages as _pages

    slot, tag = _accel.HotSlot(), _pages.tag(2, _pages.GAPS)
    assert slot.log() is None and slot.take_log(tag, 4096) is None
    assert not slot.add(("t", 3, 1, -1), 5)  # no log stream
    slot.set_log("t", 3, 1, 2, 100)  # batched keys of ("t", 3), sid 2, no bucket after 100
    assert not slot.add(("t", 3, 1, 0), 100)  # not after the floor
    assert not slot.add(("t", 3, 1, -1), 101) and not slot.add(("u", 3, 1, 0), 101) and not slot.add(("t", 4, 1, 0), 101)
    assert not slot.add(("t", 3, 2**22, 0), 101)  # packed value beyond 32 bits
    assert slot.add(("t", 3, 1, 0), 101) and slot.add(("t", 3, 1, 5), 101) and slot.add(("t", 3, 2, 0), 101)
    assert not slot.add(("t", 3, 2, 0), 101) and not slot.add(("t", 3, 1, 9), 101)  # not above the last record
    assert slot.add(("t", 3, 0, 0), 102) and slot.add(("t", 3, 9, 9), 103)
    assert not slot.add(("t", 3, 9, 10), 102)  # before the last record's deadline
    assert slot.log() == ("t", 3, 1, 2, 100, [(101, 1 << 10), (101, 1 << 10 | 5), (101, 2 << 10), (102, 0), (103, 9 << 10 | 9)])
    assert (slot.growth(), slot.entry_growth()) == (5, 4)  # entries 1 and 2 at 101, 0 at 102, 9 at 103
    with pytest.raises(RuntimeError):
        slot.set_log("t", 3, 1, 2, 200)
    with pytest.raises(RuntimeError):
        slot.unset_log()
    sid, pages, messages, entries, buckets, last_sealed, deadline, values = slot.take_log(tag, 4096)
    assert (sid, messages, entries, buckets, last_sealed, deadline, values) == (2, 4, 3, 2, 102, 103, [9 << 10 | 9])
    bodies = [(101, _pages.encode_body([(2, BitMap([1 << 10, 1 << 10 | 5, 2 << 10]))])), (102, _pages.encode_body([(2, BitMap([0]))]))]
    assert pages == _pages.pack(bodies)  # the bytes sealing gives the same buckets
    assert slot.log() == ("t", 3, 1, 2, 103, []) and (slot.growth(), slot.entry_growth()) == (0, 0)
    # At most LOG_GROUP records per deadline; a full log (LOG_CAPACITY) misses.
    slot.set_log("t", 3, 0, 1, 0)
    group, capacity = _accel.LOG_GROUP, _accel.LOG_CAPACITY
    assert all(slot.add(("t", 3, e, -1), 1) for e in range(group)) and not slot.add(("t", 3, group, -1), 1)
    assert all(slot.add(("t", 3, group + d, -1), d) for d in range(2, capacity - group + 2))
    assert not slot.add(("t", 3, 5000, -1), 5000) and slot.growth() == capacity
    # Pages split at page_bytes; their records hold every bucket but the last, in order.
    sid, pages, messages, entries, buckets, last_sealed, deadline, values = slot.take_log(_pages.tag(1, _pages.GAPS), 64)
    assert len(pages) > 1 and all(len(page) <= 64 for _, page in pages)
    assert (messages, entries, buckets) == (capacity - 1, capacity - 1, capacity - group)
    got = []
    for key, page in pages:
        for record_deadline, _, start, end in _pages.records(key, page):
            for sid_, codec, payload in _pages.body_streams(page, start, end):
                got += [(record_deadline, sid_, v) for v in _pages.decode_values(codec, payload)]
    last = capacity - group + 1
    assert got == [(1, 1, e) for e in range(group)] + [(d, 1, group + d) for d in range(2, last)]
    assert (last_sealed, deadline, values) == (last - 1, last, [group + last])
    slot.unset_log()
    assert slot.log() is None and not slot.add(("t", 3, 9000, -1), 9000)
    with pytest.raises(TypeError):
        slot.set_log(b"t", 3, 0, 1, 0)
    with pytest.raises(ValueError):
        slot.set_log("t", 3, 2, 1, 0)
    with pytest.raises(TypeError):
        slot.take_log(tag)
    slot.set_log("t", 3, 0, 1, 2**64)  # beyond 64 bits (fake clocks only): no log
    assert slot.log() is None


def test_tail_log_holds_one_new_bucket_per_add_with_the_content_of_pure_python():
    """Precision 0, one add per ms (the y0-x1 benchmark): after a slow add, adds go to the
    C tail log; the next Python operation flushes them into pages, same content as without it."""
    from pulsar_nack.core import pages as _pages
    from pulsar_nack.core.buckets import TimeBuckets

    fast, pure = TimeBuckets(0), TimeBuckets(0, speedups=False)
    for i in range(5000):
        for b in (fast, pure):
            b.add(("t", 7, i, -1), 1000 + i)
    log = fast.hot_slot.log()
    assert log[:4] == ("t", 7, 0, fast._log_sid) and 0 < len(log[5]) <= 2048
    assert len(fast) == len(pure) == 5000 and fast.entries == pure.entries == 5000
    fast._check()  # checks the records, does not flush them
    assert fast.hot_slot.log() == log and fast.peek_deadline() == pure.peek_deadline() == 1000
    assert fast.bucket_count == pure.bucket_count == 5000  # flushes
    assert fast.hot_slot.log()[5] == []
    fast._check()
    assert list(fast) == list(pure)
    pages = [(k, p) for k, p in fast._buckets.items() if type(p) is bytes]
    assert len(pages) > 5 and all(len(p) <= _pages.PAGE_BYTES for _, p in pages)
    assert fast.memory_bytes() / len(fast) < 16
    assert fast.pop_due(3999) == pure.pop_due(3999) and len(fast) == 2000
    fast._check()
    # A second stream's add is slow (the log takes one stream); the log follows it.
    fast.add(("u", 1, 1, -1), 7000)
    fast.add(("u", 1, 2, -1), 7001)
    assert fast.hot_slot.log()[:2] == ("u", 1) and len(fast.hot_slot.log()[5]) == 1
    fast.add(("t", 7, 9, -1), 7002)  # another stream: slow; it flushes the log, which then takes this stream
    assert fast.hot_slot.log()[:2] == ("t", 7) and fast.hot_slot.log()[5] == [] and type(fast._buckets[7001]) is dict
    fast._check()
    assert fast.clear() == {"t": [("t", 7, i, -1) for i in range(3000, 5000)] + [("t", 7, 9, -1)], "u": [("u", 1, 1, -1), ("u", 1, 2, -1)]}
    assert fast.hot_slot.log() is None and len(fast) == 0
    fast._check()


def test_tail_log_hands_a_dense_bucket_back_as_a_hot_bitmap():
    from pyroaring import BitMap

    from pulsar_nack.core.buckets import TimeBuckets

    b = TimeBuckets(0)
    b.add(("t", 1, 0, -1), 10)
    for e in range(1, 9):
        b.add(("t", 1, e, -1), 11)  # 8 records of bucket 11
    assert len(b.hot_slot.log()[5]) == 8
    b.add(("t", 1, 9, -1), 11)  # the 9th: slow; the flush opens bucket 11, its bitmap becomes hot
    assert b.hot_slot.log()[5] == [] and b._buckets[11] == {0: BitMap(range(1, 10))}
    assert [s[0] for s in b.hot_slot.slots()] == [10, 11] and b.add(("t", 1, 10, -1), 11) and b.hot_slot.log()[5] == []
    # After a dense bucket the log waits for a sparse one: it would only take first adds.
    b.add(("t", 1, 0, 0), 12)
    assert b.hot_slot.log() is None and b._log_sid == -1
    # Batched keys: entries count each entry once per bucket.
    for entry, index, deadline in [(0, 1, 13), (0, 2, 13), (1, 0, 13), (1, 0, 14), (5, 3, 14)]:
        b.add(("t", 1, entry, index), deadline)
    assert b.hot_slot.log()[2:] == (1, b._log_sid, 13, [(14, 1 << 10), (14, 5 << 10 | 3)])
    assert b.entries == 11 + 1 + 2 + 2
    b._check()
    b.seal_all()
    b._check()
    assert b.entries == 16 and len(b) == 17


@settings(max_examples=300, deadline=None)
@given(
    min_delay=st.integers(0, 5_000),
    span=st.integers(0, 100_000),
    multiplier=st.sampled_from([1.0, 1.5, 2.0, 3.0, 10.0]),
    fixed=st.integers(0, 10**6),
    use_backoff=st.booleans(),
    delay_ms=st.none() | st.integers(0, 10**7),
    count=st.none() | st.integers(0, 200),
)
def test_the_c_delay_table_is_resolve_delays_rule(min_delay, span, multiplier, fixed, use_backoff, delay_ms, count):
    """The C hot path keeps the delay rule as a table (``_backoff_table``): for every call form it
    takes, its deadline is ``now + resolve_delay(...)``, the one statement of the rule."""
    from pyroaring import BitMap

    from pulsar_nack.core.backoff import resolve_delay
    from pulsar_nack.core.tracker import _backoff_table

    backoff = MultiplierRedeliveryBackoff(min_delay, min_delay + span, multiplier) if use_backoff else None
    delays = _backoff_table(backoff)
    if delays is False:
        return  # a backoff the C path leaves to the Python one (which is resolve_delay)
    lock, slot, bitmap = threading.Lock(), _accel.HotSlot(), BitMap()
    slot.set(0, MAX_DELAY_MS + 10**7, "t", 1, 0, bitmap)
    python_path = []
    fast = _accel.FastAdd(slot, lock, lambda: 100, fixed, MAX_DELAY_MS, lambda *a, **k: python_path.append(a),
                          python_path.append, delays)
    deadline = fast.add(("t", 1, 0, -1), delay_ms, count)
    assert python_path == []
    assert deadline == 100 + resolve_delay(delay_ms, backoff, fixed, 0 if count is None else count)
