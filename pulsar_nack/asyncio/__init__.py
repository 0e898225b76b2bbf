"""`pulsar_nack.asyncio`: the nacking consumer for ``pulsar.asyncio.Client``.

``consumer = await pulsar_nack.asyncio.subscribe(client, topic, subscription_name, **kw)``
returns an :class:`AsyncNackingConsumer` (see :mod:`pulsar_nack.consumer.async_consumer`).
Needs pulsar-client 3.9.0 or later: importing this module on an older one raises
:class:`~pulsar_nack.errors.UnsupportedClientError`.
"""

from __future__ import annotations

from ..consumer._client import load_asyncio

load_asyncio()  # UnsupportedClientError on a pulsar-client without the pulsar.asyncio consumer (< 3.9.0)

from ..consumer.async_consumer import AsyncNackingConsumer, subscribe  # noqa: E402

__all__ = ["AsyncNackingConsumer", "subscribe"]
