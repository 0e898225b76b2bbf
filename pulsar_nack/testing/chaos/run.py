"""One chaos or soak run from start to end: cluster, workers, nemesis, drain, history.

:func:`run` starts a :class:`~pulsar_nack.testing.PulsarCluster` of two brokers in the
run's directory, the dead-letter reader, the consumers and the producers of the workload,
then for *minutes* lets the nemesis throw faults (none in a soak). Then the **drain**: the
nemesis stops (every fault has ended), the producers stop, and the consumers keep going
without faults until every produced message is settled (acked or dead-lettered) in each
of its subscriptions, or the drain times out; after a quiet period that lets stray copies
show up, the workers stop, and a plain consumer per subscription records what the broker
still holds unacknowledged there (``leftover``); then the cluster stops. What happened is in the history directory,
for :func:`~pulsar_nack.testing.chaos.checker.check`.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..admin import topic_path
from ..cluster import PulsarCluster
from .fleet import Fleet
from .history import Ev, HistoryTail, HistoryWriter
from .nemesis import Fault, Nemesis
from .workload import WorkloadSpec, default_workload

__all__ = ["RunConfig", "RunResult", "Settlement", "run"]

_TICK_S = 0.5
_LEFTOVER_QUIET_MS = 3_000


@dataclass(frozen=True)
class RunConfig:
    """How long, how hard, and where.

    Attributes
    ----------
    directory : Path
        The run's directory: ``history/``, ``logs/``, ``cluster/``, ``workload.json``.
    minutes : float
        Length of the phase with load (and faults, unless *soak*).
    seed : int
    soak : bool
        No nemesis; consumers sample memory every *sample_s*.
    rate_per_s : float
        The batched producers' rate per topic (the unbatched ones send half as much).
    gap_s : (float, float)
        The nemesis's pause between faults.
    drain_timeout_s, quiet_s : float
    sample_s : float
    faults : tuple of str
        The nemesis's fault kinds (:class:`~.nemesis.Fault` values; empty: every kind).
    min_faults : int
        The load phase goes on past *minutes* until the nemesis has thrown this many faults
        (a fault can take long on a slow machine: a broker restart), at most twice as long.
    """

    directory: Path
    minutes: float
    seed: int
    soak: bool = False
    rate_per_s: float = 8.0
    gap_s: tuple[float, float] = (5.0, 30.0)
    drain_timeout_s: float = 240.0
    quiet_s: float = 5.0
    sample_s: float = 10.0
    faults: tuple[str, ...] = ()
    broker_config: dict[str, str] = field(default_factory=lambda: {"delayedDeliveryTickTimeMillis": "100"})
    min_faults: int = 0


@dataclass
class RunResult:
    spec: WorkloadSpec
    started: float
    load_ended: float
    drained: bool
    drain_s: float
    outstanding: int
    faults: dict[str, int]
    worker_exits: list[tuple[str, int]]
    version: str


class Settlement:
    """What is produced and what is settled so far, per subscription, from the history as it grows."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.tail = HistoryTail(spec.history)
        self.produced: dict[str, set[str]] = defaultdict(set)
        self.settled: dict[str, set[str]] = defaultdict(set)

    def poll(self) -> int:
        """Read what is new; return how many (message, subscription) pairs are still unsettled."""
        for record in self.tail.poll():
            ev = record["ev"]
            if ev == Ev.PRODUCE.value:
                self.produced[record["topic"]].add(record["id"])
            elif ev in (Ev.ACK.value, Ev.DEAD_LETTER.value):
                self.settled[record["sub"]].add(record["id"])
        return sum(len(ids - self.settled[sub]) for alias, ids in self.produced.items()
                   for sub in self.spec.subscriptions_of(alias))  # fmt: skip


def _start_cluster(config: RunConfig) -> PulsarCluster:
    return PulsarCluster(data_dir=config.directory / "cluster", broker_config=config.broker_config).start()


