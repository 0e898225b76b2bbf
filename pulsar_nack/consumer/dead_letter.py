"""Dead letters: the one sender of messages to a dead-letter topic, for every consumer."""

from __future__ import annotations

import threading
from typing import Any

import pulsar

from .nacking import PARTITION_SUFFIX

__all__ = ["DeadLetter"]


class DeadLetter:
    """Sends messages to a dead-letter topic once the application saw them often enough.

    Counts deliveries to the application, not the broker's per-entry redeliveries: a
    copy of a batch message swallowed while its own nack was pending does not count.
    Mirrors the client's ``ConsumerDeadLetterPolicy``: the topic defaults to
    ``<topic>-<subscription>-DLQ`` (per topic, partition suffix removed), the message
    keeps its payload, key and properties, plus ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``.
    """

    def __init__(self, client: pulsar.Client, subscription: str, policy: pulsar.ConsumerDeadLetterPolicy) -> None:
        self.max_redeliver_count: int = policy.max_redeliver_count
        self._topic: str = policy.dead_letter_topic or ""
        self._initial_subscription: str = policy.initial_subscription_name or ""
        self._client = client
        self._subscription = subscription
        self._producers: dict[str, pulsar.Producer] = {}
        self._lock = threading.Lock()

    def _producer(self, topic: str) -> pulsar.Producer:
        target = self._topic or f"{PARTITION_SUFFIX.sub('', topic)}-{self._subscription}-DLQ"
        with self._lock:
            producer = self._producers.get(target)
            if producer is None:
                if self._initial_subscription:
                    self._client.subscribe(target, self._initial_subscription).close()
                producer = self._producers[target] = self._client.create_producer(target)
            return producer

    def send(self, message: Any) -> None:
        """Publish *message* to its dead-letter topic (blocks until stored)."""
        message_id = message.message_id()
        properties = dict(message.properties())
        properties.setdefault("REAL_TOPIC", message.topic_name())
        properties.setdefault("ORIGIN_MESSAGE_ID", str(message_id))
        key = message.partition_key()
        self._producer(message.topic_name()).send(message.data(), properties, partition_key=key or None)

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()
