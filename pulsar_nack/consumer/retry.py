"""Retry letter topics: ``reconsume_later``, compatible with the Java client.

A retry that must survive the consumer is republished, not remembered:
``reconsume_later(message, delay_ms)`` produces a copy of the message to the
subscription's **retry letter topic** with a delivery time, and acks the original only
once the copy is stored. The consumer also reads the retry topic (a Shared
subscription of the same name, by a consumer of its own, as Java's), so the copy comes
back to it (or to any consumer of the subscription) when the broker delivers it. After
``max_redeliver_count`` reconsumes the copy goes to the **dead letter topic** instead.
Nothing about a pending retry lives only in the consumer's memory (a copy held by the
consumers, below, is still unacked on the broker): a crash, a restart or a broker restart
loses nothing and keeps every delay.

What the Java client (4.0.8) does, and this module does the same:

Names
    ``<first topic>-<subscription>-RETRY`` and ``<first topic>-<subscription>-DLQ`` (the
    topic's full name, as given), unless the old-style names
    ``persistent://<tenant>/<ns>/<subscription>-RETRY`` / ``-DLQ`` exist already; names
    given explicitly win over both. One retry topic and one DLQ per subscription, for a
    partitioned topic too.
The copy
    Payload, key, ordering key and event time of the message; its properties plus
    ``REAL_TOPIC`` (the original topic without ``-partition-N``), ``ORIGIN_MESSAGE_ID``
    and ``ORIGIN_MESSAGE_IDY_TIME`` (the first message's id in Java's text form
    ``ledger:entry:partition[:batchIndex]``), ``REAL_SUBSCRIPTION`` (each only if
    absent, so they describe the first message of the chain), then the caller's
    properties (which win, as in Java), then ``RECONSUMETIMES`` (1, or one more) and
    ``DELAY_TIME`` (the delay in ms). Sent with ``deliver_after(delay)`` when the delay
    is above 0, by a producer with batching off and chunking on.
Dead letters
    When the new ``RECONSUMETIMES`` would exceed ``max_redeliver_count`` (16 unless a
    ``dead_letter_policy`` says otherwise), the same copy goes to the DLQ without a
    delivery time. The first delivery does not count: a maximum of 2 gives 3 deliveries.

And two things the Java client does not:

Never early
    The broker's delayed delivery is tick based: a stock broker
    (``delayedDeliveryTickTimeMillis=1000``, not strict) delivers at once a message due
    within one tick, so a 1 s retry comes back after a few ms. A copy that arrives
    before its due time (publish time + ``DELAY_TIME``) is held, unacked and so still
    durable, and handed to the application only when due: kept in memory when due
    within :data:`MEMORY_HOLD_MS`, else nacked into a never-early tracker of its own
    (:meth:`RetryLetter.admit`).
Held by the consumer (``retry_hold_ms``, off by default)
    The broker stores and dispatches every delayed copy as an entry of its own: neither
    the Java nor the C++ producer batches a message with a delivery time. With
    ``subscribe(..., retry_hold_ms=N)`` a reconsume whose delay is at most N ms is
    sent instead by a second, batching producer, without a delivery time and with
    :data:`DELIVER_AT_TIME` (when it is due, epoch ms); the consumer that receives it
    holds it, unacked and so still durable, in memory until due (up to
    :data:`MEMORY_HOLD_MAX` copies, the rest in the hold tracker), one copy per message;
    when the retry topic's consumer reconnects the copies it kept are dropped, as the
    client's receive queue is (the broker sends them again, maybe to another consumer:
    :mod:`~pulsar_nack.consumer.memory_hold`). Fewer entries for the
    broker, fewer sends for the client (``bench/results/demo-retries.json``). The cost:
    a consumer that does not hold copies (Java's) gets these at once, so use it only
    where every consumer of the subscription is this library's. A payload above
    :data:`HELD_MAX_BYTES` still goes the broker's way (the batching producer cannot
    chunk).
The original topic
    The application sees a retried message as a :class:`RetryMessage`: a
    ``pulsar.Message`` whose ``topic_name()`` is the original topic (``REAL_TOPIC``),
    so handlers need not know about the retry topic. ``retry_topic_name()`` gives the
    topic it was read from; ``message_id()`` and acks are those of the retry topic.

What Python cannot do as Java does: an old-style retry or DLQ topic is found only when
it is partitioned (pulsar-client has no existence check for a non-partitioned topic
that does not also create it); name such a topic explicitly. A key that Java sent as
bytes (base64 in the protocol) is copied as its base64 text.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulsar

from .._validate import MAX_DELAY_MS, check_bool, check_properties
from ..core.backoff import resolve_delay
from ..core.keys import PARTITION_SUFFIX
from ..errors import DeadLetterError
from ..timing import HANDOFF_DELAY_MS
from ._client import (
    RawClient,
    RawMessage,
    RawMessageId,
    build_message,
    is_ok,
    is_raw_message,
    is_raw_message_id,
    received,
    retry_producer_configuration,
    shared_listener_configuration,
    unwrap_message,
    wrap_message,
)
from ._client import raw_client as _inner_client
from .dead_letter import DeadLetter
from .in_flight import ReconsumesInFlight
from .memory_hold import MEMORY_HOLD_MAX, MemoryHold
from .message_pool import KeepingProducer
from .msgid import message_key
from .nacking import NackingCore, full_topic_name
from .settings import ConsumerSettings

__all__ = [
    "DELAY_TIME",
    "DELIVER_AT_TIME",
    "HELD_MAX_BYTES",
    "MEMORY_HOLD_MAX",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_MESSAGE_ID_LEGACY",
    "REAL_SUBSCRIPTION",
    "REAL_TOPIC",
    "RECONSUMETIMES",
    "RetryLetter",
    "RetryMessage",
    "RetryTopics",
    "due_time_ms",
    "is_held",
    "java_message_id",
    "legacy_topic_names",
    "origin_key",
    "resolve_retry_topics",
    "retry_properties",
    "retry_topics_for",
]

RECONSUMETIMES = "RECONSUMETIMES"
"""How many times the message was reconsumed (1 on the first retry copy)."""
DELAY_TIME = "DELAY_TIME"
"""The delay of the last reconsume, in ms."""
REAL_TOPIC = "REAL_TOPIC"
"""The topic the first message was read from, without ``-partition-N``."""
REAL_SUBSCRIPTION = "REAL_SUBSCRIPTION"
"""The subscription that reconsumed it first."""
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
"""The first message's id, ``ledger:entry:partition[:batchIndex]`` as Java prints it."""
ORIGIN_MESSAGE_ID_LEGACY = "ORIGIN_MESSAGE_IDY_TIME"
"""The same id under the Java client's old (misspelled) name, which it still writes."""
MAX_RECONSUMETIMES = 16
"""``max_redeliver_count`` when retries are on without a dead-letter policy (as Java)."""
DELIVER_AT_TIME = "DELIVER_AT_TIME"
"""When a copy held by the consumers (``retry_hold_ms``) is due, epoch ms; not a Java property.

Such a copy is batched, and a batch carries one publish time, its first message's: publish
time + ``DELAY_TIME`` would make the later members of a batch due early."""
HELD_MAX_BYTES = 128 * 1024
"""A payload above this goes the broker's way even under ``retry_hold_ms``: the client's
default largest batch, and its batching producer cannot chunk."""

