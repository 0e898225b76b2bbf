"""Hypothesis state machine: the tracker against a reference model and the baseline.

On an injected clock, with adds, clock advances and pops interleaved:

* every added (key, bucket) comes out of ``pop_due`` exactly once;
* never before its trimmed deadline, and never left behind once ``now`` has passed it;
* the baseline (exact deadlines) never releases a key the tracker still holds;
* ``close()`` returns exactly what is pending;
* ``_check()`` holds after every step.

Each run builds the tracker with or without the C hot path (``pulsar_nack.core._speedups``)
and with or without a multiplier backoff. Adds take every documented call form in turn
(``add(key)``, ``add(key, delay)`` and ``delay_ms=``, ``add(key, None, count)`` and
``redelivery_count=``). The ``add_run`` and ``add_batch_run`` rules make the calls the hot
slots serve (plain and batched keys, interleaved topics, the buckets of several backoff
delays); sparse steps give the
pages' GAPS codec gaps of one, two and three bytes, and ``seal_all`` and small
``max_open`` values seal, split and unseal pages between adds and pops. ``add_ticks``
moves the clock between the adds of one stream (at precision 0 a new bucket per add), the
C hot slot's tail log: its records stay in the log across steps (``_check()`` checks them
without flushing) until a pop, a close, a seal or another stream's slow add flushes them.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helpers import PurePythonTracker
from pulsar_nack import MultiplierRedeliveryBackoff, NegativeAcksTracker
from pulsar_nack.core import HashMapNegativeAcksTracker
from pulsar_nack.core import accel as _accel

TOPICS = ["a", "b", "persistent://tenant/ns/x-partition-3"]
_EDGES = [0, 1, 2**16 - 1, 2**16, 2**16 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**53, 2**63 - 2, 2**63 - 1]


def ids() -> st.SearchStrategy[int]:
    """Ids near roaring container boundaries (multiples of 2**16) and 32/63-bit limits."""
    near_container = st.builds(lambda k, d: max(0, k * 2**16 + d), st.integers(0, 8), st.integers(-2, 2))
    return st.one_of(st.sampled_from(_EDGES), near_container, st.integers(0, 300), st.integers(0, 2**63 - 1))


batch_indexes = st.one_of(
    st.just(-1), st.integers(0, 12), st.sampled_from([1023, 1024, 2**16, 2**31 - 1])
)
keys = st.tuples(st.sampled_from(TOPICS), ids(), ids(), batch_indexes)
delays = st.one_of(st.sampled_from([0, 1, 255, 256, 257, 1023, 1024, 1025]), st.integers(0, 5000))
steps = st.sampled_from([0, 1, 2, 3, 10, 127, 128, 300, 16384, 70000])
counts = st.one_of(st.none(), st.integers(0, 6))


class TrackerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000
        self.model: dict[int, set] = {}  # trimmed bucket -> keys
        self.baseline_pending: set = set()
        self.released_by_tracker: Counter = Counter()
        self.calls = 0
        self.tracker: NegativeAcksTracker
        self.baseline: HashMapNegativeAcksTracker

    def clock(self) -> int:
        return self.now

    @initialize(
        bits=st.sampled_from([0, 1, 4, 8, 10]),
        round_up=st.booleans(),
        max_open=st.sampled_from([1, 2, 16]),
        speedups=st.booleans(),
        backoff=st.booleans(),
    )
    def setup(self, bits: int, round_up: bool, max_open: int, speedups: bool, backoff: bool) -> None:
        self.bits, self.round_up = bits, round_up
        self.backoff = MultiplierRedeliveryBackoff(50, 400, 2) if backoff else None
        cls = NegativeAcksTracker if speedups and _accel.SPEEDUPS else PurePythonTracker
        self.make = lambda: cls(
            precision_bits=bits,
            round_up=round_up,
            max_open_buckets=max_open,
            clock=self.clock,
            delay_ms=100,
            backoff=self.backoff,
        )
        self.tracker = self.make()
        self.baseline = HashMapNegativeAcksTracker(clock=self.clock, delay_ms=100)

    def delay_of(self, count: int | None) -> int:
        """The delay ``add(key, None, count)`` takes: the backoff's (count 0 for None), or the fixed 100 ms."""
        return 100 if self.backoff is None else self.backoff.next_delay_ms(count or 0)

    def bucket_of(self, deadline: int) -> int:
        low = (1 << self.bits) - 1
        return (deadline + low if self.round_up else deadline) & ~low

    @rule(key=keys, delay=delays)
    def add(self, key, delay) -> None:
        self._add(key, delay)

    @rule(topic=st.sampled_from(TOPICS), ledger=ids(), first=ids(), count=st.integers(1, 40), step=steps, rc=counts)
    def add_run(self, topic, ledger, first, count, step, rc) -> None:
        """Plain keys of one ledger: ``add(key)`` or ``add(key, None, count)``, the hot path's calls."""
        for i in range(count):
            entry = first + i * step
            if entry < 2**63:
                self._add((topic, ledger, entry, -1), None, rc)

    @rule(
        topics=st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True),
        ledger=ids(),
        first=ids(),
        entries=st.integers(1, 8),
        indexes=st.lists(st.integers(0, 12), min_size=1, max_size=4),
        rc=counts,
    )
    def add_batch_run(self, topics, ledger, first, entries, indexes, rc) -> None:
        """Batched keys, topics interleaved: ``add(key)`` or ``add(key, None, count)``."""
        for entry in range(first, min(first + entries, 2**63)):
            for index in indexes:
                for topic in topics:
                    self._add((topic, ledger, entry, index), None, rc)

    @rule(
        topic=st.sampled_from(TOPICS),
        ledger=st.one_of(st.integers(0, 2), ids()),
        first=st.one_of(st.integers(0, 300), ids()),
        count=st.integers(1, 60),
        step=st.sampled_from([0, 1, 1, 2, 300, 2**20]),
        tick=st.sampled_from([0, 1, 1, 1, 2, 3, 256]),
        batched=st.booleans(),
        rc=counts,
    )
    def add_ticks(self, topic, ledger, first, count, step, tick, batched, rc) -> None:
        """One stream, the clock moving *tick* ms between adds: the tail log's pattern."""
        for i in range(count):
            entry = first + (i // 3 if batched else i) * step
            if entry >= 2**63:
                break
            self._add((topic, ledger, entry, i % 3 if batched else -1), None, rc)
            self.now += tick

    def _add(self, key, delay, rc=None) -> None:
        self.calls += 1  # every documented call form, by position and by keyword, in turn
        if delay is not None:
            deadline = self.tracker.add(key, delay_ms=delay) if self.calls % 2 else self.tracker.add(key, delay)
        elif rc is None:
            deadline = self.tracker.add(key)
        else:
            deadline = self.tracker.add(key, redelivery_count=rc) if self.calls % 2 else self.tracker.add(key, None, rc)
        assert deadline == self.now + (self.delay_of(rc) if delay is None else delay)
        self.model.setdefault(self.bucket_of(deadline), set()).add(key)
        if key not in self.baseline_pending:  # the baseline replaces; keep its keys unique
            self.baseline.add(key, delay_ms=deadline - self.now)
            self.baseline_pending.add(key)

    @rule(ms=st.one_of(st.integers(0, 300), st.sampled_from([255, 256, 1024, 5000])))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def pop(self) -> None:
        due = self.tracker.pop_due()
        got = Counter(k for topic, ks in due.items() for k in ks if k[0] == topic)
        assert sum(got.values()) == sum(map(len, due.values())), "a key is filed under the wrong topic"
        expected = Counter()
        for bucket in [b for b in self.model if b <= self.now]:
            expected.update(self.model.pop(bucket))
        assert got == expected
        self.released_by_tracker.update(got)
        for keys_ in self.baseline.pop_due().values():
            for key in keys_:
                self.baseline_pending.discard(key)
                # Floor mode is never late: the baseline (exact deadlines) releases only
                # keys the tracker released already. (Round-up mode may be late by design.)
                if not self.round_up:
                    assert self.released_by_tracker[key] > 0, f"tracker still holds {key} past its deadline"

    @rule()
    def seal_all(self) -> None:
        with self.tracker._lock:
            self.tracker._buckets.seal_all()

    @rule()
    def close(self) -> None:
        """Closing returns exactly what is pending; a new tracker takes over (the baseline goes on)."""
        left = self.tracker.close(flush=False)
        expected = Counter(k for keys_ in self.model.values() for k in keys_)
        assert Counter(k for keys_ in left.values() for k in keys_) == expected
        assert all(k[0] == topic for topic, keys_ in left.items() for k in keys_)
        self.released_by_tracker.update(expected)
        self.model.clear()
        self.tracker = self.make()

    @invariant()
    def consistent(self) -> None:
        self.tracker._check()
        assert len(self.tracker) == sum(map(len, self.model.values()))
        earliest = min(self.model, default=None)
        assert self.tracker.peek_deadline() == earliest

    def teardown(self) -> None:
        self.tracker.close(flush=False)
        self.baseline.close(flush=False)


TrackerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_tracker_state_machine = TrackerMachine.TestCase


def test_pop_order_is_by_deadline_within_a_topic():
    now = [0]
    tracker = NegativeAcksTracker(precision_bits=0, clock=lambda: now[0])
    for i, delay in enumerate([50, 10, 30, 20, 40]):
        tracker.add(("t", 1, i, -1), delay_ms=delay)
    due = tracker.pop_due(100)["t"]
    assert [k[2] for k in due] == [1, 3, 2, 4, 0]
