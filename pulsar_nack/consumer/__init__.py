"""The consumer layer: ``pulsar.Consumer`` wrappers with the core's tracker inside.

- :mod:`~pulsar_nack.consumer.settings`: :class:`ConsumerSettings`, the one settings
  object of both consumers, and the checks of ``subscribe`` and ``seek`` arguments;
- :mod:`~pulsar_nack.consumer.nacking`: :class:`NackingCore`, shared by both consumers
  (tracker, keys, pending set, handoff to the client, dead-letter counts);
- :mod:`~pulsar_nack.consumer.common`: the consumer code that neither blocks nor awaits,
  shared by both consumers;
- :mod:`~pulsar_nack.consumer.blocking`: :class:`NackingConsumer` and :func:`subscribe`;
- :mod:`~pulsar_nack.consumer.async_consumer`: the asyncio consumer
  (public door: :mod:`pulsar_nack.asyncio`);
- :mod:`~pulsar_nack.consumer.dead_letter`: the one dead-letter sender;
- :mod:`~pulsar_nack.consumer.subscription`: :class:`Sharing`, whether other consumers may
  receive a consumer's messages (the batch handoff and the delivery counts depend on it);
- :mod:`~pulsar_nack.consumer.msgid`: the reader of a message's id (C, or pure Python);
- :mod:`~pulsar_nack.consumer._client`: the one seam to pulsar-client's private surface,
  which checks at import that the installed client has what the consumers use.
"""

from __future__ import annotations

from ..errors import ConsumerClosedError
from . import _client  # noqa: F401 (first: checks the installed pulsar-client, UnsupportedClientError)
from .blocking import NackingConsumer, subscribe
from .common import ConsumerStats
from .dead_letter import DeadLetter
from .settings import ConsumerSettings, SeekArgumentError
from .subscription import Sharing

__all__ = [
    "ConsumerClosedError",
    "ConsumerSettings",
    "ConsumerStats",
    "DeadLetter",
    "NackingConsumer",
    "SeekArgumentError",
    "Sharing",
    "subscribe",
]
