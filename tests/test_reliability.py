"""Regression tests for issue 11: huge delays, failing and BaseException callbacks, close races.

No broker: the trackers and the timer are driven directly (the consumer-level test of a
huge nack delay is in test_consumer_surface.py, on Apache Pulsar).
"""

from __future__ import annotations

import logging
import threading

import pytest

from helpers import FakeClock, PurePythonTracker, wait_for
from pulsar_nack import (
    FixedDelay,
    MultiplierRedeliveryBackoff,
    NegativeAcksTracker,
)
from pulsar_nack.core import HashMapNegativeAcksTracker
from pulsar_nack.core.timer import DeadlineTimer, monotonic_ms

TRACKERS = [NegativeAcksTracker, PurePythonTracker, HashMapNegativeAcksTracker]
HUGE = 2**1100
"""The delay of the issue's reproduction: far beyond any float (``HUGE / 1000.0`` overflows)."""
BOUND = 2**40
"""``pulsar_nack.MAX_DELAY_MS``, spelled out so this file imports on code without it."""


def timer_kwargs(cls: type) -> dict:
    """Exact deadlines for the bucket tracker, a quick scan for the baseline."""
    return {"precision_bits": 0} if issubclass(cls, NegativeAcksTracker) else {"interval_ms": 10}


def flat(due: dict) -> list:
    return [k for keys in due.values() for k in keys]


class Calls:
    """A redeliver callback recording each call's keys; ``fail`` decides per call (1-based)."""

    def __init__(self, fail=None) -> None:
        self.calls: list[list] = []
        self.lock = threading.Lock()
        self.fail = fail

    def __call__(self, due: dict) -> None:
        with self.lock:
            self.calls.append(flat(due))
            n = len(self.calls)
        if self.fail is not None:
            self.fail(n)

    def all_keys(self) -> list:
        with self.lock:
            return [k for call in self.calls for k in call]


class BlockThenFail(Calls):
    """The first call signals ``entered``, blocks until ``release``, then raises."""

    def __init__(self) -> None:
        super().__init__(self._first_blocks_then_fails)
        self.entered, self.release = threading.Event(), threading.Event()

    def _first_blocks_then_fails(self, n: int) -> None:
        if n == 1:
            self.entered.set()
            self.release.wait(10)
            raise ConnectionError("client down")


# ---------------------------------------------------------------- defect 1: huge delays


@pytest.mark.parametrize("cls", TRACKERS)
def test_huge_delay_is_refused_and_later_adds_are_still_released(cls):
    """The issue's reproduction: a delay of 2**1100 ms was accepted and killed the timer."""
    got = Calls()
    tracker = cls(got, delay_ms=0, **timer_kwargs(cls))
    try:
        with pytest.raises(ValueError, match="delay_ms"):
            tracker.add(("t", 1, 0, -1), delay_ms=HUGE)
        with pytest.raises(ValueError, match="delay_ms"):
            tracker.add(("t", 1, 0, -1), delay_ms=BOUND + 1)
        assert len(tracker) == 0  # nothing stored
        tracker.add(("t", 1, 9, -1), delay_ms=BOUND)  # the bound itself is accepted
        tracker.add(("t", 1, 1, -1), delay_ms=50)
        assert wait_for(lambda: ("t", 1, 1, -1) in got.all_keys())
        tracker.add(("t", 1, 2, -1), delay_ms=50)
        assert wait_for(lambda: ("t", 1, 2, -1) in got.all_keys())
        assert len(tracker) == 1
    finally:
        assert flat(tracker.close(flush=False)) == [("t", 1, 9, -1)]


class HugeBackoff:
    def next_delay_ms(self, redelivery_count: int) -> int:
        return HUGE


@pytest.mark.parametrize("cls", TRACKERS)
@pytest.mark.parametrize(
    "kwargs",
    [{"delay_ms": HUGE}, {"delay_ms": BOUND + 1}, {"retry_delay_ms": HUGE}, {"retry_delay_ms": BOUND + 1}],
)
def test_configured_delays_above_the_bound_are_refused(cls, kwargs):
    with pytest.raises(ValueError, match="_ms"):
        cls(**kwargs)
    cls(**dict.fromkeys(kwargs, BOUND)).close()


@pytest.mark.parametrize("cls", TRACKERS)
def test_backoff_delay_above_the_bound_is_refused_and_nothing_is_stored(cls):
    tracker = cls(backoff=HugeBackoff(), clock=FakeClock())
    with pytest.raises(ValueError, match="backoff"):
        tracker.add(("t", 1, 1, -1))
    assert len(tracker) == 0
    tracker.add(("t", 1, 2, -1), delay_ms=5)  # a per-call delay overrides the backoff
    assert flat(tracker.close(flush=False)) == [("t", 1, 2, -1)]


