"""`pulsar_nack.asyncio`: the nacking consumer for ``pulsar.asyncio.Client``.

``await pulsar_nack.asyncio.subscribe(client, topic, subscription_name, **kw)`` returns
an :class:`AsyncNackingConsumer`: the API of ``pulsar.asyncio.Consumer`` (``await
receive()``, ``acknowledge``, ``negative_acknowledge``, ...), with the semantics of
:class:`~pulsar_nack.consumer.NackingConsumer`: per-call ``delay_ms``, backoff by
redelivery count, precision bits, batch-index awareness, and the same close modes.

Both consumers are built on one :class:`~pulsar_nack.consumer.nacking.NackingCore` (tracker,
keys, pending set, handoff); this module only adds the asyncio surface.

Threads and the event loop
    The tracker's timer thread hands due entries to the C++ client directly
    (``_pulsar.Consumer.negative_acknowledge``, which only queues the id in the
    client's own tracker): it never calls into the event loop, so a busy or blocked
    loop does not delay a redelivery. The loop calls into the core only for short,
    lock-protected updates (no I/O, no wait on the timer), and every client call that
    waits is awaited through the client's own callbacks, as ``pulsar.asyncio`` does.
    :meth:`AsyncNackingConsumer.close` joins the timer thread in the default executor,
    not on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Iterable
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from .._validate import check_bool, check_name
from ..core.backoff import RedeliveryBackoff
from ..core.buckets import DEFAULT_PRECISION_BITS
from ..core.tracker import NegativeAcksTracker
from .blocking import ConsumerClosedError, ConsumerStats
from .nacking import HANDOFF_DELAY_MS, NackingCore

__all__ = ["AsyncNackingConsumer", "subscribe"]


class AsyncNackingConsumer:
    """A ``pulsar.asyncio.Consumer`` whose negative acknowledgements use PIP-393 time buckets.

    Create it with :func:`subscribe`. The coroutine methods mirror
    ``pulsar.asyncio.Consumer``; ``negative_acknowledge`` takes an optional per-call
    ``delay_ms``. Messages and ids may be ``pulsar`` or ``_pulsar`` objects.

    Parameters
    ----------
    consumer : pulsar.asyncio.Consumer
        Subscribed with ``negative_ack_redelivery_delay_ms=handoff_delay_ms``.
    topics : list of str, str, or re.Pattern
        What the consumer reads (messages of other topics are refused).
    **settings
        ``negative_ack_redelivery_delay_ms``, ``negative_ack_precision_bit_cnt``,
        ``redelivery_backoff``, ``never_early``, ``handoff_delay_ms``, ``coalesce_ms``,
        ``guard_unbatched``: the keywords of :class:`~pulsar_nack.consumer.nacking.NackingCore`,
        as for :class:`~pulsar_nack.consumer.NackingConsumer`.
    """

    tracker: NegativeAcksTracker
    _consumer: pulsar_asyncio.Consumer
    _raw: _pulsar.Consumer
    _core: NackingCore
    _closed: bool

    def __init__(
        self,
        consumer: pulsar_asyncio.Consumer,
        topics: Iterable[str] | re.Pattern[str],
        *,
        _core: NackingCore | None = None,
        **settings: Any,
    ) -> None:
        if not isinstance(consumer, pulsar_asyncio.Consumer):
            raise TypeError(f"consumer must be a pulsar.asyncio.Consumer, not {type(consumer).__name__}")
        self._core = NackingCore(self._hand_off, topics, **settings) if _core is None else _core
        self._consumer = consumer
        self._raw = consumer._consumer
        self._closed = False
        self.tracker = self._core.tracker

    # ------------------------------------------------------------------ receiving

    async def receive(self) -> pulsar.Message:
        """Receive the next message the application should see.

        Early copies of messages whose nack is still pending (a batch sibling's
        redelivery, an ack timeout) are swallowed here, left unacked: their own handoff
        brings them back. Cancelling a receive (``asyncio.wait_for``) behaves as in
        ``pulsar.asyncio``. Runtime complexity: O(1) per received message.
        """
        self._check_open()
        admit = self._core.admit
        while True:
            message = await self._consumer.receive()
            if admit(message._message):
                return message

    # ------------------------------------------------------------------ settling

    async def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or id (``pulsar`` or ``_pulsar``).

        Validated before anything is sent: TypeError for something that is not a
        message or id, ValueError for a message of another topic.
        """
        self._check_open()
        raw = self._core.before_ack(message)
        await self._consumer.acknowledge(raw)
        next(self._core.acked)

    async def acknowledge_cumulative(self, message: Any) -> None:
        """Acknowledge everything up to *message* (not on Shared subscriptions)."""
        self._check_open()
        raw = self._core.before_ack(message)
        await self._consumer.acknowledge_cumulative(raw)

    async def negative_acknowledge(self, message: Any, delay_ms: int | None = None) -> None:
        """Redeliver *message* after *delay_ms*, the backoff's delay, or the fixed delay.

        Does no I/O: the nack goes into the tracker at once (O(1), a lock held for
        microseconds), and the timer thread hands it to the client when it is due.

        Raises
        ------
        TypeError
            For something that is not a pulsar message or id, or a non-int delay.
        ValueError
            For a negative delay, a message of another consumer, or a batch message
            whose nack is already pending.
        ConsumerClosedError
            After :meth:`close`.
        """
        self._check_open()
        self._core.nack(message, delay_ms)

    def _hand_off(self, ids: list[_pulsar.MessageId]) -> None:
        """Core callback, on the timer thread: queue each due entry in the C++ client.

        Never touches the event loop.
        """
        nack = self._raw.negative_acknowledge
        for message_id in ids:
            nack(message_id)

    # ------------------------------------------------------------------ the rest of the API

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacked message now; pending nacks are dropped."""
        self._check_open()
        self._core.reset()
        self._consumer.redeliver_unacknowledged_messages()

    async def seek(self, messageid: Any) -> None:
        """Reset the subscription to a message id or a publish timestamp (ms); pending nacks are dropped."""
        self._check_open()
        if isinstance(messageid, bool) or not isinstance(messageid, (int, pulsar.MessageId)):
            raise TypeError(f"seek takes a pulsar.MessageId or a timestamp in ms, not {type(messageid).__name__}")
        self._core.reset()
        await self._consumer.seek(messageid)

    async def get_last_message_id(self) -> _pulsar.MessageId:
        self._check_open()
        return await self._consumer.get_last_message_id()

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        return self._consumer.consumer_name()

    def is_connected(self) -> bool:
        return not self._closed and self._raw.is_connected()

    async def unsubscribe(self) -> None:
        """Unsubscribe (pending nacks are dropped with the subscription) and close."""
        self._check_open()
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._core.close, False)
        await self._consumer.unsubscribe()

    async def close(self, redeliver_pending: bool = True) -> None:
        """Close the consumer; nothing pending is lost. Idempotent.

        ``redeliver_pending=True`` (default) hands every pending nack to the client now,
        so those messages are redelivered at once (to this subscription's other
        consumers). ``False`` leaves them unacked: the broker redelivers them when this
        consumer is gone. The timer thread is joined in the default executor, so the
        loop keeps running meanwhile.
        """
        check_bool("redeliver_pending", redeliver_pending)
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._core.close, redeliver_pending)
        await self._consumer.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConsumerStats:
        """Counters (as :meth:`NackingConsumer.stats <pulsar_nack.consumer.NackingConsumer.stats>`), plus the tracker's."""
        return ConsumerStats(**self._core.counts(), tracker=self.tracker.stats())  # type: ignore[typeddict-item]  # (counts() returns the ConsumerStats keys, typed as dict[str, int])

    async def __aenter__(self) -> AsyncNackingConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncNackingConsumer topics={self._core.topics!r} pending={len(self.tracker)} closed={self._closed}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("this AsyncNackingConsumer is closed")


