"""What pulsar-nack promises, verified on Apache Pulsar standalone: partitioned topics,
Key_Shared, redelivery on Failover and Exclusive, batch-index acknowledgement, two
processes on one subscription.

Timing bounds are behaviour bounds, generous for a loaded 2-core machine:

- *never early*: a nacked message comes back no earlier than its requested time minus
  ``2**bits - 1`` ms (the bucket floor), minus a few ms of clock-read skew;
- *on time*: and no later than ``LATE_MS`` after it (the handoff needs about 100-133 ms;
  the benchmarks measure the real figure).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pulsar
import pytest

import pulsar_nack
from helpers import produce, wait_for
from pulsar_nack.testing import quiet_client

pytestmark = pytest.mark.broker

BITS = 6
EARLY_MS = (1 << BITS) - 1 + 5  # bucket floor + clock-read skew
LATE_MS = 2_000  # generous: scheduling on a loaded machine; the benchmarks measure it
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def client(apache_broker: Any) -> Any:
    c = quiet_client(apache_broker.url)
    yield c
    c.close()


def new_topic(prefix: str = "ap") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


class Recorder:
    """Drives a consumer: the first delivery of a payload is acked or nacked by its name,
    later deliveries are acked. Records every delivery with its time."""

    def __init__(self, consumer: Any, delays: dict[bytes, int]) -> None:
        self.consumer = consumer
        self.delays = delays  # payload -> nack delay (ms); payloads not in it are acked
        self.deliveries: dict[bytes, list[float]] = defaultdict(list)
        self.requested: dict[bytes, float] = {}
        self.topics: dict[bytes, set[str]] = defaultdict(set)

    def pump(self, until: Any, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while not until() and time.monotonic() < end:
            try:
                message = self.consumer.receive(100)
            except pulsar.Timeout:
                continue
            self.handle(message)
        return bool(until())

    def handle(self, message: Any) -> None:
        now = time.monotonic()
        payload = message.data()
        self.deliveries[payload].append(now)
        self.topics[payload].add(message.topic_name())
        if payload in self.delays and payload not in self.requested:
            self.requested[payload] = now + self.delays[payload] / 1000
            self.consumer.negative_acknowledge(message, delay_ms=self.delays[payload])
        else:
            self.consumer.acknowledge(message)

    def all_back(self) -> bool:
        return all(len(self.deliveries[p]) >= 2 for p in self.delays)

    def lateness_ms(self) -> dict[bytes, float]:
        """Second arrival minus the requested time, per nacked payload."""
        return {p: (self.deliveries[p][1] - self.requested[p]) * 1000 for p in self.delays}


def assert_on_time(recorder: Recorder) -> None:
    for payload, late in recorder.lateness_ms().items():
        assert -EARLY_MS <= late <= LATE_MS, f"{payload!r} came back {late:.0f} ms after its requested time"


# ---------------------------------------------------------------- subscription types


@pytest.mark.parametrize("consumer_type", ["Shared", "KeyShared"])
def test_shared_and_key_shared_each_nack_returns_once_on_time(client: Any, consumer_type: str) -> None:
    topic = new_topic()
    payloads = [f"m{i}".encode() for i in range(30)]
    delays = {p: 400 + 150 * (i % 6) for i, p in enumerate(payloads) if i % 3 == 0}
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=getattr(pulsar.ConsumerType, consumer_type),
        negative_ack_precision_bit_cnt=BITS,
    )
    produce(client, topic, payloads)
    recorder = Recorder(consumer, delays)
    assert recorder.pump(recorder.all_back, 60), "not every nacked message came back"
    # Quiet period: nothing more may arrive (no duplicates, no acked message back).
    recorder.pump(lambda: False, 1.5)
    consumer.close()
    assert_on_time(recorder)
    counts = Counter({p: len(t) for p, t in recorder.deliveries.items()})
    assert all(counts[p] == 2 for p in delays), counts
    assert all(counts[p] == 1 for p in payloads if p not in delays), "an acked message came back"


@pytest.mark.parametrize("consumer_type", ["Failover", "Exclusive"])
def test_failover_and_exclusive_lose_nothing_and_return_acked_never(client: Any, consumer_type: str) -> None:
    """On Failover and Exclusive the C++ client answers a handoff by redelivering *every*
    unacked message of the consumer. Nothing may be lost and nothing acked may come back;
    nacked messages may come back early as a side effect (counted, documented)."""
    topic = new_topic()
    payloads = [f"m{i}".encode() for i in range(20)]
    delays = {p: 500 + 300 * (i % 4) for i, p in enumerate(payloads) if i % 2 == 0}
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=getattr(pulsar.ConsumerType, consumer_type),
        negative_ack_precision_bit_cnt=BITS,
    )
    produce(client, topic, payloads)
    recorder = Recorder(consumer, delays)
    assert recorder.pump(recorder.all_back, 60), "a nacked message never came back"
    recorder.pump(lambda: False, 1.5)
    consumer.close()
    acked = [p for p in payloads if p not in delays]
    assert all(len(recorder.deliveries[p]) == 1 for p in acked), "an acked message came back"
    for payload, late in recorder.lateness_ms().items():
        assert late <= LATE_MS, f"{payload!r} came back {late:.0f} ms late"


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("consumer_type", ["Failover", "Exclusive"])
def test_failover_and_exclusive_per_call_delays_hold(client: Any, consumer_type: str, batched: bool) -> None:
    """a nacked for 3,000 ms, then b for 500 ms (issue 22 saw b back after about 2,800 ms).

    b comes back at its time: no earlier than its bucket floor allows (``BITS`` precision
    bits, where handoffs are never early), no later than ``LATE_MS`` after it. b's
    handoff makes the client ask for every unacked message, so a copy of a comes back
    then too: it is swallowed until a's own time, batched or not (a message of its own
    used to come back early with b). Three rounds, each on a topic of its own."""
    for round_ in range(3):
        topic = new_topic()
        consumer = pulsar_nack.subscribe(
            client, topic, "s", consumer_type=getattr(pulsar.ConsumerType, consumer_type), negative_ack_precision_bit_cnt=BITS
        )
        try:
            produce(client, topic, [b"a", b"b"], batch_size=2 if batched else 0)
            recorder = Recorder(consumer, {b"a": 3_000, b"b": 500})
            assert recorder.pump(recorder.all_back, 15), f"round {round_}: a or b never came back"
        finally:
            consumer.close(redeliver_pending=False)
        late = recorder.lateness_ms()
        assert -EARLY_MS <= late[b"b"] <= LATE_MS, f"round {round_}: b came back {late[b'b']:.0f} ms after its time"
        assert -EARLY_MS <= late[b"a"] <= LATE_MS, f"round {round_}: a came back {late[b'a']:.0f} ms after its time"


# ---------------------------------------------------------------- partitioned topics


def test_partitioned_topic_each_nack_returns_on_its_partition_at_its_time(client: Any, apache_broker: Any) -> None:
    topic = apache_broker.create_partitioned_topic(new_topic("pt"), 4)
    payloads = [f"p{i}".encode() for i in range(40)]
    delays = {p: 400 + 200 * (i % 5) for i, p in enumerate(payloads) if i % 2 == 1}
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_precision_bit_cnt=BITS
    )
    producer = client.create_producer(
        topic, batching_enabled=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution
    )
    for payload in payloads:
        producer.send(payload)
    producer.close()
    recorder = Recorder(consumer, delays)
    assert recorder.pump(recorder.all_back, 60)
    recorder.pump(lambda: False, 1.0)
    consumer.close()
    partitions = {next(iter(recorder.topics[p])) for p in payloads}
    assert len(partitions) == 4 and all(t.startswith(f"{topic}-partition-") for t in partitions)
    assert all(len(recorder.topics[p]) == 1 for p in delays), "a message came back on another partition"
    assert all(len(recorder.deliveries[p]) == 2 for p in delays)
    assert_on_time(recorder)


def test_list_of_a_partitioned_and_a_plain_topic(client: Any, apache_broker: Any) -> None:
    partitioned = apache_broker.create_partitioned_topic(new_topic("pt"), 4)
    plain = new_topic("plain")
    payloads = {partitioned: [f"a{i}".encode() for i in range(16)], plain: [f"b{i}".encode() for i in range(8)]}
    everything = [p for ps in payloads.values() for p in ps]
    delays = {p: 400 + 250 * (i % 4) for i, p in enumerate(everything)}
    consumer = pulsar_nack.subscribe(
        client, [partitioned, plain], "s", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_precision_bit_cnt=BITS,
    )
    for topic, ps in payloads.items():
        producer = client.create_producer(
            topic, batching_enabled=False,
            message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        )
        for payload in ps:
            producer.send(payload)
        producer.close()
    recorder = Recorder(consumer, delays)
    assert recorder.pump(recorder.all_back, 60)
    recorder.pump(lambda: False, 1.0)
    consumer.close()
    assert all(len(recorder.deliveries[p]) == 2 for p in everything)
    assert all(len(recorder.topics[p]) == 1 for p in everything)
    assert all(next(iter(recorder.topics[p])) == plain for p in payloads[plain])
    assert all(next(iter(recorder.topics[p])).startswith(partitioned + "-partition-") for p in payloads[partitioned])
    assert_on_time(recorder)


# ---------------------------------------------------------------- batch-index acknowledgement


@pytest.mark.parametrize("consumer_type", ["Exclusive", "Shared"])
def test_batch_index_acks_each_member_returns_at_its_own_time(client: Any, consumer_type: str) -> None:
    """Members 7, 8 and 9 of one entry nacked for 400 ms, 1 s and 1.8 s, the rest acked: acked siblings never
    return; each nacked member returns once, at its own time on Exclusive, and when the last of them is due on
    Shared (where another consumer may get the entry: docs/consumer.md, "Batches")."""
    topic = new_topic("batch")
    payloads = [f"b{i}".encode() for i in range(10)]
    delays = {payloads[7]: 400, payloads[8]: 1_000, payloads[9]: 1_800}
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=getattr(pulsar.ConsumerType, consumer_type),
        batch_index_ack_enabled=True, negative_ack_precision_bit_cnt=BITS,
    )
    produce(client, topic, payloads, batch_size=10)
    recorder = Recorder(consumer, delays)
    assert recorder.pump(recorder.all_back, 60)
    recorder.pump(lambda: False, 1.5)
    consumer.close()
    assert all(len(recorder.deliveries[p]) == 1 for p in payloads[:7]), "an acked sibling came back"
    assert all(len(recorder.deliveries[p]) == 2 for p in delays)
    if consumer_type == "Shared":  # the entry waits for its last nacked member
        recorder.requested = dict.fromkeys(recorder.requested, max(recorder.requested.values()))
    assert_on_time(recorder)


_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import pulsar, pulsar_nack
    from pulsar_nack.testing import quiet_client

    url, topic, out, stop = sys.argv[1:5]
    client = quiet_client(url)
    consumer = pulsar_nack.subscribe(client, topic, "two-procs", consumer_type=pulsar.ConsumerType.Shared,
                                      batch_index_ack_enabled=True, negative_ack_precision_bit_cnt=6,
                                      receiver_queue_size=5)
    with open(out, "a", buffering=1) as log:
        log.write(json.dumps({"ready": True}) + "\\n")
        import os
        while not os.path.exists(stop):
            try:
                m = consumer.receive(100)
            except pulsar.Timeout:
                continue
            name = m.data().decode()
            now = time.monotonic()
            log.write(json.dumps({"name": name, "t": now, "count": m.redelivery_count()}) + "\\n")
            if name.startswith("nack") and m.redelivery_count() == 0:
                consumer.negative_acknowledge(m, delay_ms=int(name.split("-")[1]))
            else:
                consumer.acknowledge(m)
    consumer.close()
    client.close()
    """
)


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_batch_index_acks_hold_across_two_processes_on_one_subscription(
    client: Any, apache_broker: Any, tmp_path: Path
) -> None:
    """Two consumer processes share a Shared subscription; a batch entry redelivered to the
    process that did not see it first still skips its acked siblings (the broker's ack set).
    One nacked member per batch: each returns once, at its own time, to either process."""
    topic = new_topic("two")
    env = dict(os.environ, PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    stop = tmp_path / "stop"
    logs = [tmp_path / f"w{i}.jsonl" for i in range(2)]
    # Subscribe first, so that the subscription exists before anything is produced.
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, apache_broker.url, topic, str(log), str(stop)], env=env)
        for log in logs
    ]
    try:
        assert wait_for(lambda: all(_read_log(p) for p in logs), 60), "workers did not start"
        names = []
        for batch in range(12):
            members = [f"ack{batch}.{i}" for i in range(9)]
            members.insert(batch % 10, f"nack-{300 + 150 * (batch % 6)}-{batch}")
            names.extend(members)
        produce(client, topic, [n.encode() for n in names], batch_size=10)
        nacked = [n for n in names if n.startswith("nack")]

        def records() -> list[dict[str, Any]]:
            return [r for p in logs for r in _read_log(p) if "name" in r]

        def all_back() -> bool:
            seen = Counter(r["name"] for r in records())
            return all(seen[n] >= 2 for n in nacked)

        assert wait_for(all_back, 90), "a nacked batch member never came back"
        time.sleep(0)  # no extra wait: a quiet period follows through the backlog check below
        assert wait_for(lambda: apache_broker.admin.backlog(topic, "two-procs") == 0, 30)
    finally:
        stop.touch()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    per_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records():
        per_name[record["name"]].append(record)
    assert all(len(per_name[n]) == 1 for n in names if n.startswith("ack")), "an acked sibling came back"
    for name in nacked:
        first, second = sorted(per_name[name], key=lambda r: r["t"])[:2]
        late_ms = (second["t"] - first["t"]) * 1000 - int(name.split("-")[1])
        assert -EARLY_MS - 5 <= late_ms <= LATE_MS, f"{name} came back {late_ms:.0f} ms off its delay"
        assert len(per_name[name]) == 2, f"{name} delivered {len(per_name[name])} times"
    pids = {p.name for p in logs if any("name" in r for r in _read_log(p))}
    assert len(pids) == 2, "both processes should have received messages"


