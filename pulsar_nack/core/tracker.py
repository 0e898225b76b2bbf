"""`NegativeAcksTracker`: time buckets + an earliest-deadline timer + backoff.

This is PIP-393's tracker for Python: pending messages are held in
:class:`~pulsar_nack.core.buckets.TimeBuckets` (a few bytes each), and one
:class:`~pulsar_nack.core.timer.DeadlineTimer` thread wakes only for the earliest bucket and
hands everything due to a ``redeliver`` callback, grouped by topic. No pulsar import:
the callback decides what redelivery means (the consumer layer hands the ids to the
Pulsar client).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable

from .._validate import MAX_DELAY_MS, check_ms
from . import accel as _accel
from .backoff import MultiplierRedeliveryBackoff, RedeliveryBackoff
from .base import NEVER, BaseTracker, DueKeys, Redeliver, TrackerStats
from .buckets import DEFAULT_PRECISION_BITS, TimeBuckets
from .timer import DeadlineTimer, monotonic_ms

__all__ = ["DueKeys", "NegativeAcksTracker", "TrackerStats"]

_MAX_BACKOFF_TABLE = 64
"""Backoff delays the C hot path holds (counts beyond take the last)."""


def _backoff_table(backoff: RedeliveryBackoff | None) -> tuple[int, ...] | bool | None:
    """The delays of a multiplier backoff by redelivery count, up to the count where it
    stops growing (larger counts take the last); None without a backoff; False for a
    backoff the C path cannot take (any other class, one with jitter, or one still
    growing after 64 counts).

    >>> _backoff_table(MultiplierRedeliveryBackoff(100, 1000, 2))
    (100, 200, 400, 800, 1000)
    """
    if backoff is None:
        return None
    if type(backoff) is not MultiplierRedeliveryBackoff or backoff.jitter:
        return False  # a table read once would freeze the jitter's draws
    delays = [backoff.next_delay_ms(0)]
    while len(delays) < _MAX_BACKOFF_TABLE and delays[-1] < backoff.max_delay_ms and backoff.min_delay_ms:
        delays.append(backoff.next_delay_ms(len(delays)))
    if delays[-1] != backoff.next_delay_ms(1 << 30):
        return False  # it still grows at the table's end: leave it to the Python path
    return tuple(delays)


class NegativeAcksTracker(BaseTracker):
    """Track negatively acknowledged messages and release each when its delay is over.

    Parameters
    ----------
    redeliver : callable, optional
        ``redeliver({topic: [key, ...]})``, called on the timer thread with no lock held
        when buckets fall due. If it raises (``BaseException`` included), the error is
        logged and the keys are tracked again for ``retry_delay_ms``; the thread lives
        on. Without it there is no thread: call :meth:`pop_due` yourself (manual mode).
    delay_ms : int
        Delay when neither a per-call delay nor a backoff applies. Default 60 s, as
        pulsar's ``negative_ack_redelivery_delay_ms``. Every delay (this one, per call,
        from the backoff, ``retry_delay_ms``, ``lead_ms``, ``coalesce_ms``) is an int
        from 0 to ``MAX_DELAY_MS`` (2**40 ms, about 34.8 years); above it ``ValueError``.
    precision_bits : int
        Deadlines are trimmed by this many bits (``negative_ack_precision_bit_cnt``);
        0-30, default 8 (256 ms buckets).
    round_up : bool
        False (default): up to ``2**precision_bits - 1`` ms early, never late (Java).
        True: never early.
    backoff : RedeliveryBackoff, optional
        Delay by redelivery count, e.g. :class:`~pulsar_nack.core.backoff.MultiplierRedeliveryBackoff`.
    clock : callable
        Monotonic milliseconds; inject a fake one in tests.
    lead_ms : int
        Fire buckets this many ms before their deadline (to compensate a known handoff
        delay downstream). Default 0.
    coalesce_ms : int
        Release bursts at least this many ms apart: the timer never fires twice within
        it, so buckets falling due sooner wait and go out together (up to this much
        late, never early). Default 0 (one release per bucket).
    default_topic : str
        Topic for bare message ids, which carry none.
    retry_delay_ms : int
        Delay before retrying keys whose ``redeliver`` call failed. Default 1000.
    max_open_buckets : int
        See :class:`~pulsar_nack.core.buckets.TimeBuckets`.
    speedups : bool
        Use the C hot path for ``add(key)`` when ``pulsar_nack.core._speedups`` is built
        (default). False: pure Python, to debug or to compare. Behaviour is the same.

    >>> clock = iter(range(0, 10**6, 100)).__next__
    >>> tracker = NegativeAcksTracker(delay_ms=1000, precision_bits=0, clock=clock)
    >>> tracker.add(("t", 1, 2, -1))
    1000
    >>> tracker.pop_due(999)
    {}
    >>> tracker.pop_due(1000)
    {'t': [('t', 1, 2, -1)]}
    """

    precision_bits: int
    lead_ms: int
    coalesce_ms: int
    _buckets: TimeBuckets
    _timer: DeadlineTimer | None

    def __init__(
        self,
        redeliver: Redeliver | None = None,
        *,
        delay_ms: int = 60_000,
        precision_bits: int = DEFAULT_PRECISION_BITS,
        round_up: bool = False,
        backoff: RedeliveryBackoff | None = None,
        clock: Callable[[], int] = monotonic_ms,
        lead_ms: int = 0,
        coalesce_ms: int = 0,
        default_topic: str = "",
        retry_delay_ms: int = 1000,
        max_open_buckets: int = 16,
        speedups: bool = True,
    ) -> None:
        super().__init__(
            redeliver,
            delay_ms=delay_ms,
            backoff=backoff,
            clock=clock,
            default_topic=default_topic,
            retry_delay_ms=retry_delay_ms,
        )
        lead_ms = check_ms("lead_ms", lead_ms)
        coalesce_ms = check_ms("coalesce_ms", coalesce_ms)
        self._buckets = TimeBuckets(
            precision_bits, round_up=round_up, max_open_buckets=max_open_buckets, speedups=speedups
        )
        self.precision_bits = precision_bits
        # The hot path: adds go straight into the buckets, which return the bucket deadline.
        self._put = self._store = self._buckets.add_at
        self._timer = None
        if redeliver is not None:
            self._timer = DeadlineTimer(
                self._on_due, clock=clock, lead_ms=lead_ms, min_gap_ms=coalesce_ms, name="pulsar-nack-tracker"
            )
        self.lead_ms = lead_ms
        self.coalesce_ms = coalesce_ms
        if speedups:
            self._install_fast_add()

    def _install_fast_add(self) -> None:
        """Bind ``add`` to the C hot path when it is built.

        The C code serves every documented call form, ``add(key)``, a per-call delay
        (``add(key, 1000)``, ``add(key, delay_ms=1000)``) and a redelivery count
        (``add(key, None, 3)``, ``add(key, redelivery_count=3)``) with the fixed delay or a
        :class:`~pulsar_nack.core.backoff.MultiplierRedeliveryBackoff` (whose delays it
        reads once, here, as a table), for a key a hot slot takes. It calls the Python code
        (:meth:`add`, :meth:`_track`) for everything else, so behaviour is the same; only
        these calls are cheaper. Subclasses that override ``add`` keep their own, and so do
        trackers with any other backoff.
        """
        delays = _backoff_table(self._backoff)
        if _accel.FastAdd is None or delays is False:
            return
        if type(self).add is not BaseTracker.add:
            return
        # The C code reads CLOCK_MONOTONIC itself when that is what monotonic_ms reads.
        native = time.get_clock_info("monotonic").implementation == "clock_gettime(CLOCK_MONOTONIC)"
        fast = _accel.FastAdd(
            slot=self._buckets.hot_slot,
            lock=self._lock,
            clock=None if self._clock is monotonic_ms and native else self._clock,
            delay_ms=self._delay_ms,
            max_delay_ms=MAX_DELAY_MS,
            general=types.MethodType(BaseTracker.add, self),
            track=self._track,
            delays=delays,
        )
        self.add = fast.add  # type: ignore[method-assign]  # (the C hot path replaces the bound method per instance, on purpose)

    def __len__(self) -> int:
        with self._lock:  # the count is two reads (counters + hot slot growth)
            return len(self._buckets)

    def peek_deadline(self) -> int | None:
        """Earliest bucket deadline, or None. O(1)."""
        with self._lock:
            return self._buckets.peek_deadline()

    def _arm(self, wake_by_ms: int) -> None:
        if self._timer is not None:
            self._timer.request(wake_by_ms)

    def _pop(self, now_ms: int) -> DueKeys:
        return self._buckets.pop_due(now_ms)

    def _drain(self) -> DueKeys:
        self._armed = NEVER
        return self._buckets.clear()

    def _on_due(self, now_ms: int) -> int | None:
        """Timer callback: release what is due (with the lead), return the next deadline."""
        with self._lock:
            due = self._buckets.pop_due(now_ms + self.lead_ms)
            self._redeliveries += sum(map(len, due.values()))
        self._release(due)
        with self._lock:
            following = self._buckets.peek_deadline()
            self._armed = NEVER if following is None else following
        return following

    def _structure_stats(self) -> tuple[int, int, int, int]:
        b = self._buckets
        return len(b), b.entries, b.bucket_count, b.memory_bytes()

    def _timer_stats(self) -> tuple[int, int | None]:
        if self._timer is None:
            return 0, None
        return self._timer.wakeups, self._timer.last_lateness_ms

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.close(self._join_timeout_s)

    def _restore(self, due: DueKeys, deadline_ms: int) -> int:
        wake_by = super()._restore(due, deadline_ms)
        if self._closed:
            # Keys stored into a closed tracker must not leave a hot slot behind: the C
            # add would take a key into it without reaching the closed check.
            self._buckets.forget_hot()
        return wake_by

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is pending and no callback runs; False on timeout.

        Useful in tests and at shutdown. Returns at once in manual mode.
        """
        if self._timer is None:
            return not len(self)
        return self._timer.wait_idle(timeout_s) and not len(self)

    def _check(self) -> None:
        """Assert the invariants of the buckets and of the timer arming. For tests."""
        with self._lock:
            self._buckets._check()
            earliest = self._buckets.peek_deadline()
            # The timer has been asked for a deadline no later than the earliest bucket.
            if earliest is not None and self._timer is not None:
                assert self._armed <= earliest
