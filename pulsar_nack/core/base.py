"""What the PIP-393 tracker and the hash-map baseline share: the public interface.

Both trackers take keys or pulsar messages, resolve a delay (per call, by backoff, or
fixed), keep the pending messages, release them when due to a ``redeliver`` callback
(from their own timer thread) or to :meth:`pop_due` (manual mode), and report the same
:class:`TrackerStats`. Subclasses own the storage and the timer.

Failure policy (nothing is dropped):

* ``redeliver`` raising on the timer thread, ``BaseException`` included: logged, and the
  keys are tracked again for ``retry_delay_ms``; the thread lives on. (On a thread,
  ``SystemExit`` would end only that thread, and with it every later release.)
* ... while :meth:`close` runs: the keys go back into the closed tracker; ``close()``
  collects them after joining the timer thread and flushes or returns them. If the
  callback outlives the join (5 s), they stay pending (``len()`` counts them, a warning
  is logged) and a later ``close()`` or :meth:`drain` returns them.
* ``redeliver`` raising during ``close(flush=True)``, on the caller's thread: an
  ``Exception`` makes ``close()`` return the keys; a ``BaseException`` (e.g.
  ``KeyboardInterrupt``) propagates and the keys stay pending for a later ``close()``.
"""

from __future__ import annotations

import functools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from time import monotonic_ns as _monotonic_ns
from typing import TypedDict

from .._validate import check_bool, check_int, check_ms
from ..errors import TrackerClosedError
from .backoff import RedeliveryBackoff, resolve_delay
from .keys import MessageKey, key_of, redelivery_count_of
from .timer import monotonic_ms

__all__ = ["NEVER", "BaseTracker", "DueKeys", "Redeliver", "ReleaseListener", "TrackerStats"]

NEVER = 1 << 127
"""A time later than any deadline."""

_log = logging.getLogger("pulsar_nack.core.tracker")

DueKeys = dict[str, list[MessageKey]]
"""Due keys grouped by topic, each list in deadline order."""
Redeliver = Callable[[DueKeys], None]
ReleaseListener = Callable[[int, int], None]
"""``listener(released_messages, lateness_ms)``, called after each timer release."""


class TrackerStats(TypedDict):
    """A snapshot of a tracker's counters."""

    pending_messages: int
    pending_entries: int
    buckets: int
    memory_bytes: int
    redeliveries: int
    redeliver_errors: int
    timer_wakeups: int
    last_lateness_ms: int | None
    drained: int
    """Keys removed without release: by :meth:`BaseTracker.drain`, or returned by ``close()``."""


