"""pulsar-nack: negative acknowledgements for Pulsar consumers, after PIP-393.

What users call is listed here. The layers underneath:

- :mod:`pulsar_nack.core`: the tracker and everything under it (imports neither pulsar
  nor pyspark);
- :mod:`pulsar_nack.consumer`: the blocking and asyncio consumers (loaded on first use);
- :mod:`pulsar_nack.asyncio`: ``subscribe`` for ``pulsar.asyncio.Client``;
- :mod:`pulsar_nack.spark`: one tracked consumer per Spark executor;
- :mod:`pulsar_nack.metrics`: OpenTelemetry instruments;
- :mod:`pulsar_nack.testing`: Apache Pulsar brokers for tests (never imported at run time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._validate import MAX_DELAY_MS
from .core.backoff import FixedDelay, MultiplierRedeliveryBackoff, RedeliveryBackoff
from .core.tracker import NegativeAcksTracker, TrackerStats
from .errors import ClosedError, ConsumerClosedError, PulsarNackError, TrackerClosedError

# The one place the version is written: pyproject.toml reads this literal (a dynamic version).
__version__ = "1.0.0"

# Public names of the consumer layer, which imports pulsar: loaded on first use.
_LAZY = {
    "NackingConsumer": "consumer",
    "subscribe": "consumer",
    "AsyncNackingConsumer": "asyncio",
}

__all__ = [
    "MAX_DELAY_MS",
    "AsyncNackingConsumer",
    "ClosedError",
    "ConsumerClosedError",
    "FixedDelay",
    "MultiplierRedeliveryBackoff",
    "NackingConsumer",
    "NegativeAcksTracker",
    "PulsarNackError",
    "RedeliveryBackoff",
    "TrackerClosedError",
    "TrackerStats",
    "__version__",
    "subscribe",
]

if TYPE_CHECKING:
    from .asyncio import AsyncNackingConsumer as AsyncNackingConsumer
    from .consumer import NackingConsumer as NackingConsumer
    from .consumer import subscribe as subscribe


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
