"""`NackingConsumer` and `subscribe()`: a `pulsar.Consumer` with our tracker inside.

The application keeps the consumer API it knows; ``negative_acknowledge`` goes to a
:class:`~pulsar_nack.tracker.NegativeAcksTracker` instead of the client's own tracker.

Handoff to the client
    The Python client can redeliver specific messages in one way only:
    ``negative_acknowledge(MessageId)``, into the C++ tracker (min delay 100 ms, a timer
    every delay/3). So the consumer is subscribed with
    ``negative_ack_redelivery_delay_ms=handoff_delay_ms`` (100). The client's timer
    ticks every ``delay // 3`` (33 ms) from the first nack and releases only entries
    strictly past due, so a handoff to an idle tracker comes back on the 4th tick,
    132 ms later (measured: 134-137 ms with the broker round trip on loopback). Our
    buckets fire early by exactly that client latency (:func:`client_handoff_latency_ms`),
    so a message arrives a few ms after its bucket deadline. That holds while the
    client's tracker is idle at each handoff, i.e. bursts at least 165 ms apart (its
    last tick runs 33 ms after a redelivery): true for buckets of 256 ms and more.
    Below 8 precision bits, and with ``never_early``, buckets fire early by only the
    client's delay (100 ms): a message then arrives 0-33 ms after its bucket deadline,
    never before it. Each due entry is handed over as
    ``_pulsar.MessageId(partition, ledger, entry, -1)`` with its topic name set (the
    multi-topic consumer routes by it and silently drops ids without one).

Bursts, not a trickle
    Every ``negative_acknowledge`` into the C++ client re-arms its ~33 ms timer, so
    handoffs closer together than that starve it. The tracker coalesces: one burst per
    due bucket, never two bursts less than ``coalesce_ms`` (50) apart; a bucket falling
    due sooner waits for the gap (it matters only below 6 precision bits, where
    buckets are closer than 64 ms).

Batch-index awareness
    The broker redelivers whole entries. For every batched entry in flight we keep one
    byte per batch index (:class:`BatchIndexState`). A redelivered copy yields only the
    indexes that are released (their own nack delay is over) or never delivered;
    acked, in-flight and still-pending siblings are swallowed. Swallowed copies stay
    unacked, so nothing is lost; when every index of an entry is acked, the entry is
    acked as a whole and its state dropped.
"""

from __future__ import annotations

import enum
import logging
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

import _pulsar
import pulsar

from ._base import DueKeys
from ._validate import check_bool, check_int, check_ms, check_topics
from .backoff import RedeliveryBackoff
from .buckets import DEFAULT_PRECISION_BITS
from .errors import ConsumerClosedError
from .keys import PARTITION_SUFFIX as _PARTITION_SUFFIX
from .keys import MessageKey, redelivery_count_of
from .timer import monotonic_ms
from .tracker import NegativeAcksTracker, TrackerStats

__all__ = ["BatchIndexState", "ConsumerClosedError", "ConsumerStats", "NackingConsumer", "subscribe"]

_log = logging.getLogger(__name__)

HANDOFF_DELAY_MS = 100
"""The C++ client's minimum nack delay: what the wrapped consumer is subscribed with."""


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


def _handoff_lead_ms(handoff_delay_ms: int, precision_bits: object, never_early: bool) -> int:
    """How early buckets fire: the client's full latency only where it is exact (see above)."""
    exact = isinstance(precision_bits, int) and precision_bits >= 8 and not never_early
    return client_handoff_latency_ms(handoff_delay_ms) if exact else handoff_delay_ms


COALESCE_MS = 50
"""Minimum gap between handoff bursts; above the C++ timer interval (delay/3 = 33 ms)."""
SETTLED_MEMORY = 4096
"""Entries settled after a nack that are remembered, to swallow straggling copies."""
_EntryKey = tuple[str, int, int]  # (topic, ledger_id, entry_id)


