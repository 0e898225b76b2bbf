"""The consumer's own ack timeout: received, unsettled messages in time buckets, pushed by ``in_progress``.

With ``unacked_messages_timeout_ms`` the plain client keeps every received message id in
its own tracker (a set per tick) and redelivers the ones the application has not settled
within that time. The wrapper keeps that timeout itself instead, so that it can:

* send a message at its last delivery (its dead-letter policy's ``max_redeliver_count``)
  to the dead-letter topic at the timeout, from the copy kept, without a further receive,
  as the C++ client does;
* push one message's deadline by the timeout again when the application says it is still
  working on it (:meth:`AckTimeout.extend`, the consumers' ``in_progress``: NATS
  JetStream's ``AckProgress``, the "in progress" acknowledgement; Kafka share groups'
  ``RENEW``; SQS's ``ChangeMessageVisibility``);
* hold a few bytes per message: a deadline in a :class:`~pulsar_nack.core.tracker.NegativeAcksTracker`
  of its own (rounded up: never before the timeout) and a bit in a Roaring bitmap of the
  messages in flight; a dict entry only for a message whose deadline was pushed.

:class:`AckTimeout` calls ``expire(keys)`` on its timer thread with the messages still in
flight at their deadline; the consumer redelivers them (or dead-letters them).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .._validate import check_ms
from ..core.base import DueKeys
from ..core.keys import MessageKey
from ..core.timer import monotonic_ms
from ..core.tracker import NegativeAcksTracker
from .message_sets import Item, PendingNacks

__all__ = ["AckTimeout"]

PRECISION_BITS = 6
"""64 ms buckets: the client's own ack-timeout tick is coarser (1 s by default)."""


class AckTimeout:
    """Deadlines ``timeout_ms`` after each :meth:`start`; ``expire(keys)`` for those still in flight.

    Parameters
    ----------
    timeout_ms : int
        The consumer's ``unacked_messages_timeout_ms``.
    expire : callable
        ``expire([(key, first_chunk), ...])`` (*first_chunk* None but for a chunked
        message), on the timer thread, no lock held; an exception is logged
        and the keys are tried again a second later (the tracker's failure policy).
    """

    timeout_ms: int
    _tracker: NegativeAcksTracker
    _expire: Callable[[list[tuple[MessageKey, tuple[int, int] | None]]], None]
    _in_flight: PendingNacks
    """The messages started and not settled."""
    _pushed: dict[Item, int]
    """Messages whose deadline :meth:`extend` pushed: their latest deadline (earlier ones are ignored)."""
    _chunks: dict[Item, tuple[int, int]]
    """Chunked messages in flight: the entry of their first chunk (for the handoff)."""
    _lock: threading.Lock

    def __init__(self, timeout_ms: int, expire: Callable[[list[tuple[MessageKey, tuple[int, int] | None]]], None]) -> None:
        self.timeout_ms = check_ms("timeout_ms", timeout_ms, 1)
        if not callable(expire):
            raise TypeError("expire must be callable")
        self._expire = expire
        self._in_flight = PendingNacks()
        self._pushed, self._chunks = {}, {}
        self._lock = threading.Lock()
        self._tracker = NegativeAcksTracker(
            self._due, delay_ms=self.timeout_ms, precision_bits=PRECISION_BITS, round_up=True
        )

    def start(self, key: MessageKey, first_chunk: tuple[int, int] | None = None) -> None:
        """The message *key* was delivered now: it expires ``timeout_ms`` from now unless settled. O(1).

        *first_chunk*: the entry of its first chunk, for a chunked message.
        """
        item = (key[1], key[2], key[3])
        with self._lock:
            if not self._in_flight.add(*item):  # delivered again while in flight: the earlier deadline goes
                self._pushed[item] = monotonic_ms() + self.timeout_ms
            if first_chunk is not None:
                self._chunks[item] = first_chunk
        self._tracker.add(key)

    def settle(self, item: Item) -> None:
        """*item* was acked, nacked or dead-lettered: it does not expire. O(1)."""
        if self._in_flight.count:
            with self._lock:
                self._in_flight.discard(*item)
                if self._pushed:
                    self._pushed.pop(item, None)
                if self._chunks:
                    self._chunks.pop(item, None)

    def extend(self, key: MessageKey) -> bool:
        """Push the deadline of *key* to ``timeout_ms`` from now; False if it is not in flight. O(1)."""
        item = (key[1], key[2], key[3])
        with self._lock:
            if item not in self._in_flight:
                return False
            self._pushed[item] = monotonic_ms() + self.timeout_ms
        self._tracker.add(key)
        return True

    def _due(self, due: DueKeys) -> None:
        now = monotonic_ms()
        expired = []
        with self._lock:
            for keys in due.values():
                for key in keys:
                    item = (key[1], key[2], key[3])
                    if item not in self._in_flight:
                        continue  # settled meanwhile
                    pushed = self._pushed.get(item)
                    if pushed is not None and pushed > now:
                        continue  # an earlier deadline: the pushed one stands
                    self._pushed.pop(item, None)
                    self._in_flight.discard(*item)
                    expired.append((key, self._chunks.pop(item, None) if self._chunks else None))
        if expired:
            self._expire(expired)

    def __len__(self) -> int:
        """Messages in flight."""
        return self._in_flight.count

    def memory_bytes(self) -> int:
        """Bytes of the deadlines and the in-flight set (an estimate, as the tracker's)."""
        with self._lock:
            pushed = sys.getsizeof(self._pushed) if self._pushed else 0
        return self._tracker.stats()["memory_bytes"] + self._in_flight.memory_bytes() + pushed

    def close(self) -> None:
        """Stop the timer; pending deadlines are dropped. Idempotent."""
        self._tracker.close(flush=False)
