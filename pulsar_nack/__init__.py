"""pulsar-nack: negative acknowledgements for Pulsar consumers, after PIP-393.

The core (:mod:`~pulsar_nack.buckets`, :mod:`~pulsar_nack.timer`,
:mod:`~pulsar_nack.backoff`, :mod:`~pulsar_nack.tracker`, :mod:`~pulsar_nack.baseline`)
imports neither pulsar nor pyspark. The consumer layer (``subscribe``,
``NackingConsumer``) and the Spark helpers are loaded on first use. The test brokers
live in :mod:`pulsar_nack.testing`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._validate import MAX_DELAY_MS
from .backoff import FixedDelay, MultiplierRedeliveryBackoff, RedeliveryBackoff
from .baseline import HashMapNegativeAcksTracker
from .buckets import TimeBuckets
from .errors import ClosedError, ConsumerClosedError, PulsarNackError, TrackerClosedError
from .keys import MessageKey, key_of
from .timer import DeadlineTimer
from .tracker import NegativeAcksTracker, TrackerStats

__version__ = "0.1.0"

# Public names of the layers that import pulsar or pyspark, loaded lazily.
_LAZY = {
    "NackingConsumer": "consumer",
    "subscribe": "consumer",
    "ConsumerConfig": "spark",
    "TaskBudget": "spark",
    "run_consumer_tasks": "spark",
}

__all__ = [
    "MAX_DELAY_MS",
    "ClosedError",
    "ConsumerClosedError",
    "ConsumerConfig",
    "DeadlineTimer",
    "FixedDelay",
    "HashMapNegativeAcksTracker",
    "MessageKey",
    "MultiplierRedeliveryBackoff",
    # the lazy names of _LAZY:
    "NackingConsumer",
    "NegativeAcksTracker",
    "PulsarNackError",
    "RedeliveryBackoff",
    "TaskBudget",
    "TimeBuckets",
    "TrackerClosedError",
    "TrackerStats",
    "__version__",
    "key_of",
    "run_consumer_tasks",
    "subscribe",
]

if TYPE_CHECKING:
    from .consumer import NackingConsumer as NackingConsumer
    from .consumer import subscribe as subscribe
    from .spark import ConsumerConfig as ConsumerConfig
    from .spark import TaskBudget as TaskBudget
    from .spark import run_consumer_tasks as run_consumer_tasks


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
