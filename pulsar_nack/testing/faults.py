"""Faults a two-broker cluster throws at consumers with nacks pending, and what reaches the application.

Each scenario runs on a :class:`~pulsar_nack.testing.PulsarCluster` with one or more
*arms* reading the same topic, each on a subscription and a client of its own, so that
both see the same fault at the same moment:

- ``"ours"``: :func:`pulsar_nack.subscribe` (8 precision bits, per-call delays or a
  :class:`~pulsar_nack.MultiplierRedeliveryBackoff`);
- ``"builtin"``: the plain ``client.subscribe`` and ``negative_acknowledge(message)``, whose
  delay is the consumer's fixed ``negative_ack_redelivery_delay_ms`` (it has no per-call
  delay and, in the Python client, no backoff); ``batch_index_ack_enabled=True`` as ours.

One thread per arm (eight in :func:`eight_threads`) receives and settles messages while the
fault happens. Every delivery is logged (:class:`DeliveryLog`) with its time, and so are the
application's acks and nacks, with the time each nack is due (the delay the arm honours:
the requested one for ours, the fixed one for the built-in). The findings
(:class:`Findings`) are the same for both arms:

lost
    payloads never delivered, or whose last nack no later delivery answered;
early
    a delivery answering a nack more than :data:`EARLY_MS` before it was due (the floor
    of an 8-bit bucket, 255 ms, plus 10 ms for clock reads on a busy machine);
duplicates
    deliveries beyond one plus one per nack;
after ack
    deliveries of a payload the application had acked;
lateness
    arrival minus due time of every answered nack, in ms; and *late*: answers after
    ``max(due, end of the fault) + LATE_S``, where the end of the fault is when the
    consumer can hear from the broker again (see each scenario).

``tests/test_faults.py`` asserts the guarantees on ours; ``bench/faults.py`` records both
arms side by side (``bench/results/faults.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.backoff import MultiplierRedeliveryBackoff, RedeliveryBackoff
from ..errors import BrokerError
from .client import quiet_client
from .cluster import PulsarCluster
from .waits import wait_until

__all__ = [
    "ARMS",
    "EARLY_MS",
    "LATE_S",
    "PRECISION_BITS",
    "QUIET_S",
    "Arm",
    "DeliveryLog",
    "FaultRun",
    "Findings",
    "broker_freeze",
    "broker_kill",
    "broker_kill_while_acking",
    "broker_restart",
    "eight_threads",
    "open_producer",
    "produce",
    "send_all",
    "spark_demo_with_kill",
    "topic_unload",
]

ARMS = ("ours", "builtin")
PRECISION_BITS = 8
EARLY_MS = (1 << PRECISION_BITS) - 1 + 10
"""A delivery this much before its nack was due is early: the bucket floor plus clock slack."""
LATE_S = 1.0
"""An answer later than ``max(due, end of the fault) + LATE_S`` is late."""
QUIET_S = 1.5
"""How long the arms keep receiving after the last expected delivery, so that an unwanted
copy gets its chance to show up (a reconnect redelivers well within a second here)."""
NAMESPACE = "public/default"

Decide = Callable[[bytes, int, int], "int | None"]
"""``decide(payload, nth, redelivery_count)``: the nack delay in ms for the *nth* delivery
(0 for the first) of *payload*, or None to acknowledge it."""


def new_topic(prefix: str) -> str:
    """A fresh topic name in ``public/default``."""
    return f"persistent://{NAMESPACE}/{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- the log


class DeliveryLog:
    """Every delivery of every payload to one arm, what the application did, and when. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: dict[bytes, list[float]] = defaultdict(list)
        self.topics: dict[bytes, str] = {}
        self.due: dict[bytes, list[float]] = defaultdict(list)
        self.acked_at: dict[bytes, float] = {}
        self.after_ack: list[tuple[bytes, float]] = []

    def delivered(self, payload: bytes, topic: str, now: float) -> int:
        """Log a delivery at *now*; return how many came before it (its *nth*)."""
        with self.lock:
            if payload in self.acked_at:
                self.after_ack.append((payload, now - self.acked_at[payload]))
            arrivals = self.deliveries[payload]
            arrivals.append(now)
            self.topics.setdefault(payload, topic)
            return len(arrivals) - 1

    def nacked(self, payload: bytes, due: float) -> None:
        with self.lock:
            self.due[payload].append(due)

    def acked(self, payload: bytes, now: float) -> None:
        with self.lock:
            self.acked_at.setdefault(payload, now)

    def back(self, payload: bytes) -> bool:
        """Delivered, and every nack of it answered by a later delivery."""
        with self.lock:
            return len(self.deliveries.get(payload, ())) > len(self.due.get(payload, ()))

    def all_back(self, payloads: Sequence[bytes]) -> bool:
        return all(self.back(p) for p in payloads)

    def count(self, payloads: Sequence[bytes]) -> int:
        """How many of *payloads* were delivered at least once."""
        with self.lock:
            return sum(1 for p in payloads if p in self.deliveries)

    def answers(self) -> list[tuple[bytes, float, float]]:
        """``(payload, due, arrival)`` of every nack a later delivery answered."""
        with self.lock:
            return [
                (payload, due, self.deliveries[payload][i + 1])
                for payload, dues in self.due.items()
                for i, due in enumerate(dues)
                if i + 1 < len(self.deliveries[payload])
            ]


# --------------------------------------------------------------------------- arms