HOLD_PRECISION_BITS = 4
"""Precision of the tracker that holds early copies: 16 ms buckets, rounded up."""
GUARD_ALWAYS = 1 << 62
"""Guarded deliveries of the retry topic's consumer: it never goes quiet, so it remembers the
copies it acked (as a consumer's own topics do while guarding) and filters the copies that a
broker sends again after a crash lost those acks. Copies are few beside a topic's messages."""

_CONSUMER_TYPES = ("Shared", "KeyShared")
_log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- pure rules


def is_held(delay_ms: int, hold_ms: int, payload_bytes: int) -> bool:
    """True if a reconsume of this delay and payload is held by the consumers, not by the broker.

    The one statement of the rule (the consumers' :meth:`RetryLetter.submit`, and a Spark
    task's grace, use it): a delay above 0 and within ``retry_hold_ms``, and a payload the
    batching producer can send (at most :data:`HELD_MAX_BYTES`). O(1).

    >>> is_held(500, 1_000, 10), is_held(0, 1_000, 10), is_held(500, 1_000, HELD_MAX_BYTES + 1)
    (True, False, False)
    """
    return 0 < delay_ms <= hold_ms and payload_bytes <= HELD_MAX_BYTES


def java_message_id(message_id: Any) -> str:
    """A message id as the Java client prints it: ``ledger:entry:partition[:batchIndex]``.

    The batch index is written only for a batched message (index 0 or more), as Java's
    ``BatchMessageIdImpl``. O(1).

    >>> java_message_id(pulsar.MessageId(-1, 27, 0, -1))
    '27:0:-1'
    >>> java_message_id(pulsar.MessageId(2, 11, 5, 0))
    '11:5:2:0'
    """
    text = f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.partition()}"
    batch_index = message_id.batch_index()
    return f"{text}:{batch_index}" if batch_index >= 0 else text


def legacy_topic_names(topic: str, subscription: str) -> tuple[str, str]:
    """The old-style retry and DLQ names: ``<domain>://<tenant>/<ns>/<subscription>-RETRY``, ``-DLQ``.

    >>> legacy_topic_names("orders", "billing")
    ('persistent://public/default/billing-RETRY', 'persistent://public/default/billing-DLQ')
    """
    namespace = full_topic_name(topic).rsplit("/", 1)[0]
    return f"{namespace}/{subscription}-RETRY", f"{namespace}/{subscription}-DLQ"


def reconsume_times(message: Any) -> int:
    """How many times *message* was reconsumed: its ``RECONSUMETIMES``, 0 when absent. O(1).

    Raises ValueError when the property is not an integer (Java fails the reconsume too).
    """
    value = message.properties().get(RECONSUMETIMES)
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the message's {RECONSUMETIMES} property is not an integer: {value!r}") from None


