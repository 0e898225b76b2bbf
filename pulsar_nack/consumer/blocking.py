"""`NackingConsumer` and `subscribe()`: a `pulsar.Consumer` with our tracker inside.

The application keeps the consumer API it knows; ``negative_acknowledge`` goes to a
:class:`~pulsar_nack.core.tracker.NegativeAcksTracker` instead of the client's own tracker.
The broker-agnostic part (tracker, keys, pending set, handoff) is
:class:`~pulsar_nack.consumer.nacking.NackingCore`; this module adds the ``pulsar.Consumer``
surface around it.

Handoff to the client
    The Python client can redeliver specific messages in one way only:
    ``negative_acknowledge(MessageId)``, into the C++ tracker (min delay 100 ms, a timer
    every delay/3). So the consumer is subscribed with
    ``negative_ack_redelivery_delay_ms=handoff_delay_ms`` (100). The client's timer
    ticks every ``delay // 3`` (33 ms) from the first nack and releases only entries
    strictly past due, so a handoff to an idle tracker comes back on the 4th tick,
    132 ms later. Our buckets fire early by exactly that client latency
    (:func:`~pulsar_nack.consumer.nacking.client_handoff_latency_ms`), so a message arrives a
    few ms after its bucket deadline, while bursts are at least 165 ms apart (buckets
    of 256 ms and more). Below 8 precision bits, and with ``never_early``, buckets fire
    early by only the client's delay (100 ms): a message then arrives 0-33 ms after its
    bucket deadline, never before it. Each due entry is handed over as
    ``_pulsar.MessageId(partition, ledger, entry, -1)`` with its topic name set (the
    multi-topic consumer routes by it and silently drops ids without one).

Bursts, not a trickle
    Every ``negative_acknowledge`` into the C++ client re-arms its ~33 ms timer, so
    handoffs closer together than that starve it. The tracker coalesces: one burst per
    due bucket, never two bursts less than ``coalesce_ms`` (50) apart.

Batches
    The broker redelivers whole entries. With batch-index acknowledgement (which
    :func:`subscribe` turns on) the broker's ack set makes the client skip acked
    siblings of a redelivered entry. Siblings whose own nack is still pending are
    swallowed (left unacked; their own handoff brings them back); every other sibling is
    delivered again, as the plain client does, so nothing unsettled is stuck. No state
    is kept for a batch without a pending nack.
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from time import monotonic_ns as _monotonic_ns
from typing import Any, TypedDict

import _pulsar
import pulsar

from .._validate import check_bool, check_int, check_ms, check_name, check_topics
from ..core.backoff import RedeliveryBackoff
from ..core.buckets import DEFAULT_PRECISION_BITS
from ..core.timer import monotonic_ms
from ..core.tracker import TrackerStats
from ..errors import ConsumerClosedError
from .dead_letter import DeadLetter
from .nacking import (
    COALESCE_MS,
    HANDOFF_DELAY_MS,
    NackingCore,
    client_handoff_latency_ms,
)

__all__ = [
    "ConsumerClosedError",
    "ConsumerStats",
    "NackingConsumer",
    "client_handoff_latency_ms",
    "subscribe",
]

_log = logging.getLogger(__name__)

_Message = pulsar.Message
ACK_FLUSH_MS = 150
"""Wait before ``redeliver_unacknowledged_messages``: the client's ack grouping (100 ms) plus margin."""


def _is_received(message: Any) -> bool:
    return isinstance(message, (pulsar.Message, _pulsar.Message))


class ConsumerStats(TypedDict):
    """Counters of a :class:`NackingConsumer`, with its tracker's stats."""

    received: int
    delivered: int
    swallowed: int
    acked: int
    nacked: int
    dead_lettered: int
    handed_off_entries: int
    handoff_bursts: int
    pending_guarded: int
    tracker: TrackerStats