def _prepare(cluster: PulsarCluster, config: RunConfig) -> WorkloadSpec:
    history = config.directory / "history"
    spec = default_workload(cluster.url, config.seed, str(history), uuid.uuid4().hex[:8], config.rate_per_s)
    spec.sample_s = config.sample_s
    for alias, topic in spec.topics.items():
        if alias in spec.partitions:
            cluster.create_partitioned_topic(topic, spec.partitions[alias])
            cluster.spread_partitions(topic, spec.partitions[alias])
        else:
            cluster.admin.request("PUT", topic_path(topic))
    letters = [sub.dead_letter_topic(spec) for sub in spec.subscriptions]
    letters += [t for t in (sub.retry_topic(spec) for sub in spec.subscriptions) if t]
    for topic in letters:
        cluster.admin.request("PUT", topic_path(topic))
    for topic in [*spec.topics.values(), *letters]:
        # a send retried across a fault (a producer's, a retry's, a dead letter's) is stored once
        cluster.admin.request("POST", f"{topic_path(topic)}/deduplicationEnabled", True)
    spec.save(config.directory / "workload.json")
    return spec


def _wait_subscribed(settle_tail: HistoryTail, names: list[str], timeout_s: float) -> None:
    waiting = set(names)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        waiting -= {r["proc"] for r in settle_tail.poll() if r["ev"] == Ev.SUBSCRIBE.value}
        time.sleep(_TICK_S)
    if waiting:
        raise RuntimeError(f"consumers not subscribed within {timeout_s} s: {sorted(waiting)}")


def _supervise(fleet: Fleet, writer: HistoryWriter) -> None:
    """Restart a worker that ended by itself (a finding, recorded as an error)."""
    for name in fleet.reap_exited():
        code = fleet.exits[-1][1]
        writer.write(Ev.ERROR, op="worker exit", worker=name, code=code)
        fleet.start(fleet.roles[name], name)


def _load_phase(config: RunConfig, cluster: PulsarCluster, fleet: Fleet, spec: WorkloadSpec,
                writer: HistoryWriter) -> dict[str, int]:  # fmt: skip
    """Load (and faults, unless a soak) for ``config.minutes``; return the faults thrown by kind."""
    began = time.monotonic()
    end, latest = began + config.minutes * 60, began + 2 * config.minutes * 60
    kinds = [Fault(kind) for kind in config.faults] or None
    nemesis = None if config.soak else Nemesis(cluster, fleet, spec, writer, config.seed, config.gap_s, kinds)
    next_fault = time.monotonic() + (nemesis.next_gap_s() if nemesis else 0)
    while _loading(time.monotonic(), end, latest, nemesis, config.min_faults):
        _supervise(fleet, writer)
        if nemesis is not None and time.monotonic() >= next_fault:
            nemesis.step()
            next_fault = time.monotonic() + nemesis.next_gap_s()
        time.sleep(_TICK_S)
    if nemesis is None:
        return {}
    nemesis.heal()
    return dict(nemesis.counts)


def _loading(now: float, end: float, latest: float, nemesis: Nemesis | None, min_faults: int) -> bool:
    """True while the load phase goes on: until *end*, then until *min_faults* faults were thrown or *latest*."""
    short = nemesis is not None and sum(nemesis.counts.values()) < min_faults
    return now < end or (short and now < latest)


def _drain(config: RunConfig, fleet: Fleet, spec: WorkloadSpec, writer: HistoryWriter) -> tuple[bool, float, int]:
    """Stop the producers, then wait for every message to be settled; return (drained, seconds, outstanding)."""
    for name in fleet.names("producer"):
        fleet.stop(name, timeout_s=180)
    writer.write(Ev.SAMPLE, phase="drain")
    settlement = Settlement(spec)
    began = time.monotonic()
    outstanding = settlement.poll()
    while outstanding and time.monotonic() - began < config.drain_timeout_s:
        _supervise(fleet, writer)
        time.sleep(1.0)
        outstanding = settlement.poll()
    drained_s = time.monotonic() - began
    time.sleep(config.quiet_s)  # stray copies (after an ack, after a dead letter) get their chance to show up
    return not outstanding, drained_s, settlement.poll()