# ---------------------------------------------------------------- failures


def test_broker_restart_with_pending_nacks_loses_nothing(client: Any, apache_broker: Any) -> None:
    topic = new_topic("restart")
    payloads = [f"r{i}".encode() for i in range(20)]
    delays = dict.fromkeys(payloads, 3_000)
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    produce(client, topic, payloads)
    recorder = Recorder(consumer, delays)
    assert recorder.pump(lambda: len(recorder.requested) == len(payloads), 30)
    apache_broker.restart()
    assert recorder.pump(recorder.all_back, 90), "a pending nack was lost across the restart"
    consumer.close()
    assert wait_for(lambda: apache_broker.admin.backlog(topic, "s") == 0, 30)


def test_dead_letter_policy_after_n_redeliveries(client: Any) -> None:
    topic = new_topic("dlq")
    dlq = f"{topic}-s-DLQ"
    dead = client.subscribe(dlq, "check", consumer_type=pulsar.ConsumerType.Shared)
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=200,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq),
    )
    produce(client, topic, [b"poison", b"fine"])
    counts: list[int] = []
    end = time.monotonic() + 30
    dead_letters: list[bytes] = []
    while time.monotonic() < end and not dead_letters:
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            try:
                dead_letters.append(dead.receive(50).data())
            except pulsar.Timeout:
                pass
            continue
        if message.data() == b"poison":
            counts.append(message.redelivery_count())
            consumer.negative_acknowledge(message)
        else:
            consumer.acknowledge(message)
    consumer.close()
    dead.close()
    assert dead_letters == [b"poison"], "the poison message never reached the dead-letter topic"
    assert counts == [0, 1, 2], f"the application saw redelivery counts {counts}"
    assert consumer.stats()["nacked"] == 3