def due_time_ms(message: Any) -> int | None:
    """When a retry copy is due (epoch ms); None if not a retry copy. O(1).

    Its publish time + ``DELAY_TIME``, or its :data:`DELIVER_AT_TIME` if later (a copy held
    by the consumers; a stale one that a Java consumer copied into its own retry is earlier).
    """
    properties = message.properties()
    delay = properties.get(DELAY_TIME)
    if delay is None:
        return None
    try:
        due = int(message.publish_timestamp()) + int(delay)
        deliver_at = properties.get(DELIVER_AT_TIME)
        return due if deliver_at is None else max(due, int(deliver_at))
    except ValueError:
        return None


def retry_properties(
    message: Any,
    subscription: str,
    delay_ms: int,
    custom: Mapping[str, str] | None = None,
    deliver_at_ms: int | None = None,
) -> dict[str, str]:
    """The properties of the retry (or dead-letter) copy of *message*, exactly as Java builds them.

    The message's own properties (but an earlier :data:`DELIVER_AT_TIME`); ``REAL_TOPIC``,
    ``ORIGIN_MESSAGE_IDY_TIME``, ``ORIGIN_MESSAGE_ID`` and ``REAL_SUBSCRIPTION`` if
    absent; then *custom* (which overrides any of them); then ``RECONSUMETIMES`` (1, or
    the value so far + 1), ``DELAY_TIME``, and :data:`DELIVER_AT_TIME` for a copy the
    consumers hold (*deliver_at_ms*). O(properties).

    Raises ValueError when ``RECONSUMETIMES`` (the message's or *custom*'s) is not an
    integer.
    """
    properties = dict(message.properties())
    properties.pop(DELIVER_AT_TIME, None)
    origin_id = java_message_id(message.message_id())
    properties.setdefault(REAL_TOPIC, PARTITION_SUFFIX.sub("", message.topic_name()))
    properties.setdefault(ORIGIN_MESSAGE_ID_LEGACY, origin_id)
    properties.setdefault(ORIGIN_MESSAGE_ID, origin_id)
    properties.setdefault(REAL_SUBSCRIPTION, subscription)
    if custom:
        properties.update(custom)
    old = properties.get(RECONSUMETIMES)
    try:
        count = 1 if old is None else int(old) + 1
    except ValueError:
        raise ValueError(f"{RECONSUMETIMES} must be an integer, got {old!r}") from None
    properties[RECONSUMETIMES] = str(count)
    properties[DELAY_TIME] = str(max(delay_ms, 0))
    if deliver_at_ms is not None:
        properties[DELIVER_AT_TIME] = str(deliver_at_ms)
    return properties


# ---------------------------------------------------------------------- settings


def _succeeded(future: concurrent.futures.Future[Any]) -> bool:
    """Whether a done *future* holds a result (not an exception, not cancelled)."""
    return not future.cancelled() and future.exception() is None


@dataclass(frozen=True)
class RetryTopics:
    """Where reconsumed messages go: the resolved retry and dead letter topics of a subscription."""

    retry_letter_topic: str
    dead_letter_topic: str
    max_redeliver_count: int
    initial_subscription_name: str | None = None

    def dead_letter_policy(self) -> pulsar.ConsumerDeadLetterPolicy:
        """The same DLQ and count for the nack path, as Java's ``enableRetry`` gives it."""
        return pulsar.ConsumerDeadLetterPolicy(
            self.max_redeliver_count, self.dead_letter_topic, self.initial_subscription_name
        )


def raw_client(client: Any) -> RawClient:
    """The ``_pulsar.Client`` inside a ``pulsar.Client`` or ``pulsar.asyncio.Client``."""
    raw = _inner_client(client)
    if raw is None:
        raise TypeError(f"client must be a pulsar.Client or pulsar.asyncio.Client, not {type(client).__name__}")
    return raw


def retry_topics_for(
    client: Any, topics: object, subscription: str, settings: ConsumerSettings, subscribe_kwargs: Mapping[str, Any]
) -> RetryTopics | None:
    """The retry letter topics a ``subscribe`` call asks for (``settings.retry_enable``), or None.

    Validates what the settings cannot (see :func:`check_retry_args`), then resolves the
    names (:func:`resolve_retry_topics`: at most two lookups, nothing created).
    """
    if not settings.retry_enable:
        return None
    check_retry_args(topics, subscribe_kwargs)
    assert isinstance(topics, list)
    return resolve_retry_topics(
        raw_client(client), topics, subscription, settings.dead_letter_policy, settings.retry_letter_topic
    )


def check_retry_args(topics: object, subscribe_kwargs: Mapping[str, Any]) -> None:
    """Validate what retries need of a ``subscribe`` call beyond its settings; changes nothing.

    Topic names (the retry topic is named after the first one), and a Shared or
    Key_Shared subscription: the broker's delayed delivery works on no other type.
    ``retry_letter_topic`` itself is :class:`~pulsar_nack.consumer.settings.ConsumerSettings`'s.
    """
    if not isinstance(topics, list):
        raise ValueError("retry_enable=True needs topic names, not a pattern (the retry topic is named after the first topic)")
    kind = subscribe_kwargs.get("consumer_type", pulsar.ConsumerType.Exclusive)
    name = getattr(kind, "name", kind)
    if name not in _CONSUMER_TYPES:
        raise ValueError(
            f"retry_enable=True needs consumer_type Shared or KeyShared, not {name}: the broker delays "
            "retry copies only on those subscription types"
        )