def test_spark_config_delays_above_the_bound_are_refused():
    from pulsar_nack.spark import ConsumerConfig

    with pytest.raises(ValueError, match="negative_ack_redelivery_delay_ms"):
        ConsumerConfig("pulsar://127.0.0.1:1", "t", "s", negative_ack_redelivery_delay_ms=HUGE)
    config = ConsumerConfig("pulsar://127.0.0.1:1", "t", "s", redelivery_backoff=HugeBackoff())
    with pytest.raises(ValueError, match="backoff delay_ms"):
        config.retry_delay_ms(1)
    assert ConsumerConfig("pulsar://127.0.0.1:1", "t", "s", negative_ack_redelivery_delay_ms=BOUND).retry_delay_ms(1) == BOUND


@pytest.mark.parametrize(
    "make",
    [
        lambda: FixedDelay(HUGE),
        lambda: FixedDelay(BOUND + 1),
        lambda: MultiplierRedeliveryBackoff(0, HUGE),
        lambda: MultiplierRedeliveryBackoff(BOUND + 1, BOUND + 1),
    ],
)
def test_backoffs_refuse_delays_above_the_bound(make):
    with pytest.raises(ValueError, match="delay_ms"):
        make()
    assert MultiplierRedeliveryBackoff(1, BOUND).next_delay_ms(10**6) == BOUND


@pytest.mark.parametrize("cls", [NegativeAcksTracker, PurePythonTracker])
@pytest.mark.parametrize("kwargs", [{"lead_ms": BOUND + 1}, {"coalesce_ms": HUGE}])
def test_timer_spacings_above_the_bound_are_refused(cls, kwargs):
    with pytest.raises(ValueError):
        cls(**kwargs)


@pytest.mark.parametrize("far", [HUGE, -HUGE, 2**63, 2**64 + 5])
def test_timer_survives_any_deadline(far):
    """A deadline beyond the float range (or the C long range) must not kill the thread."""
    fired: list[int] = []
    timer = DeadlineTimer(fired.append)
    try:
        timer.request(far)
        # A past deadline fires at once; a future one has been planned once woken.
        assert wait_for(lambda: fired if far < 0 else timer.wakeups >= 1, 5)
        before = len(fired)
        timer.request(monotonic_ms() + 20)
        assert wait_for(lambda: len(fired) > before, 10), "the timer thread died"
        assert timer.is_alive()
    finally:
        timer.close()


def test_timer_survives_a_huge_deadline_returned_by_its_callback():
    fired: list[int] = []

    def on_due(now: int) -> int:
        fired.append(now)
        return HUGE if len(fired) == 1 else None  # type: ignore[return-value]

    timer = DeadlineTimer(on_due)
    try:
        timer.request(monotonic_ms())
        assert wait_for(lambda: len(fired) == 1)
        timer.request(monotonic_ms() + 20)
        assert wait_for(lambda: len(fired) == 2, 10), "the timer thread died"
    finally:
        timer.close()


@pytest.mark.parametrize("far", [1.5, "soon", None])
def test_timer_refuses_a_deadline_that_is_not_an_int(far):
    timer = DeadlineTimer(lambda now: None)
    try:
        with pytest.raises(TypeError):
            timer.request(far)  # type: ignore[arg-type]
        assert timer.next_deadline is None
    finally:
        timer.close()


# ---------------------------------------------------------------- defect 3: close races, BaseException


@pytest.mark.parametrize("cls", TRACKERS)
@pytest.mark.parametrize("flush", [True, False])
def test_keys_whose_redeliver_fails_while_close_runs_are_not_lost(cls, flush, caplog):
    """The callback blocks, close() starts on another thread, then the callback raises.

    The keys must come back from close() or be handed to the callback again; before the
    fix close() returned {} and the retry raised inside the error handler.
    """
    got = BlockThenFail()
    tracker = cls(got, delay_ms=0, **timer_kwargs(cls))
    tracker.add(("t", 1, 1, -1))
    assert got.entered.wait(10)
    returned: list[dict] = []
    closer = threading.Thread(target=lambda: returned.append(tracker.close(flush=flush)))
    with caplog.at_level(logging.ERROR):
        closer.start()
        assert wait_for(lambda: tracker.closed)
        got.release.set()
        closer.join(15)
    assert not closer.is_alive() and len(returned) == 1
    again = [k for call in got.calls[1:] for k in call]
    assert flat(returned[0]) + again == [("t", 1, 1, -1)]
    assert (again == []) is (not flush)  # flush hands them over again; no flush returns them
    assert len(tracker) == 0


