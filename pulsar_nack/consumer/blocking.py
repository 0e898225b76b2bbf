"""`NackingConsumer` and `subscribe()`: a `pulsar.Consumer` with our tracker inside.

The application keeps the consumer API it knows; ``negative_acknowledge`` goes to a
:class:`~pulsar_nack.core.tracker.NegativeAcksTracker` instead of the client's own tracker.
The broker-agnostic part (tracker, keys, pending set, handoff) is
:class:`~pulsar_nack.consumer.nacking.NackingCore`; this module adds the ``pulsar.Consumer``
surface around it.

Handoff to the client
    The Python client can redeliver specific messages in one way only:
    ``negative_acknowledge(MessageId)``, into the C++ tracker (a minimum delay, and a
    timer every delay/3). So the consumer is subscribed with
    ``negative_ack_redelivery_delay_ms`` set to :data:`~pulsar_nack.timing.HANDOFF_DELAY_MS`.
    The client's timer ticks every ``delay // 3`` and releases only entries strictly past
    due, so a handoff comes back between one delay and one delay plus a tick later
    (:func:`~pulsar_nack.timing.client_handoff_latency_ms`). Our buckets fire early by the
    client's delay less :data:`~pulsar_nack.timing.HANDOFF_MARGIN_MS`
    (:func:`~pulsar_nack.timing.handoff_lead_ms`), in every mode: a message arrives at
    least that margin after its bucket deadline, never before it, and a copy that
    comes before that deadline (a reconnect's) is swallowed. Each due entry is handed over as
    ``_pulsar.MessageId(partition, ledger, entry, -1)`` with its topic name set (the
    multi-topic consumer routes by it and silently drops ids without one).

Bursts, not a trickle
    Every ``negative_acknowledge`` into the C++ client re-arms its ~33 ms timer, so
    handoffs closer together than that starve it. The tracker coalesces: one burst per
    due bucket, never two bursts less than ``coalesce_ms`` apart.

Copies
    The broker redelivers whole entries, and every unacked message after a reconnect.
    Which copies reach the application is decided by
    :meth:`~pulsar_nack.consumer.nacking.NackingCore.admit` (see
    :mod:`pulsar_nack.consumer.nacking`): a copy of a message whose nack is pending is
    swallowed (left unacked; its own handoff brings it back), a message comes back once
    per nack, and an acked message is filtered (and acked again, so that a broker
    without batch-index acks settles the entry). Every other copy is delivered, as the
    plain client does, so nothing unsettled is stuck.

The gate
    While the ledger is quiet or guards with its C table alone, :meth:`NackingConsumer.receive`
    and :meth:`NackingConsumer.acknowledge` are one call into C each (``_msgid.Gate``): the
    client's receive, the ``pulsar.Message`` around it and the table's verdict; the table's
    record of the ack and the client's acknowledge; for the ack that completes a watched
    entry with a nacked member, the ledger's one step (``note_completing_ack``) in between.
    What the gate cannot decide (a copy of a watched entry, another ack the ledger records)
    goes on to the Python paths: the gate returns such a copy to the thread that received
    it, with its verdict. With an ack timeout, a retry letter topic or a stand-in consumer, and
    without the C reader, there is no gate.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from time import monotonic_ns as _monotonic_ns
from typing import TYPE_CHECKING, Any, cast

import pulsar

from .._validate import check_bool, check_int, check_name, check_topics
from ..core.backoff import RedeliveryBackoff
from ..core.buckets import DEFAULT_PRECISION_BITS
from ..core.timer import monotonic_ms
from ..errors import ConsumerClosedError
from ..timing import ACK_FLUSH_MS, HANDOFF_DELAY_MS, RETRY_POLL_MS
from ._client import consumer_schema, message_receiver, raw_id, unwrap_message
from .admission import Screening
from .common import ConsumerBase
from .keywords import SubscribeKeywords
from .msgid import EntryTable, Gate
from .nacking import TopicMatcher
from .retry import RetryLetter, retry_topics_for
from .settings import ConsumerSettings, seek_target, subscribe_settings

__all__ = [
    "NackingConsumer",
    "subscribe",
]

if TYPE_CHECKING:  # pragma: no cover - typing only
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

_log = logging.getLogger(__name__)

_Message = pulsar.Message
_NO_SCREEN, _TABLE_SCREEN = Screening.NONE, Screening.TABLE


def _receive_again(receive: Callable[..., pulsar.Message], timeout_millis: int | None, start_ns: int) -> pulsar.Message:
    """The next message after a copy the application does not see, within what is left of *timeout_millis*."""
    if timeout_millis is None:
        return receive()
    left = timeout_millis - (_monotonic_ns() - start_ns) // 1_000_000
    return receive(max(left, 0))


class NackingConsumer(ConsumerBase):
    """A ``pulsar.Consumer`` whose negative acknowledgements use PIP-393 time buckets.

    Create it with :func:`subscribe` (recommended) or :meth:`wrap`. The methods mirror
    ``pulsar.Consumer``; ``negative_acknowledge`` takes an optional per-call
    ``delay_ms``. Messages and ids may be ``pulsar`` or ``_pulsar`` objects.

    Parameters
    ----------
    consumer : pulsar.Consumer
        Subscribed with ``negative_ack_redelivery_delay_ms=settings.handoff_delay_ms``.
    topics : list of str, str, or re.Pattern
        The topics the consumer reads (to refuse messages of other consumers).
    settings : ConsumerSettings, optional
        Delays, precision, backoff, dead-letter policy (see
        :class:`~pulsar_nack.consumer.settings.ConsumerSettings`; the same object the
        asyncio consumer takes).
    client : pulsar.Client, optional
        With a dead-letter policy: the client that creates the dead-letter producers
        (default: the consumer's own).
    retry : RetryLetter, optional
        The retry letter topic and its own consumer (:func:`subscribe` with
        ``retry_enable=True`` makes it): :meth:`reconsume_later`, and the copies that
        come back, handed over by :meth:`receive` as
        :class:`~pulsar_nack.consumer.retry.RetryMessage` objects.
    """

    _receiver: Callable[..., pulsar.Message] | None
    _receive_message: Callable[..., pulsar.Message] | None
    _acknowledge_raw: Callable[[Any], None] | None
    """The client's ``acknowledge`` of a received ``_pulsar.Message`` (the common path); None once closed or for a stand-in."""
    _started: Callable[[Any], None] | None
    _settled: Callable[[Any], None] | None

    def __init__(
        self,
        consumer: pulsar.Consumer,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None = None,
        *,
        client: pulsar.Client | None = None,
        retry: RetryLetter | None = None,
    ) -> None:
        if not isinstance(consumer, pulsar.Consumer):
            raise TypeError(f"consumer must be a pulsar.Consumer, not {type(consumer).__name__}")
        super().__init__(consumer, topics, settings, client, retry)
        self._value_schema = consumer_schema(consumer)
        raw = self._raw
        # The common paths, built once: a consumer with a retry letter topic, or a stand-in
        # without a _pulsar.Consumer, receives and acks through the general paths.
        self._receiver = message_receiver(raw, self._value_schema) if raw is not None else None
        self._receive_message = self._receiver if retry is None else None
        self._acknowledge_raw = raw.acknowledge if raw is not None else None
        self._started, self._settled = self._core.started, self._core.settled  # the ack timeout's logs, or None
        self._gate = self._build_gate(raw)

    def _build_gate(self, raw: Any) -> Any:
        """The common paths of receive and acknowledge in C (``_msgid.Gate``), or None where
        they run in Python: no C table, a stand-in or retrying consumer, or an ack timeout
        (whose logs the Python paths keep)."""
        core = self._core
        ledger = core.ledger
        if Gate is None or self._receive_message is None or raw is None or self._started is not None:
            return None
        if not isinstance(ledger.entries, EntryTable):  # the pure-Python table (PULSAR_NACK_PURE_PYTHON)
            return None
        return Gate(raw.receive, raw.acknowledge, _Message, self._value_schema, ledger, _NO_SCREEN, _TABLE_SCREEN,
                    ledger.entries, core.received, core.acked, ledger.note_completing_ack)

    @classmethod
    def wrap(
        cls,
        consumer: pulsar.Consumer,
        topics: str | list[str] | tuple[str, ...],
        settings: ConsumerSettings | None = None,
        *,
        handoff_delay_ms: int | None = None,
        client: pulsar.Client | None = None,
    ) -> NackingConsumer:
        """Wrap an existing consumer.

        Python cannot read a consumer's ``negative_ack_redelivery_delay_ms``, so state it
        as *handoff_delay_ms* (it replaces ``settings.handoff_delay_ms``). Handed-off
        messages come back that much after the handoff; if it is longer than the delays
        you ask for, they cannot be on time, and a ``RuntimeWarning`` says so. Unknown
        (None) is taken as pulsar's default, 60 s.
        """
        settings = ConsumerSettings() if settings is None else settings
        if not isinstance(settings, ConsumerSettings):
            raise TypeError(f"settings must be a ConsumerSettings, not {type(settings).__name__}")
        delay = settings.negative_ack_redelivery_delay_ms
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
        elif isinstance(handoff_delay_ms, int) and handoff_delay_ms > delay:
            warnings.warn(
                f"NackingConsumer.wrap: the consumer's own nack delay ({handoff_delay_ms} ms) is longer "
                f"than the requested delay ({delay} ms); redeliveries will come late.",
                RuntimeWarning,
                stacklevel=2,
            )
        return cls(consumer, topics, settings.replace(handoff_delay_ms=handoff_delay_ms), client=client)

    # ------------------------------------------------------------------ receiving

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """Receive the next message the application should see.

        Copies the application must not see (of a message whose nack is pending, of a
        message that came back and is not settled yet, of an acked message) are dropped
        here: see :meth:`~pulsar_nack.consumer.nacking.NackingCore.admit`. With a
        dead-letter policy, a message the application has seen ``max_redeliver_count +
        1`` times goes to the dead-letter topic instead. Raises ``pulsar.Timeout`` as the
        client does when nothing arrives within *timeout_millis*. Runtime complexity: O(1).
        """
        gate = self._gate
        held = gate.receive(timeout_millis) if gate is not None else None
        if held is not None and held.__class__ is not tuple:  # decided in C: the common paths
            return held
        receive = self._receive_message
        if receive is None:  # closed, a retry letter topic, or a stand-in consumer
            return self._receive_other(timeout_millis)
        if held is not None:  # the copy the gate received and left to the screen
            message, verdict, start_ns = held
        elif timeout_millis is None:
            message, verdict, start_ns = receive(), None, 0
        else:
            if type(timeout_millis) is not int or timeout_millis < 0:
                check_int("timeout_millis", timeout_millis, 0)
            start_ns = _monotonic_ns()
            message, verdict = receive(timeout_millis), None
        return self._screen(message, verdict, receive, timeout_millis, start_ns)

    def _screen(
        self, message: pulsar.Message, verdict: int | None, receive: Callable[..., pulsar.Message],
        timeout_millis: int | None, start_ns: int,
    ) -> pulsar.Message:
        """receive() where the gate did not decide: screen *message* (its table *verdict*, or None: not screened yet), and the copies after it."""
        core = self._core
        ledger = core.ledger
        while True:
            raw = unwrap_message(message)
            if verdict is None:  # a copy no one has screened
                screening = ledger.screening
                if screening is _NO_SCREEN:  # nothing to compare with
                    next(core.received)
                    break
                if screening is _TABLE_SCREEN:  # guarding: the C table decides the copies of entries without nack state
                    next(core.received)
                    verdict = ledger.entries.admit_message(raw, message)
                elif core.admit(raw, message):
                    return message  # (admit logs it for the ack timeout itself)
            if verdict is not None and (not verdict or core.screen_kept(raw, message, verdict)):  # 0: delivered
                break
            message, verdict = _receive_again(receive, timeout_millis, start_ns), None  # dropped, or a dead letter
        started = self._started
        if started is not None:  # an ack timeout: logged, its id read a tick later only if still unsettled
            started(message)
        return message

    def _receive_other(self, timeout_millis: int | None) -> pulsar.Message:
        """receive() off the common path: refused once closed, else with a retry letter topic or a stand-in consumer."""
        self._check_open()
        if self._retry is not None and self._receiver is not None:
            return self._receive_retrying(self._receiver, self._retry, timeout_millis)
        return self._receive_wrapped(timeout_millis)

    def _receive_retrying(
        self, receive: Callable[..., pulsar.Message], retry: RetryLetter, timeout_millis: int | None
    ) -> pulsar.Message:
        """receive() of a consumer with a retry letter topic: due retry copies first, then its own topics.

        The retry topic's consumer queues copies as they come due (on the client's
        listener thread), so the wait on the consumer's own topics is cut into slices
        of at most :data:`RETRY_POLL_MS` to look at that queue again.
        """
        if timeout_millis is not None and (type(timeout_millis) is not int or timeout_millis < 0):
            check_int("timeout_millis", timeout_millis, 0)
        deadline = None if timeout_millis is None else monotonic_ms() + timeout_millis
        core = self._core
        while True:
            copy, wait = retry.take_due()
            if copy is not None:
                return retry.message(copy, self._value_schema)
            wait = RETRY_POLL_MS if wait is None else min(wait, RETRY_POLL_MS)
            if deadline is not None:
                wait = min(wait, deadline - monotonic_ms())
            try:
                message = receive(max(wait, 1))
            except pulsar.Timeout:
                if deadline is not None and monotonic_ms() >= deadline and retry.ms_to_next_due() != 0:
                    raise
                continue
            if not retry.swallowed(message, self._redeliver) and core.admit(message):
                return message

    def _receive_wrapped(self, timeout_millis: int | None) -> pulsar.Message:
        """receive() through the ``pulsar.Consumer`` methods (a stand-in consumer)."""
        deadline = None if timeout_millis is None else monotonic_ms() + check_int("timeout_millis", timeout_millis, 0)
        while True:
            if deadline is None:
                message = self._plain.receive()
            else:
                message = self._plain.receive(max(deadline - monotonic_ms(), 0))
            if self._core.admit(message):
                return message

    def batch_receive(self) -> list[pulsar.Message]:
        """Receive a batch (per the consumer's batch receive policy), early copies and dead letters removed."""
        self._check_open()
        messages = [m for m in self._plain.batch_receive() if self._core.admit(m)]
        retry = self._retry
        if retry is not None:  # and the retry copies that are due
            while (copy := retry.pop_due()) is not None:
                messages.append(retry.message(copy, self._value_schema))
        return messages

    def _admit(self, message: Any) -> bool:
        """Record a received message (wrapped or raw); False if the application must not see it."""
        return self._core.admit(message)

    # ------------------------------------------------------------------ settling

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or id (``pulsar`` or ``_pulsar``). O(1).

        Raises TypeError for something that is not a message or id, ValueError for a
        message of another topic or a batch index outside its batch (nothing is sent).
        An id built without a batch size for a member of an entry in flight is recorded,
        and its entry acked whole once every member is (the client would ack the whole
        entry at once).
        """
        gate = self._gate
        if gate is not None and gate.acknowledge(message):  # acked in C: the common paths
            return
        core = self._core
        ledger = core.ledger
        acknowledge_raw = self._acknowledge_raw
        if acknowledge_raw is not None and type(message) is _Message and (
                ledger.screening is _NO_SCREEN or (ledger.atomic_table and ledger.entries.ack_message(message))):
            settled = self._settled
            if settled is not None:  # an ack timeout: its deadline ends (by identity, no id read)
                settled(message)
            acknowledge_raw(unwrap_message(message))  # nothing else to check (open: see _mark_closed)
        else:
            self._acknowledge_guarded(message)
        next(core.acked)

    def _acknowledge_guarded(self, message: Any) -> None:
        """acknowledge() off the common path: a retry copy, an id, or a consumer keeping books."""
        self._check_open()
        if self._retry is not None and self._retry.owns(message):  # a retry copy: its own consumer
            self._retry.acknowledge(message)
            return
        core = self._core
        raw = core.before_ack(message)
        if raw is None:  # recorded; acked with its entry
            pass
        elif self._raw is not None:
            self._raw.acknowledge(raw)
        else:
            self._plain.acknowledge(raw)
        core.after_ack()

    def acknowledge_cumulative(self, message: Any) -> None:
        """Acknowledge everything up to *message* (not supported on Shared subscriptions).

        Accepts a message or an id, also a bare id on a multi-topic consumer (the id
        carries its topic inside the client). Validated before anything is sent.
        """
        self._check_open()
        if self._retry is not None and self._retry.owns(message):
            raise ValueError("a retry copy cannot be acknowledged cumulatively (its subscription is Shared)")
        raw = self._core.before_ack(message)
        self._plain.acknowledge_cumulative(raw if raw is not None else raw_id(message))
        self._core.after_ack()

    def negative_acknowledge(self, message: Any, delay_ms: int | None = None) -> None:
        """Redeliver *message* after *delay_ms*, the backoff's delay, or the fixed delay.

        With a dead-letter policy, a message at its last delivery goes to the dead-letter
        topic instead; it is acknowledged once its dead letter is stored.

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
        if self._retry is not None and self._retry.owns(message):  # never early, on the retry topic's consumer
            self._retry.nack(message, delay_ms)
            return
        self._core.nack(message, delay_ms)

    def reconsume_later(
        self, message: Any, delay_ms: int | None = None, properties: dict[str, str] | None = None
    ) -> None:
        """Retry *message* durably: republish it to the retry letter topic, then ack it.

        Needs ``subscribe(..., retry_enable=True)``. The copy is delivered again after
        *delay_ms* (else the backoff's delay for its ``RECONSUMETIMES``, else the fixed
        delay), never before (see :mod:`~pulsar_nack.consumer.retry`); after
        ``max_redeliver_count`` reconsumes it goes to the dead letter topic instead.
        Blocks until the broker stored the copy, then acks the original: if the produce
        fails, the original stays unacked and the client's exception is raised.
        *properties* are added to the copy's (and override them, as in Java).

        Raises
        ------
        TypeError
            For something that is not a received message, a non-int delay, properties
            that are not str to str.
        ValueError
            For a negative delay, a message of another consumer, a ``RECONSUMETIMES``
            that is not an integer.
        RuntimeError
            If the consumer was subscribed without ``retry_enable=True``
            (:class:`~pulsar_nack.errors.ConsumerClosedError` after :meth:`close`).
        pulsar.PulsarException
            The client's error when the copy could not be stored.
        """
        self._check_open()
        retry = self._reconsume_target(message)  # validates: nothing is sent for bad input
        retry.submit(message, delay_ms, properties).result()
        self.acknowledge(message)

    def reconsume_later_async(
        self, message: Any, delay_ms: int | None = None, properties: dict[str, str] | None = None
    ) -> concurrent.futures.Future[str]:
        """:meth:`reconsume_later` without waiting: a future, done once the copy is stored and the original acked.

        Its result says where the copy went: ``"retry"``, or ``"dead_letter"`` past
        ``max_redeliver_count``. The ack is made on the client's thread when the broker
        confirms the copy; if the produce fails (or the consumer closed meanwhile), the
        original stays unacked and the future holds the exception. Bad input raises at
        once, as :meth:`reconsume_later`. For a loop that must not wait a round trip per
        retry (the Spark tasks).
        """
        self._check_open()
        return self._reconsume_target(message).submit(
            message, delay_ms, properties, on_stored=functools.partial(self.acknowledge, message)
        )

    def reject(self, message: Any, properties: dict[str, str] | None = None) -> None:
        """Give up on *message* now: send it to the dead-letter topic, whatever its redelivery count, then ack it.

        The dead letter is the one the dead-letter policy would send (its topic and
        format, :mod:`~pulsar_nack.consumer.dead_letter`); with ``retry_enable=True``,
        the one a reconsume past ``max_redeliver_count`` sends (Java's dead letter
        topic and form). *properties* are added to it. Blocks until the dead letter is
        stored, then the original is acknowledged; until then its copies are not
        delivered. As NATS's ``AckTerm`` and Kafka share groups' ``REJECT``, but the
        message is kept.

        Raises
        ------
        TypeError, ValueError
            As :meth:`acknowledge`; ValueError also for a message whose nack is pending.
        DeadLetterError
            Without a ``dead_letter_policy`` or ``retry_enable=True`` (nothing is sent:
            a dead-letter topic nobody subscribes to is deleted by a stock broker when
            idle), or when the dead letter was not stored (the original stays
            unacknowledged, the application's again).
        pulsar.PulsarException
            The client's error on the retry letter's path.
        """
        future, ack_after = self._reject(message, properties)
        future.result()
        if ack_after:
            self.acknowledge(message)

    def in_progress(self, message: Any) -> bool:
        """Say the application is still working on *message*: push its ack timeout to
        ``unacked_messages_timeout_ms`` from now; False if it is not in flight (settled, or
        already redelivered). O(1).

        Named after NATS JetStream's "in progress" acknowledgement (``AckProgress``); Kafka
        share groups call it ``RENEW``, SQS ``ChangeMessageVisibility``. The plain client has
        none: a message worked on longer than the timeout is redelivered.

        Raises
        ------
        RuntimeError
            Without ``unacked_messages_timeout_ms`` (:class:`~pulsar_nack.errors.ConsumerClosedError` after :meth:`close`).
        TypeError, ValueError
            As :meth:`acknowledge`.
        """
        self._check_open()
        return self._core.in_progress(message)

    # ------------------------------------------------------------------ the rest of the API

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacked message now.

        Pending nacks are dropped: their messages are unacked, so they come back now
        with the rest (and count as a redelivery for dead letters). Acked members of
        entries still being processed stay known, so their copies are filtered. The
        client groups acks for 100 ms before sending them, so this call first waits
        ``ACK_FLUSH_MS`` (150 ms): the broker has then recorded every earlier ack when
        the request arrives.
        """
        self._check_open()
        self._core.reset(forget_counts=False)
        time.sleep(ACK_FLUSH_MS / 1000)  # let the client send its grouped acks first
        self._plain.redeliver_unacknowledged_messages()
        if self._retry is not None:
            self._retry.redeliver_unacknowledged_messages()

    def seek(self, message_id: Any) -> None:
        """Reset the subscription to a message id or a publish timestamp (ms), as the client.

        Takes what ``pulsar.Consumer.seek`` takes (a ``pulsar`` or ``_pulsar`` id, an
        int) and refuses the rest as it does, with
        :class:`~pulsar_nack.consumer.settings.SeekArgumentError` (a ``ValueError`` and a
        ``TypeError``). Pending nacks and delivery counts are dropped first: messages
        after the new position are delivered again anyway, those before it are skipped.
        """
        self._check_open()
        seek_target(message_id)
        self._core.reset(forget_counts=True)
        self._plain.seek(message_id)

    def get_last_message_id(self) -> Any:
        """The id of the last message of the topic, as the client returns it."""
        self._check_open()
        return self._plain.get_last_message_id()

    def pause_message_listener(self) -> None:
        self._check_open()
        self._plain.pause_message_listener()
        if self._retry is not None:
            self._retry.pause_message_listener()

    def resume_message_listener(self) -> None:
        self._check_open()
        self._plain.resume_message_listener()
        if self._retry is not None:
            self._retry.resume_message_listener()

    def unsubscribe(self) -> None:
        """Unsubscribe (pending nacks are dropped with the subscription) and close."""
        self._check_open()
        self._mark_closed()
        try:
            if self._retry is not None:
                self._retry.unsubscribe()
            self._close_core(redeliver_pending=False)
            self._drain_dead_letters()
            self._plain.unsubscribe()
            self._consumer_closed = True
        finally:
            self._close_dead_letters()

    def _mark_closed(self) -> None:
        """Closed from now on: the common paths of receive and acknowledge lead to the checks."""
        self._closed = True
        self._receive_message = None
        self._acknowledge_raw = None
        self._gate = None

    def close(self, redeliver_pending: bool = True) -> None:
        """Close the consumer; nothing pending is lost. Idempotent.

        ``redeliver_pending=True`` (default) hands every pending nack to the client now,
        so those messages are redelivered at once (to this subscription's other
        consumers). ``False`` leaves them unacked: the broker redelivers them when this
        consumer is gone. Either way they come back, earlier than their delay. Dead
        letters in flight are waited for (up to 5 s). If a step raises, the later ones
        still run, and calling ``close()`` again retries what did not finish.
        """
        check_bool("redeliver_pending", redeliver_pending)
        if self._released:
            return
        self._mark_closed()
        try:
            self._close_core(redeliver_pending)
        finally:
            try:
                self._drain_dead_letters()
                if not self._consumer_closed:
                    self._plain.close()
                    self._consumer_closed = True
            finally:
                self._close_dead_letters()

    def __iter__(self) -> NackingConsumer:
        """``for message in consumer``: :meth:`receive` until the consumer is closed (see :meth:`__next__`)."""
        return self

    def __next__(self) -> pulsar.Message:
        """The next message, as :meth:`receive` gives it; ``StopIteration`` once the consumer is closed.

        The iteration ends when :meth:`close` (or :meth:`unsubscribe`) has been called,
        from this thread or another: a receive that waits is cut short by it, and a
        message received while the close runs is not handed out (it stays unacked, and
        the broker redelivers it). Any other error of :meth:`receive` is raised; closing
        the client instead of the consumer raises the client's error.

        >>> for message in consumer:  # doctest: +SKIP
        ...     consumer.acknowledge(message)
        """
        if self._closed:
            raise StopIteration
        try:
            outcome: Any = self.receive()
        except Exception as error:
            outcome = error
        message = self._iterated(outcome)
        if message is None:
            raise StopIteration
        return message

    def __enter__(self) -> NackingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SUBSCRIBE_KEYWORDS = frozenset(inspect.signature(pulsar.Client.subscribe).parameters) - {
    "self",
    "topic",
    "subscription_name",
    "negative_ack_redelivery_delay_ms",
    "message_listener",
}


def _check_subscribe_args(
    client: Any, topic: Any, subscription_name: Any, message_listener: Any, subscribe_kwargs: dict[str, Any]
) -> tuple[str | list[str] | re.Pattern[str], TopicMatcher]:
    """Validate every argument :func:`subscribe` checks itself; return the topic for the client, and the topics.

    Changes nothing.
    """
    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, not {type(client).__name__}")
    check_name("subscription_name", subscription_name)
    names: str | list[str] | re.Pattern[str] = topic if isinstance(topic, re.Pattern) else check_topics("topic", topic)
    topics = TopicMatcher(names)
    unknown = sorted(set(subscribe_kwargs) - _SUBSCRIBE_KEYWORDS)
    if unknown:
        raise TypeError(f"subscribe() got unexpected keyword argument(s): {', '.join(unknown)}")
    if message_listener is not None and not callable(message_listener):
        raise TypeError("message_listener must be callable")
    if isinstance(names, list) and len(names) == 1:
        names = names[0]
    return names, topics


def _copy_listener(holder: list[NackingConsumer], message_listener: Callable[..., None]) -> Callable[[Any], None]:
    """The retry topic's listener for a ``message_listener``: due copies go to it as RetryMessage objects."""

    def deliver(raw: Any) -> None:
        wrapper = holder[0]
        if wrapper.closed or wrapper._retry is None:
            return
        try:
            message_listener(wrapper, wrapper._retry.message(raw, wrapper._value_schema))
        except Exception:
            _log.exception("message listener failed")

    return deliver


def _admitting_listener(
    holder: list[NackingConsumer], ready: threading.Event, message_listener: Callable[..., None]
) -> Callable[[pulsar.Consumer, pulsar.Message], None]:
    """The client's listener for a ``message_listener``: admitted messages go to it, once the wrapper exists."""

    def listener(_consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        ready.wait()
        if not holder:  # the wrapper could not be built; the consumer is being closed
            return
        wrapper = holder[0]
        if wrapper.closed or not wrapper._admit(message):
            return
        try:
            message_listener(wrapper, message)
        except Exception:
            _log.exception("message listener failed")

    return listener


def _topic_list(names: str | list[str] | re.Pattern[str]) -> Any:
    """The topic names of a subscribe call as a list (a pattern stays a pattern)."""
    return [names] if isinstance(names, str) else names


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
    retry_enable: bool = False,
    retry_letter_topic: str | None = None,
    retry_hold_ms: int = 0,
    **subscribe_kwargs: Unpack[SubscribeKeywords],
) -> NackingConsumer:
    """Subscribe like ``client.subscribe(...)`` and return a :class:`NackingConsumer`.

    Takes every keyword of ``pulsar.Client.subscribe`` (*topic* may be a list or a
    ``re.Pattern``); ``negative_ack_redelivery_delay_ms`` becomes the tracker's fixed
    delay and the consumer itself is subscribed with the 100 ms handoff delay.
    ``batch_index_ack_enabled`` defaults to True here (False in pulsar): with it the
    broker's ack set keeps acked batch siblings from coming back. A
    ``dead_letter_policy`` is handled by the wrapper, by the client's rules (see
    :mod:`~pulsar_nack.consumer.dead_letter`). A ``message_listener`` receives the
    :class:`NackingConsumer` and only the messages it should see. Every argument is
    validated before anything is subscribed (:func:`~pulsar_nack.consumer.settings.subscribe_settings`,
    shared with :func:`pulsar_nack.asyncio.subscribe`).

    ``retry_enable=True`` (Java's ``enableRetry``) adds durable retries:
    :meth:`NackingConsumer.reconsume_later` and a subscription to the retry letter topic
    (*retry_letter_topic*, else named as Java names it; see
    :mod:`~pulsar_nack.consumer.retry`). It needs ``consumer_type`` Shared or
    KeyShared. ``dead_letter_policy`` then gives ``max_redeliver_count`` (default 16)
    and the dead letter topic of both the reconsume and the nack path, as in Java.
    *retry_hold_ms* (default 0) lets the consumers, not the broker, hold the retries of
    up to that delay: batched copies, cheaper per retry, that a Java consumer of the
    retry topic would get at once (:class:`~pulsar_nack.consumer.settings.ConsumerSettings`).

    Example (needs a broker; ``examples/wrap_consumer.py`` runs one)::

        consumer = pulsar_nack.subscribe(client, "orders", "billing",
            consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=5000)
    """
    keywords = cast("dict[str, Any]", subscribe_kwargs)  # exactly what the caller gave
    names, topics = _check_subscribe_args(client, topic, subscription_name, message_listener, keywords)
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
    retry_topics = retry_topics_for(client, _topic_list(names), subscription_name, settings, keywords)
    if retry_topics is not None and settings.dead_letter_policy is not None:  # the nack path's DLQ: the same topic
        settings = settings.replace(dead_letter_policy=retry_topics.dead_letter_policy())
    holder: list[NackingConsumer] = []
    ready = threading.Event()
    consumer = client.subscribe(
        names,
        subscription_name,
        negative_ack_redelivery_delay_ms=HANDOFF_DELAY_MS,
        message_listener=None if message_listener is None else _admitting_listener(holder, ready, message_listener),
        **keywords,
    )
    retry = None
    try:
        retry = None if retry_topics is None else RetryLetter.for_settings(client, subscription_name, retry_topics, settings)
        holder.append(NackingConsumer(consumer, topics, settings, client=client, retry=retry))
    except BaseException:
        if retry is not None:
            retry.close(redeliver_pending=False)
        consumer.close()
        raise
    finally:
        ready.set()
    if retry is not None:  # the retry topic's own consumer, once the wrapper exists for its copies
        try:
            retry.subscribe(keywords, None if message_listener is None else _copy_listener(holder, message_listener))
        except BaseException:
            holder[0].close(redeliver_pending=False)
            raise
    return holder[0]