def _partitioned(raw_client: Any, topic: str) -> bool:
    """True if *topic* exists as a partitioned topic (a lookup that creates nothing on stock brokers)."""
    try:
        partitions = raw_client.get_topic_partitions(topic)
    except Exception:  # not found, or not allowed: not an old-style topic we can use
        return False
    return any(name != topic for name in partitions)


def resolve_retry_topics(
    raw_client: Any,
    topics: list[str],
    subscription: str,
    policy: pulsar.ConsumerDeadLetterPolicy | None,
    retry_letter_topic: str | None,
) -> RetryTopics:
    """The retry and dead letter topics of a subscription, named as the Java client names them.

    Explicit names win (*retry_letter_topic*, the policy's ``dead_letter_topic``); then
    an old-style name that exists (found only when partitioned, see the module notes);
    then ``<first topic>-<subscription>-RETRY`` / ``-DLQ``. One partitioned-metadata
    lookup per old-style name, and none when both names are given.
    """
    first = full_topic_name(topics[0])
    dead_letter = policy.dead_letter_topic if policy is not None else ""
    retry, dlq = retry_letter_topic or "", dead_letter or ""
    if not (retry and dlq):
        legacy_retry, legacy_dlq = legacy_topic_names(first, subscription)
        if not retry:
            retry = legacy_retry if _partitioned(raw_client, legacy_retry) else f"{first}-{subscription}-RETRY"
        if not dlq:
            dlq = legacy_dlq if _partitioned(raw_client, legacy_dlq) else f"{first}-{subscription}-DLQ"
    return RetryTopics(
        retry_letter_topic=full_topic_name(retry),
        dead_letter_topic=full_topic_name(dlq),
        max_redeliver_count=policy.max_redeliver_count if policy is not None else MAX_RECONSUMETIMES,
        initial_subscription_name=(policy.initial_subscription_name or None) if policy is not None else None,
    )


# ---------------------------------------------------------------------- the message the application sees


class RetryMessage(pulsar.Message):
    """A message read from the retry letter topic, as the application sees it.

    A ``pulsar.Message`` in every way (data, value, properties, key, event time, its
    retry-topic ``message_id()`` for acks), but it reads as the original message
    redelivered, so a handler treats it as such:

    - ``topic_name()`` is the topic the first message came from (its ``REAL_TOPIC``
      property, without ``-partition-N``); ``retry_topic_name()`` is where it was read;
    - ``redelivery_count()`` is ``RECONSUMETIMES``, how many times it was reconsumed (the
      broker's count of the copy itself also counts the times it was held, and says
      nothing about the message).

    ``arrived_at_ms`` is when the retry topic's consumer received the copy (epoch ms: the
    broker's delivery, or the hold's redelivery of a copy that came more than
    :data:`MEMORY_HOLD_MS` early), None when not known (a ``message_listener``'s copies).
    """

    arrived_at_ms: int | None = None

    def topic_name(self) -> str:
        """The original topic (``REAL_TOPIC``), or the retry topic if the property is missing."""
        raw = unwrap_message(self)
        real = raw.properties().get(REAL_TOPIC)
        return str(real) if real else str(raw.topic_name())

    def retry_topic_name(self) -> str:
        """The retry letter topic this copy was read from."""
        return str(unwrap_message(self).topic_name())

    def reconsume_times(self) -> int:
        """``RECONSUMETIMES``: how many times this message was reconsumed (1 or more)."""
        return reconsume_times(unwrap_message(self))

    def redelivery_count(self) -> int:
        """How many times the message came back: its ``RECONSUMETIMES``."""
        return reconsume_times(unwrap_message(self))

    def due_at_ms(self) -> int | None:
        """When this copy was due (epoch ms): its publish time + ``DELAY_TIME``."""
        return due_time_ms(unwrap_message(self))


def origin_key(message: Any) -> tuple[str, int, int, int] | None:
    """The key ``(topic, ledger, entry, batch_index)`` the first message of a retry copy had.

    From ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` (``-partition-N`` added back from the
    id's partition); None if they are missing or not in Java's form. O(1).

    >>> class Copy:
    ...     def properties(self):
    ...         return {"REAL_TOPIC": "persistent://public/default/t", "ORIGIN_MESSAGE_ID": "7:3:1:-1"}
    >>> origin_key(Copy())
    ('persistent://public/default/t-partition-1', 7, 3, -1)
    """
    properties = message.properties()
    topic, origin = properties.get(REAL_TOPIC), properties.get(ORIGIN_MESSAGE_ID)
    if not topic or not origin:
        return None
    try:
        parts = [int(p) for p in origin.split(":")]
    except ValueError:
        return None
    if len(parts) not in (3, 4):
        return None
    ledger, entry, partition = parts[:3]
    batch_index = parts[3] if len(parts) == 4 else -1
    return (f"{topic}-partition-{partition}" if partition >= 0 else topic), ledger, entry, batch_index


# ---------------------------------------------------------------------- the sender and the hold


def _close_producer(producer: concurrent.futures.Future[Any]) -> None:
    producer.result(timeout=30).close()