class Arm:
    """One consumer (ours or the built-in nack) on its own client and subscription.

    Parameters
    ----------
    kind : str
        ``"ours"`` or ``"builtin"``.
    url, topic : str
    delay_ms : int
        The built-in's fixed delay; ours' default delay.
    backoff : RedeliveryBackoff, optional
        Ours nacks without a delay and lets the consumer's backoff choose it (the scenario's
        ``decide`` must compute the same delay, for the log).
    client_options, subscribe_options : dict, optional
        Extra ``pulsar.Client`` and ``subscribe`` keywords.
    """

    def __init__(
        self,
        kind: str,
        url: str,
        topic: str,
        *,
        delay_ms: int,
        backoff: RedeliveryBackoff | None = None,
        client_options: dict[str, Any] | None = None,
        subscribe_options: dict[str, Any] | None = None,
    ) -> None:
        import pulsar

        if kind not in ARMS:
            raise ValueError(f"kind must be one of {ARMS}, got {kind!r}")
        self.kind = kind
        self.log = DeliveryLog()
        self.errors: list[str] = []
        self.decide: Decide = lambda _payload, _nth, _count: None
        self.fixed_delay_ms = delay_ms if kind == "builtin" else None
        self.backoff = backoff if kind == "ours" else None
        options = {"consumer_type": pulsar.ConsumerType.Shared, "negative_ack_redelivery_delay_ms": delay_ms,
                   **({} if kind == "ours" else {"batch_index_ack_enabled": True}), **(subscribe_options or {})}  # fmt: skip
        self.client = quiet_client(url, **(client_options or {}))
        try:
            self.consumer: Any = self._subscribe(topic, backoff, options)
        except BaseException:
            self.client.close()
            raise

    def _subscribe(self, topic: str, backoff: RedeliveryBackoff | None, options: dict[str, Any]) -> Any:
        """Subscribe, again after a timeout for 60 s: a short operation timeout (broker_freeze) can
        expire on a busy machine before any fault."""
        import pulsar

        import pulsar_nack

        deadline = time.monotonic() + 60
        while True:
            try:
                if self.kind == "ours":
                    return pulsar_nack.subscribe(
                        self.client, topic, self.kind, negative_ack_precision_bit_cnt=PRECISION_BITS,
                        redelivery_backoff=backoff, **options,
                    )  # fmt: skip
                return self.client.subscribe(topic, self.kind, **options)
            except pulsar.Timeout:
                if time.monotonic() >= deadline:
                    raise

    def handle(self, message: Any) -> None:
        """Log a delivery, then ack or nack it as ``decide`` says."""
        now = time.monotonic()
        payload = message.data()
        nth = self.log.delivered(payload, message.topic_name(), now)
        delay = self.decide(payload, nth, message.redelivery_count())
        if delay is None:
            self.log.acked(payload, now)
            self.consumer.acknowledge(message)
        elif self.fixed_delay_ms is not None:
            self.log.nacked(payload, now + self.fixed_delay_ms / 1000)
            self.consumer.negative_acknowledge(message)
        else:
            self.log.nacked(payload, now + delay / 1000)
            if self.backoff is not None:
                self.consumer.negative_acknowledge(message)
            else:
                self.consumer.negative_acknowledge(message, delay_ms=delay)

    def pump(self, stop: threading.Event) -> None:
        """Receive and handle until *stop* is set; errors are kept in :attr:`errors`."""
        import pulsar

        while not stop.is_set():
            try:
                message = self.consumer.receive(100)
            except pulsar.Timeout:
                continue
            except Exception as error:  # a finding, reported by the scenario
                self.errors.append(f"receive: {error!r}")
                time.sleep(0.1)
                continue
            try:
                self.handle(message)
            except Exception as error:
                self.errors.append(f"settle: {error!r}")

    def pending(self) -> int | None:
        """Nacks pending in our tracker (None for the built-in)."""
        return len(self.consumer.tracker) if self.kind == "ours" else None

    def stats(self) -> dict[str, Any]:
        """Our consumer's counters (swallowed, filtered, ...); empty for the built-in."""
        return dict(self.consumer.stats()) if self.kind == "ours" else {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
        with contextlib.suppress(Exception):
            self.client.close()


def one_active() -> dict[str, Any]:
    """Subscribe options for one active consumer (Failover), where members of one batch entry are nacked for
    different delays: on a Shared subscription they come back with the entry's last (docs/consumer.md,
    "Batches"), and these scenarios check each member's own time."""
    import pulsar

    return {"consumer_type": pulsar.ConsumerType.Failover}


def open_arms(url: str, topic: str, kinds: Sequence[str], **options: Any) -> list[Arm]:
    """One :class:`Arm` per kind on *topic*; all closed again if one fails to open."""
    arms: list[Arm] = []
    try:
        for kind in kinds:
            arms.append(Arm(kind, url, topic, **options))
    except BaseException:
        for arm in arms:
            arm.close()
        raise
    return arms


@contextlib.contextmanager
def pumping(arms: Sequence[Arm], decide: Decide, threads: int = 1) -> Iterator[None]:
    """Receive on *threads* threads per arm while the block runs."""
    stop = threading.Event()
    workers = []
    for arm in arms:
        arm.decide = decide
        workers += [threading.Thread(target=arm.pump, args=(stop,), name=f"pump-{arm.kind}-{i}", daemon=True)
                    for i in range(threads)]  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)


def open_producer(client: Any, topic: str, batch_size: int = 0) -> Any:
    """A producer of *topic* batching *batch_size* messages per entry (0: one per entry), without send timeout."""
    return client.create_producer(
        topic,
        batching_enabled=batch_size > 0,
        batching_max_messages=max(batch_size, 2),
        batching_max_publish_delay_ms=1000,
        block_if_queue_full=True,
        send_timeout_millis=0,
    )


