"""One thread that sleeps until the earliest deadline and calls back.

Unlike a fixed-interval poll (the built-in client's ``delay/3`` timer, re-armed by every
nack), :class:`DeadlineTimer` waits exactly until the earliest requested deadline minus
a configurable lead:

* a request for an *earlier* deadline wakes it at once, so it re-plans;
* a request for a *later* deadline changes nothing, so a steady stream of adds never
  postpones a due deadline;
* with nothing requested it blocks without a timeout, so an idle timer makes no wakeups;
* with ``min_gap_ms``, two fires are never closer than that (bursts are coalesced);
* an exception from the callback, ``BaseException`` included, is logged and the thread
  lives on (in a thread, ``SystemExit`` would only end the thread, and with it every
  later release; ``KeyboardInterrupt`` reaches the main thread only);
* any int deadline is safe: a wait beyond ``threading.TIMEOUT_MAX`` is capped (the
  thread re-plans when it wakes), so even ``2**1100`` neither overflows nor kills it;
* :meth:`close` is idempotent and joins the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._validate import check_int, check_ms

__all__ = ["DeadlineTimer", "monotonic_ms"]

_log = logging.getLogger(__name__)

_MAX_WAIT_MS = int(threading.TIMEOUT_MAX * 1000) // 2
"""Longest single wait, in ms: beyond it the thread wakes and re-plans (ints, so no overflow)."""


def _wait_seconds(wait_ms: int) -> float:
    """The seconds to wait for *wait_ms* > 0, capped to a finite, allowed timeout. O(1)."""
    return min(wait_ms, _MAX_WAIT_MS) / 1000.0


def monotonic_ms() -> int:
    """Milliseconds of the monotonic clock (the default clock everywhere)."""
    return time.monotonic_ns() // 1_000_000


class DeadlineTimer:
    """Call ``on_due(now_ms)`` when the earliest requested deadline arrives.

    Parameters
    ----------
    on_due : callable
        Called on the timer thread, with no lock held, once ``now >= deadline - lead``.
        It returns the next deadline to wait for, or None when nothing is pending.
    clock : callable
        Monotonic milliseconds; injectable for tests.
    lead_ms : int
        Fire this many ms before the deadline (e.g. to compensate for a known handoff
        delay). Default 0; at most ``MAX_DELAY_MS``.
    min_gap_ms : int
        Never fire twice within this many ms; a deadline that falls sooner waits for the
        gap. Default 0; at most ``MAX_DELAY_MS``.
    name : str
        Thread name.

    >>> fired = []
    >>> timer = DeadlineTimer(lambda now: fired.append(now))
    >>> timer.request(monotonic_ms())
    >>> timer.wait_idle(5.0)
    True
    >>> len(fired)
    1
    >>> timer.close()
    """

    lead_ms: int
    min_gap_ms: int
    wakeups: int
    """Times the thread woke up (from a timeout or a request)."""
    fires: int
    """Times ``on_due`` was called."""
    last_lateness_ms: int | None
    """``now - (deadline - lead_ms)`` at the last fire: how late the thread woke."""
    _on_due: Callable[[int], int | None]
    _clock: Callable[[], int]
    _cond: threading.Condition
    _next: int | None
    _busy: bool
    _closed: bool
    _last_fire: int | None
    _thread: threading.Thread

    def __init__(
        self,
        on_due: Callable[[int], int | None],
        *,
        clock: Callable[[], int] = monotonic_ms,
        lead_ms: int = 0,
        min_gap_ms: int = 0,
        name: str = "pulsar-nack-timer",
    ) -> None:
        if not callable(on_due) or not callable(clock):
            raise TypeError("on_due and clock must be callable")
        self.lead_ms = check_ms("lead_ms", lead_ms)
        self.min_gap_ms = check_ms("min_gap_ms", min_gap_ms)
        self._last_fire = None
        self._on_due = on_due
        self._clock = clock
        self.wakeups = 0
        self.fires = 0
        self.last_lateness_ms = None
        self._cond = threading.Condition(threading.Lock())
        self._next = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, deadline_ms: int) -> None:
        """Make sure the timer fires by *deadline_ms* (minus the lead). O(1).

        Wakes the thread only when *deadline_ms* is earlier than what it waits for. Any
        int is safe, however far in the past or future.

        Raises
        ------
        TypeError
            If *deadline_ms* is not an int.
        """
        check_int("deadline_ms", deadline_ms)
        with self._cond:
            if self._next is None or deadline_ms < self._next:
                self._next = deadline_ms
                self._cond.notify_all()

    @property
    def next_deadline(self) -> int | None:
        """The deadline the thread waits for, or None."""
        return self._next

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is requested and no callback runs; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._next is not None or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and join it. Idempotent; safe from the callback itself."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def closed(self) -> bool:
        return self._closed

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _call_on_due(self, now: int) -> int | None:
        """Run the callback; log whatever it raises (BaseException too) and return None then."""
        try:
            following = self._on_due(now)
        except BaseException:  # the policy: nothing a callback raises ends the thread
            _log.exception("negative-ack timer callback failed; the timer keeps running")
            return None
        if following is None:
            return None
        try:
            return check_int("the deadline on_due returned", following)
        except TypeError:
            _log.exception("negative-ack timer callback returned %r, not an int or None; ignored", following)
            return None

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._closed:
                    if self._next is None:
                        cond.wait()
                    else:
                        fire_at = self._next - self.lead_ms
                        if self._last_fire is not None:
                            fire_at = max(fire_at, self._last_fire + self.min_gap_ms)
                        wait_ms = fire_at - self._clock()
                        if wait_ms <= 0:
                            break
                        cond.wait(_wait_seconds(wait_ms))
                    self.wakeups += 1
                if self._closed:
                    return
                deadline, self._next, self._busy = self._next, None, True
            assert deadline is not None  # the wait loop is left only with a deadline due
            now = self._last_fire = self._clock()
            self.fires += 1
            self.last_lateness_ms = now - (deadline - self.lead_ms)
            following = self._call_on_due(now)
            with cond:
                self._busy = False
                if following is not None and (self._next is None or following < self._next):
                    self._next = following
                cond.notify_all()
