"""`HashMapNegativeAcksTracker`: the pre-PIP-393 design, as a baseline.

A dict from message key to deadline, scanned whole by a fixed-interval timer every
``delay_ms / 3`` while anything is pending, like the Java client before PIP-393 (and
the C++ client under ``pulsar-client``). Same interface and stats as
:class:`~pulsar_nack.core.tracker.NegativeAcksTracker`; it is the reference model in the
property tests and the baseline in the benchmarks.

Its costs, for comparison: a dict entry, a key tuple and a deadline int per message
(about 200 bytes in CPython); O(n) per scan; and up to one interval of lateness.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .._validate import check_int, check_ms
from .backoff import RedeliveryBackoff
from .base import NEVER, BaseTracker, DueKeys, Redeliver
from .keys import MessageKey, checked_key
from .timer import monotonic_ms

__all__ = ["HashMapNegativeAcksTracker"]


class HashMapNegativeAcksTracker(BaseTracker):
    """Pending messages in a dict, released by a scan every ``interval_ms``.

    Parameters are those of :class:`~pulsar_nack.core.tracker.NegativeAcksTracker`, plus
    ``interval_ms`` (default ``max(delay_ms // 3, 1)``, as the pre-PIP-393 clients) and
    without the bucket options: deadlines are exact milliseconds. Re-adding a pending
    key replaces its deadline.

    >>> tracker = HashMapNegativeAcksTracker(delay_ms=1000, clock=lambda: 0)
    >>> tracker.add(("t", 1, 2, -1))
    1000
    >>> tracker.pop_due(1000)
    {'t': [('t', 1, 2, -1)]}
    """

    interval_ms: int
    _deadlines: dict[MessageKey, int]
    _wake: threading.Condition
    _thread: threading.Thread | None
    _wakeups: int
    _last_lateness_ms: int | None

    def __init__(
        self,
        redeliver: Redeliver | None = None,
        *,
        delay_ms: int = 60_000,
        backoff: RedeliveryBackoff | None = None,
        clock: Callable[[], int] = monotonic_ms,
        default_topic: str = "",
        retry_delay_ms: int = 1000,
        interval_ms: int | None = None,
    ) -> None:
        super().__init__(
            redeliver,
            delay_ms=delay_ms,
            backoff=backoff,
            clock=clock,
            default_topic=default_topic,
            retry_delay_ms=retry_delay_ms,
        )
        if interval_ms is None:
            interval_ms = max(self.delay_ms // 3, 1)
        self.interval_ms = check_ms("interval_ms", interval_ms, 1)
        self._deadlines = {}
        self._put = self._store = self._put_key
        self._wake = threading.Condition(self._lock)
        self._wakeups = 0
        self._last_lateness_ms = None
        self._thread = None
        if redeliver is not None:
            self._thread = threading.Thread(target=self._run, name="pulsar-nack-baseline", daemon=True)
            self._thread.start()

    def __len__(self) -> int:
        return len(self._deadlines)

    def _put_key(self, key: MessageKey, deadline_ms: int) -> int:
        """Store *key* (checked by :func:`~pulsar_nack.core.keys.checked_key`) due at *deadline_ms*. O(1)."""
        key = checked_key(key)
        self._deadlines[key] = check_int("deadline_ms", deadline_ms, 0)
        return NEVER - 1 if len(self._deadlines) == 1 else NEVER

    def _arm(self, wake_by_ms: int) -> None:
        """The scan thread needs waking only when the first key arrives."""
        if self._thread is not None:
            self._wake.notify()

    def _pop(self, now_ms: int) -> DueKeys:
        """O(n): scan every pending key."""
        due_keys = [key for key, deadline in self._deadlines.items() if deadline <= now_ms]
        due: DueKeys = {}
        if not due_keys:
            return due
        deadlines = self._deadlines
        for key in sorted(due_keys, key=deadlines.__getitem__):
            lateness = now_ms - deadlines.pop(key)
            if self._last_lateness_ms is None or lateness > self._last_lateness_ms:
                self._last_lateness_ms = lateness
            due.setdefault(key[0], []).append(key)
        return due

    def _drain(self) -> DueKeys:
        due: DueKeys = {}
        for key in sorted(self._deadlines, key=self._deadlines.__getitem__):
            due.setdefault(key[0], []).append(key)
        self._deadlines.clear()
        self._armed = NEVER
        return due

    def _run(self) -> None:
        """Scan every ``interval_ms`` while anything is pending; sleep otherwise."""
        while True:
            with self._lock:
                while not self._closed and not self._deadlines:
                    self._wake.wait()
                    self._wakeups += 1
                if self._closed:
                    return
                self._wake.wait(self.interval_ms / 1000.0)
                self._wakeups += 1
                if self._closed:
                    return
                self._last_lateness_ms = None
                due = self._pop(self._clock())
                if not self._deadlines:
                    self._armed = NEVER
                self._redeliveries += sum(map(len, due.values()))
            self._release(due)

    def _structure_stats(self) -> tuple[int, int, int, int]:
        """O(n): entries are counted by building the set of ``(topic, ledger, entry)``."""
        n = len(self._deadlines)
        # The dict table, plus per entry its key tuple, the entry id and deadline ints.
        per_entry = 0
        if n:
            key, deadline = next(iter(self._deadlines.items()))
            per_entry = sys.getsizeof(key) + sys.getsizeof(key[2]) + sys.getsizeof(deadline)
        entries = len({key[:3] for key in self._deadlines})
        return n, entries, n, sys.getsizeof(self._deadlines) + n * per_entry

    def _timer_stats(self) -> tuple[int, int | None]:
        return self._wakeups, self._last_lateness_ms

    def _stop_timer(self) -> None:
        with self._lock:
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._join_timeout_s)