class BatchIndexState(enum.IntEnum):
    """Where one message of a batched entry stands."""

    NOT_DELIVERED = 0  # not handed to the application yet
    IN_FLIGHT = 1  # delivered, not settled
    ACKED = 2
    NACKED = 3  # negatively acknowledged, its delay not over
    RELEASED = 4  # its delay is over: the next copy of the entry delivers it


class _BatchEntry:
    """Per-index states of one batched entry in flight. One byte per index."""

    __slots__ = ("irregular", "states")

    states: bytearray
    irregular: bool  # a nack or a swallowed copy happened: settle by an entry-level ack

    def __init__(self, size: int) -> None:
        self.states = bytearray(size)
        self.irregular = False

    def grow(self, index: int) -> None:
        if index >= len(self.states):
            self.states.extend(bytes(index + 1 - len(self.states)))

    def settled(self) -> bool:
        return self.states.count(BatchIndexState.ACKED) == len(self.states)


class ConsumerStats(TypedDict):
    """Counters of a :class:`NackingConsumer`, with its tracker's stats."""

    received: int
    delivered: int
    swallowed: int
    acked: int
    nacked: int
    handed_off_entries: int
    handoff_bursts: int
    open_batch_entries: int
    tracker: TrackerStats


def _batch_size(message_id: Any) -> int:
    """``batch_size`` from a serialized ``MessageIdData`` (protobuf field 6), or 0."""
    try:
        data = message_id.serialize()
    except Exception:
        return 0
    pos, size = 0, 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            if field == 6:
                size = value
        elif wire == 2:
            length, pos = _varint(data, pos)
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            return 0
    return size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _raw_id(obj: Any) -> Any:
    """The ``_pulsar.MessageId`` of a message or id, wrapped or raw."""
    if isinstance(obj, _pulsar.MessageId):
        return obj
    if isinstance(obj, (pulsar.Message, _pulsar.Message)):
        return _raw_id(obj.message_id())
    inner = getattr(obj, "_msg_id", None)
    if isinstance(inner, _pulsar.MessageId):
        return inner
    raise TypeError(f"expected a pulsar Message or MessageId, not {type(obj).__name__}")


def _handoff_id(topic: str, ledger_id: int, entry_id: int) -> _pulsar.MessageId:
    """The entry-level id the client redelivers: partition from the topic name, topic set."""
    match = _PARTITION_SUFFIX.search(topic)
    message_id = _pulsar.MessageId(int(match.group(1)) if match else -1, ledger_id, entry_id, -1)
    if topic:
        message_id.topic_name(topic)
    return message_id