def send_all(producer: Any, payloads: Sequence[bytes], wait_s: float = 60.0) -> None:
    """Send *payloads*; BrokerError unless the broker confirms every one within *wait_s*."""
    import pulsar

    results: list[Any] = []
    for payload in payloads:
        producer.send_async(payload, lambda result, _id: results.append(result))
    producer.flush()
    wait_until(lambda: len(results) >= len(payloads), wait_s)
    failed = [r for r in results if r != pulsar.Result.Ok]
    if failed or len(results) != len(payloads):
        raise BrokerError(f"{len(payloads) - results.count(pulsar.Result.Ok)} of {len(payloads)} sends failed: {failed[:3]}")


def produce(client: Any, topic: str, payloads: Sequence[bytes], *, batch_size: int = 0) -> None:
    """Send *payloads* (in batches of *batch_size*, or one per entry); BrokerError unless all are confirmed."""
    producer = open_producer(client, topic, batch_size)
    try:
        send_all(producer, payloads)
    finally:
        producer.close()


# --------------------------------------------------------------------------- findings


def _percentile(ordered: Sequence[float], q: float) -> float | None:
    if not ordered:
        return None
    return float(ordered[min(len(ordered) - 1, round((len(ordered) - 1) * q / 100))])


@dataclass
class Findings:
    """What one arm's application saw in one scenario (see the module docstring)."""

    arm: str
    messages: int
    deliveries: int
    nacks: int
    lost: list[bytes]
    early: dict[bytes, float]
    """payload -> ms ahead of its due time, for answers more than EARLY_MS early."""
    duplicates: dict[bytes, int]
    """payload -> deliveries beyond one plus one per nack."""
    after_ack: list[tuple[bytes, float]]
    """(payload, seconds after its ack) of every delivery after an ack."""
    lateness_ms: list[float]
    late: dict[bytes, float]
    """payload -> ms beyond ``max(due, end of the fault) + LATE_S``."""
    stats: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, arm: Arm, payloads: Sequence[bytes], fault_end: Callable[[bytes], float] | None = None) -> Findings:
        """The findings of *arm* over *payloads*; *fault_end(payload)* is when its fault ended (default: never mattered)."""
        log = arm.log
        answers = log.answers()
        early: dict[bytes, float] = {}
        late: dict[bytes, float] = {}
        for payload, due, arrival in answers:
            ahead = (due - arrival) * 1000
            if ahead > EARLY_MS:
                early[payload] = max(ahead, early.get(payload, 0.0))
            bound = max(due, fault_end(payload) if fault_end is not None else due) + LATE_S
            if arrival > bound:
                late[payload] = max((arrival - bound) * 1000, late.get(payload, 0.0))
        with log.lock:
            deliveries = {p: len(d) for p, d in log.deliveries.items()}
            nacks = {p: len(d) for p, d in log.due.items()}
            after_ack = list(log.after_ack)
        return cls(
            arm=arm.kind,
            messages=len(payloads),
            deliveries=sum(deliveries.values()),
            nacks=sum(nacks.values()),
            lost=[p for p in payloads if not log.back(p)],
            early=early,
            duplicates={p: n - 1 - nacks.get(p, 0) for p, n in deliveries.items() if n > 1 + nacks.get(p, 0)},
            after_ack=after_ack,
            lateness_ms=sorted((arrival - due) * 1000 for _, due, arrival in answers),
            late=late,
            stats=arm.stats(),
            errors=list(arm.errors),
        )

    @classmethod
    def merge(cls, parts: Sequence[Findings]) -> Findings:
        """Several runs of one arm as one."""
        merged = cls(parts[0].arm, 0, 0, 0, [], {}, {}, [], [], {})
        for part in parts:
            merged.messages += part.messages
            merged.deliveries += part.deliveries
            merged.nacks += part.nacks
            merged.lost += part.lost
            merged.early.update(part.early)
            merged.duplicates.update(part.duplicates)
            merged.after_ack += part.after_ack
            merged.lateness_ms += part.lateness_ms
            merged.late.update(part.late)
            merged.errors += part.errors
            for key, value in part.stats.items():
                if isinstance(value, int):
                    merged.stats[key] = merged.stats.get(key, 0) + value
        merged.lateness_ms.sort()
        return merged

    def summary(self) -> dict[str, Any]:
        """The figures, JSON-ready: counts and lateness percentiles (ms)."""
        ordered = self.lateness_ms
        points = {"min": 0, "p50": 50, "p99": 99, "max": 100}
        lateness = {name: _percentile(ordered, q) for name, q in points.items()}
        return {
            "arm": self.arm,
            "messages": self.messages,
            "deliveries": self.deliveries,
            "nacks": self.nacks,
            "lost": len(self.lost),
            "early": len(self.early),
            "earliest_ms_ahead": round(max(self.early.values()), 1) if self.early else None,
            "duplicates": sum(self.duplicates.values()),
            "after_ack": len(self.after_ack),
            "late": len(self.late),
            "lateness_ms": {"count": len(ordered), **{k: None if v is None else round(v, 1) for k, v in lateness.items()}},
            "consumer_stats": {k: v for k, v in self.stats.items() if isinstance(v, (int, float))},
            "errors": self.errors[:5],
        }

    def problems(self) -> str:
        """A short description of every broken guarantee (empty if none), for assertion messages."""
        def head(items: Any) -> str:
            return str(list(items)[:5])

        parts = []
        if self.lost:
            parts.append(f"{len(self.lost)} lost {head(self.lost)}")
        if self.early:
            parts.append(f"{len(self.early)} early (ms ahead) {head(self.early.items())}")
        if self.duplicates:
            parts.append(f"{sum(self.duplicates.values())} duplicates {head(self.duplicates.items())}")
        if self.after_ack:
            parts.append(f"{len(self.after_ack)} after their ack (s) {head(self.after_ack)}")
        if self.late:
            parts.append(f"{len(self.late)} late (ms beyond the bound) {head(self.late.items())}")
        return "; ".join(parts)


