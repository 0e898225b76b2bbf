"""Dead letters: the one sender of messages to a dead-letter topic, for both consumers and Spark.

:class:`DeadLetter` builds and sends a dead letter exactly as the C++ client inside
pulsar-client 3.13 (C++ 4.2, ``ConsumerImpl::processPossibleToDLQ``) does:

* the topic is the policy's ``dead_letter_topic``, else :func:`dead_letter_topic` of the
  message's own topic: ``<topic>-<subscription>-DLQ``. The C++ client has one consumer
  per partition, so a partitioned topic gets one dead-letter topic per partition
  (``orders-partition-0-billing-DLQ``);
* the message keeps its payload and properties, and gets ``ORIGIN_MESSAGE_ID`` (the
  original id as the client prints it, ``(ledger,entry,partition,batch_index)``) and
  ``REAL_TOPIC`` (the message's topic, partition included); its partition key and
  ordering key are set when the original has them. The event time is not carried
  (nor by the client);
* the producer has batching off, chunking on (a dead letter above the broker's
  ``maxMessageSize`` goes in chunks, as the Java client's; the C++ client inside
  pulsar-client 3.13 cannot send it: apache/pulsar-client-cpp#604), ``block_if_queue_full``
  off and the consumer's schema.
  ``initial_subscription_name`` is created before the producer, from the earliest
  position, as the broker creates it for the C++ client's producer.

Everything is asynchronous on the client's own callbacks (``create_producer_async``,
``send_async``), so no thread waits on the network and no lock is held while calling
the client. :meth:`DeadLetter.send` waits for the result, for callers that must (Spark).

:class:`DeadLetterRoute` is what a consumer does with a message its
:class:`~pulsar_nack.consumer.nacking.NackingCore` routes to the dead-letter topic: send
it, acknowledge the original only once the dead letter is stored, and give it back to
the core (to come back and be tried again) when it was not.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import DeadLetterError
from ..timing import SEND_TIMEOUT_S
from ._client import (
    RawClient,
    RawMessage,
    build_message,
    earliest_subscription_configuration,
    is_ok,
    plain_producer_configuration,
    raw_client,
    received,
)
from .message_pool import KeepingProducer
from .nacking import full_topic_name

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

    from .nacking import NackingCore

__all__ = [
    "ORIGIN_MESSAGE_ID",
    "REAL_TOPIC",
    "DeadLetter",
    "DeadLetterRoute",
    "dead_letter_topic",
]

_log = logging.getLogger(__name__)

REAL_TOPIC = "REAL_TOPIC"
"""Property naming the topic the dead letter came from (C++ ``SYSTEM_PROPERTY_REAL_TOPIC``)."""
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
"""Property holding the original message id, ``(ledger,entry,partition,batch_index)``."""

Done = Callable[[BaseException | None], None]
"""Called once a dead letter is stored (None) or could not be (the error)."""


def dead_letter_topic(topic: str, subscription: str) -> str:
    """``<topic>-<subscription>-DLQ``, as the C++ client names a consumer's dead-letter topic.

    *topic* is the message's own topic, so a partition keeps its suffix (the C++ client
    has one consumer, and one dead-letter topic, per partition).

    >>> dead_letter_topic("persistent://public/default/orders-partition-2", "billing")
    'persistent://public/default/orders-partition-2-billing-DLQ'
    >>> dead_letter_topic("orders", "billing")
    'persistent://public/default/orders-billing-DLQ'
    """
    return f"{full_topic_name(topic)}-{subscription}-DLQ"


def _raw_client(client: Any) -> RawClient:
    """The ``_pulsar.Client`` of a ``pulsar.Client`` or ``pulsar.asyncio.Client`` (or itself)."""
    raw = raw_client(client)
    if raw is None:
        raise TypeError(f"client must be a pulsar.Client or pulsar.asyncio.Client, not {type(client).__name__}")
    return raw


def build_dead_letter(message: Any, properties: Mapping[str, str] | None = None) -> RawMessage:
    """The dead letter of *message*, as the C++ client builds it; *properties* are added.

    The original's properties first, then *properties*, then ``ORIGIN_MESSAGE_ID`` and
    ``REAL_TOPIC`` (which win, as in the client). O(properties).
    """
    raw = received(message)
    merged = dict(raw.properties())
    if properties:
        merged.update(properties)
    merged[ORIGIN_MESSAGE_ID] = str(raw.message_id())
    merged[REAL_TOPIC] = raw.topic_name()
    return build_message(raw.data(), merged, raw.partition_key(), raw.ordering_key())


class DeadLetter:
    """Sends dead letters: one producer per dead-letter topic, created on first use.

    Parameters
    ----------
    client : pulsar.Client or pulsar.asyncio.Client
        The consumer's client.
    subscription : str
        The consumer's subscription (the default topic name uses it).
    topic : str, optional
        Every dead letter goes here; else :func:`dead_letter_topic` of the message's topic.
    initial_subscription : str, optional
        Created on each dead-letter topic before its producer, from the earliest position.
    schema : pulsar.schema.Schema, optional
        The consumer's schema, given to the producer (the payload is sent as received).
    """

    def __init__(
        self,
        client: Any,
        subscription: str,
        *,
        topic: str | None = None,
        initial_subscription: str | None = None,
        schema: Any = None,
    ) -> None:
        self._native = _raw_client(client)
        if not isinstance(subscription, str) or not subscription:
            raise TypeError("subscription must be a non-empty str")
        self._subscription = subscription
        self._topic = topic or None
        self._initial_subscription = initial_subscription or None
        self._value_schema_info = None if schema is None else schema.schema_info()
        # topic -> its producer, or the sends waiting while it is being created
        self._producers: dict[str, KeepingProducer | list[Callable[[Any, BaseException | None], None]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_policy(
        cls, client: Any, subscription: str, policy: pulsar.ConsumerDeadLetterPolicy, schema: Any = None
    ) -> DeadLetter:
        """The sender for a consumer's ``ConsumerDeadLetterPolicy``."""
        return cls(
            client,
            subscription,
            topic=policy.dead_letter_topic or None,
            initial_subscription=policy.initial_subscription_name or None,
            schema=schema,
        )

    def topic_for(self, message_topic: str) -> str:
        """The dead-letter topic of a message of *message_topic*."""
        return self._topic or dead_letter_topic(message_topic, self._subscription)

    # ------------------------------------------------------------------ sending

    def send_async(
        self, message: Any, done: Done, *, topic: str | None = None, properties: Mapping[str, str] | None = None
    ) -> None:
        """Send the dead letter of *message*; call ``done(None)`` once stored, ``done(error)`` if not.

        *done* runs on a client thread (or on this one, for an error found at once); it
        must not block. The dead letter is built here, so *message* may be reused after.
        """
        built = build_dead_letter(message, properties)
        self.send_message_async(built, topic or self.topic_for(received(message).topic_name()), done)

    def send_message_async(self, built: RawMessage, target: str, done: Done) -> None:
        """Send a message the caller built to the dead-letter topic *target*; ``done`` as :meth:`send_async`.

        For a dead letter in another client's form: the reconsume path's, which carries
        the Java client's properties (:mod:`~pulsar_nack.consumer.retry`).
        """

        def with_producer(producer: Any, error: BaseException | None) -> None:
            if error is not None:
                done(error)
                return

            def sent(result: Any, _message_id: Any) -> None:
                done(None if is_ok(result) else DeadLetterError(f"sending to {target} failed: {result}"))

            try:
                producer.send_async(built, sent)
            except Exception as exc:  # e.g. the producer was closed meanwhile
                done(DeadLetterError(f"sending to {target} failed: {exc}"))

        self._with_producer(target, with_producer)

    def send(self, message: Any, *, topic: str | None = None, properties: Mapping[str, str] | None = None) -> None:
        """Send the dead letter of *message* and wait until it is stored.

        Raises :class:`~pulsar_nack.errors.DeadLetterError` if it was not. Must not be
        called on a client callback thread.
        """
        finished = threading.Event()
        outcome: list[BaseException | None] = []

        def done(error: BaseException | None) -> None:
            outcome.append(error)
            finished.set()

        self.send_async(message, done, topic=topic, properties=properties)
        if not finished.wait(SEND_TIMEOUT_S):
            raise DeadLetterError(f"no answer for a dead letter within {SEND_TIMEOUT_S:.0f} s")
        if outcome[0] is not None:
            raise outcome[0]

    # ------------------------------------------------------------------ producers

    def _with_producer(self, target: str, then: Callable[[Any, BaseException | None], None]) -> None:
        """Call ``then(producer, None)``, creating the producer first if needed, or ``then(None, error)``."""
        with self._lock:
            if self._closed:
                state: Any = DeadLetterError("the dead-letter sender is closed")
            else:
                state = self._producers.get(target)
                if state is None:
                    self._producers[target] = [then]
                elif isinstance(state, list):
                    state.append(then)
        if isinstance(state, BaseException):
            then(None, state)
        elif state is None:  # we create it; the lock is not held while calling the client
            self._create(target)
        elif not isinstance(state, list):
            then(state, None)

    def _create(self, target: str) -> None:
        """Create the initial subscription (if any), then the producer of *target*; all asynchronous."""
        if self._initial_subscription is None:
            self._create_producer(target)
            return
        conf = earliest_subscription_configuration()

        def subscribed(result: Any, consumer: Any) -> None:
            if not is_ok(result):  # it may exist with another type: the producer decides
                _log.warning("could not create subscription %r on %s: %s", self._initial_subscription, target, result)
                self._create_producer(target)
                return
            consumer.close_async(lambda _result: self._create_producer(target))

        try:
            self._native.subscribe_async(target, self._initial_subscription, conf, subscribed)
        except Exception:
            _log.warning("could not create subscription %r on %s", self._initial_subscription, target, exc_info=True)
            self._create_producer(target)

    def _create_producer(self, target: str) -> None:
        conf = plain_producer_configuration(self._value_schema_info)

        def created(result: Any, producer: Any) -> None:
            error = None if is_ok(result) else DeadLetterError(f"creating a producer on {target} failed: {result}")
            with self._lock:
                waiting = self._producers.pop(target, [])
                if error is None and self._closed:
                    error = DeadLetterError("the dead-letter sender is closed")
                elif error is None:
                    producer = self._producers[target] = KeepingProducer(producer)
            if error is not None and is_ok(result):
                producer.close_async(lambda _result: None)
            for then in waiting if isinstance(waiting, list) else ():
                then(None if error is not None else producer, error)

        try:
            self._native.create_producer_async(target, conf, created)
        except Exception as exc:
            created_error = DeadLetterError(f"creating a producer on {target} failed: {exc}")
            with self._lock:
                waiting = self._producers.pop(target, [])
            for then in waiting if isinstance(waiting, list) else ():
                then(None, created_error)

    def close(self) -> None:
        """Close every producer (waiting for what they have in flight). Idempotent."""
        with self._lock:
            self._closed = True
            producers = [p for p in self._producers.values() if not isinstance(p, list)]
            for topic in [t for t, p in self._producers.items() if not isinstance(p, list)]:
                del self._producers[topic]
        for producer in producers:
            try:
                producer.close()
            except Exception:  # a broken connection: nothing more to do
                _log.debug("closing a dead-letter producer failed", exc_info=True)


