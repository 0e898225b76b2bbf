"""Retry copies held in a consumer's memory until due, and dropped when its connection drops.

A retry copy that arrives before it is due (one held by the consumers, ``retry_hold_ms``, or
one a few ms early by the broker's tick) is kept here, unacknowledged, and handed to the
application when due. It is then in the state of a message in the client's receive queue:
received, not yet given to the application, still the broker's to send again. When a consumer
reconnects (its topic moved, its broker restarted), the broker sends every message that
consumer had not acknowledged again, to it or to another consumer of the subscription, and the
C++ client clears its receive queue (``ConsumerImpl::connectionOpened``), so that the
application sees only the new copy. :class:`MemoryHold` does the same with the copies it keeps:
one kept before a reconnect is dropped (left unacknowledged: the broker has sent it again), and
so is one that arrives while the consumer is disconnected.

The bindings have no reconnect callback, so :class:`ConnectionWatch` looks at the retry topic's
consumer (``is_connected()``): on every copy kept or taken, and every
:data:`~pulsar_nack.timing.CONNECTION_POLL_MS` from a thread of its own while copies are kept.
The C++ client waits at least its reconnect backoff's first interval (100 ms unless the
application's ``pulsar.Client`` sets another) before it reconnects, so a look falls in that gap;
a consumer moved by the extensible load manager reconnects without a wait, and a look can miss
that.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

from ..timing import CONNECTION_POLL_MS, MEMORY_HOLD_MS

__all__ = ["MEMORY_HOLD_MAX", "MemoryHold"]

MEMORY_HOLD_MAX = 10_000
"""Copies held by the consumers that one consumer keeps in memory at most; the rest wait in
the hold tracker (a few bytes each, a broker round trip to come back)."""

Key = tuple[str, int, int, int]
"""``(topic, ledger, entry, batch_index)`` of a received copy (``msgid.message_key``)."""


class ConnectionWatch:
    """How many times one consumer was seen disconnected: its epoch, one more at each drop seen. Thread-safe.

    >>> up = [True]; watch = ConnectionWatch(lambda: up[0])
    >>> watch.look()
    (True, 0)
    >>> up[0] = False; watch.look(), watch.look()
    ((False, 1), (False, 1))
    >>> up[0] = True; watch.look()
    (True, 1)
    """

    def __init__(self, is_connected: Callable[[], bool]) -> None:
        self._is_connected = is_connected
        self._epoch = 0
        self._down = False
        self._lock = threading.Lock()

    def look(self) -> tuple[bool, int]:
        """``(connected now, epoch)``, after a look at the consumer. O(1)."""
        try:
            connected = bool(self._is_connected())
        except Exception:  # a closed consumer: no connection
            connected = False
        with self._lock:
            if not connected and not self._down:
                self._epoch += 1
            self._down = not connected
            return connected, self._epoch


class MemoryHold:
    """Copies kept unacknowledged until due, one per message, dropped when the consumer reconnects. Thread-safe.

    Parameters
    ----------
    clock_ms : callable
        Wall-clock epoch milliseconds (the copies' due times are wall-clock).
    is_connected : callable
        The retry topic's consumer's ``is_connected``.
    hold_ms : int
        ``retry_hold_ms``: a copy due within it is kept while fewer than :data:`MEMORY_HOLD_MAX`
        are; one due within :data:`~pulsar_nack.timing.MEMORY_HOLD_MS` always is.
    """

    def __init__(self, clock_ms: Callable[[], int], is_connected: Callable[[], bool], hold_ms: int = 0) -> None:
        self._clock_ms = clock_ms
        self._watch = ConnectionWatch(is_connected)
        self._hold_ms = hold_ms
        # (due epoch ms, sequence: unique, so the copies are never compared, key, copy, arrival, epoch)
        self._queued: list[tuple[int, int, Key, Any, int, int]] = []
        self._newest: dict[Key, int] = {}  # key -> the sequence number of its copy that counts
        self._arrived: dict[int, int] = {}  # id(copy) -> its arrival (epoch ms), from take_due to arrival()
        self._sequence = itertools.count()
        self._lock = threading.Lock()
        self._has_copies = threading.Event()  # wakes the idle watcher thread when a copy is kept
        self._stop = threading.Event()  # set by close
        self._watcher: threading.Thread | None = None

    def __len__(self) -> int:
        """Copies kept now. O(1)."""
        return len(self._newest)

    def keep(self, key: Key, copy: Any, left_ms: int) -> bool:
        """Keep *copy* (of message *key*), due in *left_ms*; False if it does not fit (the hold tracker takes it).

        True also for a copy dropped, left unacknowledged: one that arrives while the consumer
        is disconnected or closing (the broker sends it again). A copy of a message kept here
        already (a reconnect's, or its entry's redelivery) replaces it, so the message goes out
        once, when due. O(log n).
        """
        connected, epoch = self._watch.look()
        with self._lock:
            if self._stop.is_set() or not connected:
                return True
            if key not in self._newest and not self._fits(left_ms):
                return False
            now = self._clock_ms()
            sequence = next(self._sequence)
            self._newest[key] = sequence
            heapq.heappush(self._queued, (now + max(left_ms, 0), sequence, key, copy, now, epoch))
        self._watch_connection()
        return True

    def _fits(self, left_ms: int) -> bool:
        return left_ms <= MEMORY_HOLD_MS or (left_ms <= self._hold_ms and len(self._newest) < MEMORY_HOLD_MAX)

    def take_due(self) -> tuple[Any | None, int | None]:
        """``(copy, 0)`` for a copy due now, ``(None, ms)`` while the earliest is not due, ``(None, None)``
        with nothing kept. Skips the copies replaced or kept before a reconnect. One clock read, and the
        lock only for a copy due: the receive loop calls it for every message. O(log n)."""
        queued = self._queued
        while True:
            try:
                earliest = queued[0][0]  # a peek without the lock: one list read, atomic under the GIL
            except IndexError:
                return None, None
            now = self._clock_ms()
            if earliest > now:
                return None, earliest - now
            taken = self._pop_due(now)
            if taken is not None:
                return taken

    def _pop_due(self, now: int) -> tuple[Any | None, int | None] | None:
        """The earliest copy if due at *now* and still current; None to look again (it was skipped)."""
        _connected, epoch = self._watch.look()
        with self._lock:  # another thread may have taken it meanwhile: look again, at the same time
            if not self._queued:
                return None, None
            if self._queued[0][0] > now:
                return None, self._queued[0][0] - now
            _due, sequence, key, copy, arrived, kept_in = heapq.heappop(self._queued)
            if self._newest.get(key) != sequence:
                return None  # replaced by a newer copy, still queued
            del self._newest[key]
            if kept_in != epoch:
                return None  # kept before a reconnect: the broker has sent it again
            self._arrived[id(copy)] = arrived
            return copy, 0

    def ms_to_next_due(self) -> int | None:
        """Milliseconds until the earliest copy kept is due (0: now), or None. O(1)."""
        try:
            earliest = self._queued[0][0]
        except IndexError:
            return None
        return max(earliest - self._clock_ms(), 0)

    def arrival(self, copy: Any) -> int | None:
        """When *copy*, just taken, arrived (epoch ms), once. O(1)."""
        return self._arrived.pop(id(copy), None)

    def clear(self) -> None:
        """Forget every copy kept (they stay unacknowledged). O(1)."""
        with self._lock:
            self._queued.clear()
            self._newest.clear()
            self._arrived.clear()

    def close(self) -> None:
        """Forget every copy and stop watching. Idempotent."""
        with self._lock:
            self._stop.set()
            watcher, self._watcher = self._watcher, None
        self.clear()
        self._has_copies.set()
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=1.0)

    def _watch_connection(self) -> None:
        """Make sure the watcher thread runs while copies are kept."""
        with self._lock:
            if self._watcher is None and not self._stop.is_set():
                self._watcher = threading.Thread(target=self._watch_loop, name="pulsar-nack-hold-watch", daemon=True)
                self._watcher.start()
        self._has_copies.set()

    def _watch_loop(self) -> None:
        """The watcher thread: a look every ``CONNECTION_POLL_MS`` while copies are kept, asleep while none are."""
        while not self._stop.is_set():
            if self._queued:
                self._watch.look()
                self._stop.wait(CONNECTION_POLL_MS / 1000)
                continue
            self._has_copies.clear()
            if not self._queued:  # looked again after clearing: a copy kept meanwhile has set it since
                self._has_copies.wait()
