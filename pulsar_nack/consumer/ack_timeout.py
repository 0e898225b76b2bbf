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

No id is read on the hot path
    Reading a message's id costs about as much as a receive, and most messages are
    settled long before their timeout. So a receive only appends the message object to
    a log (:attr:`AckTimeout.received`, one C call: ``msgid.log_received``), and an acknowledgement takes
    it out again if it is the log's last entry (the receive-then-ack pattern: the message
    is freed by the ack, as without a timeout), else appends it to a log of settled
    objects (:attr:`AckTimeout.settled`, one C call: ``msgid.settle_logged``). Every
    :data:`~pulsar_nack.timing.ACK_TIMEOUT_TICK_MS`, on the timer thread,
    :meth:`AckTimeout.convert` takes the settled log first, then the received one (so
    every settled message's receive is in this log or an earlier one), drops the
    received messages settled meanwhile by identity (``id(message)``: both logs hold
    their objects, so no two live ones share it), and reads the id only of those still
    unsettled, which get their deadline ``timeout_ms`` from then (never before the
    timeout: at most a tick and a bucket late). A message is held one tick at most, and
    no more than :data:`LOG_LIMIT` are held: past that, the receive that logs one
    converts the log itself (the heap a peak of held objects grows would stay in the
    process after them). After that a message costs the bytes above. Settling by id (a nack, a reject, an ack of an
    id) appends the id's ``(ledger, entry, batch_index)`` to the received log instead,
    in order with the receives: it settles the copies received before it.

::

    receive ──append──▶ received log ─┐  every ACK_TIMEOUT_TICK_MS (timer thread):
    ack ──────append──▶ settled log ──┴─▶ unsettled ─▶ id read ─▶ in-flight bitmap + tracker deadline
                                          settled   ─▶ dropped (no id read)

:class:`AckTimeout` calls ``expire(keys)`` on its timer thread with the messages still in
flight at their deadline; the consumer redelivers them (or dead-letters them).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from .._validate import check_ms
from ..core.base import DueKeys
from ..core.keys import MessageKey
from ..core.timer import DeadlineTimer, monotonic_ms
from ..core.tracker import NegativeAcksTracker
from ..timing import ACK_TIMEOUT_TICK_MS
from . import msgid as _msgid
from .message_sets import Item, PendingNacks

__all__ = ["LOG_LIMIT", "PRECISION_BITS", "AckTimeout"]

_log = logging.getLogger(__name__)

PRECISION_BITS = 6
"""64 ms buckets: the client's own ack-timeout tick is coarser (1 s by default)."""
LOG_LIMIT = 128
"""The received log is converted on the receiving thread once it is longer than this: held message
objects stay few (the heap a peak of them grows would stay in the process after them)."""

ReadKey = Callable[[Any], tuple[MessageKey, "tuple[int, int] | None"]]
"""``read_key(message) -> (key, first_chunk)``: a received message's tracker key and, for a
chunked message, the entry of its first chunk (else None)."""


class AckTimeout:
    """Deadlines ``timeout_ms`` after each receive; ``expire(keys)`` for those still in flight.

    Parameters
    ----------
    timeout_ms : int
        The consumer's ``unacked_messages_timeout_ms``.
    expire : callable
        ``expire([(key, first_chunk), ...])`` (*first_chunk* None but for a chunked
        message), on the timer thread, no lock held; an exception is logged
        and the keys are tried again a second later (the tracker's failure policy).
    read_key : callable
        ``read_key(message) -> (key, first_chunk)`` for a received message (the id read,
        off the hot path: on the timer thread, or in :meth:`extend`).

    The consumer calls :attr:`received` with each message it hands to the application,
    :attr:`settled` with each message the application acknowledges, and :meth:`settle`
    for a message settled by its id.
    """

    timeout_ms: int
    received: Callable[[Any], None]
    """``received(message)``: the application got *message* (one C call appending it to the received log,
    any thread; past ``LOG_LIMIT`` entries the log is converted then, on that thread)."""
    settled: Callable[[Any], None]
    """``settled(message)``: the application acknowledged *message* (one C call, any thread): out of the
    received log if it is its last entry (the receive-then-ack pattern: freed by the ack), else logged as settled."""
    _received_log: list[Any]
    """Messages received (and ``(ledger, entry, batch_index)`` settled by id), in order, since the last conversion."""
    _settled_log: list[Any]
    """Message objects acknowledged since the last conversion."""
    _read_key: ReadKey
    _tracker: NegativeAcksTracker
    _expire: Callable[[list[tuple[MessageKey, tuple[int, int] | None]]], None]
    _in_flight: PendingNacks
    """The messages received more than a tick ago (converted) and not settled."""
    _pushed: dict[Item, int]
    """Messages whose deadline :meth:`extend` pushed: their latest deadline (earlier ones are ignored)."""
    _chunks: dict[Item, tuple[int, int]]
    """Chunked messages in flight: the entry of their first chunk (for the handoff)."""
    _lock: threading.Lock
    """Guards the in-flight set, ``_pushed`` and ``_chunks``."""
    _convert_lock: threading.Lock
    """One conversion at a time (the tick's, an expiry's, :meth:`extend`'s), so the logs are taken in order."""
    _ticker: DeadlineTimer

    def __init__(
        self, timeout_ms: int, expire: Callable[[list[tuple[MessageKey, tuple[int, int] | None]]], None],
        read_key: ReadKey,
    ) -> None:
        self.timeout_ms = check_ms("timeout_ms", timeout_ms, 1)
        if not callable(expire) or not callable(read_key):
            raise TypeError("expire and read_key must be callable")
        self._expire, self._read_key = expire, read_key
        self._received_log, self._settled_log = [], []
        self.received = functools.partial(_msgid.log_received, self._received_log, LOG_LIMIT, self.convert)
        self.settled = functools.partial(_msgid.settle_logged, self._received_log, self._settled_log)
        self._in_flight = PendingNacks()
        self._pushed, self._chunks = {}, {}
        self._lock, self._convert_lock = threading.Lock(), threading.Lock()
        self._tracker = NegativeAcksTracker(
            self._due, delay_ms=self.timeout_ms, precision_bits=PRECISION_BITS, round_up=True
        )
        # Ticks while the consumer is open, as the client's own ack-timeout tracker does.
        self._ticker = DeadlineTimer(self._tick, name="pulsar-nack-ack-timeout")
        self._ticker.request(monotonic_ms() + ACK_TIMEOUT_TICK_MS)

    def settle(self, item: Item) -> None:
        """*item* was nacked, dead-lettered, or acked by its id: the copies received before it do not expire. O(1)."""
        self._received_log.append(item)

    def extend(self, key: MessageKey) -> bool:
        """Push the deadline of *key* to ``timeout_ms`` from now; False if it is not in flight. O(1) but for the conversion."""
        self.convert()  # a message received within the last tick is in flight too
        item = (key[1], key[2], key[3])
        with self._lock:
            if item not in self._in_flight:
                return False
            self._pushed[item] = monotonic_ms() + self.timeout_ms
        self._tracker.add(key)
        return True

    # ------------------------------------------------------------------ the conversion

    def _tick(self, now: int) -> int:
        """DeadlineTimer callback: convert, and tick again (an error is logged: the next tick retries)."""
        try:
            self.convert()
        except Exception:
            _log.exception("ack timeout: converting the received messages failed")
        return now + ACK_TIMEOUT_TICK_MS

    def convert(self) -> None:
        """Give each message received and not settled since the last conversion its deadline.

        O(received + settled) on the calling thread; an id is read only for a message still
        unsettled, and for an object acknowledged after its own conversion.
        """
        with self._convert_lock:
            settled = _msgid.take_log(self._settled_log)  # first: every settled message's receive is in a log taken now or before
            received = _msgid.take_log(self._received_log)
            if not settled and not received:
                return
            settled_ids = set(map(id, settled))
            received_ids = set(map(id, received))
            # Acked after their own conversion (or acked as another object than the one received): by id.
            late = [self._read_key(m)[0] for m in settled if id(m) not in received_ids]
            if late:
                self._discard([(key[1], key[2], key[3]) for key in late])
            started: dict[Item, tuple[MessageKey, tuple[int, int] | None]] = {}
            for entry in received:
                if id(entry) in settled_ids:
                    continue  # settled within the tick: no id read
                if type(entry) is tuple:  # settled by id: the copies received before it
                    started.pop(entry, None)
                    self._discard([entry])
                    continue
                key, first_chunk = self._read_key(entry)
                item = (key[1], key[2], key[3])
                started.pop(item, None)  # a later copy's deadline replaces an earlier one's
                started[item] = (key, first_chunk)
            if started:
                self._start(list(started.values()))

    def _start(self, keys: list[tuple[MessageKey, tuple[int, int] | None]]) -> None:
        """The messages of *keys* are unsettled: each expires ``timeout_ms`` from now."""
        with self._lock:
            for key, first_chunk in keys:
                item = (key[1], key[2], key[3])
                if not self._in_flight.add(*item):  # delivered again while in flight: the earlier deadline goes
                    self._pushed[item] = monotonic_ms() + self.timeout_ms
                if first_chunk is not None:
                    self._chunks[item] = first_chunk
        for key, _ in keys:
            self._tracker.add(key)

    def _discard(self, items: list[Item]) -> None:
        """*items* are settled: they leave the in-flight set."""
        with self._lock:
            if not self._in_flight.count:
                return
            for item in items:
                self._in_flight.discard(*item)
                if self._pushed:
                    self._pushed.pop(item, None)
                if self._chunks:
                    self._chunks.pop(item, None)

    def _due(self, due: DueKeys) -> None:
        self.convert()  # the settles of the last tick first: a message settled before its deadline never expires
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

    # ------------------------------------------------------------------ counters

    def __len__(self) -> int:
        """Messages received and not settled (the logs converted first)."""
        self.convert()
        return self._in_flight.count

    def memory_bytes(self) -> int:
        """Bytes of the deadlines, the in-flight set and the logs (an estimate, as the tracker's)."""
        self.convert()
        with self._lock:
            pushed = sys.getsizeof(self._pushed) if self._pushed else 0
        logs = sys.getsizeof(self._received_log) + sys.getsizeof(self._settled_log)
        return self._tracker.stats()["memory_bytes"] + self._in_flight.memory_bytes() + pushed + logs

    def close(self) -> None:
        """Stop the timers; pending deadlines are dropped. Idempotent."""
        self._ticker.close()
        self._tracker.close(flush=False)
        self._received_log.clear()
        self._settled_log.clear()

