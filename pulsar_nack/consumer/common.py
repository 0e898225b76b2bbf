"""What the blocking and the asyncio consumer share, written once.

:class:`ConsumerBase` builds the :class:`~pulsar_nack.consumer.nacking.NackingCore` from
a :class:`~pulsar_nack.consumer.settings.ConsumerSettings`, the dead-letter route when
the settings have a policy, and the handoff to the client; it holds the guards, the
counters and the close bookkeeping. :class:`~pulsar_nack.consumer.NackingConsumer` and
:class:`~pulsar_nack.consumer.async_consumer.AsyncNackingConsumer` add only the calls
that block or are awaited.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from .._validate import check_properties
from ..core.tracker import NegativeAcksTracker, TrackerStats
from ..errors import ConsumerClosedError, DeadLetterError
from ..timing import DEAD_LETTER_DRAIN_S
from ._client import RawMessageId, consumer_client, consumer_schema, raw_consumer, received
from .dead_letter import DeadLetter, DeadLetterRoute
from .nacking import NackingCore, TopicMatcher
from .retry import RetryLetter
from .settings import ConsumerSettings

__all__ = ["ConsumerBase", "ConsumerStats"]

_log = logging.getLogger(__name__)



class _ConsumerCounts(TypedDict):
    """The counters every nacking consumer has (see :class:`ConsumerStats`)."""

    received: int
    delivered: int
    swallowed: int
    filtered: int
    acked: int
    nacked: int
    dead_lettered: int
    handed_off_entries: int
    handoff_bursts: int
    pending_guarded: int
    memory_bytes: int
    tracker: TrackerStats


class ConsumerStats(_ConsumerCounts, total=False):
    """Counters of a nacking consumer, with its tracker's stats.

    ``memory_bytes`` estimates the consumer's own books beside its tracker: the nack sets,
    the complete entries and the table of entries in flight.

    With retry letter topics (``retry_enable=True``) also ``reconsumed`` (retry copies
    stored by ``reconsume_later``), ``retry_dead_lettered`` (reconsumes past
    ``max_redeliver_count``, stored in the DLQ) and ``held`` (retry copies the broker
    delivered early, held until due; not counted as received or delivered). With
    ``unacked_messages_timeout_ms`` also ``ack_timeout_in_flight`` (received messages not
    settled yet, under the consumer's ack timeout) and ``ack_timeout_memory_bytes``.
    """

    ack_timeout_in_flight: int
    ack_timeout_memory_bytes: int
    reconsumed: int
    retry_dead_lettered: int
    held: int


class ConsumerBase:
    """The parts of a nacking consumer that do not depend on blocking or awaiting.

    Parameters
    ----------
    consumer : pulsar.Consumer or pulsar.asyncio.Consumer
        The wrapped consumer, subscribed with
        ``negative_ack_redelivery_delay_ms=settings.handoff_delay_ms``.
    topics : list of str, str, re.Pattern, or TopicMatcher
        What the consumer reads (messages of other topics are refused).
    settings : ConsumerSettings, optional
        Default ``ConsumerSettings()``.
    client : pulsar.Client or pulsar.asyncio.Client, optional
        Needed with a dead-letter policy (it creates the dead-letter producers).
    retry : RetryLetter, optional
        The consumer's retry letter topic (``subscribe(..., retry_enable=True)`` makes
        it): ``reconsume_later``, and the copies its own consumer reads. With a
        dead-letter policy, the policy's sender sends its dead letters too.
    """

    tracker: NegativeAcksTracker
    settings: ConsumerSettings
    handoff_delay_ms: int
    _consumer: Any
    _raw: Any  # the _pulsar.Consumer inside, or None for a stand-in
    _core: NackingCore
    _route: DeadLetterRoute | None
    _retry: RetryLetter | None
    _closed: bool
    _core_closed: bool
    _consumer_closed: bool

    def __init__(
        self,
        consumer: Any,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None,
        client: Any,
        retry: RetryLetter | None = None,
    ) -> None:
        if settings is None:
            settings = ConsumerSettings()
        elif not isinstance(settings, ConsumerSettings):
            raise TypeError(f"settings must be a ConsumerSettings, not {type(settings).__name__}")
        self._raw = raw_consumer(consumer)
        self._plain = consumer
        core = NackingCore(self._hand_off, topics, settings, acknowledge=self._ack_quietly)
        self._route = None
        if core.counting:
            try:
                self._route = _dead_letter_route(consumer, settings, client, core, self._acknowledge_async)
            except BaseException:
                core.close(redeliver_pending=False)
                raise
        self._retry = retry
        if retry is not None and self._route is not None:
            retry.use_dead_letter(self._route.sender)  # one sender for the consumer's dead letters
        self._core = core
        self.settings = settings
        self.tracker = core.tracker
        self.handoff_delay_ms = core.handoff_delay_ms
        self._closed = self._core_closed = self._consumer_closed = False

    # ------------------------------------------------------------------ client calls that never block

    def _hand_off(self, ids: list[RawMessageId]) -> None:
        """Core callback, on the timer thread: give each due entry to the client's own tracker.

        ``negative_acknowledge`` only queues the id in the C++ client; it never waits.
        """
        nack = self._raw.negative_acknowledge if self._raw is not None else self._plain.negative_acknowledge
        for message_id in ids:
            nack(message_id)

    def _redeliver(self, message: Any) -> None:
        """Ask the client to redeliver a received *message*: a copy kept while its reconsume was on its way,
        which failed (:meth:`~pulsar_nack.consumer.retry.RetryLetter.swallowed`). It never waits."""
        if self._raw is not None:
            self._raw.negative_acknowledge(received(message))
        else:
            self._plain.negative_acknowledge(message)

    def _ack_quietly(self, message: Any) -> None:
        """Core callback: acknowledge a copy the application does not see (or a whole entry).

        ``acknowledge`` only queues the ack in the client's ack group; it never waits.
        Not counted as an acknowledgement of the application.
        """
        try:
            if self._raw is not None:
                self._raw.acknowledge(message)
            else:
                self._plain.acknowledge(message)
        except Exception:  # the client is closing: the broker redelivers it, and it is filtered again
            _log.warning("could not acknowledge a filtered copy", exc_info=True)

    def _acknowledge_async(self, message_id: RawMessageId) -> None:
        """Acknowledge without waiting (dead letters: runs on a client thread)."""
        if self._raw is not None:
            self._raw.acknowledge_async(message_id, _ignore_result)
        else:
            self._plain.acknowledge(message_id)
        next(self._core.acked)

    def _reconsume_target(self, message: Any) -> RetryLetter:
        """The retry letter, once *message* is checked as ``key_of`` checks it (nothing sent for bad input)."""
        retry = self._retry
        if retry is None:
            raise RuntimeError("reconsume_later needs a consumer subscribed with retry_enable=True")
        if retry.owns(message):
            retry.check(message)
        else:
            self._core.key_of(message)
        return retry

    def _reject(
        self, message: Any, properties: Mapping[str, str] | None
    ) -> tuple[concurrent.futures.Future[str], bool]:
        """Send *message* to the dead-letter topic now, whatever its count (``reject``).

        Returns the future of the dead letter and whether the caller still acks the
        original once it is done: yes on the retry letter's path (retries on: Java's dead
        letter topic and form); the policy's route acks it itself. Bad input raises at
        once and sends nothing.
        """
        self._check_open()
        check_properties("properties", properties)
        retry = self._retry
        if retry is not None:
            self._reconsume_target(message)  # validates
            return retry.submit(message, properties=properties, dead_letter=True), True
        if self._route is None:  # why not a default topic: without a subscription, the broker deletes it when idle
            raise DeadLetterError(
                "reject needs a dead-letter topic: subscribe with a dead_letter_policy (or retry_enable=True)"
            )
        self._core.reject(message)
        return self._route.reject(message, properties), False

    # ------------------------------------------------------------------ the plain parts of the API

    def topic(self) -> str:
        return str(self._plain.topic())

    def subscription_name(self) -> str:
        return str(self._plain.subscription_name())

    def consumer_name(self) -> str:
        return str(self._plain.consumer_name())

    def is_connected(self) -> bool:
        """False once closed; else whether the client is connected."""
        if self._closed:
            return False
        return bool(self._raw.is_connected() if self._raw is not None else self._plain.is_connected())

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConsumerStats:
        """Counters, plus the tracker's stats."""
        counts = self._core.counts()
        if self._retry is not None:
            counts.update(self._retry.counts())
        return ConsumerStats(**counts, tracker=self.tracker.stats())  # type: ignore[typeddict-item]  # (counts() returns the ConsumerStats keys, typed as dict[str, int])

    def __repr__(self) -> str:
        return f"<{type(self).__name__} topics={self._core.topics!r} pending={len(self.tracker)} closed={self._closed}>"

    def _iterated(self, outcome: Any) -> Any:
        """What iteration hands out after a receive gave *outcome* (a message, or the exception
        it raised): the message; None once the consumer is closed, the end of the iteration (a
        receive cut short by ``close()``, or a message received while it ran, left unacked for
        the broker to redeliver); else the exception is raised."""
        if self._closed:
            return None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError(f"this {type(self).__name__} is closed")

    # ------------------------------------------------------------------ closing, in steps that can be retried

    @property
    def _released(self) -> bool:
        return self._closed and self._core_closed and self._consumer_closed

    def _close_core(self, redeliver_pending: bool) -> None:
        """Step 1 of close: stop the tracker (hand pending nacks off, or leave them unacked)."""
        if not self._core_closed:
            self._core.close(redeliver_pending)
            if self._retry is not None:  # its hold tracker, and the retry producer
                self._retry.close(redeliver_pending)
            self._core_closed = True

    def _drain_dead_letters(self) -> None:
        """Step 2: wait (bounded) for dead letters in flight, so their originals get acknowledged."""
        if self._route is not None:
            self._route.drain(DEAD_LETTER_DRAIN_S)

    def _close_dead_letters(self) -> None:
        """Step 4 (after the consumer): close the dead-letter producers. Idempotent."""
        if self._route is not None:
            self._route.sender.close()


def _dead_letter_route(
    consumer: Any, settings: ConsumerSettings, client: Any, core: NackingCore, acknowledge: Any
) -> DeadLetterRoute:
    """The dead-letter route of a consumer whose settings have a policy, set on its core."""
    policy = settings.dead_letter_policy
    assert policy is not None
    if client is None:
        client = consumer_client(consumer)  # a pulsar.Consumer knows its client
    if client is None:
        raise ValueError("a dead_letter_policy needs the client: pass client=")
    sender = DeadLetter.from_policy(client, consumer.subscription_name(), policy, consumer_schema(consumer))
    route = DeadLetterRoute(sender, core, acknowledge)
    core.route_dead_letters(route)
    return route


def _ignore_result(_result: Any) -> None:
    """``acknowledge_async`` callback: the ack is grouped; a failure shows as a redelivery."""
