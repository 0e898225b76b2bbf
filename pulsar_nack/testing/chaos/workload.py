"""What a chaos or soak run consists of: topics, subscriptions, consumer and producer processes.

A :class:`WorkloadSpec` is written as JSON into the run's directory; every worker process
reads it and finds its own part by name. :func:`default_workload` is the workload of
``python -m bench.chaos``:

- ``orders``, a topic of 4 partitions spread over both brokers, fed by a batched and an
  unbatched producer; subscription ``nack-shared`` (Shared): nacks with per-call delays or
  a :class:`~pulsar_nack.MultiplierRedeliveryBackoff`, a dead-letter policy; read by a
  blocking consumer (8-bit buckets) and an asyncio one (``never_early``);
- ``events``, a topic with 16 keys, fed by a key-batched and an unbatched producer;
  subscription ``retry-keyshared`` (Key_Shared, ``retry_enable``): ``reconsume_later`` and
  nacks, one dead-letter policy for both; read by a blocking consumer and an asyncio one
  that holds its retry copies (``retry_hold_ms``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .fate import Mechanism

__all__ = ["ConsumerSpec", "ProducerSpec", "SubscriptionSpec", "WorkloadSpec", "default_workload"]

TOKEN = "chaos_token"
"""The property that names one ``reconsume_later`` call, carried by its copy."""
DLQ_SUBSCRIPTION = "chaos-dlq"
"""The dead-letter topics' initial subscription, read by the dead-letter reader."""
PRECISION_BITS = 8


@dataclass(frozen=True)
class SubscriptionSpec:
    """One subscription and its retry rules."""

    name: str
    topic: str
    """The alias of its topic in :attr:`WorkloadSpec.topics`."""
    consumer_type: str
    """``Shared`` or ``KeyShared`` (a ``pulsar.ConsumerType`` name)."""
    mechanisms: tuple[Mechanism, ...]
    max_redeliver_count: int = 3
    backoff: tuple[int, int, float] = (200, 3_000, 2.0)
    """``MultiplierRedeliveryBackoff(min_delay_ms, max_delay_ms, multiplier)``."""

    def dead_letter_topic(self, spec: WorkloadSpec) -> str:
        return f"{spec.topics[self.topic]}-{self.name}-DLQ"

    def retry_topic(self, spec: WorkloadSpec) -> str | None:
        """The retry letter topic (the consumers' default name), or None without reconsumes."""
        return f"{spec.topics[self.topic]}-{self.name}-RETRY" if Mechanism.RECONSUME in self.mechanisms else None


@dataclass(frozen=True)
class ConsumerSpec:
    """One consumer process."""

    name: str
    subscription: str
    mode: str
    """``blocking`` (``pulsar_nack.subscribe``) or ``asyncio`` (``pulsar_nack.asyncio.subscribe``)."""
    never_early: bool = False
    retry_hold_ms: int = 0

    @property
    def floor_ms(self) -> int:
        """How early a bucket may release a nack (the floor of an 8-bit bucket, or 0 when rounding up)."""
        return 0 if self.never_early else (1 << PRECISION_BITS) - 1


@dataclass(frozen=True)
class ProducerSpec:
    """One producer process."""

    name: str
    topic: str
    rate_per_s: float
    batched: bool
    keys: int = 0
    """Distinct partition keys (0: none)."""
    burst: int = 300
    """Messages sent at once on SIGUSR1 (the nemesis's producer burst)."""


@dataclass
class WorkloadSpec:
    """Everything the processes of one run share."""

    url: str
    seed: int
    history: str
    topics: dict[str, str]
    """Alias -> full topic name."""
    partitions: dict[str, int]
    subscriptions: list[SubscriptionSpec]
    consumers: list[ConsumerSpec]
    producers: list[ProducerSpec]
    operation_timeout_s: int = 2
    sample_s: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict)

    def subscription(self, name: str) -> SubscriptionSpec:
        return next(s for s in self.subscriptions if s.name == name)

    def consumer(self, name: str) -> ConsumerSpec:
        return next(c for c in self.consumers if c.name == name)

    def producer(self, name: str) -> ProducerSpec:
        return next(p for p in self.producers if p.name == name)

    def subscriptions_of(self, alias: str) -> list[str]:
        """The subscriptions that must each settle every message of topic *alias*."""
        return [s.name for s in self.subscriptions if s.topic == alias]

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WorkloadSpec:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        raw["subscriptions"] = [
            SubscriptionSpec(**{**s, "mechanisms": tuple(Mechanism(m) for m in s["mechanisms"]),
                                "backoff": tuple(s["backoff"])})
            for s in raw["subscriptions"]
        ]  # fmt: skip
        raw["consumers"] = [ConsumerSpec(**c) for c in raw["consumers"]]
        raw["producers"] = [ProducerSpec(**p) for p in raw["producers"]]
        return cls(**raw)


def default_workload(url: str, seed: int, history: str, tag: str, rate_per_s: float = 8.0) -> WorkloadSpec:
    """The workload described in the module's docstring; *tag* makes the topic names unique."""
    topics = {"orders": f"persistent://public/default/chaos-orders-{tag}",
              "events": f"persistent://public/default/chaos-events-{tag}"}  # fmt: skip
    both = (Mechanism.RECONSUME, Mechanism.NACK)
    return WorkloadSpec(
        url=url,
        seed=seed,
        history=history,
        topics=topics,
        partitions={"orders": 4},
        subscriptions=[
            SubscriptionSpec("nack-shared", "orders", "Shared", (Mechanism.NACK,)),
            SubscriptionSpec("retry-keyshared", "events", "KeyShared", both),
        ],
        consumers=[
            ConsumerSpec("nack-blocking", "nack-shared", "blocking"),
            ConsumerSpec("nack-asyncio", "nack-shared", "asyncio", never_early=True),
            ConsumerSpec("retry-blocking", "retry-keyshared", "blocking"),
            ConsumerSpec("retry-asyncio", "retry-keyshared", "asyncio", retry_hold_ms=3_000),
        ],
        producers=[
            ProducerSpec("orders-batched", "orders", rate_per_s, batched=True),
            ProducerSpec("orders-single", "orders", rate_per_s / 2, batched=False),
            ProducerSpec("events-batched", "events", rate_per_s, batched=True, keys=16),
            ProducerSpec("events-single", "events", rate_per_s / 2, batched=False, keys=16),
        ],
    )