class BaseTracker(ABC):
    """Common part of :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` and the baseline.

    See :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` for the parameters.
    """

    _delay_ms: int
    _backoff: RedeliveryBackoff | None
    default_topic: str
    retry_delay_ms: int
    _redeliver: Redeliver | None
    _clock: Callable[[], int]
    _lock: threading.Lock
    _acquire: Callable[[], bool]
    _release_lock: Callable[[], None]
    _closed: bool
    _redeliveries: int
    _redeliver_errors: int
    _drained: int
    _release_listeners: tuple[ReleaseListener, ...]
    _armed: int
    """The earliest wake-up the timer was asked for (``NEVER`` when none)."""
    _put: Callable[[MessageKey, int], int]
    """Store a key due at a deadline (lock held); return the time the timer must wake by
    for it. May raise TypeError/ValueError, storing nothing. Set by the subclass."""
    _store: Callable[[MessageKey, int], int]
    """What :meth:`add` stores with: ``_put`` while open, a refusal once closed."""
    _join_timeout_s: float = 5.0
    """How long :meth:`close` waits for the timer thread (and a redeliver call it runs)."""

    def __init__(
        self,
        redeliver: Redeliver | None,
        *,
        delay_ms: int,
        backoff: RedeliveryBackoff | None,
        clock: Callable[[], int],
        default_topic: str,
        retry_delay_ms: int,
    ) -> None:
        if redeliver is not None and not callable(redeliver):
            raise TypeError(f"redeliver must be callable or None, not {type(redeliver).__name__}")
        if backoff is not None and not callable(getattr(backoff, "next_delay_ms", None)):
            raise TypeError("backoff must have a next_delay_ms(redelivery_count) method")
        if not callable(clock):
            raise TypeError("clock must be callable")
        if not isinstance(default_topic, str):
            raise TypeError(f"default_topic must be str, not {type(default_topic).__name__}")
        self._delay_ms = check_ms("delay_ms", delay_ms)
        self.retry_delay_ms = check_ms("retry_delay_ms", retry_delay_ms)
        self._backoff = backoff
        self.default_topic = default_topic
        self._redeliver = redeliver
        self._clock = clock
        self._lock = threading.Lock()
        self._acquire, self._release_lock = self._lock.acquire, self._lock.release
        self._closed = False
        self._redeliveries = 0
        self._redeliver_errors = 0
        self._drained = 0
        self._release_listeners = ()
        self._armed = NEVER

    # ------------------------------------------------------------------ storage

    @abstractmethod
    def _arm(self, wake_by_ms: int) -> None:
        """Tell the timer to wake by *wake_by_ms* (lock held; must not block)."""

    @abstractmethod
    def _pop(self, now_ms: int) -> DueKeys:
        """Remove and return what is due at *now_ms* (lock held)."""

    @abstractmethod
    def _drain(self) -> DueKeys:
        """Remove and return everything (lock held)."""

    @abstractmethod
    def _structure_stats(self) -> tuple[int, int, int, int]:
        """``(pending_messages, pending_entries, buckets, memory_bytes)`` (lock held)."""

    @abstractmethod
    def _timer_stats(self) -> tuple[int, int | None]:
        """``(timer_wakeups, last_lateness_ms)``."""

    @abstractmethod
    def _stop_timer(self) -> None:
        """Stop and join the timer thread, if any."""

    @abstractmethod
    def __len__(self) -> int:
        """Pending messages. O(1)."""

    # ------------------------------------------------------------------ public API

    @property
    def delay_ms(self) -> int:
        """The fixed delay (read-only)."""
        return self._delay_ms

    @property
    def backoff(self) -> RedeliveryBackoff | None:
        """The redelivery backoff, if any (read-only)."""
        return self._backoff

    def add(self, key_or_message: object, delay_ms: int | None = None, redelivery_count: int | None = None) -> int:
        """Track a message for redelivery; return its (untrimmed) deadline in ms.

        Parameters
        ----------
        key_or_message : tuple or pulsar Message/MessageId
            ``(topic, ledger_id, entry_id, batch_index)``, or a pulsar message or id
            (wrapped or raw; an id takes ``default_topic``).
        delay_ms : int, optional
            Per-call delay, 0 to ``MAX_DELAY_MS`` (2**40 ms, about 34.8 years); overrides
            the backoff and the fixed delay.
        redelivery_count : int, optional
            Count for the backoff; defaults to the message's ``redelivery_count()``.

        Raises
        ------
        TypeError, ValueError
            For a wrong type or bad value (a delay, given or from the backoff, above
            ``MAX_DELAY_MS`` included); nothing is stored then.
        TrackerClosedError
            After :meth:`close` (a ``RuntimeError``).
        """
        if type(key_or_message) is tuple:
            key = key_or_message
        else:
            key = key_of(key_or_message, self.default_topic)
        if delay_ms is None and redelivery_count is None and self._backoff is None:
            delay = self._delay_ms
        else:
            if delay_ms is None and redelivery_count is not None:
                check_int("redelivery_count", redelivery_count, 0)
            count = functools.partial(redelivery_count_of, key_or_message) if redelivery_count is None else redelivery_count
            delay = resolve_delay(delay_ms, self._backoff, self._delay_ms, count)
        clock = self._clock
        return self._track(key, (_monotonic_ns() // 1_000_000 if clock is monotonic_ms else clock()) + delay)

    def add_at(self, key: MessageKey, deadline_ms: int) -> int:
        """Track *key* ``(topic, ledger_id, entry_id, batch_index)`` until the clock's *deadline_ms*; return it.

        For a key that must come back with another one: pass the deadline :meth:`add`
        returned for that one, and both fall into the same bucket.

        Raises
        ------
        TypeError, ValueError
            For a wrong type or bad value (a negative deadline included); nothing is stored then.
        TrackerClosedError
            After :meth:`close` (a ``RuntimeError``).
        """
        return self._track(key, check_int("deadline_ms", deadline_ms, 0))

    def _track(self, key: MessageKey, deadline_ms: int) -> int:
        """Store *key* due at *deadline_ms* (not yet validated) and arm the timer; return the deadline."""
        self._acquire()  # cheaper than `with self._lock` on this hot path
        try:
            wake_by = self._store(key, deadline_ms)  # raises once closed
            if wake_by < self._armed:
                self._armed = wake_by
                self._arm(wake_by)
        finally:
            self._release_lock()
        return deadline_ms

    def pop_due(self, now_ms: int | None = None) -> DueKeys:
        """Remove and return the keys due at *now_ms* (default: the clock's now).

        The manual mode: use it with no ``redeliver`` callback (no timer thread).
        """
        now = self._clock() if now_ms is None else check_int("now_ms", now_ms, 0)
        with self._lock:
            due = self._pop(now)
            self._redeliveries += sum(map(len, due.values()))
        return due

    @staticmethod
    def _refuse_closed(key: object, deadline_ms: int) -> int:
        """Stands in for ``_store`` after close, so :meth:`add` needs no closed check."""
        raise TrackerClosedError("the tracker is closed")

    def drain(self) -> DueKeys:
        """Remove and return every pending key without releasing it. O(n).

        After :meth:`close`, this returns the keys of a ``redeliver`` call that failed
        after ``close()`` stopped waiting for it (see the module docstring).
        """
        with self._lock:
            due = self._drain()
            self._drained += sum(map(len, due.values()))
            return due

    def _release(self, due: DueKeys) -> None:
        """Hand due keys to ``redeliver`` (timer thread, no lock held); never lose them.

        Whatever the callback raises, ``BaseException`` included, is logged and the keys
        are tracked again for ``retry_delay_ms``: into the closed tracker if
        :meth:`close` runs meanwhile, which then collects them.
        """
        if not due or self._redeliver is None:
            return
        try:
            self._redeliver(due)
        except BaseException:  # the policy: see the module docstring
            _log.exception("redeliver callback failed; the keys will be retried in %d ms", self.retry_delay_ms)
            deadline = self._clock() + self.retry_delay_ms
            with self._lock:
                self._redeliver_errors += 1
                wake_by = self._restore(due, deadline)
                if self._closed:
                    _log.warning(
                        "the tracker was closed while redeliver ran: %d failed keys kept; close() or drain() returns them",
                        sum(map(len, due.values())),
                    )
                elif wake_by < self._armed:
                    self._armed = wake_by
                    self._arm(wake_by)
        else:
            if self._release_listeners:
                self._notify_release(sum(map(len, due.values())))

    # ------------------------------------------------------------------ observers

    def add_release_listener(self, listener: ReleaseListener) -> None:
        """Call ``listener(released_messages, lateness_ms)`` after each timer release.

        For observers such as :func:`pulsar_nack.metrics.instrument`: it runs on the
        timer thread, after ``redeliver`` returned, with no lock held; an exception is
        logged and ignored. ``lateness_ms`` is how late the timer woke for the earliest
        bucket it released (the tracker's ``last_lateness_ms``). Nothing is added to
        :meth:`add`. O(listeners).
        """
        if not callable(listener):
            raise TypeError(f"listener must be callable, not {type(listener).__name__}")
        with self._lock:
            self._release_listeners = (*self._release_listeners, listener)

    def remove_release_listener(self, listener: ReleaseListener) -> None:
        """Stop calling *listener* (no error if it was not added). O(listeners)."""
        with self._lock:
            self._release_listeners = tuple(f for f in self._release_listeners if f != listener)

    def _notify_release(self, released: int) -> None:
        lateness = self._timer_stats()[1]
        for listener in self._release_listeners:
            try:
                listener(released, 0 if lateness is None else lateness)
            except Exception:
                _log.exception("release listener failed")

    def _restore(self, due: DueKeys, deadline_ms: int) -> int:
        """Track released keys again at *deadline_ms*, even once closed (lock held). O(k).

        Returns the time the timer must wake by for them. The keys came out of the
        structure, so they are valid and storing them cannot fail.
        """
        wake_by = NEVER
        for keys in due.values():
            self._redeliveries -= len(keys)
            for key in keys:
                wake_by = min(wake_by, self._put(key, deadline_ms))
        return wake_by

    def close(self, flush: bool = True) -> DueKeys:
        """Stop the timer and empty the tracker. Idempotent.

        ``flush=True`` hands every pending key to ``redeliver`` now (returns ``{}``), or,
        without a callback, returns them. ``flush=False`` returns them unreleased, for
        the caller to deal with (e.g. leave them unacked). Nothing is dropped: keys whose
        ``redeliver`` call fails while closing are flushed again or returned, and a
        ``redeliver`` that raises a ``BaseException`` here leaves the keys pending (see
        the module docstring). A later call returns whatever is still pending.

        Runtime complexity: O(n) for n pending keys, plus the wait for the timer thread.
        """
        check_bool("flush", flush)
        with self._lock:
            already = self._closed
            self._closed = True
            self._store = self._refuse_closed
            pending = self._drain()
        if not already:
            self._stop_timer()  # a redeliver call failing meanwhile puts its keys back
            with self._lock:
                pending = _merge(self._drain(), pending)
        if not (flush and self._redeliver is not None and pending):
            with self._lock:
                self._drained += sum(map(len, pending.values()))
            return pending
        count = sum(map(len, pending.values()))
        with self._lock:
            self._redeliveries += count
        try:
            self._redeliver(pending)
        except Exception:
            _log.exception("redeliver callback failed while closing; returning the keys")
            with self._lock:
                self._redeliveries -= count
                self._drained += count
            return pending
        except BaseException:
            with self._lock:
                self._restore(pending, self._clock())
            raise
        return {}

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> TrackerStats:
        """A snapshot of the counters. O(open buckets + streams) for the tracker."""
        wakeups, lateness = self._timer_stats()
        with self._lock:
            messages, entries, buckets, memory = self._structure_stats()
            return TrackerStats(
                pending_messages=messages,
                pending_entries=entries,
                buckets=buckets,
                memory_bytes=memory,
                redeliveries=self._redeliveries,
                redeliver_errors=self._redeliver_errors,
                timer_wakeups=wakeups,
                last_lateness_ms=lateness,
                drained=self._drained,
            )

    def __enter__(self) -> BaseTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pending={len(self)} closed={self._closed}>"


def _merge(first: DueKeys, then: DueKeys) -> DueKeys:
    """Keys of *first*, then those of *then*, per topic. O(k)."""
    for topic, keys in then.items():
        first.setdefault(topic, []).extend(keys)
    return first
