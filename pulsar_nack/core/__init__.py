"""The tracker core: PIP-393 time buckets, the deadline timer, backoff and the tracker.

Nothing here imports pulsar or pyspark: the core runs with any redelivery callback.
Layers above (:mod:`pulsar_nack.consumer`, :mod:`pulsar_nack.spark`) import from here,
never the other way round.

- :mod:`~pulsar_nack.core.keys`: the message key ``(topic, ledger, entry, batch_index)``;
- :mod:`~pulsar_nack.core.buckets`: sorted time buckets → ledger → entry-id containers;
- :mod:`~pulsar_nack.core.pages`: the sealed-page format of a bucket's ids;
- :mod:`~pulsar_nack.core.accel`: the optional C hot path (``_speedups.c``) and its stand-in;
- :mod:`~pulsar_nack.core.timer`: the timer that wakes only for the earliest deadline;
- :mod:`~pulsar_nack.core.backoff`: fixed delay and multiplier backoff;
- :mod:`~pulsar_nack.core.base`, :mod:`~pulsar_nack.core.tracker`: :class:`NegativeAcksTracker`;
- :mod:`~pulsar_nack.core.baseline`: the hash-map tracker the benchmarks compare against.
"""

from __future__ import annotations

from .backoff import FixedDelay, MultiplierRedeliveryBackoff, RedeliveryBackoff
from .baseline import HashMapNegativeAcksTracker
from .buckets import TimeBuckets
from .keys import MessageKey, key_of
from .timer import DeadlineTimer
from .tracker import NegativeAcksTracker, TrackerStats

__all__ = [
    "DeadlineTimer",
    "FixedDelay",
    "HashMapNegativeAcksTracker",
    "MessageKey",
    "MultiplierRedeliveryBackoff",
    "NegativeAcksTracker",
    "RedeliveryBackoff",
    "TimeBuckets",
    "TrackerStats",
    "key_of",
]