class NackingConsumer:
    """A ``pulsar.Consumer`` whose negative acknowledgements use PIP-393 time buckets.

    Create it with :func:`subscribe` (recommended) or :meth:`wrap`. The methods mirror
    ``pulsar.Consumer``; ``negative_acknowledge`` takes an optional per-call
    ``delay_ms``. Messages and ids may be ``pulsar`` or ``_pulsar`` objects.

    Parameters
    ----------
    consumer : pulsar.Consumer
        Subscribed with ``negative_ack_redelivery_delay_ms=handoff_delay_ms``.
    topics : list of str, str, or re.Pattern
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
    guard_unbatched : bool
        Swallow early copies of nacked non-batched messages too (set by :func:`subscribe`
        when ``unacked_messages_timeout_ms`` is given: the client's ack timeout would
        otherwise redeliver a nacked message before its delay).
    """

    _consumer: pulsar.Consumer
    _raw: Any  # the _pulsar.Consumer inside, or the stand-in itself
    _core: NackingCore
    _closed: bool

    def __init__(
        self,
        consumer: pulsar.Consumer,
        topics: Iterable[str] | re.Pattern[str],
        *,
        negative_ack_redelivery_delay_ms: int = 60_000,
        negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS,
        redelivery_backoff: RedeliveryBackoff | None = None,
        never_early: bool = False,
        handoff_delay_ms: int = HANDOFF_DELAY_MS,
        coalesce_ms: int = COALESCE_MS,
        guard_unbatched: bool = False,
        dead_letter: DeadLetter | None = None,
        _core: NackingCore | None = None,
    ) -> None:
        if not isinstance(consumer, pulsar.Consumer):
            raise TypeError(f"consumer must be a pulsar.Consumer, not {type(consumer).__name__}")
        if _core is None:
            check_ms("handoff_delay_ms", handoff_delay_ms)
            check_ms("coalesce_ms", coalesce_ms)
            _core = NackingCore(
                self._hand_off,
                topics,
                negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
                redelivery_backoff=redelivery_backoff,
                never_early=never_early,
                handoff_delay_ms=handoff_delay_ms,
                coalesce_ms=coalesce_ms,
                guard_unbatched=guard_unbatched,
                count_deliveries=dead_letter is not None,
            )
        self._core = _core
        self._dead_letter = dead_letter
        self._consumer = consumer
        raw = getattr(consumer, "_consumer", None)
        self._raw = raw if isinstance(raw, _pulsar.Consumer) else None
        self._schema = getattr(consumer, "_schema", None)
        self._closed = False
        self.tracker = _core.tracker
        self.handoff_delay_ms = _core.handoff_delay_ms

    @classmethod
    def wrap(
        cls,
        consumer: pulsar.Consumer,
        topics: str | list[str] | tuple[str, ...],
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

        Early copies of messages whose nack is still pending (a batch sibling's
        redelivery, the client's ack timeout) are swallowed here, left unacked: their own
        handoff brings them back. Raises ``pulsar.Timeout`` as the client does when
        nothing arrives within *timeout_millis*. Runtime complexity: O(1).
        """
        if self._closed:
            raise ConsumerClosedError("this NackingConsumer is closed")
        raw = self._raw
        if raw is None:
            return self._receive_wrapped(timeout_millis)
        core = self._core
        if timeout_millis is None:
            message = raw.receive()
        else:
            if type(timeout_millis) is not int or timeout_millis < 0:
                check_int("timeout_millis", timeout_millis, 0)
            start_ns = _monotonic_ns()
            message = raw.receive(timeout_millis)
        while True:
            if not core._pending._count:  # the common path: nothing to compare with
                next(core.received)
            elif not core.admit(message):  # an early copy: swallowed, wait for the next
                if timeout_millis is None:
                    message = raw.receive()
                else:
                    left = timeout_millis - (_monotonic_ns() - start_ns) // 1_000_000
                    message = raw.receive(max(left, 0))
                continue
            wrapped = _Message()
            wrapped._message = message
            wrapped._schema = self._schema
            return wrapped

    def _receive_wrapped(self, timeout_millis: int | None) -> pulsar.Message:
        """receive() through the ``pulsar.Consumer`` methods (a stand-in consumer)."""
        deadline = None if timeout_millis is None else monotonic_ms() + check_int("timeout_millis", timeout_millis, 0)
        while True:
            if deadline is None:
                message = self._consumer.receive()
            else:
                message = self._consumer.receive(max(deadline - monotonic_ms(), 0))
            if self._core.admit(getattr(message, "_message", message)):
                return message

    def batch_receive(self) -> list[pulsar.Message]:
        """Receive a batch (per the consumer's batch receive policy), early copies removed."""
        self._check_open()
        return [m for m in self._consumer.batch_receive() if self._core.admit(getattr(m, "_message", m))]

    def _admit(self, message: Any) -> bool:
        """Record a received message (wrapped or raw); False if it is an early copy."""
        return self._core.admit(getattr(message, "_message", message))

    # ------------------------------------------------------------------ settling

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or id (``pulsar`` or ``_pulsar``). O(1).

        Raises TypeError for something that is not a message or id, ValueError for a
        message of another topic or a batch index outside its batch (nothing is sent).
        """
        if self._closed:
            raise ConsumerClosedError("this NackingConsumer is closed")
        core = self._core
        if type(message) is _Message and not core._pending._count and self._raw is not None:
            self._raw.acknowledge(message._message)  # the common path: nothing to check
        else:
            raw = core.before_ack(message)
            if self._raw is not None:
                self._raw.acknowledge(raw)
            else:
                self._consumer.acknowledge(raw)
        next(core.acked)

    def acknowledge_cumulative(self, message: Any) -> None:
        """Acknowledge everything up to *message* (not supported on Shared subscriptions).

        Accepts a message or an id, also a bare id on a multi-topic consumer (the id
        carries its topic inside the client). Validated before anything is sent.
        """
        self._check_open()
        raw = self._core.before_ack(message)
        self._consumer.acknowledge_cumulative(raw)

    def negative_acknowledge(self, message: Any, delay_ms: int | None = None) -> None:
        """Redeliver *message* after *delay_ms*, the backoff's delay, or the fixed delay.

        Raises
        ------
        TypeError
            For something that is not a pulsar message or id, or a non-int delay.
        ValueError
            For a negative delay, a message of another consumer, a batch index outside
            its batch, or a batch message whose nack is already pending.
        ConsumerClosedError
            After :meth:`close`.
        """
        if self._closed:
            raise ConsumerClosedError("this NackingConsumer is closed")
        if delay_ms is not None:
            check_ms("delay_ms", delay_ms)
        dead_letter = self._dead_letter
        if dead_letter is not None and _is_received(message):
            self._core.key_of(message)  # validates: nothing is sent for bad input
            if self._core.deliveries(message) >= dead_letter.max_redeliver_count:
                dead_letter.send(message)
                self.acknowledge(message)
                self._core.dead_lettered(message)
                return
        self._core.nack(message, delay_ms)

    # ------------------------------------------------------------------ handoff

    def _hand_off(self, ids: list[_pulsar.MessageId]) -> None:
        """Core callback: give each due entry to the client's own tracker."""
        if self._raw is not None:
            nack = self._raw.negative_acknowledge
        else:
            nack = self._consumer.negative_acknowledge
        for message_id in ids:
            nack(message_id)

    # ------------------------------------------------------------------ the rest of the API

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacked message now.

        Pending nacks are dropped: their messages are unacked, so they come back now
        with the rest. With batch-index acknowledgement (what :func:`subscribe` sets) the
        broker's ack set keeps acked batch siblings from coming back. The client groups
        acks for 100 ms before sending them, so this call first waits ``ACK_FLUSH_MS``
        (150 ms): the broker has then recorded every earlier ack when the request arrives.
        """
        self._check_open()
        self._core.reset()
        time.sleep(ACK_FLUSH_MS / 1000)  # let the client send its grouped acks first
        self._consumer.redeliver_unacknowledged_messages()

    def seek(self, message_id: Any) -> None:
        """Reset the subscription to a message id or a publish timestamp (ms), as the client.

        Pending nacks are dropped first: messages after the new position are delivered
        again anyway, and those before it are skipped by the seek itself.
        """
        self._check_open()
        if isinstance(message_id, bool) or not isinstance(message_id, (int, pulsar.MessageId, _pulsar.MessageId)):
            raise TypeError(f"seek takes a MessageId or a timestamp in ms, not {type(message_id).__name__}")
        self._core.reset()
        self._consumer.seek(message_id)

    def get_last_message_id(self) -> Any:
        """The id of the last message of the topic, as the client returns it."""
        self._check_open()
        return self._consumer.get_last_message_id()

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
        self._core.close(redeliver_pending=False)
        self._consumer.unsubscribe()
        self._closed = True

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
        self._closed = True
        self._core.close(redeliver_pending)
        self._consumer.close()
        if self._dead_letter is not None:
            self._dead_letter.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConsumerStats:
        """Counters, plus the tracker's stats."""
        return ConsumerStats(**self._core.counts(), tracker=self.tracker.stats())  # type: ignore[typeddict-item]  # (counts() returns the ConsumerStats keys, typed as dict[str, int])

    def __enter__(self) -> NackingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NackingConsumer topics={self._core.topics!r} pending={len(self.tracker)} closed={self._closed}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("this NackingConsumer is closed")


_SUBSCRIBE_KEYWORDS = frozenset(inspect.signature(pulsar.Client.subscribe).parameters) - {
    "self",
    "topic",
    "subscription_name",
    "negative_ack_redelivery_delay_ms",
    "message_listener",
}


def _check_subscribe_args(
    client: Any, topic: Any, subscription_name: Any, message_listener: Any, subscribe_kwargs: dict[str, Any]
) -> list[str] | re.Pattern[str]:
    """Validate every argument :func:`subscribe` checks itself; return the topics. Changes nothing."""
    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, not {type(client).__name__}")
    check_name("subscription_name", subscription_name)
    topics: list[str] | re.Pattern[str] = topic if isinstance(topic, re.Pattern) else check_topics("topic", topic)
    unknown = sorted(set(subscribe_kwargs) - _SUBSCRIBE_KEYWORDS)
    if unknown:
        raise TypeError(f"subscribe() got unexpected keyword argument(s): {', '.join(unknown)}")
    if message_listener is not None and not callable(message_listener):
        raise TypeError("message_listener must be callable")
    check_bool("batch_index_ack_enabled", subscribe_kwargs.get("batch_index_ack_enabled", True))
    return topics


def subscribe(
    client: pulsar.Client,
    topic: str | list[str] | re.Pattern[str],
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

    Takes every keyword of ``pulsar.Client.subscribe`` (*topic* may be a list or a
    ``re.Pattern``); ``negative_ack_redelivery_delay_ms`` becomes the tracker's fixed
    delay and the consumer itself is subscribed with the 100 ms handoff delay.
    ``batch_index_ack_enabled`` defaults to True here (False in pulsar): with it the
    broker's ack set keeps acked batch siblings from coming back. A
    ``message_listener`` receives the :class:`NackingConsumer` and only the messages it
    should see. Every argument is validated before anything is subscribed.

    Example (needs a broker; ``examples/wrap_consumer.py`` runs one)::

        consumer = pulsar_nack.subscribe(client, "orders", "billing",
            consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=5000)
    """
    topics = _check_subscribe_args(client, topic, subscription_name, message_listener, subscribe_kwargs)
    subscribe_kwargs.setdefault("batch_index_ack_enabled", True)
    policy = subscribe_kwargs.pop("dead_letter_policy", None)
    if policy is not None and not isinstance(policy, pulsar.ConsumerDeadLetterPolicy):
        raise TypeError(f"dead_letter_policy must be a pulsar.ConsumerDeadLetterPolicy, not {type(policy).__name__}")
    dead_letter = None if policy is None else DeadLetter(client, subscription_name, policy)
    holder: list[NackingConsumer] = []

    def hand_off(ids: list[_pulsar.MessageId]) -> None:
        holder[0]._hand_off(ids)

    core = NackingCore(  # validates the tracker's settings before the broker sees anything
        hand_off,
        topics,
        negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
        redelivery_backoff=redelivery_backoff,
        never_early=never_early,
        guard_unbatched=subscribe_kwargs.get("unacked_messages_timeout_ms") is not None,
        count_deliveries=dead_letter is not None,
    )
    ready = threading.Event()
    listener = None
    if message_listener is not None:

        def listener(_consumer: pulsar.Consumer, message: pulsar.Message) -> None:
            ready.wait()
            wrapper = holder[0]
            if wrapper.closed or not wrapper._admit(message):
                return
            try:
                message_listener(wrapper, message)
            except Exception:
                _log.exception("message listener failed")

    try:
        consumer = client.subscribe(
            topics if isinstance(topics, re.Pattern) or len(topics) > 1 else topics[0],
            subscription_name,
            negative_ack_redelivery_delay_ms=HANDOFF_DELAY_MS,
            message_listener=listener,
            **subscribe_kwargs,
        )
    except BaseException:
        core.close(redeliver_pending=False)
        raise
    wrapper = NackingConsumer(consumer, topics, dead_letter=dead_letter, _core=core)
    holder.append(wrapper)
    ready.set()
    return wrapper
