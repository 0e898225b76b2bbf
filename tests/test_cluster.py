"""``pulsar_nack.testing.PulsarCluster``: ZooKeeper, a bookie and two Apache Pulsar brokers.

The session's cluster (``pulsar_cluster``) is shared; a test that kills or freezes a
broker brings it back before it returns, so the next test finds both brokers serving.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import pid_gone, wait_for
from pulsar_nack.errors import BrokerError
from pulsar_nack.testing import PulsarCluster, quiet_client
from pulsar_nack.testing.cluster import (
    BOOKIE_MAIN_CLASS,
    BROKER_MAIN_CLASS,
    ZOOKEEPER_MAIN_CLASS,
    override_properties,
)

PARTITIONS = 4
FAILOVER_DEADLINE_S = 25.0


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def _receive_all(consumer: Any, expected: set[bytes], timeout_s: float, enough: int | None = None) -> set[bytes]:
    """Receive (and ack) until every payload in *expected* came (or *enough* payloads did), or the deadline passes."""
    import pulsar

    got: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while not (expected <= got or (enough is not None and len(got) >= enough)) and time.monotonic() < deadline:
        try:
            message = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        got.add(message.data())
        consumer.acknowledge(message)
    return got


# ------------------------------------------------------------------ no broker


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="brokers"):
        PulsarCluster(brokers=0)
    with pytest.raises(TypeError, match="heap"):
        PulsarCluster(heap=256)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heap"):
        PulsarCluster(heap="lots")
    with pytest.raises(TypeError, match="broker_config"):
        PulsarCluster(broker_config={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="session_timeout_ms"):
        PulsarCluster(session_timeout_ms=10)
    with pytest.raises(BrokerError, match="not started"):
        _ = PulsarCluster().url


@pytest.mark.broker  # start() looks for a JDK and the distribution before it checks the directory
def test_a_used_data_dir_is_refused_before_any_jvm_starts(tmp_path: Path) -> None:
    (tmp_path / "left-over").write_text("x")
    cluster = PulsarCluster(data_dir=tmp_path)
    with pytest.raises(BrokerError, match="data_dir must be empty"):
        cluster.start()
    assert cluster.nodes == [cluster.zookeeper, cluster.bookie] and cluster.zookeeper.pid is None


def test_override_properties_replaces_in_place_because_bookkeeper_keeps_the_first() -> None:
    text = "a=1\n#a=commented\nb = 2\nb=3\n"
    assert override_properties(text, {"b": "9", "c": "4"}) == "a=1\n#a=commented\nb=9\nc=4\n"


# ---------------------------------------------------------------- the cluster



@pytest.mark.broker
def test_every_jvm_runs_on_loopback_with_bounded_heaps(cluster: PulsarCluster) -> None:
    assert cluster.url.startswith("pulsar://127.0.0.1:") and cluster.url.count(",") == len(cluster.brokers) - 1
    assert len(cluster.brokers) == 2
    assert cluster.admin_url in {b.admin_url for b in cluster.brokers}
    assert sorted(cluster.admin.brokers(cluster.cluster_name)) == sorted(b.broker_id for b in cluster.brokers)
    assert "public/default" in cluster.admin.namespaces("public")
    main_classes = {"zookeeper": ZOOKEEPER_MAIN_CLASS, "bookie": BOOKIE_MAIN_CLASS}
    for node in cluster.nodes:
        assert node.pid is not None
        cmdline = " ".join(psutil.Process(node.pid).cmdline())
        # conftest's leftover check looks for these main classes
        assert main_classes.get(node.name, BROKER_MAIN_CLASS) in cmdline
        assert "-Xmx128m" in cmdline if node.name == "zookeeper" else "-Xmx256m" in cmdline
        listening = [c.laddr for c in psutil.Process(node.pid).net_connections("tcp") if c.status == "LISTEN"]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), (node.name, listening)


@pytest.mark.broker
def test_produce_and_consume_through_the_multi_host_url(cluster: PulsarCluster) -> None:
    topic = _topic("hello")
    client = quiet_client(cluster.url)
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        payloads = {f"m{i}".encode() for i in range(50)}
        for payload in sorted(payloads):
            producer.send(payload)
        assert _receive_all(consumer, payloads, 30.0) == payloads
    finally:
        client.close()


@pytest.mark.broker
def test_partitions_of_one_topic_are_owned_by_both_brokers(cluster: PulsarCluster) -> None:
    topic = cluster.create_partitioned_topic(_topic("spread"), PARTITIONS)
    owners = cluster.spread_partitions(topic, PARTITIONS)
    assert set(owners.values()) == {0, 1}, owners
    assert owners == {p: cluster.owner_of(f"{topic}-partition-{p}") for p in range(PARTITIONS)}


@pytest.mark.broker
def test_move_topic_and_unload_keep_the_topic_serving(cluster: PulsarCluster) -> None:
    topic = _topic("move")
    client = quiet_client(cluster.url)
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        first = cluster.owner_of(topic)
        cluster.move_topic(topic, 1 - first)
        assert cluster.owner_of(topic) == 1 - first
        cluster.unload_topic(topic)
        payloads = {f"m{i}".encode() for i in range(20)}
        for payload in sorted(payloads):
            producer.send(payload)
        assert _receive_all(consumer, payloads, 30.0) == payloads
    finally:
        client.close()


@pytest.mark.broker
def test_a_killed_broker_hands_its_partitions_to_the_survivor_and_nothing_is_lost(cluster: PulsarCluster) -> None:
    topic = cluster.create_partitioned_topic(_topic("failover"), PARTITIONS)
    owners = cluster.spread_partitions(topic, PARTITIONS)
    client = quiet_client(cluster.url)
    try:
        # A small receiver queue keeps most messages on the brokers when one dies, and the
        # second half is sent after the kill: both must come through the survivor.
        consumer = client.subscribe(topic, "s", receiver_queue_size=10)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
        before = [f"before-{i}".encode() for i in range(500)]
        after = [f"after-{i}".encode() for i in range(500)]
        for payload in before:
            producer.send_async(payload, None)
        producer.flush()
        # Any 20: across partitions the client may hand out hundreds before the first 20 sent.
        got = _receive_all(consumer, set(before), 30.0, enough=20)
        assert len(got) < len(before) // 2, "most messages must still be on the brokers"
        victim = owners[0]
        pid = cluster.brokers[victim].pid
        assert pid is not None
        killed_at = time.monotonic()
        cluster.kill_broker(victim)
        assert pid_gone(pid)
        for payload in after:
            producer.send_async(payload, None)
        survivor = 1 - victim
        # The session times out after 6 s; 25 s leaves room for a busy machine, and fails
        # with Pulsar's default 30 s session (the lookups then move after about 31 s).
        moved = wait_for(
            lambda: all(cluster.owner_of(f"{topic}-partition-{p}") == survivor for p in range(PARTITIONS)),
            timeout_s=FAILOVER_DEADLINE_S - (time.monotonic() - killed_at),
            poll_s=0.2,
        )
        assert moved, f"the killed broker's partitions did not move to the survivor within {FAILOVER_DEADLINE_S} s"
        everything = set(before + after)
        got |= _receive_all(consumer, everything - got, 120.0)
        assert everything - got == set(), f"lost {len(everything - got)} of {len(everything)} messages"
        assert cluster.brokers[survivor].is_running()
    finally:
        client.close()
    cluster.restart_broker(victim)
    assert cluster.brokers[victim].broker_id in cluster.admin.brokers(cluster.cluster_name)
    cluster.move_topic(f"{topic}-partition-0", victim)
    assert cluster.owner_of(f"{topic}-partition-0") == victim


@pytest.mark.broker
def test_a_broker_stopped_gracefully_hands_its_topics_over_at_once(cluster: PulsarCluster) -> None:
    topic = _topic("graceful")
    owner = cluster.owner_of(topic)
    pid = cluster.brokers[owner].pid
    assert pid is not None
    cluster.stop_broker(owner)
    assert pid_gone(pid) and not cluster.brokers[owner].is_running()
    # No session to wait for (6 s, then some): SIGTERM releases the bundles before the JVM exits.
    assert wait_for(lambda: cluster.owner_of(topic) == 1 - owner, timeout_s=5.0, poll_s=0.1)
    cluster.restart_broker(owner)
    assert cluster.brokers[owner].broker_id in cluster.admin.brokers(cluster.cluster_name)


@pytest.mark.broker
def test_a_frozen_broker_holds_its_topics_until_thawed(cluster: PulsarCluster) -> None:
    topic = _topic("freeze")
    target = cluster.owner_of(topic)
    client = quiet_client(cluster.url)
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        cluster.freeze_broker(target)
        pid = cluster.brokers[target].pid
        assert wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout_s=5.0)
        assert cluster.admin_url != cluster.brokers[target].admin_url  # admin calls avoid the frozen broker
        sent: list[object] = []
        producer.send_async(b"during", lambda result, _id: sent.append(result))
        assert not wait_for(lambda: sent, timeout_s=1.0), "a frozen broker acknowledged a message"
        cluster.thaw_broker(target)
        assert not cluster.brokers[target].frozen
        producer.flush()
        assert _receive_all(consumer, {b"during"}, 30.0) == {b"during"}
        assert cluster.owner_of(topic) == target
    finally:
        client.close()


@pytest.mark.broker
def test_stop_ends_every_jvm_by_pid_and_removes_its_directory() -> None:
    cluster = PulsarCluster(brokers=1)
    with cluster:
        assert cluster.url.count(",") == 0
        pids = [node.pid for node in cluster.nodes]
        data_dir = cluster.data_dir
        assert data_dir.is_dir()
        cluster.freeze_broker(0)  # stop() must resume it to stop it gracefully
    assert all(pid is not None and pid_gone(pid) for pid in pids)
    assert not data_dir.exists()
    cluster.stop()  # idempotent
    with pytest.raises(BrokerError, match="not started"):
        _ = cluster.url