class NackingConsumer:
    """A ``pulsar.Consumer`` whose negative acknowledgements use PIP-393 time buckets.

    Create it with :func:`subscribe` (recommended) or :meth:`wrap`. The methods mirror
    ``pulsar.Consumer``; ``negative_acknowledge`` takes an optional per-call
    ``delay_ms``. Messages and ids may be ``pulsar`` or ``_pulsar`` objects.

    Parameters
    ----------
    consumer : pulsar.Consumer
        Subscribed with ``negative_ack_redelivery_delay_ms=handoff_delay_ms``.
    topics : list of str
        The topics the consumer reads (to refuse messages of other consumers).
    negative_ack_redelivery_delay_ms : int
        Fixed delay when no per-call delay or backoff applies. Default 60 s.
    negative_ack_precision_bit_cnt : int
        Deadlines are trimmed by this many bits (default 8: 256 ms buckets; a message
        may come back up to ``2**bits - 1`` ms early unless ``never_early``).
    redelivery_backoff : RedeliveryBackoff, optional
        Delay by the message's redelivery count.
    never_early : bool
        Round deadlines up instead of down.
    handoff_delay_ms, coalesce_ms : int
        The consumer's own nack delay (we hand off that much early) and the minimum gap
        between handoff bursts. Leave the defaults unless you measured.
    """

    tracker: NegativeAcksTracker
    _consumer: pulsar.Consumer
    _topics: frozenset[str]
    _batches: dict[_EntryKey, _BatchEntry]
    _settled: dict[_EntryKey, None]  # recently settled irregular entries, oldest first
    _lock: threading.Lock
    _closed: bool
    _counts: dict[str, int]

    def __init__(
        self,
        consumer: pulsar.Consumer,
        topics: Iterable[str],
        *,
        negative_ack_redelivery_delay_ms: int = 60_000,
        negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS,
        redelivery_backoff: RedeliveryBackoff | None = None,
        never_early: bool = False,
        handoff_delay_ms: int = HANDOFF_DELAY_MS,
        coalesce_ms: int = COALESCE_MS,
    ) -> None:
        if not isinstance(consumer, pulsar.Consumer):
            raise TypeError(f"consumer must be a pulsar.Consumer, not {type(consumer).__name__}")
        topic_list = check_topics("topics", topics)
        check_int("handoff_delay_ms", handoff_delay_ms, 0)
        check_int("coalesce_ms", coalesce_ms, 0)
        self._consumer = consumer
        self._topics = frozenset(_full_topic_name(t) for t in topic_list)
        self._batches = {}
        self._settled = {}
        self._lock = threading.Lock()
        self._closed = False
        self._counts = dict.fromkeys(
            ("received", "delivered", "swallowed", "acked", "nacked", "handed_off_entries", "handoff_bursts"), 0
        )
        self.handoff_delay_ms = handoff_delay_ms
        self.tracker = NegativeAcksTracker(
            self._hand_off,
            delay_ms=negative_ack_redelivery_delay_ms,
            precision_bits=negative_ack_precision_bit_cnt,
            round_up=never_early,
            backoff=redelivery_backoff,
            lead_ms=_handoff_lead_ms(handoff_delay_ms, negative_ack_precision_bit_cnt, never_early),
            coalesce_ms=coalesce_ms,
            default_topic=topic_list[0] if len(topic_list) == 1 else "",
        )

    @classmethod
    def wrap(
        cls,
        consumer: pulsar.Consumer,
        topics: Iterable[str],
        *,
        handoff_delay_ms: int | None = None,
        **kwargs: Any,
    ) -> NackingConsumer:
        """Wrap an existing consumer.

        Python cannot read a consumer's ``negative_ack_redelivery_delay_ms``, so state it
        as *handoff_delay_ms*. Handed-off messages come back that much after the handoff;
        if it is longer than the delays you ask for, they cannot be on time, and a
        ``RuntimeWarning`` says so. Unknown (None) is taken as pulsar's default, 60 s.
        """
        delay = kwargs.get("negative_ack_redelivery_delay_ms", 60_000)
        if handoff_delay_ms is None:
            handoff_delay_ms = 60_000
            warnings.warn(
                "NackingConsumer.wrap: the consumer's negative_ack_redelivery_delay_ms is unknown; "
                "assuming pulsar's default 60000 ms, so every redelivery comes about 60 s late. "
                "Subscribe with negative_ack_redelivery_delay_ms=100 (or use pulsar_nack.subscribe) "
                "and pass handoff_delay_ms=100.",
                RuntimeWarning,
                stacklevel=2,
            )
        elif handoff_delay_ms > delay:
            warnings.warn(
                f"NackingConsumer.wrap: the consumer's own nack delay ({handoff_delay_ms} ms) is longer "
                f"than the requested delay ({delay} ms); redeliveries will come late.",
                RuntimeWarning,
                stacklevel=2,
            )
        return cls(consumer, topics, handoff_delay_ms=handoff_delay_ms, **kwargs)

    # ------------------------------------------------------------------ receiving

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """Receive the next message the application should see.

        Copies of batch siblings that are acked, in flight or still waiting for their
        own delay are swallowed here (left unacked). Raises ``pulsar.Timeout`` as the
        client does when nothing arrives within *timeout_millis*.
        """
        self._check_open()
        if timeout_millis is not None:
            check_int("timeout_millis", timeout_millis, 0)
        deadline = None if timeout_millis is None else monotonic_ms() + timeout_millis
        while True:
            if deadline is None:
                message = self._consumer.receive()
            else:
                message = self._consumer.receive(max(deadline - monotonic_ms(), 0))
            if self._admit(message):
                return message

    def batch_receive(self) -> list[pulsar.Message]:
        """Receive a batch (per the consumer's batch receive policy), swallowed copies removed."""
        self._check_open()
        return [m for m in self._consumer.batch_receive() if self._admit(m)]

    def _admit(self, message: Any) -> bool:
        """Record a received message; False if it is a copy to swallow. O(1)."""
        message_id = message.message_id()
        batch_index = message_id.batch_index()
        with self._lock:
            self._counts["received"] += 1
            if batch_index < 0:
                self._counts["delivered"] += 1
                return True
            entry_key = (message.topic_name(), message_id.ledger_id(), message_id.entry_id())
            entry = self._batches.get(entry_key)
            if entry is None:
                if entry_key in self._settled:
                    # A copy still in the receive queue of an entry acked as a whole.
                    self._counts["swallowed"] += 1
                    return False
                entry = self._batches[entry_key] = _BatchEntry(_batch_size(message_id))
            entry.grow(batch_index)
            state = entry.states[batch_index]
            if state in (BatchIndexState.NOT_DELIVERED, BatchIndexState.RELEASED):
                entry.states[batch_index] = BatchIndexState.IN_FLIGHT
                self._counts["delivered"] += 1
                return True
            entry.irregular = True
            self._counts["swallowed"] += 1
            return False

    # ------------------------------------------------------------------ settling

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or id (wrapped or raw)."""
        self._check_open()
        raw = _raw_id(message)
        settle = self._settle(message, raw, BatchIndexState.ACKED)
        self._consumer.acknowledge(message)
        if settle is not None:
            self._consumer.acknowledge(settle)
        with self._lock:
            self._counts["acked"] += 1

    def acknowledge_cumulative(self, message: Any) -> None:
        """Acknowledge everything up to *message* (not supported on Shared subscriptions).

        Batch state of the acknowledged topic is dropped: everything in it is settled.
        """
        self._check_open()
        _raw_id(message)
        self._consumer.acknowledge_cumulative(message)
        topic = self._topic_of(message)
        with self._lock:
            for entry_key in [k for k in self._batches if k[0] == topic]:
                del self._batches[entry_key]

    def negative_acknowledge(self, message: Any, delay_ms: int | None = None) -> None:
        """Redeliver *message* after *delay_ms*, the backoff's delay, or the fixed delay.

        Raises
        ------
        TypeError
            For something that is not a pulsar message or id, or a non-int delay.
        ValueError
            For a negative delay, a message of another consumer, or a batch message that
            is not in flight here (already acked or already nacked).
        ConsumerClosedError
            After :meth:`close`.
        """
        self._check_open()
        raw = _raw_id(message)
        if delay_ms is not None:
            check_ms("delay_ms", delay_ms)
        key = self._key(message, raw)
        if key[3] >= 0:
            with self._lock:
                entry = self._batch_entry(key)
                self._transition(entry, key[3], BatchIndexState.NACKED)
                try:
                    self.tracker.add(key, delay_ms, self._redelivery_count(message, delay_ms))
                except BaseException:
                    entry.states[key[3]] = BatchIndexState.IN_FLIGHT
                    raise
                entry.irregular = True
                self._counts["nacked"] += 1
            return
        self.tracker.add(key, delay_ms, self._redelivery_count(message, delay_ms))
        with self._lock:
            self._counts["nacked"] += 1

    def _redelivery_count(self, message: Any, delay_ms: int | None) -> int | None:
        """The count the backoff needs, or None when no backoff applies (saves a client call)."""
        if delay_ms is not None or self.tracker.backoff is None:
            return None
        return redelivery_count_of(message)

    def _settle(self, message: Any, raw: Any, state: BatchIndexState) -> _pulsar.MessageId | None:
        """Mark a batch index settled; return the entry id to ack when the entry is done."""
        if raw.batch_index() < 0:
            return None
        key = self._key(message, raw)
        with self._lock:
            entry = self._batch_entry(key)
            self._transition(entry, key[3], state)
            if not entry.settled():
                return None
            del self._batches[key[:3]]
            if not entry.irregular:
                return None  # the client acks the entry itself once every index is acked
            self._settled[key[:3]] = None
            if len(self._settled) > SETTLED_MEMORY:
                del self._settled[next(iter(self._settled))]
        return _handoff_id(key[0], key[1], key[2])

    def _batch_entry(self, key: MessageKey) -> _BatchEntry:
        entry = self._batches.get(key[:3])
        if entry is None:
            raise ValueError(f"message {key} is not in flight on this consumer (already settled, or never received)")
        return entry

    @staticmethod
    def _transition(entry: _BatchEntry, index: int, state: BatchIndexState) -> None:
        """Move an in-flight index to ACKED or NACKED, refusing anything else."""
        entry.grow(index)
        current = BatchIndexState(entry.states[index])
        if current is not BatchIndexState.IN_FLIGHT:
            raise ValueError(f"batch index {index} is {current.name}, not in flight; cannot mark it {state.name}")
        entry.states[index] = state

    # ------------------------------------------------------------------ handoff

    def _hand_off(self, due: DueKeys) -> None:
        """Tracker callback: hand each due entry to the client once, in one burst."""
        ids = []
        with self._lock:
            for topic, keys in due.items():
                seen: set[tuple[int, int]] = set()
                for _, ledger_id, entry_id, batch_index in keys:
                    if batch_index >= 0:
                        entry = self._batches.get((topic, ledger_id, entry_id))
                        if entry is None or entry.states[batch_index] != BatchIndexState.NACKED:
                            continue  # settled meanwhile (e.g. redeliver_unacknowledged_messages)
                        entry.states[batch_index] = BatchIndexState.RELEASED
                    if (ledger_id, entry_id) not in seen:
                        seen.add((ledger_id, entry_id))
                        ids.append(_handoff_id(topic, ledger_id, entry_id))
            self._counts["handed_off_entries"] += len(ids)
            self._counts["handoff_bursts"] += bool(ids)
        for message_id in ids:
            self._consumer.negative_acknowledge(message_id)  # a raw id passes through as is

    # ------------------------------------------------------------------ the rest of the API

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacked message now.

        Pending nacks are dropped (their messages are unacked, so they come back now
        with the rest) and batch state is reset.
        """
        self._check_open()
        with self._lock:
            self.tracker.drain()
            self._batches.clear()
            self._settled.clear()
        self._consumer.redeliver_unacknowledged_messages()

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        return self._consumer.consumer_name()

    def pause_message_listener(self) -> None:
        self._check_open()
        self._consumer.pause_message_listener()

    def resume_message_listener(self) -> None:
        self._check_open()
        self._consumer.resume_message_listener()

    def is_connected(self) -> bool:
        return not self._closed and self._consumer.is_connected()

    def unsubscribe(self) -> None:
        """Unsubscribe (pending nacks are dropped with the subscription) and close."""
        self._check_open()
        self.tracker.close(flush=False)
        self._consumer.unsubscribe()
        self._mark_closed()

    def close(self, redeliver_pending: bool = True) -> None:
        """Close the consumer; nothing pending is lost. Idempotent.

        ``redeliver_pending=True`` (default) hands every pending nack to the client now,
        so those messages are redelivered at once (to this subscription's other
        consumers). ``False`` leaves them unacked: the broker redelivers them when this
        consumer is gone. Either way they come back, earlier than their delay.
        """
        check_bool("redeliver_pending", redeliver_pending)
        if self._closed:
            return
        self._mark_closed()
        self.tracker.close(flush=redeliver_pending)
        self._consumer.close()

    def _mark_closed(self) -> None:
        with self._lock:
            self._closed = True
            self._batches.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConsumerStats:
        """Counters, plus the tracker's stats."""
        with self._lock:
            counts = dict(self._counts)
            open_entries = len(self._batches)
        return ConsumerStats(**counts, open_batch_entries=open_entries, tracker=self.tracker.stats())  # type: ignore[typeddict-item]

    def __enter__(self) -> NackingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NackingConsumer topics={sorted(self._topics)} pending={len(self.tracker)} closed={self._closed}>"

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("this NackingConsumer is closed")

    def _topic_of(self, message: Any) -> str:
        topic_name = getattr(message, "topic_name", None)
        if callable(topic_name) and not isinstance(message, _pulsar.MessageId):
            return topic_name()
        if len(self._topics) == 1:
            return next(iter(self._topics))
        raise ValueError("on a consumer of several topics, pass the message, not its id: an id carries no topic")

    def _key(self, message: Any, raw: Any) -> MessageKey:
        """The tracker key of a message or id; refuses messages of other topics."""
        topic = self._topic_of(message)
        if topic not in self._topics and _PARTITION_SUFFIX.sub("", topic) not in self._topics:
            raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({sorted(self._topics)})")
        return (topic, raw.ledger_id(), raw.entry_id(), raw.batch_index())  # checked by the tracker