@dataclass
class FaultRun:
    """One scenario: its name, settings, fault timings (s from the fault's start) and each arm's findings."""

    fault: str
    settings: dict[str, Any]
    timings: dict[str, float | None]
    arms: dict[str, Findings]

    def summary(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "settings": self.settings,
            "timings_s": {k: None if v is None else round(v, 3) for k, v in self.timings.items()},
            "arms": {kind: findings.summary() for kind, findings in self.arms.items()},
        }


# --------------------------------------------------------------------------- scenarios


def _all_delivered(arms: Sequence[Arm], payloads: Sequence[bytes]) -> Callable[[], bool]:
    return lambda: all(arm.log.count(payloads) == len(payloads) for arm in arms)


def _all_back(arms: Sequence[Arm], payloads: Sequence[bytes]) -> Callable[[], bool]:
    return lambda: all(arm.log.all_back(payloads) for arm in arms)


def _settle(arms: Sequence[Arm], payloads: Sequence[bytes], timeout_s: float) -> None:
    """Wait until every payload is back on every arm (or *timeout_s*), then observe for QUIET_S."""
    wait_until(_all_back(arms, payloads), timeout_s)
    time.sleep(QUIET_S)  # the observation window: a copy that should not come gets its chance


def topic_unload(
    cluster: PulsarCluster, kinds: Sequence[str] = ("ours",), *, batched: bool, move: bool, messages: int = 200
) -> FaultRun:
    """*messages* messages, the even ones nacked for 4 s and the odd ones acked; 1 s after the
    first delivery the topic is unloaded (*move* False) or its bundle is unloaded to the
    other broker (*move* True). Every consumer reconnects and the broker redelivers every
    unacked message, 3 s before the nacks are due.

    The end of the fault, for an arm, is when the unload had returned and a broker had the
    arm's consumer subscribed again: a consumer refused while the bundle moves tries again
    after its reconnect backoff, which can take it past the nacks' due time.
    """
    topic = new_topic("move" if move else "unload")
    payloads = [f"u{i:04d}".encode() for i in range(messages)]
    arms = open_arms(cluster.url, topic, kinds, delay_ms=4_000)
    producer = quiet_client(cluster.url)
    timings: dict[str, float | None] = {}
    watch: _Watch | None = None
    try:
        with pumping(arms, lambda p, nth, _count: 4_000 if nth == 0 and int(p[1:]) % 2 == 0 else None):
            produce(producer, topic, payloads, batch_size=10 if batched else 0)
            if not wait_until(_all_delivered(arms, payloads), 60):
                raise BrokerError("not every message arrived before the fault")
            first = min(min(arm.log.deliveries[p][0] for p in payloads) for arm in arms)
            wait_until(lambda: time.monotonic() >= first + 1.0, 5)
            owner = cluster.owner_of(topic)
            watch = _Watch(cluster, [topic], 1 - owner if move else None, arms)
            began = time.monotonic()
            if move:
                cluster.move_topic(topic, 1 - owner)
            else:
                cluster.unload_topic(topic)
            ended = time.monotonic()
            _settle(arms, payloads, 60)
            watch.stop()
            timings = {"fault_s": ended - began, "nacked_to_fault_s": began - first, **watch.resubscribed_s()}
        findings = {arm.kind: Findings.of(arm, payloads, _resubscribed_end(arm, watch, ended)) for arm in arms}
    finally:
        if watch is not None:
            watch.stop()
        producer.close()
        for arm in arms:
            arm.close()
    name = ("bundle unload to the other broker" if move else "topic unload") + (", batched" if batched else "")
    settings = {"topic": topic, "messages": messages, "batch_size": 10 if batched else 0, "nacked": "every second, 4 s",
                "fault_after_s": 1.0, "owner_before": owner, "owner_after": 1 - owner if move else None}  # fmt: skip
    return FaultRun(name, settings, timings, findings)


def broker_restart(cluster: PulsarCluster, kinds: Sequence[str] = ("ours",)) -> FaultRun:
    """60 plain and 40 batched messages (batches of 10); every third batched one acked, the
    rest nacked for 4-12 s (the built-in: 8 s); then the topic's broker is restarted
    (SIGTERM: its topics move to the other broker; then it starts again).
    """
    topic = new_topic("restart")
    plain = [f"p{i:02d}".encode() for i in range(60)]
    batched = [f"b{i:02d}".encode() for i in range(40)]
    everything = plain + batched

    def decide(payload: bytes, nth: int, _count: int) -> int | None:
        number = int(payload[1:])
        if nth or (payload[:1] == b"b" and number % 3 == 0):
            return None
        return 4_000 + (number % 9) * 1_000

    arms = open_arms(cluster.url, topic, kinds, delay_ms=8_000, subscribe_options=one_active())
    producer = quiet_client(cluster.url)
    try:
        with pumping(arms, decide):
            produce(producer, topic, plain)
            produce(producer, topic, batched, batch_size=10)
            if not wait_until(_all_delivered(arms, everything), 60):
                raise BrokerError("not every message arrived before the restart")
            owner = cluster.owner_of(topic)
            began = time.monotonic()
            cluster.restart_broker(owner)
            ended = time.monotonic()
            _settle(arms, everything, 120)
        findings = {arm.kind: Findings.of(arm, everything, lambda _p: ended) for arm in arms}
    finally:
        producer.close()
        for arm in arms:
            arm.close()
    acked_siblings = sum(1 for p in batched if int(p[1:]) % 3 == 0)
    settings = {"topic": topic, "plain": len(plain), "batched": len(batched), "batch_size": 10, "acked_siblings": acked_siblings,
                "nacked": "4-12 s (built-in 8 s)", "restarted_broker": owner}  # fmt: skip
    return FaultRun("broker restart, partly acked batches", settings, {"restart_s": ended - began}, findings)