def _error_for(result: Any) -> Exception:
    """The client's exception class for a failed ``Result`` (``pulsar.exceptions``), with its name."""
    name = getattr(result, "name", str(result))
    cls = getattr(pulsar.exceptions, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = pulsar.exceptions.PulsarException
    return cls(f"Pulsar error: {name}")


class RetryLetter:
    """The retry letter topic of one consumer: its own consumer of the topic, the sends, the holds.

    Built by ``subscribe(..., retry_enable=True)``; the blocking and the asyncio consumer
    both use it. As in the Java client, the retry topic is read by a Shared subscription
    of the consumer's subscription name, here a consumer of its own, so the consumer's
    own topics stay on a single-topic consumer and its fast receive path (the cost per
    message: the ``receive`` part of ``bench/results/retry.json``). Its copies
    arrive on the client's listener thread (:meth:`_on_copy`): one due now is queued
    for the application, one due within :data:`MEMORY_HOLD_MS` is kept here until due,
    one due later is nacked into a never-early tracker of its own. :meth:`submit` never blocks: it returns a
    ``concurrent.futures.Future`` that the caller waits on or awaits.

    Parameters
    ----------
    client : pulsar.Client or pulsar.asyncio.Client
    subscription : str
    topics : RetryTopics
    settings : ConsumerSettings, optional
        The consumer's settings (default ``ConsumerSettings(retry_enable=True)``): its
        ``negative_ack_redelivery_delay_ms`` is the fixed delay when the call gives none and
        there is no ``redelivery_backoff`` (by ``RECONSUMETIMES``, 0 for a first reconsume);
        reconsumes of at most ``retry_hold_ms`` are held by the consumers, not the broker
        (see the module notes, "Held by the consumer").
    dead_letter : DeadLetter, optional
        The sender of the consumer's dead letters, when it has a dead-letter policy; else
        one of this letter's own (the same class, to ``topics.dead_letter_topic``). It
        sends the reconsume path's dead letters, built here in the Java client's form.
    clock_ms : callable
        Wall-clock epoch milliseconds (publish times are wall-clock).
    """

    topics: RetryTopics
    _hold: NackingCore
    _copies: Any  # the _pulsar.Consumer of the retry topic, once subscribed
    _producer_futures: dict[bool, concurrent.futures.Future[Any]]  # batched or not -> its producer
    _counts: dict[str, int]

    def __init__(
        self,
        client: Any,
        subscription: str,
        topics: RetryTopics,
        settings: ConsumerSettings | None = None,
        *,
        dead_letter: DeadLetter | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        settings = ConsumerSettings(retry_enable=True) if settings is None else settings
        self.topics = topics
        self.subscription = subscription
        self.delay_ms = settings.negative_ack_redelivery_delay_ms  # validated by the settings, as every setting
        self.hold_ms = settings.retry_hold_ms
        self.backoff = settings.redelivery_backoff
        self._raw_client = raw_client(client)
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._hold = NackingCore(
            self._hand_off,
            [topics.retry_letter_topic],
            ConsumerSettings(negative_ack_precision_bit_cnt=HOLD_PRECISION_BITS, never_early=True),
            acknowledge=self._ack_copy,
            guard_messages=GUARD_ALWAYS,
            start_guard=GUARD_ALWAYS,
        )
        self._own_dead_letter = dead_letter is None
        self._dead_letter = dead_letter or DeadLetter(
            client, subscription, topic=topics.dead_letter_topic, initial_subscription=topics.initial_subscription_name
        )
        self._copies = None
        # (deliver, wake): the listener's hand-over of a due copy, and the receive loop's wake-up (subscribe)
        self._listeners: tuple[Callable[[RawMessage], None] | None, Callable[[], None] | None] = (None, None)
        self._in_flight = ReconsumesInFlight()
        self._producer_futures = {}
        self._memory = MemoryHold(self._clock_ms, self._copies_connected, self.hold_ms)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("reconsumed", "retry_dead_lettered", "held", "retry_delivered"), 0)
        self._closed = False

    @classmethod
    def for_settings(cls, client: Any, subscription: str, topics: RetryTopics, settings: ConsumerSettings) -> RetryLetter:
        """The retry letter of a consumer subscribed with *settings* (its fixed delay, backoff, ``retry_hold_ms``)."""
        return cls(client, subscription, topics, settings)

    # -------------------------------------------------------------- the retry topic's consumer

    def subscribe(
        self,
        subscribe_kwargs: Mapping[str, Any],
        deliver: Callable[[RawMessage], None] | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """Subscribe to the retry topic (blocks for the round trip), Shared, as the Java client does.

        Takes the receive-side keywords of the consumer's own subscribe call
        (``receiver_queue_size``, ``consumer_name``, ``initial_position``,
        ``batch_index_ack_enabled``). With *deliver* (a message listener), due copies are
        handed to it on the listener thread and early ones are all nacked until due;
        else they are queued for :meth:`pop_due`, and *wake* (if any) is called when one
        is queued.
        """
        conf = shared_listener_configuration(
            self._on_copy,
            HANDOFF_DELAY_MS,
            receiver_queue_size=subscribe_kwargs.get("receiver_queue_size"),
            consumer_name=subscribe_kwargs.get("consumer_name"),
            initial_position=subscribe_kwargs.get("initial_position"),
            batch_index_ack=bool(subscribe_kwargs.get("batch_index_ack_enabled", True)),
        )
        self._listeners = (deliver, wake)
        self._copies = self._raw_client.subscribe(self.topics.retry_letter_topic, self.subscription, conf)

    def _on_copy(self, _consumer: Any, raw: RawMessage) -> None:
        """Listener of the retry topic's consumer (a client thread): hold, queue or hand over a copy."""
        try:
            deliver = self._listeners[0]
            if self._closed or not self._admit_copy(raw, in_memory=deliver is None, queue_due=True):
                return
            if deliver is not None:
                with self._lock:
                    self._counts["retry_delivered"] += 1
                deliver(raw)
        except Exception:  # a failing listener must not stop the client's thread
            _log.exception("handling a retry copy failed; it stays unacknowledged")

    def _copies_connected(self) -> bool:
        """True while the retry topic's consumer is connected (or not subscribed: no copy comes then)."""
        consumer = self._copies
        return consumer is None or bool(consumer.is_connected())

    def _redeliver_copy(self, raw: RawMessage) -> None:
        """A copy kept while its reconsume was on its way, which failed: the retry topic's consumer redelivers it."""
        consumer = self._copies
        if consumer is not None:
            consumer.negative_acknowledge(raw)

    def swallowed(self, message: Any, redeliver: Callable[[Any], None]) -> bool:
        """True if *message*, received on the consumer's own topics, is a copy of one whose reconsume is on its way.

        It is kept, unacknowledged (the reconsume's acknowledgement settles it), and given
        to *redeliver* if the reconsume fails (:mod:`~pulsar_nack.consumer.in_flight`).
        O(1); no id read while no reconsume is on its way.
        """
        in_flight = self._in_flight
        return bool(in_flight) and in_flight.swallow(message_key(received(message)), message, redeliver)

    def _hand_off(self, ids: list[RawMessageId]) -> None:
        """The hold tracker's handoff: the retry topic's consumer redelivers each due copy."""
        consumer = self._copies
        if consumer is None:
            return
        for message_id in ids:
            consumer.negative_acknowledge(message_id)

    def use_dead_letter(self, sender: DeadLetter) -> None:
        """Send this letter's dead letters with *sender* (the consumer's), instead of its own."""
        if self._own_dead_letter:
            self._dead_letter.close()
        self._dead_letter, self._own_dead_letter = sender, False

    def owns(self, message: Any) -> bool:
        """True if *message* (a message or id) was read from the retry topic. O(1)."""
        if isinstance(message, RetryMessage):
            return True
        inner = received(message)
        if is_raw_message_id(inner):  # first: a _pulsar.MessageId has a topic_name(str) setter, no getter
            return False  # a bare id: the main consumer's (acknowledge a retry copy by the message)
        topic = getattr(inner, "topic_name", None)
        return callable(topic) and self.is_retry_copy(inner)

    def check(self, message: Any) -> None:
        """Validate a retry copy as ``key_of`` does (TypeError, ValueError); changes nothing."""
        self._hold.key_of(message)

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a retry copy on the retry topic's consumer (and forget its hold state)."""
        raw_id = self._hold.before_ack(message)
        if raw_id is not None:  # None: recorded, acked with its entry (by after_ack)
            self._ack_copy(raw_id)
        self._hold.after_ack()

    def _ack_copy(self, message: Any) -> None:
        """Acknowledge a copy or id on the retry topic's consumer (also the hold's acks of copies of acked copies)."""
        consumer = self._copies
        if consumer is not None:
            consumer.acknowledge(message)

    def nack(self, message: Any, delay_ms: int | None) -> None:
        """Negative acknowledgement of a retry copy: tracked never-early; the delay as :meth:`delay_for`."""
        self._hold.nack(message, self.delay_for(received(message), delay_ms))

    def redeliver_unacknowledged_messages(self) -> None:
        """Forget the holds and ask the broker to redeliver every unacked copy now."""
        self._hold.reset()
        self._memory.clear()
        if self._copies is not None:
            self._copies.redeliver_unacknowledged_messages()

    def pause_message_listener(self) -> None:
        if self._copies is not None:
            self._copies.pause_message_listener()

    def resume_message_listener(self) -> None:
        if self._copies is not None:
            self._copies.resume_message_listener()

    def unsubscribe(self) -> None:
        """Unsubscribe the retry topic's consumer (pending holds are dropped) and close this letter."""
        self._hold.close(redeliver_pending=False)
        if self._copies is not None:
            self._copies.unsubscribe()
            self._copies = None
        self.close(redeliver_pending=False)

    # -------------------------------------------------------------- sending

    def delay_for(self, message: Any, delay_ms: int | None) -> int:
        """The delay of a reconsume: the call's, else the backoff's by ``RECONSUMETIMES``, else the fixed one."""
        return resolve_delay(delay_ms, self.backoff, self.delay_ms, functools.partial(reconsume_times, message))

    def submit(
        self,
        message: Any,
        delay_ms: int | None = None,
        properties: Mapping[str, str] | None = None,
        on_stored: Callable[[], None] | None = None,
        dead_letter: bool = False,
    ) -> concurrent.futures.Future[str]:
        """Produce the retry (or dead-letter) copy of a received *message*; never acks.

        With *dead_letter* (``reject``) the copy goes to the dead letter topic whatever
        its ``RECONSUMETIMES``.

        Returns a future of ``"retry"`` or ``"dead_letter"``, done once the broker stored
        the copy; it holds the client's exception if the producer or the send failed.
        *on_stored* (the consumer's ack of the original) runs on the client's thread once
        the copy is stored, before the future is done; an exception it raises fails the
        future. Bad input raises at once (TypeError, ValueError) and sends nothing.
        O(properties).
        """
        raw = received(message)
        if not is_raw_message(raw):
            raise TypeError(f"reconsume_later takes a received pulsar.Message, not {type(message).__name__}")
        check_properties("properties", properties)
        delay = self.delay_for(raw, delay_ms)
        data = raw.data()
        held = is_held(delay, self.hold_ms, len(data))
        props = retry_properties(raw, self.subscription, delay, properties, self._clock_ms() + delay if held else None)
        dead = dead_letter or int(props[RECONSUMETIMES]) > self.topics.max_redeliver_count
        if dead:
            props.pop(DELIVER_AT_TIME, None)
        broker_delay = 0 if dead or held else delay
        built = build_message(data, props, raw.partition_key(), raw.ordering_key(), raw.event_timestamp(), broker_delay)
        outcome: concurrent.futures.Future[str] = concurrent.futures.Future()
        key = message_key(raw)
        self._in_flight.start(key)  # until stored and acknowledged (or failed): its copies are kept meanwhile
        outcome.add_done_callback(lambda done: self._in_flight.end(key, stored=_succeeded(done)))
        try:
            if dead:
                self._send_dead_letter(built, outcome, on_stored)
            else:
                self._send_retry(built, outcome, held, on_stored)
        except BaseException:
            outcome.cancel()  # nothing was sent: it is no longer on its way
            raise
        return outcome

    @staticmethod
    def _stored(outcome: concurrent.futures.Future[str], where: str, on_stored: Callable[[], None] | None) -> None:
        """The copy is stored: run *on_stored*, then settle *outcome* with *where* (or its exception)."""
        if on_stored is not None:
            try:
                on_stored()
            except Exception as exc:  # e.g. closed meanwhile: the original stays unacked
                outcome.set_exception(exc)
                return
        outcome.set_result(where)

    def _send_retry(
        self,
        built: RawMessage,
        outcome: concurrent.futures.Future[str],
        batched: bool,
        on_stored: Callable[[], None] | None,
    ) -> None:
        """Send a retry copy with a retry producer (the batching one for a held copy); settle *outcome* on the client's thread."""

        def sent(result: Any, _message_id: Any) -> None:
            if not is_ok(result):
                outcome.set_exception(_error_for(result))
                return
            with self._lock:
                self._counts["reconsumed"] += 1
            self._stored(outcome, "retry", on_stored)

        def send(producer: concurrent.futures.Future[Any]) -> None:
            error = producer.exception()
            if error is not None:
                outcome.set_exception(error)
                return
            try:
                producer.result().send_async(built, sent)
            except Exception as exc:  # e.g. the producer was closed meanwhile
                outcome.set_exception(exc)

        producer = self._producer(batched)
        if producer.done():
            send(producer)  # the common path: no callback to chain
        else:
            producer.add_done_callback(send)

    def _send_dead_letter(
        self, built: RawMessage, outcome: concurrent.futures.Future[str], on_stored: Callable[[], None] | None
    ) -> None:
        """Send a copy past ``max_redeliver_count`` through the consumer's dead-letter sender."""
        if self._dead_letter is None:
            raise DeadLetterError("a reconsume past max_redeliver_count needs a dead-letter sender")

        def done(error: BaseException | None) -> None:
            if error is not None:
                outcome.set_exception(error)
                return
            with self._lock:
                self._counts["retry_dead_lettered"] += 1
            self._stored(outcome, "dead_letter", on_stored)

        self._dead_letter.send_message_async(built, self.topics.dead_letter_topic, done)

    def _producer(self, batched: bool = False) -> concurrent.futures.Future[Any]:
        """A retry producer (*batched*: of the copies the consumers hold), created once on first use
        (asynchronously); a failed one is retried."""
        with self._lock:
            if self._closed:
                raise pulsar.exceptions.AlreadyClosed("Pulsar error: AlreadyClosed (the consumer is closed)")
            future = self._producer_futures.get(batched)
            if future is not None and not (future.done() and future.exception() is not None):
                return future
            future = self._producer_futures[batched] = concurrent.futures.Future()

        def created(result: Any, producer: Any) -> None:
            if is_ok(result):
                future.set_result(KeepingProducer(producer))
            else:
                future.set_exception(_error_for(result))

        try:
            self._raw_client.create_producer_async(
                self.topics.retry_letter_topic, retry_producer_configuration(batched), created
            )
        except Exception as exc:
            future.set_exception(exc)
        return future

    # -------------------------------------------------------------- receiving

    def is_retry_copy(self, raw: RawMessage) -> bool:
        """True if *raw* was read from the retry letter topic. O(1)."""
        topic = raw.topic_name()
        retry = self.topics.retry_letter_topic
        return topic == retry or (topic.startswith(retry) and PARTITION_SUFFIX.sub("", topic) == retry)

    def admit(self, raw: RawMessage, in_memory: bool = False) -> bool:
        """True if the retry copy *raw* may go to the application now; else it is held.

        A held copy stays unacked (durable). With *in_memory*, one due within
        :data:`MEMORY_HOLD_MS`, or within ``hold_ms`` while fewer than
        :data:`MEMORY_HOLD_MAX` are kept, is kept here, for :meth:`pop_due` to return when due;
        otherwise it is nacked into this letter's never-early tracker with the time
        left, and comes back when due (at most about a handoff, 100-150 ms, late). A
        copy of a message whose hold is pending (a batch sibling's redelivery) is
        swallowed the same way. A copy of a message kept here already replaces it, and
        the copies kept before the retry topic's consumer reconnected are dropped, left
        unacked (:mod:`~pulsar_nack.consumer.memory_hold`): the broker has sent them
        again, maybe to another consumer. O(1); O(log n) for a copy kept in memory.
        """
        return self._admit_copy(raw, in_memory, queue_due=False)

    def _admit_copy(self, raw: RawMessage, in_memory: bool, queue_due: bool) -> bool:
        """:meth:`admit`; with *queue_due* a copy due now is queued for :meth:`pop_due` (and False returned)."""
        if self._in_flight and self._in_flight.swallow(message_key(raw), raw, self._redeliver_copy):
            return False  # its reconsume is on its way: a reconnect's copy, kept unacked
        if not self._hold.admit(raw):
            return False
        due = due_time_ms(raw)
        left = 0 if due is None else due + 1 - self._clock_ms()  # +1: publish times are whole ms, rounded down
        if left > 0:
            with self._lock:
                self._counts["held"] += 1
        if left <= 0 and not (queue_due and in_memory):
            return True
        if in_memory and self._memory.keep(message_key(raw), raw, left):
            wake = self._listeners[1]
            if wake is not None:
                wake()
            return False
        self._hold.nack(raw, min(left, MAX_DELAY_MS))
        return False

    def pop_due(self) -> RawMessage | None:
        """The earliest copy queued here if it is due now, else None; counted as delivered. O(log n)."""
        return self.take_due()[0]

    def take_due(self) -> tuple[RawMessage | None, int | None]:
        """:meth:`pop_due` and :meth:`ms_to_next_due` in one: ``(copy, 0)`` for a copy due now (counted
        as delivered), ``(None, ms)`` while the earliest is not due, ``(None, None)`` with nothing
        queued. One clock read, and the lock only for a copy due: the receive loop calls it for every
        message, and with copies held by the consumers (``hold_ms``) some are always queued. O(log n)."""
        copy, wait = self._memory.take_due()
        if copy is not None:
            with self._lock:
                self._counts["retry_delivered"] += 1
        return copy, wait

    def ms_to_next_due(self) -> int | None:
        """Milliseconds until the earliest copy queued here is due (0: now), or None. O(1)."""
        return self._memory.ms_to_next_due()

    def message(self, raw: RawMessage, schema: Any) -> RetryMessage:
        """The :class:`RetryMessage` the application gets for the copy *raw* (with its arrival, if queued here)."""
        wrapped = wrap_message(raw, schema if schema is not None else pulsar.schema.BytesSchema(), RetryMessage)
        assert isinstance(wrapped, RetryMessage)
        wrapped.arrived_at_ms = self._memory.arrival(raw)
        return wrapped

    def held(self) -> int:
        """Copies held now (delivered early, waiting here or in the hold tracker). O(1)."""
        return len(self._memory) + len(self._hold.tracker)

    def counts(self) -> dict[str, int]:
        """``reconsumed`` (retry copies stored), ``retry_dead_lettered`` (DLQ copies), ``held`` (early
        copies held), ``retry_delivered`` (copies handed to the application)."""
        with self._lock:
            return dict(self._counts)

    def close(self, redeliver_pending: bool = True) -> None:
        """Close the hold tracker, the retry topic's consumer and the producers. Idempotent.

        Held copies are handed to the client first (*redeliver_pending*) or left unacked;
        either way the broker redelivers them, and copies queued here, when the consumer
        is gone.
        """
        check_bool("redeliver_pending", redeliver_pending)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            producers, self._producer_futures = list(self._producer_futures.values()), {}
        self._memory.close()  # its copies are unacked: the broker redelivers them when the consumer closes
        self._hold.close(redeliver_pending)
        consumer, self._copies = self._copies, None
        for closer in (
            None if consumer is None else consumer.close,
            *(functools.partial(_close_producer, producer) for producer in producers),
            self._dead_letter.close if self._own_dead_letter else None,
        ):
            if closer is None:
                continue
            try:
                closer()
            except Exception:  # a broken connection, a producer that never came up: nothing to close
                _log.debug("closing part of a retry letter failed", exc_info=True)