def _full_topic_name(topic: str) -> str:
    """``persistent://public/default/x`` for a short name ``x``, as the client does."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    return f"persistent://{topic}"


def subscribe(
    client: pulsar.Client,
    topic: str | list[str],
    subscription_name: str,
    *,
    negative_ack_redelivery_delay_ms: int = 60_000,
    negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS,
    redelivery_backoff: RedeliveryBackoff | None = None,
    never_early: bool = False,
    message_listener: Callable[[NackingConsumer, pulsar.Message], None] | None = None,
    **subscribe_kwargs: Any,
) -> NackingConsumer:
    """Subscribe like ``client.subscribe(...)`` and return a :class:`NackingConsumer`.

    Takes every keyword of ``pulsar.Client.subscribe`` (*topic* may be a list);
    ``negative_ack_redelivery_delay_ms`` becomes the tracker's fixed delay and the
    consumer itself is subscribed with the 100 ms handoff delay. A ``message_listener``
    receives the :class:`NackingConsumer` and only the messages it should see.

    Example (needs a broker; ``examples/wrap_consumer.py`` runs one)::

        consumer = pulsar_nack.subscribe(client, "orders", "billing",
            consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=5000)
    """
    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, not {type(client).__name__}")
    if not isinstance(subscription_name, str) or not subscription_name:
        raise TypeError("subscription_name must be a non-empty str")
    topics = check_topics("topic", topic)
    if "pattern" in subscribe_kwargs or "negative_ack_redelivery_delay_ms" in subscribe_kwargs:
        raise TypeError("unsupported keyword")
    ready = threading.Event()
    holder: list[NackingConsumer] = []
    listener = None
    if message_listener is not None:
        if not callable(message_listener):
            raise TypeError("message_listener must be callable")

        def listener(_consumer: pulsar.Consumer, message: pulsar.Message) -> None:
            ready.wait()
            wrapper = holder[0]
            if wrapper.closed or not wrapper._admit(message):
                return
            try:
                message_listener(wrapper, message)
            except Exception:
                _log.exception("message listener failed")

    consumer = client.subscribe(
        topics if len(topics) > 1 else topics[0],
        subscription_name,
        negative_ack_redelivery_delay_ms=HANDOFF_DELAY_MS,
        message_listener=listener,
        **subscribe_kwargs,
    )
    try:
        wrapper = NackingConsumer(
            consumer,
            topics,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
            redelivery_backoff=redelivery_backoff,
            never_early=never_early,
        )
    except BaseException:
        consumer.close()
        raise
    holder.append(wrapper)
    ready.set()
    return wrapper
