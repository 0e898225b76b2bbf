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
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import pulsar
import pulsar.asyncio as pulsar_asyncio

from .._validate import check_bool, check_name
from ..core.backoff import RedeliveryBackoff
from ..core.buckets import DEFAULT_PRECISION_BITS
from ..timing import ACK_FLUSH_MS, HANDOFF_DELAY_MS
from ._client import async_get_last_message_id, async_redeliver_unacknowledged, consumer_schema, raw_id
from .admission import Screening
from .common import ConsumerBase
from .keywords import AsyncSubscribeKeywords
from .nacking import TopicMatcher
from .retry import RetryLetter, retry_topics_for
from .settings import ConsumerSettings, seek_target, subscribe_settings

__all__ = ["AsyncNackingConsumer", "subscribe"]

if TYPE_CHECKING:  # pragma: no cover - typing only
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

_log = logging.getLogger(__name__)


class AsyncNackingConsumer(ConsumerBase):
    """A ``pulsar.asyncio.Consumer`` whose negative acknowledgements use PIP-393 time buckets.

    Create it with :func:`subscribe`. The coroutine methods mirror
    ``pulsar.asyncio.Consumer``; ``negative_acknowledge`` takes an optional per-call
    ``delay_ms``. Messages and ids may be ``pulsar`` or ``_pulsar`` objects.

    Parameters
    ----------
    consumer : pulsar.asyncio.Consumer
        Subscribed with ``negative_ack_redelivery_delay_ms=settings.handoff_delay_ms``.
    topics : list of str, str, or re.Pattern
        What the consumer reads (messages of other topics are refused).
    settings : ConsumerSettings, optional
        The same settings object :class:`~pulsar_nack.consumer.NackingConsumer` takes.
    client : pulsar.asyncio.Client, optional
        Needed with a dead-letter policy (it creates the dead-letter producers).
    retry : RetryLetter, optional
        The retry letter topic and its own consumer (:func:`subscribe` with
        ``retry_enable=True``): :meth:`reconsume_later`, and the copies that come back.
    """

    _consumer: pulsar_asyncio.Consumer

    def __init__(
        self,
        consumer: pulsar_asyncio.Consumer,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None = None,
        *,
        client: pulsar_asyncio.Client | None = None,
        retry: RetryLetter | None = None,
    ) -> None:
        if not isinstance(consumer, pulsar_asyncio.Consumer):
            raise TypeError(f"consumer must be a pulsar.asyncio.Consumer, not {type(consumer).__name__}")
        super().__init__(consumer, topics, settings, client, retry)
        self._main_receive: asyncio.Future[Any] | None = None  # kept across calls when a retry copy won
        self._copy_ready: asyncio.Event | None = None

    # ------------------------------------------------------------------ receiving

    async def receive(self) -> pulsar.Message:
        """Receive the next message the application should see.

        Copies the application must not see (of a message whose nack is pending, of a
        message that came back and is not settled yet, of an acked message) are dropped
        here: see :meth:`~pulsar_nack.consumer.nacking.NackingCore.admit`. With a
        dead-letter policy, a message the application has seen ``max_redeliver_count +
        1`` times goes to the dead-letter topic instead. Cancelling a receive
        (``asyncio.wait_for``) behaves as in ``pulsar.asyncio``. Runtime complexity:
        O(1) per received message.
        """
        self._check_open()
        if self._retry is not None:
            return await self._receive_retrying(self._retry)
        core = self._core
        while True:
            message = await self._plain.receive()
            if core.ledger.screening is Screening.NONE:
                next(core.received)
                if core.started is not None:  # an ack timeout: logged, its id read a tick later only if unsettled
                    core.started(message)
                return message
            if core.admit(message):
                return message

    async def _receive_retrying(self, retry: RetryLetter) -> pulsar.Message:
        """receive() with a retry letter topic: the first of a due retry copy and a message of its own topics.

        A receive on its own topics that loses the race is kept for the next call, so no
        message waits in a cancelled receive.
        """
        ready = self._copy_ready
        assert ready is not None  # set when the retry consumer was subscribed
        admit = self._core.admit
        while True:
            self._check_open()  # close() dropped the kept receive: start no other
            ready.clear()
            copy = retry.pop_due()
            if copy is not None:
                return retry.message(copy, consumer_schema(self._plain))
            if self._main_receive is None:
                self._main_receive = asyncio.ensure_future(self._plain.receive())
            waiter = asyncio.ensure_future(ready.wait())
            wait = retry.ms_to_next_due()
            try:
                done, _ = await asyncio.wait(
                    {self._main_receive, waiter}, timeout=None if wait is None else wait / 1000,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                waiter.cancel()
            if self._main_receive in done:
                main, self._main_receive = self._main_receive, None
                message = main.result()
                if not retry.swallowed(message, self._redeliver) and admit(message):
                    return message

    def _drop_main_receive(self) -> None:
        """Cancel a receive kept from a call a retry copy won (its message, if any, stays unacked)."""
        main, self._main_receive = self._main_receive, None
        if main is not None and not main.cancel() and not main.cancelled() and main.exception() is None:
            _log.debug("a received message is left unacked by close(); the broker redelivers it")

    def _copy_waker(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """A callable for the retry topic's consumer (on the client's thread): a copy is queued, wake :meth:`receive`."""
        ready = self._copy_ready = asyncio.Event()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop is closed: nobody waits
                pass

        return wake

    # ------------------------------------------------------------------ settling

    async def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or id (``pulsar`` or ``_pulsar``).

        Validated before anything is sent: TypeError for something that is not a
        message or id, ValueError for a message of another topic.
        """
        self._check_open()
        if self._retry is not None and self._retry.owns(message):  # a retry copy: its own consumer (no wait)
            self._retry.acknowledge(message)
        else:
            raw = self._core.before_ack(message)
            if raw is not None:  # None: recorded, acked with its entry
                await self._plain.acknowledge(raw)
            self._core.after_ack()
        next(self._core.acked)

    async def acknowledge_cumulative(self, message: Any) -> None:
        """Acknowledge everything up to *message* (not on Shared subscriptions)."""
        self._check_open()
        if self._retry is not None and self._retry.owns(message):
            raise ValueError("a retry copy cannot be acknowledged cumulatively (its subscription is Shared)")
        raw = self._core.before_ack(message)
        await self._plain.acknowledge_cumulative(raw if raw is not None else raw_id(message))
        self._core.after_ack()

    async def negative_acknowledge(self, message: Any, delay_ms: int | None = None) -> None:
        """Redeliver *message* after *delay_ms*, the backoff's delay, or the fixed delay.

        Does no I/O: the nack goes into the tracker at once (O(1), a lock held for
        microseconds), and the timer thread hands it to the client when it is due. With
        a dead-letter policy, a message at its last delivery goes to the dead-letter
        topic instead (sent on the client's threads; acknowledged once stored).

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
        self._check_open()
        if self._retry is not None and self._retry.owns(message):  # never early, on the retry topic's consumer
            self._retry.nack(message, delay_ms)
            return
        self._core.nack(message, delay_ms)

    async def reconsume_later(
        self, message: Any, delay_ms: int | None = None, properties: dict[str, str] | None = None
    ) -> None:
        """Retry *message* durably: republish it to the retry letter topic, then ack it.

        As :meth:`NackingConsumer.reconsume_later <pulsar_nack.consumer.NackingConsumer.reconsume_later>`:
        needs ``subscribe(..., retry_enable=True)``; returns once the broker stored the
        copy and the original is acked; if the produce fails, the original stays
        unacked and the client's exception is raised. The send is asynchronous (the
        loop is never blocked). Early copies are held until due (nacked into the
        retry letter's never-early tracker).
        """
        self._check_open()
        retry = self._reconsume_target(message)  # validates: nothing is sent for bad input
        await asyncio.wrap_future(retry.submit(message, delay_ms, properties))
        await self.acknowledge(message)

    async def reject(self, message: Any, properties: dict[str, str] | None = None) -> None:
        """Give up on *message* now: send it to the dead-letter topic, whatever its redelivery count, then ack it.

        As :meth:`NackingConsumer.reject <pulsar_nack.consumer.NackingConsumer.reject>`;
        returns once the dead letter is stored and the original acknowledged. The send
        is asynchronous (the loop is never blocked).
        """
        future, ack_after = self._reject(message, properties)
        await asyncio.wrap_future(future)
        if ack_after:
            await self.acknowledge(message)

    async def in_progress(self, message: Any) -> bool:
        """Push the ack timeout of *message* to ``unacked_messages_timeout_ms`` from now; False if it is
        not in flight. As :meth:`NackingConsumer.in_progress <pulsar_nack.consumer.NackingConsumer.in_progress>`;
        does no I/O.
        """
        self._check_open()
        return self._core.in_progress(message)

    # ------------------------------------------------------------------ the rest of the API

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacked message; pending nacks are dropped.

        Not a coroutine, as in ``pulsar.asyncio``, and it does not block: the request
        goes out ``ACK_FLUSH_MS`` (150 ms) later, once the client has sent its grouped
        acks (100 ms), as :meth:`NackingConsumer.redeliver_unacknowledged_messages
        <pulsar_nack.consumer.NackingConsumer.redeliver_unacknowledged_messages>` waits
        for them. Acked batch siblings do not come back.
        """
        self._check_open()
        self._core.reset(forget_counts=False)
        try:
            asyncio.get_running_loop().call_later(ACK_FLUSH_MS / 1000, self._redeliver_now)
        except RuntimeError:  # called off the loop: a timer thread does it
            timer = threading.Timer(ACK_FLUSH_MS / 1000, self._redeliver_now)
            timer.daemon = True
            timer.start()

    def _redeliver_now(self) -> None:
        if not self._closed:
            async_redeliver_unacknowledged(self._plain)  # pulsar.asyncio has it from 3.10.0
            if self._retry is not None:
                self._retry.redeliver_unacknowledged_messages()

    async def seek(self, messageid: Any) -> None:
        """Reset the subscription to a message id or a publish timestamp (ms); pending nacks are dropped.

        Takes a ``pulsar`` or ``_pulsar`` id or an int and refuses the rest with
        :class:`~pulsar_nack.consumer.settings.SeekArgumentError` (a ``ValueError``, as
        the client raises, and a ``TypeError``), as :meth:`NackingConsumer.seek
        <pulsar_nack.consumer.NackingConsumer.seek>` does.
        """
        self._check_open()
        target = seek_target(messageid)
        if not isinstance(target, (int, pulsar.MessageId)):  # a _pulsar.MessageId: pulsar.asyncio wants the wrapper
            target = pulsar.MessageId.wrap(target)
        self._core.reset(forget_counts=True)
        await self._plain.seek(target)

    async def get_last_message_id(self) -> Any:
        self._check_open()
        return await async_get_last_message_id(self._plain)  # pulsar.asyncio has it from 3.10.0

    async def unsubscribe(self) -> None:
        """Unsubscribe (pending nacks are dropped with the subscription) and close."""
        self._check_open()
        self._closed = True
        loop = asyncio.get_running_loop()
        self._drop_main_receive()
        try:
            if self._retry is not None:
                await loop.run_in_executor(None, self._retry.unsubscribe)
            await loop.run_in_executor(None, self._close_core, False)
            await loop.run_in_executor(None, self._drain_dead_letters)
            await self._plain.unsubscribe()
            self._consumer_closed = True
        finally:
            await loop.run_in_executor(None, self._close_dead_letters)

    async def close(self, redeliver_pending: bool = True) -> None:
        """Close the consumer; nothing pending is lost. Idempotent.

        ``redeliver_pending=True`` (default) hands every pending nack to the client now,
        so those messages are redelivered at once (to this subscription's other
        consumers). ``False`` leaves them unacked: the broker redelivers them when this
        consumer is gone. The timer thread is joined, and dead letters in flight are
        waited for, in the default executor, so the loop keeps running meanwhile. If a
        step raises, the later ones still run, and calling ``close()`` again retries
        what did not finish.
        """
        check_bool("redeliver_pending", redeliver_pending)
        if self._released:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        self._drop_main_receive()
        try:
            await loop.run_in_executor(None, self._close_core, redeliver_pending)
        finally:
            try:
                await loop.run_in_executor(None, self._drain_dead_letters)
                if not self._consumer_closed:
                    await self._plain.close()
                    self._consumer_closed = True
            finally:
                await loop.run_in_executor(None, self._close_dead_letters)

    def __aiter__(self) -> AsyncNackingConsumer:
        """``async for message in consumer``: :meth:`receive` until the consumer is closed (see :meth:`__anext__`)."""
        return self

    async def __anext__(self) -> pulsar.Message:
        """The next message, as :meth:`receive` gives it; ``StopAsyncIteration`` once the consumer is closed.

        The iteration ends when :meth:`close` (or :meth:`unsubscribe`) has been called,
        by another task or (through the loop) another thread: a receive that waits is cut
        short by it, and a message received while the close runs is not handed out (it
        stays unacked, and the broker redelivers it). Any other error of :meth:`receive`
        is raised, and cancelling the task cancels the iteration as it cancels a receive.

        >>> async for message in consumer:  # doctest: +SKIP
        ...     await consumer.acknowledge(message)
        """
        if self._closed:
            raise StopAsyncIteration
        try:
            outcome: Any = await self.receive()
        except Exception as error:
            outcome = error
        message = self._iterated(outcome)
        if message is None:
            raise StopAsyncIteration
        return message

    async def __aenter__(self) -> AsyncNackingConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_SUBSCRIBE_KEYWORDS = frozenset(inspect.signature(pulsar_asyncio.Client.subscribe).parameters) - {
    "self",
    "topic",
    "subscription_name",
    "negative_ack_redelivery_delay_ms",
}


def _topics_of(topic: Any, is_pattern: Any) -> TopicMatcher:
    """The topics of a subscribe call, validated; a pattern becomes a ``re.Pattern``."""
    check_bool("is_pattern_topic", is_pattern)
    if is_pattern:
        if not isinstance(topic, str) or not topic:
            raise TypeError("with is_pattern_topic=True, topic must be a regex as a non-empty str")
        return TopicMatcher(re.compile(topic))
    topics = [topic] if isinstance(topic, str) else list(topic) if isinstance(topic, (list, tuple)) else None
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise TypeError("topic must be a topic name or a non-empty list of topic names")
    return TopicMatcher(topics)


async def subscribe(
    client: pulsar_asyncio.Client,
    topic: str | list[str],
    subscription_name: str,
    *,
    negative_ack_redelivery_delay_ms: int = 60_000,
    negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS,
    redelivery_backoff: RedeliveryBackoff | None = None,
    never_early: bool = False,
    retry_enable: bool = False,
    retry_letter_topic: str | None = None,
    retry_hold_ms: int = 0,
    **subscribe_kwargs: Unpack[AsyncSubscribeKeywords],
) -> AsyncNackingConsumer:
    """Subscribe like ``await client.subscribe(...)`` and return an :class:`AsyncNackingConsumer`.

    Takes every keyword of ``pulsar.asyncio.Client.subscribe`` (*topic* may be a list,
    or a regex with ``is_pattern_topic=True``). ``negative_ack_redelivery_delay_ms``
    becomes the tracker's fixed delay; the consumer itself is subscribed with the
    100 ms handoff delay. ``batch_index_ack_enabled`` defaults to True here (False in
    pulsar): with it the broker's ack set keeps acked batch siblings from coming back.
    A ``dead_letter_policy`` is handled as by :func:`pulsar_nack.subscribe`. Every
    argument is validated before anything is subscribed, by the same code as there
    (:func:`~pulsar_nack.consumer.settings.subscribe_settings`).

    ``retry_enable=True``, *retry_letter_topic* and *retry_hold_ms* add durable retries
    (:meth:`AsyncNackingConsumer.reconsume_later`), as for :func:`pulsar_nack.subscribe`.

    Example (needs a broker; ``examples/asyncio_consumer.py`` runs one)::

        client = pulsar.asyncio.Client("pulsar://localhost:6650")
        consumer = await pulsar_nack.asyncio.subscribe(client, "orders", "billing",
            consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=5000)
    """
    keywords = cast("dict[str, Any]", subscribe_kwargs)  # exactly what the caller gave
    if not isinstance(client, pulsar_asyncio.Client):
        raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
    check_name("subscription_name", subscription_name)
    unknown = sorted(set(keywords) - _SUBSCRIBE_KEYWORDS)
    if unknown:
        raise TypeError(f"subscribe() got unexpected keyword argument(s): {', '.join(unknown)}")
    topics = _topics_of(topic, keywords.get("is_pattern_topic", False))
    settings = subscribe_settings(
        keywords,
        negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
        redelivery_backoff=redelivery_backoff,
        never_early=never_early,
        retry_enable=retry_enable,
        retry_letter_topic=retry_letter_topic,
        retry_hold_ms=retry_hold_ms,
    )
    names = topics.pattern if topics.pattern is not None else [topic] if isinstance(topic, str) else list(topic)
    loop = asyncio.get_running_loop()
    retry_topics = await loop.run_in_executor(  # validates, then at most two lookups
        None, retry_topics_for, client, names, subscription_name, settings, keywords
    )
    if retry_topics is not None and settings.dead_letter_policy is not None:  # the nack path's DLQ: the same topic
        settings = settings.replace(dead_letter_policy=retry_topics.dead_letter_policy())
    consumer = await client.subscribe(
        topic, subscription_name, negative_ack_redelivery_delay_ms=HANDOFF_DELAY_MS, **keywords
    )
    retry = None
    try:
        if retry_topics is not None:
            retry = RetryLetter.for_settings(client, subscription_name, retry_topics, settings)
        wrapper = AsyncNackingConsumer(consumer, topics, settings, client=client, retry=retry)
    except BaseException:
        if retry is not None:
            await loop.run_in_executor(None, retry.close, False)
        await consumer.close()
        raise
    if retry is not None:  # the retry topic's own consumer (a blocking subscribe: in the executor)
        try:
            await loop.run_in_executor(None, retry.subscribe, keywords, None, wrapper._copy_waker(loop))
        except BaseException:
            await wrapper.close(redeliver_pending=False)
            raise
    return wrapper