_SUBSCRIBE_KEYWORDS = frozenset(inspect.signature(pulsar_asyncio.Client.subscribe).parameters) - {
    "self",
    "topic",
    "subscription_name",
    "negative_ack_redelivery_delay_ms",
}


def _topics_of(topic: Any, is_pattern: Any) -> list[str] | re.Pattern[str]:
    """The topics of a subscribe call, validated; a pattern becomes a ``re.Pattern``."""
    check_bool("is_pattern_topic", is_pattern)
    if is_pattern:
        if not isinstance(topic, str) or not topic:
            raise TypeError("with is_pattern_topic=True, topic must be a regex as a non-empty str")
        return re.compile(topic)
    topics = [topic] if isinstance(topic, str) else list(topic) if isinstance(topic, (list, tuple)) else None
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise TypeError("topic must be a topic name or a non-empty list of topic names")
    return topics


async def subscribe(
    client: pulsar_asyncio.Client,
    topic: str | list[str],
    subscription_name: str,
    *,
    negative_ack_redelivery_delay_ms: int = 60_000,
    negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS,
    redelivery_backoff: RedeliveryBackoff | None = None,
    never_early: bool = False,
    **subscribe_kwargs: Any,
) -> AsyncNackingConsumer:
    """Subscribe like ``await client.subscribe(...)`` and return an :class:`AsyncNackingConsumer`.

    Takes every keyword of ``pulsar.asyncio.Client.subscribe`` (*topic* may be a list,
    or a regex with ``is_pattern_topic=True``). ``negative_ack_redelivery_delay_ms``
    becomes the tracker's fixed delay; the consumer itself is subscribed with the
    100 ms handoff delay. ``batch_index_ack_enabled`` defaults to True here (False in
    pulsar): with it the broker's ack set keeps acked batch siblings from coming back.
    Every argument is validated before anything is subscribed.

    Example (needs a broker; ``examples/asyncio_consumer.py`` runs one)::

        client = pulsar.asyncio.Client("pulsar://localhost:6650")
        consumer = await pulsar_nack.asyncio.subscribe(client, "orders", "billing",
            consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=5000)
    """
    if not isinstance(client, pulsar_asyncio.Client):
        raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
    check_name("subscription_name", subscription_name)
    unknown = sorted(set(subscribe_kwargs) - _SUBSCRIBE_KEYWORDS)
    if unknown:
        raise TypeError(f"subscribe() got unexpected keyword argument(s): {', '.join(unknown)}")
    if subscribe_kwargs.get("dead_letter_policy") is not None:
        raise TypeError(
            "dead_letter_policy is not supported by pulsar_nack.asyncio yet: the client's own dead-letter "
            "count includes swallowed batch copies; use pulsar_nack.subscribe (blocking), which counts deliveries"
        )
    topics = _topics_of(topic, subscribe_kwargs.get("is_pattern_topic", False))
    subscribe_kwargs.setdefault("batch_index_ack_enabled", True)
    check_bool("batch_index_ack_enabled", subscribe_kwargs["batch_index_ack_enabled"])
    # The core first: it validates the settings, so a bad call leaves no subscription behind.
    holder: list[AsyncNackingConsumer] = []
    core = NackingCore(
        lambda ids: holder[0]._hand_off(ids),  # noqa: PLW0108 (bound later; nothing is pending before)
        topics,
        negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
        redelivery_backoff=redelivery_backoff,
        never_early=never_early,
        guard_unbatched=bool(subscribe_kwargs.get("unacked_messages_timeout_ms")),
    )
    try:
        consumer = await client.subscribe(
            topic, subscription_name, negative_ack_redelivery_delay_ms=HANDOFF_DELAY_MS, **subscribe_kwargs
        )
    except BaseException:
        core.close(False)
        raise
    holder.append(AsyncNackingConsumer(consumer, topics, _core=core))
    return holder[0]
