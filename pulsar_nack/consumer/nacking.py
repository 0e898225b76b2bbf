"""The broker-agnostic heart of a nacking consumer, shared by the sync and asyncio consumers.

:class:`NackingCore` owns everything between the application's calls and the client's
``negative_acknowledge(MessageId)`` handoff, and calls into no client itself:

* the :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` and its timer;
* the keying of messages and ids (:meth:`NackingCore.key_of`), with the topic taken from
  the message, from the consumer's only topic (plus ``-partition-N``), or kept inside
  the caller's id object when neither is known (a bare id on a multi-topic consumer);
* :class:`PendingNacks`, the compact set of nacked messages whose delay is not over,
  so that a copy of one of them (a batch sibling's redelivery, an ack timeout) is
  swallowed instead of delivered early;
* the handoff: due keys become one entry-level ``_pulsar.MessageId`` per entry, passed
  to the ``hand_off`` callable the consumer supplies (the sync consumer calls
  ``consumer.negative_acknowledge(id)`` for each);
* with a dead-letter policy, how often the application saw each unsettled message, and
  which messages go to the dead-letter topic (sent by the route the consumer supplies,
  :class:`~pulsar_nack.consumer.dead_letter.DeadLetterRoute`).

A consumer built on it calls :meth:`NackingCore.admit` on every received message (a
``_pulsar.Message``), :meth:`NackingCore.nack` for a negative acknowledgement,
:meth:`NackingCore.before_ack` before an acknowledgement, :meth:`NackingCore.reset`
before ``seek`` or ``redeliver_unacknowledged_messages``, and :meth:`NackingCore.close`.

Without a dead-letter policy, state is kept only while a nack is pending. Acknowledgements of batch messages rely on
batch-index acknowledgement (``batch_index_ack_enabled=True`` with a broker that has
``acknowledgmentAtBatchIndexLevelEnabled=true``, off by default in Pulsar 3.0 and 4.0): the
broker's ack set tells the client which siblings of a redelivered entry were acked, and
the client skips them. No per-entry object exists for batches in flight.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

import _pulsar
from pyroaring import BitMap64

from .._validate import check_ms, check_topics
from ..core.base import DueKeys
from ..core.keys import MAX_BATCH_INDEX, PARTITION_SUFFIX, MessageKey, redelivery_count_of
from ..core.tracker import NegativeAcksTracker
from ..errors import ClosedError
from . import msgid as _msgid
from .settings import COALESCE_MS, HANDOFF_DELAY_MS, ConsumerSettings

__all__ = [
    "COALESCE_MS",
    "DEAD_LETTER_RETRY_MS",
    "HANDOFF_DELAY_MS",
    "PARTITION_SUFFIX",
    "DeadLetterCallback",
    "HandOff",
    "NackingCore",
    "PendingNacks",
    "TopicMatcher",
    "batch_size_of",
    "client_handoff_latency_ms",
    "full_topic_name",
    "handoff_id",
    "handoff_lead_ms",
    "raw_id",
]

DEAD_LETTER_RETRY_MS = 1_000
"""A message whose dead letter was not stored comes back (to be routed again) after this long."""


def client_handoff_latency_ms(handoff_delay_ms: int) -> int:
    """How long the C++ client takes to redeliver an id nacked into an idle tracker.

    Its timer ticks every ``delay // 3`` ms (at least 100 ms delay) and redelivers the
    entries whose deadline is strictly past, so the id comes back on the first tick
    after ``delay``. O(1).

    >>> client_handoff_latency_ms(100)
    132
    >>> client_handoff_latency_ms(300)
    400
    """
    delay = max(handoff_delay_ms, HANDOFF_DELAY_MS)
    interval = delay // 3
    return (delay // interval + 1) * interval


def handoff_lead_ms(handoff_delay_ms: int, precision_bits: object, never_early: bool) -> int:
    """How early buckets fire: the client's full latency only where it is exact.

    A handoff into an idle client tracker comes back after :func:`client_handoff_latency_ms`;
    that holds while bursts are at least 165 ms apart, true for buckets of 256 ms and
    more. Below 8 precision bits, and with ``never_early``, buckets fire early by only
    the client's delay, so a message is never early.
    """
    exact = isinstance(precision_bits, int) and precision_bits >= 8 and not never_early
    return client_handoff_latency_ms(handoff_delay_ms) if exact else handoff_delay_ms


HandOff = Callable[[list[_pulsar.MessageId]], None]
"""What a consumer does with due entries: ``negative_acknowledge`` each id on its client."""
DeadLetterCallback = Callable[[Any, bool], None]
"""What a consumer does with a message for the dead-letter topic: ``route(message, stored)``."""
Item = tuple[int, int, int]
"""``(ledger_id, entry_id, batch_index)``: a message, whatever its topic (ledger ids are unique)."""

_BATCH_BITS = 10
_BATCH_LIMIT = 1 << _BATCH_BITS
_PACK_LIMIT = 1 << (64 - _BATCH_BITS)
_UNTITLED = ""  # the tracker topic of a key whose id object carries the real topic


def full_topic_name(topic: str) -> str:
    """``persistent://public/default/x`` for a short name ``x``, as the client does.

    >>> full_topic_name("orders")
    'persistent://public/default/orders'
    >>> full_topic_name("t/ns/orders")
    'persistent://t/ns/orders'
    """
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    return f"persistent://{topic}"


def raw_id(obj: Any) -> _pulsar.MessageId:
    """The ``_pulsar.MessageId`` of a message or id, ``pulsar`` wrapper or raw. O(1).

    Raises TypeError for anything else. Duck-typed on the wrappers' private fields
    (``pulsar.Message._message``, ``pulsar.MessageId._msg_id``), so this module does not
    import ``pulsar``.
    """
    if isinstance(obj, _pulsar.MessageId):
        return obj
    if isinstance(obj, _pulsar.Message):
        return obj.message_id()
    inner = getattr(obj, "_message", None)
    if isinstance(inner, _pulsar.Message):
        return inner.message_id()
    inner = getattr(obj, "_msg_id", None)
    if isinstance(inner, _pulsar.MessageId):
        return inner
    message_id = getattr(obj, "message_id", None)  # a stand-in message (unit tests)
    if callable(message_id) and callable(getattr(obj, "topic_name", None)):
        return raw_id(message_id())
    raise TypeError(f"expected a pulsar Message or MessageId, not {type(obj).__name__}")


def _is_message(obj: Any) -> bool:
    return not isinstance(obj, _pulsar.MessageId) and callable(getattr(obj, "topic_name", None))


def _item_of(message_id: _pulsar.MessageId) -> Item:
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


def batch_size_of(message_id: _pulsar.MessageId) -> int:
    """``batch_size`` of a serialized ``MessageIdData`` (protobuf field 6), or 0 if absent. O(1)."""
    return int(_msgid.parse_id(message_id.serialize())[4])


def handoff_id(topic: str, ledger_id: int, entry_id: int) -> _pulsar.MessageId:
    """The entry-level id the client redelivers: partition from the topic name, topic set.

    The multi-topic C++ consumer routes ids by topic name and silently drops ids without one.
    """
    match = PARTITION_SUFFIX.search(topic)
    message_id = _pulsar.MessageId(int(match.group(1)) if match else -1, ledger_id, entry_id, -1)
    if topic:
        message_id.topic_name(topic)
    return message_id


class TopicMatcher:
    """Which topics a consumer reads: a list of names, or a regular expression.

    ``partition`` topics of a listed topic match too. Runtime complexity: O(1) for a list
    (a set lookup), the regex's cost for a pattern.
    """

    __slots__ = ("names", "pattern")

    names: frozenset[str]
    pattern: re.Pattern[str] | None

    def __init__(self, topics: Iterable[str] | re.Pattern[str]) -> None:
        if isinstance(topics, re.Pattern):
            if not isinstance(topics.pattern, str):
                raise TypeError("a topic pattern must be a str pattern, not bytes")
            self.names, self.pattern = frozenset(), topics
            return
        topic_list = check_topics("topics", topics)
        self.names, self.pattern = frozenset(full_topic_name(t) for t in topic_list), None

    @property
    def single(self) -> str | None:
        """The consumer's one topic, or None for several topics or a pattern."""
        return next(iter(self.names)) if len(self.names) == 1 else None

    def __contains__(self, topic: str) -> bool:
        base = PARTITION_SUFFIX.sub("", topic)
        if self.pattern is not None:
            return bool(self.pattern.fullmatch(base) or self.pattern.fullmatch(base.split("://", 1)[-1]))
        return topic in self.names or base in self.names

    def __repr__(self) -> str:
        return f"TopicMatcher({self.pattern.pattern!r})" if self.pattern else f"TopicMatcher({sorted(self.names)})"


