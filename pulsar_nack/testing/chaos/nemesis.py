"""The nemesis of a chaos run: seeded faults at random moments, each recorded with its time.

:class:`Nemesis` draws every choice (which fault, its target, how long it lasts, the gap
before the next) from one ``random.Random(seed)``, so the sequence of faults is reproducible
from the seed printed at the start of a run; their moments follow the wall clock. Every
fault ends by itself (a killed broker or consumer is started again, a frozen broker
resumed) before the next begins, so stopping the nemesis leaves the cluster whole. Faults
only touch loopback processes the run started.

Kinds (:class:`Fault`): topic unload, bundle unload to a chosen broker, broker SIGKILL then
restart, broker SIGSTOP past the clients' operation timeout then SIGCONT, consumer process
SIGKILL then restart, consumer close and resubscribe (SIGUSR1), producer burst (SIGUSR1).
"""

from __future__ import annotations

import enum
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence

from ...errors import BrokerError
from ..cluster import PulsarCluster
from .fleet import Fleet
from .history import Ev, HistoryWriter
from .workload import WorkloadSpec

__all__ = ["Fault", "Nemesis"]

NAMESPACE = "public/default"


class Fault(str, enum.Enum):
    TOPIC_UNLOAD = "topic-unload"
    BUNDLE_UNLOAD = "bundle-unload"
    BROKER_KILL = "broker-kill"
    BROKER_FREEZE = "broker-freeze"
    CONSUMER_KILL = "consumer-kill"
    RESUBSCRIBE = "resubscribe"
    PRODUCER_BURST = "producer-burst"


WEIGHTS = {Fault.TOPIC_UNLOAD: 2, Fault.BUNDLE_UNLOAD: 2, Fault.BROKER_KILL: 1.5, Fault.BROKER_FREEZE: 1.5,
           Fault.CONSUMER_KILL: 2, Fault.RESUBSCRIBE: 2, Fault.PRODUCER_BURST: 1}  # fmt: skip