class _Watch:
    """Around a fault, polls on a thread: when every partition's lookup names *survivor* (any
    broker if None), when each arm's consumer is connected again after being seen
    disconnected, and when the broker has each arm's consumer of each partition subscribed
    again (a new ``connectedSince`` in the topic's stats).

    Build it just before the fault: it notes the subscriptions as they are (the broker's
    view before the fault). ``is_connected()`` turns True before the broker has answered the
    subscribe, and a consumer whose subscribe is refused while the bundle moves tries again
    after its backoff, so the broker's answer is when the fault ended for that consumer.
    """

    def __init__(
        self, cluster: PulsarCluster, partitions: Sequence[str], survivor: int | None, arms: Sequence[Arm]
    ) -> None:
        self.reconnected_at: dict[str, float | None] = {arm.kind: None for arm in arms}
        self.moved_at: float | None = None
        self._cluster, self._partitions, self._survivor, self._arms = cluster, partitions, survivor, arms
        self._before = {partition: self._connected_since(partition) for partition in partitions}
        self.resubscribed_at: dict[tuple[str, str], float] = {}
        """(arm kind, partition) -> when the broker was first seen to have that consumer subscribed again."""
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-watch", daemon=True)
        self._thread.start()

    def _connected_since(self, partition: str) -> dict[str, str]:
        """Subscription (arm kind) -> its consumers' ``connectedSince``, joined; {} while no broker answers."""
        try:
            subscriptions = self._cluster.admin.topic_stats(partition).get("subscriptions", {})
        except (BrokerError, OSError, ValueError):  # the owner is away or ownership changes hands
            return {}
        return {kind: ",".join(sorted(str(c.get("connectedSince")) for c in sub.get("consumers", ())))
                for kind, sub in subscriptions.items() if sub.get("consumers")}  # fmt: skip

    def _moved(self) -> bool:
        if self._survivor is None:  # an unload in place: no owner to wait for, no lookup to make
            return True
        try:
            return all(self._cluster.owner_of(p) == self._survivor for p in self._partitions)
        except (BrokerError, OSError):  # a lookup while ownership changes hands
            return False

    def _resubscribed(self) -> bool:
        """Note the consumers the broker has subscribed again since the last poll; True when every one is."""
        kinds = list(self.reconnected_at)
        for partition in self._partitions:
            if all((kind, partition) in self.resubscribed_at for kind in kinds):
                continue
            now, since = time.monotonic(), self._connected_since(partition)
            for kind in kinds:
                fresh = since.get(kind) not in (None, self._before[partition].get(kind))
                if fresh and (kind, partition) not in self.resubscribed_at:
                    self.resubscribed_at[(kind, partition)] = now
        return len(self.resubscribed_at) == len(kinds) * len(self._partitions)

    def _run(self) -> None:
        seen_down: set[str] = set()
        while not self._stop.is_set():
            now = time.monotonic()
            for arm in self._arms:
                connected = arm.consumer.is_connected()
                if not connected:
                    seen_down.add(arm.kind)
                elif arm.kind in seen_down and self.reconnected_at[arm.kind] is None:
                    self.reconnected_at[arm.kind] = now
            if self.moved_at is None and self._moved():
                self.moved_at = time.monotonic()
            resubscribed = self._resubscribed()
            if self.moved_at is not None and resubscribed and all(v is not None for v in self.reconnected_at.values()):
                return
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def since(self, moment: float | None) -> float | None:
        return None if moment is None else moment - self.began

    def fault_end(self, kind: str, partition: str | None, default: float) -> float:
        """When the fault ended for arm *kind*'s consumer of *partition*: the broker had it subscribed
        again (*default* if that was never seen)."""
        return self.resubscribed_at.get((kind, partition or ""), default)

    def resubscribed_s(self) -> dict[str, float | None]:
        """Timings for the record: per arm, seconds from the fault to its last consumer subscribed again."""
        return {f"{kind}_resubscribed_s": self.since(max((at for (k, _), at in self.resubscribed_at.items() if k == kind),
                                                         default=None))
                for kind in self.reconnected_at}  # fmt: skip