def _leftovers(cluster: PulsarCluster, spec: WorkloadSpec, writer: HistoryWriter) -> int:
    """Once every consumer is closed: record what each subscription still holds unacknowledged.

    A plain consumer per subscription (and per retry topic) receives, without acking, until
    nothing comes for :data:`_LEFTOVER_QUIET_MS`; return how many it got.
    """
    import pulsar

    from ..client import quiet_client
    from .fate import decode

    client = quiet_client(cluster.url)
    count = 0
    try:
        for sub in spec.subscriptions:
            topics = [(spec.topics[sub.topic], sub.consumer_type)]
            retry = sub.retry_topic(spec)
            if retry:
                topics.append((retry, "Shared"))  # a retry topic's subscription is Shared
            for topic, kind in topics:
                consumer = client.subscribe(topic, sub.name, consumer_type=getattr(pulsar.ConsumerType, kind))
                while True:
                    try:
                        message = consumer.receive(_LEFTOVER_QUIET_MS)
                    except pulsar.Timeout:
                        break
                    writer.write(Ev.LEFTOVER, id=decode(message.data())[0], sub=sub.name, mid=str(message.message_id()),
                                 rc=message.redelivery_count(), topic=topic)  # fmt: skip
                    count += 1
                consumer.close()
    finally:
        client.close()
    return count


def run(config: RunConfig, progress: Any = print, cluster: PulsarCluster | None = None) -> RunResult:
    """Run the workload (with the nemesis unless ``config.soak``) and drain; see the module's docstring.

    On a fresh cluster with ``config.broker_config``, stopped at the end; or on *cluster*, a
    running one of two brokers (its topics are the run's own; it is left running, every
    broker up).
    """
    config.directory.mkdir(parents=True, exist_ok=True)
    own = cluster is None
    cluster = _start_cluster(config) if cluster is None else cluster
    fleet: Fleet | None = None
    try:
        spec = _prepare(cluster, config)
        writer = HistoryWriter(spec.history, "run")
        writer.write(Ev.START, role="run", seed=config.seed, soak=config.soak, minutes=config.minutes)
        fleet = Fleet(config.directory / "workload.json", config.directory / "logs")
        fleet.start("dead-letters", "dead-letters")
        for consumer in spec.consumers:
            fleet.start("consumer", consumer.name)
        _wait_subscribed(HistoryTail(spec.history), [c.name for c in spec.consumers], 180)
        for producer in spec.producers:
            fleet.start("producer", producer.name)
        started = time.time()
        progress(f"load {'(soak) ' if config.soak else 'with the nemesis '}for {config.minutes} min, seed {config.seed}")
        faults = _load_phase(config, cluster, fleet, spec, writer)
        load_ended = time.time()
        writer.write(Ev.SAMPLE, phase="load-ended", faults=faults)
        progress(f"faults: {faults}; draining")
        drained, drain_s, outstanding = _drain(config, fleet, spec, writer)
        progress(f"drained: {drained} in {drain_s:.0f} s, {outstanding} unsettled")
        for name in fleet.names("consumer"):
            fleet.signal(name, signal.SIGTERM)
        fleet.stop_all(timeout_s=60)
        leftovers = _leftovers(cluster, spec, writer)
        progress(f"{leftovers} messages left unacknowledged in the subscriptions")
        writer.write(Ev.STOP)
        writer.close()
        return RunResult(spec, started, load_ended, drained, drain_s, outstanding, faults, list(fleet.exits),
                         cluster.version)  # fmt: skip
    finally:
        if fleet is not None:
            fleet.stop_all(timeout_s=10)
        if own:
            cluster.stop()