class PendingNacks:
    """The set of nacked messages whose delay is not over, a few bytes each.

    Keyed by ledger id (ledger ids are unique in a cluster, across topics), then one
    :class:`pyroaring.BitMap64` of ``entry_id << 10 | (batch_index + 1)`` values, so the
    messages of consecutive entries share Roaring containers. Values that do not pack
    (a batch index of 1023 or more, an entry id of ``2**54`` or more) go to a plain set.

    Not thread-safe: :class:`NackingCore` holds its lock around every call. ``count``
    (the number of messages) may be read without it, as a hint.

    >>> p = PendingNacks()
    >>> p.add(7, 100, 3); (7, 100, 3) in p, (7, 100, 4) in p, len(p)
    (True, False, 1)
    >>> p.discard(7, 100, 3); len(p)
    0
    """

    __slots__ = ("_by_ledger", "_wide", "count")

    _by_ledger: dict[int, BitMap64]
    _wide: set[tuple[int, int, int]]
    count: int

    def __init__(self) -> None:
        self._by_ledger = {}
        self._wide = set()
        self.count = 0

    def add(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        """Add a message. O(log n) in the ledger's bitmap."""
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            if bitmap is None:
                bitmap = self._by_ledger[ledger_id] = BitMap64()
            value = entry_id << _BATCH_BITS | (batch_index + 1)
            if value not in bitmap:
                bitmap.add(value)
                self.count += 1
        elif (ledger_id, entry_id, batch_index) not in self._wide:
            self._wide.add((ledger_id, entry_id, batch_index))
            self.count += 1

    def discard(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        """Remove a message if present. O(log n)."""
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            value = entry_id << _BATCH_BITS | (batch_index + 1)
            if bitmap is not None and value in bitmap:
                bitmap.discard(value)
                self.count -= 1
                if not bitmap:
                    del self._by_ledger[ledger_id]
        elif (ledger_id, entry_id, batch_index) in self._wide:
            self._wide.discard((ledger_id, entry_id, batch_index))
            self.count -= 1

    def __contains__(self, item: tuple[int, int, int]) -> bool:
        ledger_id, entry_id, batch_index = item
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            return bitmap is not None and (entry_id << _BATCH_BITS | (batch_index + 1)) in bitmap
        return item in self._wide

    def __len__(self) -> int:
        return self.count

    def clear(self) -> None:
        self._by_ledger.clear()
        self._wide.clear()
        self.count = 0

    def memory_bytes(self) -> int:
        """Serialized size of the bitmaps plus the dict and set slots (an estimate). O(ledgers)."""
        total = 64 * len(self._by_ledger) + 100 * len(self._wide)
        return total + sum(b.get_statistics()["n_bytes_array_containers"] + b.get_statistics()[
            "n_bytes_bitset_containers"] + b.get_statistics()["n_bytes_run_containers"] for b in self._by_ledger.values())

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        # The count is the number of stored values; no empty bitmap is kept.
        assert self.count == sum(len(b) for b in self._by_ledger.values()) + len(self._wide)
        assert all(self._by_ledger.values())


def _counter_value(counter: itertools.count[int]) -> int:
    """How many times ``next`` was called on a counter started at 0 (read without advancing)."""
    return int(repr(counter)[6:-1])


class NackingCore:
    """Tracker, pending set, keys, handoff and dead-letter counts of one consumer; no client calls.

    Parameters
    ----------
    hand_off : callable
        Called from the tracker's timer thread (and by :meth:`close`) with the
        entry-level ids to redeliver; it must ``negative_acknowledge`` each on the
        client. No lock is held during the call. If it raises, the tracker logs the
        error and retries the keys after ``retry_delay_ms``.
    topics : list of str, str, re.Pattern, or TopicMatcher
        What the consumer reads; messages of other topics are refused.
    settings : ConsumerSettings, optional
        The tracker's settings, the handoff's and the dead-letter policy (defaults:
        ``ConsumerSettings()``).

    Dead letters
        With a dead-letter policy of ``max_redeliver_count`` N, the core counts how
        often the application saw each unsettled message: the larger of its own count
        of nacks of it and the broker's ``redelivery_count()`` minus the copies of it
        that were swallowed (the broker counts per entry, swallowed copies included,
        and forgets the count when a sibling is acked; neither figure is ever above the
        true count). As in the C++ client, a message seen N + 1 times (counts 0 … N) is
        routed to the dead-letter topic when the application nacks it, and a message
        that arrives after that (brought back by an ack timeout, by
        ``redeliver_unacknowledged_messages``, by a sibling's redelivery, or by the
        broker in any other way) is routed there instead of being delivered. The route is the
        callable given to :meth:`route_dead_letters`, called outside the lock; it
        reports back through :meth:`dead_letter_stored` and :meth:`dead_letter_failed`.
    """

    tracker: NegativeAcksTracker
    topics: TopicMatcher
    settings: ConsumerSettings
    guard_unbatched: bool
    max_redeliver_count: int | None
    counting: bool
    pending: PendingNacks
    _hand_off_ids: HandOff
    _route: DeadLetterCallback | None
    _bare: dict[tuple[int, int], _pulsar.MessageId]
    _copies: dict[Item, int]
    _nacks: dict[Item, int]
    _last: dict[Item, Any]
    _sending: set[Item]
    _stored: PendingNacks
    _lock: threading.Lock
    _counts: dict[str, int]

    def __init__(
        self,
        hand_off: HandOff,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None = None,
    ) -> None:
        if not callable(hand_off):
            raise TypeError("hand_off must be callable")
        if settings is None:
            settings = ConsumerSettings()
        elif not isinstance(settings, ConsumerSettings):
            raise TypeError(f"settings must be a ConsumerSettings, not {type(settings).__name__}")
        self.settings = settings
        self.topics = topics if isinstance(topics, TopicMatcher) else TopicMatcher(topics)
        self.guard_unbatched = settings.guard_unbatched
        self.max_redeliver_count = settings.max_redeliver_count
        self.counting = self.max_redeliver_count is not None
        self._hand_off_ids = hand_off
        self._route = None
        self.pending = PendingNacks()
        self._bare = {}
        self._copies, self._nacks, self._last = {}, {}, {}
        self._sending = set()
        self._stored = PendingNacks()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("swallowed", "dead_lettered", "handed_off_entries", "handoff_bursts"), 0)
        self.received = itertools.count()
        self.acked = itertools.count()
        self._nacked = itertools.count()
        bits, never_early = settings.negative_ack_precision_bit_cnt, settings.never_early
        self.tracker = NegativeAcksTracker(
            self._on_due,
            delay_ms=settings.negative_ack_redelivery_delay_ms,
            precision_bits=bits,
            round_up=never_early,
            backoff=settings.redelivery_backoff,
            lead_ms=handoff_lead_ms(settings.handoff_delay_ms, bits, never_early),
            coalesce_ms=settings.coalesce_ms,
            default_topic=self.topics.single or "",
        )
        self.handoff_delay_ms = settings.handoff_delay_ms
        # nack() may skip the general path: no backoff, no guard, no delivery counts.
        self._fast_nack = settings.redelivery_backoff is None and not self.guard_unbatched and not self.counting

    def route_dead_letters(self, route: DeadLetterCallback) -> None:
        """Set where messages for the dead-letter topic go: ``route(message, stored)``.

        ``stored`` is False for a message to send (then acknowledge), True for a copy of
        one whose dead letter is already stored (to acknowledge again).
        """
        if not callable(route):
            raise TypeError("route must be callable")
        self._route = route

    # ------------------------------------------------------------------ receiving

    def admit(self, message: _pulsar.Message) -> bool:
        """Record a received message; False if the application must not see it.

        That is an early copy of a message whose nack is pending (swallowed, left
        unacked), or, with a dead-letter policy, a message seen often enough (routed to
        the dead-letter topic). Runtime complexity: O(1) with nothing pending and no
        dead-letter policy (one counter step); otherwise one id read and a bitmap
        lookup.
        """
        next(self.received)
        if self.counting:
            return self._admit_counted(message)
        if not self.pending.count:
            return True
        message_id = message.message_id()
        batch_index = message_id.batch_index()
        if batch_index < 0 and not self.guard_unbatched:
            return True
        item = (message_id.ledger_id(), message_id.entry_id(), batch_index)
        with self._lock:
            if item not in self.pending:
                return True
            self._counts["swallowed"] += 1
        return False

    def _admit_counted(self, message: _pulsar.Message) -> bool:
        """:meth:`admit` with a dead-letter policy: count, deliver, swallow or route."""
        limit = self.max_redeliver_count
        assert limit is not None
        count = message.redelivery_count()
        if count < limit and not (self.pending.count or self._nacks or self._sending or self._stored.count):
            return True  # the common path: nothing to compare with
        message_id = message.message_id()
        batch_index = message_id.batch_index()
        item = (message_id.ledger_id(), message_id.entry_id(), batch_index)
        route: bool | None  # None: swallow; else route it (True: its dead letter is stored already)
        with self._lock:
            if (batch_index >= 0 or self.guard_unbatched) and item in self.pending:
                self._copies[item] = self._copies.get(item, 0) + 1
                route = None
            elif item in self._sending:
                route = None  # its dead letter is on the way
            elif item in self._stored:
                route = True  # a copy of a stored dead letter: acknowledge it again
            else:
                seen = max(self._nacks.get(item, 0), count - self._copies.get(item, 0))
                if seen <= limit:
                    if seen == limit:  # its last delivery: a nack or a redelivery sends it
                        self._last[item] = message
                    return True
                self._sending.add(item)
                self._last.pop(item, None)
                route = False
            self._counts["swallowed"] += 1
        if route is not None:
            self._send_dead_letter(message, route)
        return False

    def _send_dead_letter(self, message: Any, stored: bool) -> None:
        route = self._route
        if route is None:
            raise RuntimeError("a dead-letter policy without a route: call route_dead_letters() first")
        route(message, stored)

    def dead_letter_stored(self, message: Any) -> None:
        """The route stored the dead letter of *message*: count it, remember it, forget its counts."""
        item = _item_of(raw_id(message))
        with self._lock:
            self._sending.discard(item)
            self._stored.add(*item)
            self._copies.pop(item, None)
            self._nacks.pop(item, None)
            self._last.pop(item, None)
            self._counts["dead_lettered"] += 1

    def dead_letter_failed(self, message: Any) -> None:
        """The route could not store the dead letter of *message*: it comes back and is tried again.

        The message stays unacknowledged; it is handed to the client after
        ``DEAD_LETTER_RETRY_MS``, and when it arrives it is routed again.
        """
        item = _item_of(raw_id(message))
        limit = self.max_redeliver_count
        with self._lock:
            self._sending.discard(item)
            if limit is not None:  # the next arrival is routed, whatever the broker counts
                self._nacks[item] = max(self._nacks.get(item, 0), limit + 1)
        try:
            self.tracker.add(self.key_of(message)[0], DEAD_LETTER_RETRY_MS)
        except ClosedError:
            pass  # closing: the broker redelivers it when this consumer is gone

    def forget(self, message: Any) -> None:
        """Drop the delivery counts of a settled message (acked or dead-lettered). O(1)."""
        if self._copies or self._nacks or self._last:
            item = _item_of(raw_id(message))
            with self._lock:
                self._copies.pop(item, None)
                self._nacks.pop(item, None)
                self._last.pop(item, None)

    # ------------------------------------------------------------------ settling

    def key_of(self, message: Any) -> tuple[MessageKey, _pulsar.MessageId]:
        """The tracker key of a message or id, and its raw id; validates, changes nothing.

        Raises
        ------
        TypeError
            For something that is not a pulsar message or id.
        ValueError
            For a message of a topic this consumer does not read, or a batch index
            outside the id's batch.
        """
        inner = getattr(message, "_message", None)
        if isinstance(inner, _pulsar.Message):  # a pulsar.Message: the common path, no checks needed
            raw = inner.message_id()
            topic = inner.topic_name()
            if topic not in self.topics.names and topic not in self.topics:
                raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")
            return (topic, raw.ledger_id(), raw.entry_id(), raw.batch_index()), raw
        raw = raw_id(message)
        batch_index = raw.batch_index()
        if _is_message(message):
            topic = message.topic_name()
            if topic not in self.topics:
                raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")
        else:
            if batch_index >= 0:
                size = batch_size_of(raw)
                if size and batch_index >= size:
                    raise ValueError(f"batch index {batch_index} is outside its batch of {size} messages")
            if batch_index > MAX_BATCH_INDEX:
                raise ValueError(f"batch_index must be below 2**31, got {batch_index}")
            single = self.topics.single
            if single is None:
                topic = _UNTITLED  # the id object knows its topic; we keep the object
            else:
                partition = raw.partition()
                topic = f"{single}-partition-{partition}" if partition >= 0 else single
        return (topic, raw.ledger_id(), raw.entry_id(), batch_index), raw

    def nack(self, message: Any, delay_ms: int | None = None) -> None:
        """Track a negative acknowledgement: the message comes back after its delay.

        With a dead-letter policy, a message at its last delivery goes to the
        dead-letter topic instead (see the class notes). Runtime complexity: O(1) (the
        tracker's add) plus a bitmap insert for a message that must be remembered
        (batched, guarded, or a bare id of unknown topic).

        Raises TypeError or ValueError for bad input (nothing changes then).
        """
        inner = getattr(message, "_message", None)
        if (
            delay_ms is None
            and self._fast_nack
            and isinstance(inner, _pulsar.Message)
            and (fast_key := _msgid.message_key(inner))[3] < 0
        ):
            # The common call: a received non-batched pulsar.Message, the fixed delay.
            topic = fast_key[0]
            if topic not in self.topics.names and topic not in self.topics:
                raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")
            self.tracker.add(fast_key)
            next(self._nacked)
            return
        if delay_ms is not None:
            check_ms("delay_ms", delay_ms)
        key, raw = self.key_of(message)
        if self.counting and self._last and self._nack_to_dead_letter(key):
            next(self._nacked)
            return
        count = None
        if delay_ms is None and self.tracker.backoff is not None:
            count = redelivery_count_of(message)
        if key[3] < 0 and not self.guard_unbatched and key[0] is not _UNTITLED and not self.counting:
            self.tracker.add(key, delay_ms, count)
            next(self._nacked)
            return
        self._track(key, raw, delay_ms, count)
        next(self._nacked)

    def _nack_to_dead_letter(self, key: MessageKey) -> bool:
        """Route a message at its last delivery to the dead-letter topic; False if it is not there."""
        item = (key[1], key[2], key[3])
        with self._lock:
            last = self._last.pop(item, None)
            if last is None:
                return False
            self._sending.add(item)
        self._send_dead_letter(last, False)
        return True

    def _track(self, key: MessageKey, raw: _pulsar.MessageId, delay_ms: int | None, count: int | None) -> None:
        """:meth:`nack` for a message that is remembered (batched, guarded, bare or counted)."""
        item = (key[1], key[2], key[3])
        remember = key[3] >= 0 or self.guard_unbatched or key[0] is _UNTITLED
        with self._lock:
            if item in self.pending:
                raise ValueError(f"message {key} is already NACKED (its nack is pending)")
            if self.counting:
                self._nacks[item] = self._nacks.get(item, 0) + 1
            if remember:
                self.pending.add(*item)
            if key[0] is _UNTITLED:
                self._bare[(key[1], key[2])] = raw
        try:
            self.tracker.add(key, delay_ms, count)
        except BaseException:
            with self._lock:
                if remember:
                    self.pending.discard(*item)
                self._bare.pop((key[1], key[2]), None)
                if self.counting:
                    self._nacks[item] -= 1
            raise

    def before_ack(self, message: Any) -> _pulsar.MessageId:
        """Validate an acknowledgement and forget the message's pending nack and counts; return its raw id.

        Raises TypeError or ValueError for bad input (nothing changes then). O(1).
        """
        if self.pending.count or self._nacks or self._copies or self._last or not _is_message(message):
            key, raw = self.key_of(message)
            if self.pending.count:
                with self._lock:
                    self.pending.discard(key[1], key[2], key[3])
            self.forget(raw)
            return raw
        return raw_id(message)

    # ------------------------------------------------------------------ handoff

    def _on_due(self, due: DueKeys) -> None:
        """Tracker callback: hand each due entry to the client once, in one burst."""
        ids = []
        released = []
        with self._lock:
            for topic, keys in due.items():
                seen: set[tuple[int, int]] = set()
                for _, ledger_id, entry_id, batch_index in keys:
                    released.append((ledger_id, entry_id, batch_index))
                    if (ledger_id, entry_id) in seen:
                        continue
                    seen.add((ledger_id, entry_id))
                    if topic is _UNTITLED or topic == _UNTITLED:
                        bare = self._bare.pop((ledger_id, entry_id), None)
                        if bare is not None:
                            ids.append(bare)
                    else:
                        ids.append(handoff_id(topic, ledger_id, entry_id))
            self._counts["handed_off_entries"] += len(ids)
            self._counts["handoff_bursts"] += bool(ids)
        if ids:
            self._hand_off_ids(ids)
        with self._lock:  # after the handoff: the copies arrive 100 ms later, to be delivered
            for item in released:
                self.pending.discard(*item)

    # ------------------------------------------------------------------ resets

    def reset(self, forget_counts: bool = True) -> DueKeys:
        """Forget every pending nack; return them.

        Before ``redeliver_unacknowledged_messages`` (``forget_counts=False``: the
        messages come back now, and their delivery counts still hold) or ``seek``
        (``True``: the subscription starts afresh, dead letters included).
        """
        with self._lock:
            dropped = self.tracker.drain()
            self.pending.clear()
            self._bare.clear()
            if forget_counts:
                self._copies.clear()
                self._nacks.clear()
                self._last.clear()
                self._stored.clear()
        return dropped

    def close(self, redeliver_pending: bool) -> None:
        """Stop the tracker: hand every pending nack off now, or leave it unacked."""
        self.tracker.close(flush=redeliver_pending)
        with self._lock:
            self.pending.clear()
            self._bare.clear()
            self._copies.clear()
            self._nacks.clear()
            self._last.clear()
            self._stored.clear()

    # ------------------------------------------------------------------ counters

    def counts(self) -> dict[str, int]:
        """Counters: received, swallowed, delivered, acked, nacked, dead-lettered, handoffs, pending batch messages."""
        with self._lock:
            counts = dict(self._counts)
            pending = len(self.pending)
        received = _counter_value(self.received)
        return {
            "received": received,
            "delivered": received - counts["swallowed"],
            "acked": _counter_value(self.acked),
            "nacked": _counter_value(self._nacked),
            **counts,
            "pending_guarded": pending,
        }

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        with self._lock:
            self.pending._check()
            self._stored._check()
            # Every bare id waiting for its handoff is a pending key.
            assert len(self._bare) <= len(self.tracker) or not self._bare
            # A message is at most one of: at its last delivery, on its way to the DLQ.
            assert not (set(self._last) & self._sending)