@pytest.mark.parametrize("cls", TRACKERS)
def test_redeliver_failing_after_close_gave_up_waiting_keeps_its_keys(cls, caplog):
    """The callback outlives close()'s join: its keys stay pending, and close() returns them."""
    got = BlockThenFail()
    tracker = cls(got, delay_ms=0, **timer_kwargs(cls))
    tracker._join_timeout_s = 0.05  # stands in for a callback blocked longer than the 5 s join
    tracker.add(("t", 1, 1, -1))
    assert got.entered.wait(10)
    with caplog.at_level(logging.WARNING):
        assert tracker.close(flush=False) == {}
        got.release.set()
        assert wait_for(lambda: len(tracker) == 1), "the failed keys were dropped"
    assert any("closed" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert flat(tracker.close(flush=False)) == [("t", 1, 1, -1)]
    assert len(tracker) == 0
    with pytest.raises(RuntimeError):
        tracker.add(("t", 1, 2, -1))  # still closed: only the failed keys went back


@pytest.mark.parametrize("cls", [NegativeAcksTracker, PurePythonTracker])
def test_keys_put_back_into_a_closed_tracker_do_not_reopen_it_to_adds(cls):
    """Failed keys of one ledger go back into the closed tracker's buckets; a later add
    into that same bucket must still be refused (the C hot path must not take it)."""
    clock = FakeClock(10_000)
    got = BlockThenFail()
    tracker = cls(got, delay_ms=0, retry_delay_ms=0, precision_bits=0, clock=clock)
    tracker._join_timeout_s = 0.05
    for entry in range(3):
        tracker.add(("t", 1, entry, -1), delay_ms=5)
    clock.now = 10_005  # all three fall due in one call
    assert got.entered.wait(10)
    assert tracker.close(flush=False) == {}
    got.release.set()
    assert wait_for(lambda: len(tracker) == 3)
    from pulsar_nack.errors import TrackerClosedError  # here: the file also runs on code without it

    with pytest.raises(TrackerClosedError):
        tracker.add(("t", 1, 7, -1))  # now + delay_ms = 10_005: the bucket of the failed keys
    assert sorted(flat(tracker.close(flush=False))) == [("t", 1, e, -1) for e in range(3)]


@pytest.mark.parametrize("cls", TRACKERS)
@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_base_exception_in_redeliver_keeps_the_timer_and_the_keys(cls, error, caplog):
    """Policy: a BaseException from redeliver on the timer thread is handled like an
    Exception (logged, keys retried after retry_delay_ms); the thread lives on."""

    def fail(n: int) -> None:
        if n == 1:
            raise error("stop")

    got = Calls(fail)
    tracker = cls(got, delay_ms=0, retry_delay_ms=20, **timer_kwargs(cls))
    try:
        with caplog.at_level(logging.ERROR):
            tracker.add(("t", 1, 1, -1))
            assert wait_for(lambda: len(got.calls) >= 2), "the key was dropped with the thread"
        assert got.calls[0] == got.calls[1] == [("t", 1, 1, -1)]
        tracker.add(("t", 1, 2, -1))
        assert wait_for(lambda: ("t", 1, 2, -1) in got.all_keys()), "the timer thread died"
        assert tracker.stats()["redeliver_errors"] == 1
        assert caplog.records
    finally:
        tracker.close()


@pytest.mark.parametrize("cls", TRACKERS)
def test_base_exception_in_redeliver_during_close_propagates_and_keeps_the_keys(cls):
    """On the caller's thread a KeyboardInterrupt is re-raised; the keys stay pending and
    a second close() (or drain()) returns them."""

    def fail(n: int) -> None:
        raise KeyboardInterrupt

    tracker = cls(Calls(fail), delay_ms=3_600_000)
    tracker.add(("t", 1, 1, -1))
    tracker.add(("u", 2, 3, 4))
    with pytest.raises(KeyboardInterrupt):
        tracker.close()
    assert len(tracker) == 2 and tracker.closed
    assert sorted(flat(tracker.close(flush=False))) == [("t", 1, 1, -1), ("u", 2, 3, 4)]
    assert tracker.stats()["redeliveries"] == 0


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_base_exception_in_timer_callback_is_logged_and_the_timer_lives_on(error, caplog):
    calls: list[int] = []

    def on_due(now: int) -> None:
        calls.append(now)
        if len(calls) == 1:
            raise error("stop")

    timer = DeadlineTimer(on_due)
    try:
        with caplog.at_level(logging.ERROR, logger="pulsar_nack.core.timer"):
            timer.request(monotonic_ms())
            assert wait_for(lambda: len(calls) == 1)
            timer.request(monotonic_ms())
            assert wait_for(lambda: len(calls) == 2), "the timer thread died"
        assert timer.is_alive() and caplog.records
    finally:
        timer.close()