class DeadLetterRoute:
    """What a consumer does with the messages its core routes to the dead-letter topic.

    The core calls it (outside its lock) with a message and whether its dead letter was
    already stored. A new one is sent; once stored, the original is acknowledged and
    the core counts it. If it was not stored, the original stays unacknowledged and
    the core takes it back, so it comes back and is tried again. A copy of a message
    already dead-lettered is acknowledged again, in case the first ack was lost.

    Parameters
    ----------
    sender : DeadLetter
    core : NackingCore
    acknowledge : callable
        Acknowledges a ``_pulsar.MessageId`` without blocking (the client's
        ``acknowledge_async``); may run on a client thread.
    """

    def __init__(self, sender: DeadLetter, core: NackingCore, acknowledge: Callable[[Any], None]) -> None:
        self.sender = sender
        self._core = core
        self._acknowledge = acknowledge
        self._in_flight = 0
        self._idle = threading.Condition()

    def __call__(self, message: Any, stored: bool) -> None:
        if stored:
            self._acknowledge(received(message).message_id())
            return
        with self._idle:
            self._in_flight += 1
        try:
            self.sender.send_async(message, lambda error: self._done(message, error))
        except BaseException as exc:
            self._done(message, exc)
            if not isinstance(exc, Exception):
                raise

    def reject(self, message: Any, properties: Mapping[str, str] | None = None) -> concurrent.futures.Future[str]:
        """Send the dead letter of a rejected *message* now (the core marked it with ``reject``).

        Returns a future, done with ``"dead_letter"`` once the dead letter is stored and
        the original acknowledged, or with the error (the original stays
        unacknowledged and is the application's again: no retry is made for it).
        """
        outcome: concurrent.futures.Future[str] = concurrent.futures.Future()
        with self._idle:
            self._in_flight += 1
        try:
            self.sender.send_async(message, lambda error: self._done(message, error, outcome), properties=properties)
        except BaseException as exc:
            self._done(message, exc, outcome)
            if not isinstance(exc, Exception):
                raise
        return outcome

    def _done(
        self, message: Any, error: BaseException | None, outcome: concurrent.futures.Future[str] | None = None
    ) -> None:
        """A dead letter's answer; *outcome* is a reject's future (a failed reject is not tried again)."""
        try:
            if error is None:
                self._core.dead_letter_stored(message)
                self._acknowledge(received(message).message_id())
            elif outcome is not None:
                self._core.reject_failed(message)
            else:
                _log.warning("dead letter not stored, the message stays unacknowledged and is tried again: %s", error)
                self._core.dead_letter_failed(message)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
            if outcome is not None:
                if error is None:
                    outcome.set_result("dead_letter")
                else:
                    outcome.set_exception(error)

    @property
    def in_flight(self) -> int:
        """Dead letters sent and not answered yet."""
        return self._in_flight

    def drain(self, timeout_s: float) -> bool:
        """Wait until no dead letter is in flight (at most *timeout_s*); True if none is."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait for dead letters in flight (bounded), then close the sender's producers."""
        try:
            if not self.drain(timeout_s):
                _log.warning("closing with %d dead letters still in flight", self._in_flight)
        finally:
            self.sender.close()