def broker_kill(cluster: PulsarCluster, kinds: Sequence[str] = ("ours",), *, messages: int = 1_000) -> FaultRun:
    """SIGKILL of a broker while a partitioned topic has *messages* nacks pending with backoff.

    A 4-partition topic is spread over both brokers; ours nacks with
    ``MultiplierRedeliveryBackoff(2 s, 60 s, 3)`` (2 s, 6 s, 18 s by redelivery count; the
    built-in: 2 s fixed). Half the messages (*long*, ``L``) are nacked three times and
    acked on their fourth delivery; once all of them wait for their third retry (18 s),
    the other half (*short*, ``S``) is sent, nacked twice (2 s, 6 s) and acked on the
    third. As soon as every short one is nacked, the owner of partition 0 is killed with
    SIGKILL: its partitions move to the other broker once its metadata session expires,
    while the short retries fall due (during the failover) and the long ones do not (after
    it, unless the failover takes over 18 s). 200 more messages are sent after the kill.
    The killed broker is restarted at the end.

    The end of the fault, for a payload of a moved partition, is when the surviving broker had
    its arm's consumer of that partition subscribed again (when ``is_connected()`` was back to
    True, if that was never seen); for the others it never mattered.
    """
    backoff = MultiplierRedeliveryBackoff(2_000, 60_000, 3.0)
    topic = cluster.create_partitioned_topic(new_topic("kill"), 4)
    owners = cluster.spread_partitions(topic, 4)
    victim = owners[0]
    moved = {f"{topic}-partition-{p}" for p, owner in owners.items() if owner == victim}
    long = [f"L{i:04d}".encode() for i in range(messages // 2)]
    short = [f"S{i:04d}".encode() for i in range(messages - len(long))]
    after = [f"a{i:03d}".encode() for i in range(200)]

    def decide(payload: bytes, nth: int, count: int) -> int | None:
        nacks = {b"L": 3, b"S": 2}.get(payload[:1], 0)
        return backoff.next_delay_ms(count) if nth < nacks else None

    arms = open_arms(cluster.url, topic, kinds, delay_ms=backoff.next_delay_ms(0), backoff=backoff)
    client = quiet_client(cluster.url)
    watch: _Watch | None = None
    try:
        producer = open_producer(client, topic, batch_size=10)
        with pumping(arms, decide):
            send_all(producer, long)
            if not wait_until(lambda: all(len(arm.log.deliveries.get(p, ())) >= 3 for arm in arms for p in long), 90):
                raise BrokerError("the long ones did not reach their third nack")
            send_all(producer, short)
            if not wait_until(_all_delivered(arms, short), 60):
                raise BrokerError("not every short one arrived before the kill")
            pending = {arm.kind: arm.pending() for arm in arms}
            watch = _Watch(cluster, sorted(moved), 1 - victim, arms)
            cluster.kill_broker(victim)
            send_all(producer, after, wait_s=120)
            _settle(arms, long + short + after, 120)
            watch.stop()
        findings = {arm.kind: _kill_findings(arm, long + short + after, moved, watch) for arm in arms}
    finally:
        if watch is not None:
            watch.stop()
        client.close()
        for arm in arms:
            arm.close()
        restarted = time.monotonic()
        cluster.restart_broker(victim)
    timings = {"lookups_moved_s": watch.since(watch.moved_at) if watch else None,
               **{f"{kind}_reconnected_s": watch.since(at) for kind, at in (watch.reconnected_at.items() if watch else [])},
               **(watch.resubscribed_s() if watch else {}),
               "restart_s": time.monotonic() - restarted}  # fmt: skip
    settings = {"topic": topic, "partitions": 4, "owners": owners, "killed": victim, "messages": messages, "sent_after_kill": 200,
                "batch_size": 10, "backoff": "MultiplierRedeliveryBackoff(2000, 60000, 3.0); built-in 2000 fixed",
                "nacks": "long 3, short 2", "pending_at_kill": pending,
                "session_timeout_ms": cluster.session_timeout_ms}  # fmt: skip
    return FaultRun("broker killed (SIGKILL), partitioned topic", settings, timings, findings)


def _kill_findings(arm: Arm, payloads: Sequence[bytes], moved: set[str], watch: _Watch) -> Findings:
    """Findings of one arm after a kill: for the moved partitions the fault ended when the broker had
    the arm's consumer of the partition subscribed again (at its reconnect if that was never seen)."""
    reconnected = watch.reconnected_at[arm.kind] or watch.began

    def fault_end(payload: bytes) -> float:
        partition = arm.log.topics.get(payload)
        return watch.fault_end(arm.kind, partition, reconnected) if partition in moved else 0.0

    return Findings.of(arm, payloads, fault_end)


def _resubscribed_end(arm: Arm, watch: _Watch, ended: float) -> Callable[[bytes], float]:
    """*fault_end* for :meth:`Findings.of` after an unload: when the broker had the arm's consumer of the
    payload's topic subscribed again, and not before the unload ended at *ended*."""
    return lambda payload: max(ended, watch.fault_end(arm.kind, arm.log.topics.get(payload), ended))


def _timed_call(call: Callable[[], object], outcome: dict[str, Any]) -> threading.Thread:
    """Run *call* on a thread; record how long it took and what it raised, in *outcome*."""

    def run() -> None:
        began = time.monotonic()
        try:
            call()
            outcome["error"] = None
        except Exception as error:  # the outcome is the finding
            outcome["error"] = type(error).__name__
        outcome["seconds"] = round(time.monotonic() - began, 3)

    thread = threading.Thread(target=run, name="timed-call", daemon=True)
    thread.start()
    return thread


def broker_freeze(
    cluster: PulsarCluster, kinds: Sequence[str] = ("ours",), *, freeze_s: float = 4.0, operation_timeout_s: int = 2
) -> FaultRun:
    """300 batched messages nacked for 1.0-8.2 s (the built-in: 2 s) and acked on their return;
    once all are nacked, the topic's broker is frozen with SIGSTOP for *freeze_s*, longer
    than the clients' *operation_timeout_s*, then resumed with SIGCONT. During the freeze
    each arm asks for ``get_last_message_id()``, which times out. The freeze stays under
    the brokers' metadata session timeout, so the broker keeps its topics.

    About half the retries fall due during the freeze, the rest after it. The end of the fault
    is the SIGCONT.
    """
    if freeze_s * 1000 >= cluster.session_timeout_ms:
        raise ValueError(f"freeze_s must stay under the session timeout ({cluster.session_timeout_ms} ms), got {freeze_s}")
    topic = new_topic("freeze")
    payloads = [f"f{i:03d}".encode() for i in range(300)]
    producer = quiet_client(cluster.url)
    try:
        open_producer(producer, topic).close()  # the topic is loaded before the short timeouts apply
        arms = open_arms(cluster.url, topic, kinds, delay_ms=2_000, subscribe_options=one_active(),
                         client_options={"operation_timeout_seconds": operation_timeout_s})  # fmt: skip
    except BaseException:
        producer.close()
        raise
    calls: dict[str, dict[str, Any]] = {arm.kind: {} for arm in arms}
    try:
        with pumping(arms, lambda p, nth, _count: None if nth else 1_000 + int(p[1:]) % 10 * 800):
            produce(producer, topic, payloads, batch_size=10)
            if not wait_until(_all_delivered(arms, payloads), 60):
                raise BrokerError("not every message arrived before the freeze")
            owner = cluster.owner_of(topic)
            frozen = time.monotonic()
            cluster.freeze_broker(owner)
            try:
                threads = [_timed_call(arm.consumer.get_last_message_id, calls[arm.kind]) for arm in arms]
                wait_until(lambda: time.monotonic() >= frozen + freeze_s, freeze_s + 1)  # the fault's length
            finally:
                cluster.thaw_broker(owner)
            thawed = time.monotonic()
            for thread in threads:
                thread.join(30)
            _settle(arms, payloads, 60)
        findings = {arm.kind: Findings.of(arm, payloads, lambda _p: thawed) for arm in arms}
    finally:
        producer.close()
        for arm in arms:
            arm.close()
    due_during = sum(1 for arm in arms[:1] for p in payloads if frozen <= arm.log.due[p][0] <= thawed)
    settings = {"topic": topic, "messages": 300, "batch_size": 10, "nacked": "1.0-8.2 s (built-in 2 s)", "freeze_s": freeze_s,
                "operation_timeout_s": operation_timeout_s, "due_during_freeze": due_during,
                "get_last_message_id_during_freeze": calls}  # fmt: skip
    return FaultRun("broker frozen (SIGSTOP) past the operation timeout", settings, {"frozen_s": thawed - frozen}, findings)


def eight_threads(
    cluster: PulsarCluster, kinds: Sequence[str] = ("ours",), *, runs: int = 10, messages: int = 4_000, threads: int = 8
) -> FaultRun:
    """*threads* threads sharing one consumer, *messages* batched messages (batches of 10),
    every third nacked for 200 ms and acked on its return; *runs* runs, each on a fresh topic.

    Members of one entry nacked on both sides of a bucket boundary are handed to the client
    in two bursts, and the C++ client redelivers the entry once per burst (issue 23).
    No fault is injected: the cluster serves it as it is.
    """
    parts: dict[str, list[Findings]] = defaultdict(list)
    took = []
    producer = quiet_client(cluster.url)
    try:
        for run in range(runs):
            began = time.monotonic()
            topic = new_topic(f"threads{run}")
            payloads = [f"e{i:04d}".encode() for i in range(messages)]
            arms = open_arms(cluster.url, topic, kinds, delay_ms=200)
            try:
                with pumping(arms, lambda p, nth, _count: 200 if nth == 0 and int(p[1:]) % 3 == 0 else None, threads):
                    produce(producer, topic, payloads, batch_size=10)
                    _settle(arms, payloads, 120)
                for arm in arms:
                    parts[arm.kind].append(Findings.of(arm, payloads))
            finally:
                for arm in arms:
                    arm.close()
            took.append(time.monotonic() - began)
    finally:
        producer.close()
    findings = {kind: Findings.merge(found) for kind, found in parts.items()}
    settings = {"runs": runs, "messages_per_run": messages, "threads": threads, "batch_size": 10,
                "nacked": "every third, 200 ms"}  # fmt: skip
    return FaultRun(f"{threads} threads sharing a consumer, {runs} runs", settings,
                    {"run_s_max": max(took), "run_s_total": sum(took)}, findings)  # fmt: skip


DEMO_TOPIC_PREFIX = f"persistent://{NAMESPACE}/pulsar-nack-demo-"
DEMO_SUBSCRIPTION = "pulsar-nack-demo"


def _demo_topics(cluster: PulsarCluster) -> set[str]:
    return {t for t in cluster.admin.request("GET", f"persistent/{NAMESPACE}") if t.startswith(DEMO_TOPIC_PREFIX)}


def _backlog(cluster: PulsarCluster, topic: str) -> int | None:
    """The demo subscription's ``msgBacklog`` (in *entries*: batches count once), None before it exists."""
    try:
        subscription = cluster.admin.topic_stats(topic).get("subscriptions", {}).get(DEMO_SUBSCRIPTION)
    except (BrokerError, OSError):
        return None
    return None if subscription is None else int(subscription.get("msgBacklog", 0))


class _Progress:
    """How far the demo's subscription got: its backlog against the largest backlog seen."""

    def __init__(self, cluster: PulsarCluster, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        self.peak = 0
        self.backlog: int | None = None

    def done(self) -> float:
        """The share of the peak backlog acknowledged so far (0 before the subscription exists)."""
        self.backlog = _backlog(self.cluster, self.topic)
        if self.backlog is None:
            return 0.0
        self.peak = max(self.peak, self.backlog)
        return 1 - self.backlog / self.peak if self.peak else 0.0


def _new_demo_topic(cluster: PulsarCluster, before: set[str], demo: subprocess.Popen[bytes]) -> str:
    """The demo topic created since *before*; BrokerError if the demo exits or 300 s pass first."""
    deadline = time.monotonic() + 300
    while demo.poll() is None and time.monotonic() < deadline:
        created = _demo_topics(cluster) - before
        if created:
            return min(created)
        time.sleep(0.2)
    raise BrokerError(f"the demo created no topic (exit code {demo.poll()})")


def spark_demo_with_kill(
    cluster: PulsarCluster,
    master_url: str,
    *,
    tracker: str = "ours",
    messages: int = 20_000,
    tasks: int = 2,
    kill_at: float = 0.3,
    receiver_queue_size: int | None = None,
    subscription: str = "Shared",
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Run ``pulsar-nack demo --service-url <cluster> --master <master_url> --subscription <subscription> --json`` and kill the
    broker that owns its topic with SIGKILL once its subscription has acknowledged *kill_at* of
    its peak backlog; restart that broker after the demo. The demo's own summary says what was lost,
    left in the subscription and duplicated.

    Returns ``{"tracker", "summary", "killed_broker", "killed_at_done", "backlog_at_kill", "killed_after_s",
    "returncode", "log_tail"}``; *summary* is None if the demo printed none.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    before = _demo_topics(cluster)
    argv = [sys.executable, "-m", "pulsar_nack.cli", "demo", "--service-url", cluster.url, "--master", master_url,
            "--messages", str(messages), "--tasks", str(tasks), "--tracker", tracker, "--subscription", subscription,
            "--json"]  # fmt: skip
    if receiver_queue_size is not None:
        argv += ["--receiver-queue-size", str(receiver_queue_size)]
    victim: int | None = None
    done = 0.0
    at_kill: dict[str, int] = {}
    with open(os.devnull, "rb") as stdin, _scratch_file() as out, _scratch_file() as err:
        began = time.monotonic()
        demo = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=env)
        try:
            topic = _new_demo_topic(cluster, before, demo)
            progress = _Progress(cluster, topic)
            wait_until(lambda: demo.poll() is not None or progress.done() >= kill_at, 300, 0.1)
            if demo.poll() is None:
                victim = cluster.owner_of(topic)
                done = round(progress.done(), 3)
                at_kill = {"backlog_entries": progress.backlog or 0, "peak_backlog_entries": progress.peak}
                killed = time.monotonic()
                cluster.kill_broker(victim)
            demo.wait(timeout_s)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
            if victim is not None:
                cluster.restart_broker(victim)
        out.seek(0)
        err.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
        log_tail = err.read().decode(errors="replace")[-8000:]
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return {"tracker": tracker, "summary": summary, "killed_broker": victim, "killed_at_done": done, "backlog_at_kill": at_kill,
            "killed_after_s": None if victim is None else round(killed - began, 2), "returncode": demo.returncode,
            "log_tail": log_tail}  # fmt: skip


@contextlib.contextmanager
def _scratch_file() -> Iterator[Any]:
    import tempfile

    with tempfile.TemporaryFile() as handle:
        yield handle


def broker_kill_while_acking(
    cluster: PulsarCluster, kinds: Sequence[str] = ("ours",), *, messages: int = 20_000, kill_at: int = 6_000
) -> FaultRun:
    """A steady stream: *messages* batched messages, every tenth nacked for 500 ms and acked on
    its return, about 1 ms of work per message; once *kill_at* are acked, the topic's broker is
    killed with SIGKILL. The new owner redelivers every ack the dead broker had not persisted:
    the findings' *after ack* counts the copies that came back to the consumer that acked them.
    The killed broker is restarted at the end.
    """
    topic = new_topic("acking")
    payloads = [f"x{i:05d}".encode() for i in range(messages)]

    def decide(payload: bytes, nth: int, _count: int) -> int | None:
        time.sleep(0.001)  # the application's work
        return 500 if nth == 0 and int(payload[1:]) % 10 == 0 else None

    arms = open_arms(cluster.url, topic, kinds, delay_ms=500)
    producer = quiet_client(cluster.url)
    killed = time.monotonic()
    acked_before: dict[str, int] = {}
    owner: int | None = None
    try:
        produce(producer, topic, payloads, batch_size=10)
        owner = cluster.owner_of(topic)
        with pumping(arms, decide):
            if not wait_until(lambda: all(len(arm.log.acked_at) >= kill_at for arm in arms), 120):
                raise BrokerError(f"fewer than {kill_at} messages acked before the kill")
            acked_before = {arm.kind: len(arm.log.acked_at) for arm in arms}
            killed = time.monotonic()
            cluster.kill_broker(owner)
            _settle(arms, payloads, 120)
        findings = {arm.kind: Findings.of(arm, payloads, lambda _p: killed) for arm in arms}
    finally:
        producer.close()
        for arm in arms:
            arm.close()
        if owner is not None:
            cluster.restart_broker(owner)
    settings = {"topic": topic, "messages": messages, "batch_size": 10, "nacked": "every tenth, 500 ms",
                "acked_before_kill": acked_before, "killed": owner}  # fmt: skip
    return FaultRun("broker killed (SIGKILL) while acking", settings, {}, findings)
