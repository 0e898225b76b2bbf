"""`pulsar_nack.asyncio`: the nacking consumer for ``pulsar.asyncio.Client``.

``consumer = await pulsar_nack.asyncio.subscribe(client, topic, subscription_name, **kw)``
returns an :class:`AsyncNackingConsumer` (see :mod:`pulsar_nack.consumer.async_consumer`).
"""

from __future__ import annotations

from ..consumer.async_consumer import AsyncNackingConsumer, subscribe

__all__ = ["AsyncNackingConsumer", "subscribe"]