class Nemesis:
    """Throws one fault per :meth:`step` at *cluster* and *fleet*.

    Parameters
    ----------
    cluster : PulsarCluster
    fleet : Fleet
        The run's workers (consumers are killed and signalled, producers signalled).
    spec : WorkloadSpec
    writer : HistoryWriter
        The run's own history file: each fault is recorded at its beginning and its end.
    seed : int
    gap_s : (float, float)
        Bounds of the uniform pause after each fault.
    kinds : sequence of Fault, optional
        The kinds to choose from (default: every kind, weighted by :data:`WEIGHTS`).
    """

    def __init__(self, cluster: PulsarCluster, fleet: Fleet, spec: WorkloadSpec, writer: HistoryWriter, seed: int,
                 gap_s: tuple[float, float] = (5.0, 30.0), kinds: Sequence[Fault] | None = None) -> None:  # fmt: skip
        self.cluster = cluster
        self.fleet = fleet
        self.spec = spec
        self.writer = writer
        self.rng = random.Random(seed)
        self.gap_s = gap_s
        self.kinds = list(kinds or WEIGHTS)
        self.counts: Counter[str] = Counter()
        self._apply: dict[Fault, Callable[[], str]] = {
            Fault.TOPIC_UNLOAD: self._topic_unload, Fault.BUNDLE_UNLOAD: self._bundle_unload,
            Fault.BROKER_KILL: self._broker_kill, Fault.BROKER_FREEZE: self._broker_freeze,
            Fault.CONSUMER_KILL: self._consumer_kill,
            Fault.RESUBSCRIBE: lambda: self._usr1(Fault.RESUBSCRIBE, "consumer"),
            Fault.PRODUCER_BURST: lambda: self._usr1(Fault.PRODUCER_BURST, "producer"),
        }  # fmt: skip

    def next_gap_s(self) -> float:
        return self.rng.uniform(*self.gap_s)

    def step(self) -> Fault:
        """Choose a fault, throw it, wait for its end; return its kind."""
        fault = self.rng.choices(self.kinds, [WEIGHTS[k] for k in self.kinds])[0]
        try:
            self._apply[fault]()
        except (BrokerError, OSError) as error:  # the admin API of a broker that just moved, for example
            self.writer.write(Ev.ERROR, op=f"fault {fault.value}", error=repr(error)[:300])
        self.counts[fault.value] += 1
        return fault

    def _begin(self, fault: Fault, target: str) -> None:
        self.writer.write(Ev.FAULT, kind=fault.value, target=target, phase="begin")

    def _end(self, fault: Fault, target: str) -> None:
        self.writer.write(Ev.FAULT, kind=fault.value, target=target, phase="end")

    def _topics(self) -> list[str]:
        topics = list(self.spec.topics.values())
        topics += [t for t in (s.retry_topic(self.spec) for s in self.spec.subscriptions) if t]
        return topics

    def _topic_unload(self) -> str:
        topic = self.rng.choice(self._topics())
        self._begin(Fault.TOPIC_UNLOAD, topic)
        self.cluster.unload_topic(topic)
        self._end(Fault.TOPIC_UNLOAD, topic)
        return topic

    def _bundle_unload(self) -> str:
        bundles = self.cluster.admin.bundles(NAMESPACE)
        bundle = self.rng.choice(bundles)
        to = self.rng.randrange(len(self.cluster.brokers))
        target = f"{bundle}->broker-{to}"
        self._begin(Fault.BUNDLE_UNLOAD, target)
        self.cluster.unload_bundle(NAMESPACE, bundle, to_broker=to)
        self._end(Fault.BUNDLE_UNLOAD, target)
        return target

    def _broker_kill(self) -> str:
        index = self.rng.randrange(len(self.cluster.brokers))
        down_s = self.rng.uniform(2.0, 10.0)
        target = f"broker-{index}"
        self._begin(Fault.BROKER_KILL, target)
        self.cluster.kill_broker(index)
        time.sleep(down_s)
        self._restart(index)
        self._end(Fault.BROKER_KILL, target)
        return target

    def _restart(self, index: int) -> None:
        for attempt in range(3):
            try:
                self.cluster.restart_broker(index)
                return
            except BrokerError as error:
                self.writer.write(Ev.ERROR, op=f"restart broker-{index} ({attempt + 1})", error=repr(error)[:300])
        raise BrokerError(f"broker-{index} did not restart")

    def _broker_freeze(self) -> str:
        index = self.rng.randrange(len(self.cluster.brokers))
        # past the clients' operation timeout, under the metadata session timeout (the broker keeps its topics)
        frozen_s = self.rng.uniform(self.spec.operation_timeout_s + 0.5, self.cluster.session_timeout_ms / 1000 - 1.5)
        target = f"broker-{index}"
        self._begin(Fault.BROKER_FREEZE, target)
        self.cluster.freeze_broker(index)
        try:
            time.sleep(frozen_s)
        finally:
            self.cluster.thaw_broker(index)
        self._end(Fault.BROKER_FREEZE, target)
        return target

    def _consumer_kill(self) -> str:
        name = self.rng.choice(self.fleet.names("consumer"))
        down_s = self.rng.uniform(0.5, 5.0)
        self._begin(Fault.CONSUMER_KILL, name)
        self.fleet.kill(name)
        time.sleep(down_s)
        self.fleet.start("consumer", name)
        self._end(Fault.CONSUMER_KILL, name)
        return name

    def _usr1(self, fault: Fault, role: str) -> str:
        """SIGUSR1 to one worker of *role*: a consumer closes and resubscribes, a producer sends a burst."""
        name = self.rng.choice(self.fleet.names(role))
        self._begin(fault, name)
        self.fleet.signal(name, signal.SIGUSR1)
        self._end(fault, name)
        return name

    def heal(self) -> None:
        """Make sure every broker runs and none is frozen (after a fault that failed half-way)."""
        for broker in self.cluster.brokers:
            if broker.frozen:
                self.cluster.thaw_broker(broker.index)
            if not broker.is_running():
                self._restart(broker.index)
