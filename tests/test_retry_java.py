"""Retry letter topics shared with the Java client: our Python consumer and a Java consumer on one subscription.

The Java side (``tests/java/RetryPeer.java``) is compiled here, with the JDK the broker
runs on, against the Apache Pulsar distribution's own client jars (its ``lib/``): the
Java client 4.0.8 with ``enableRetry(true)``. Nothing is downloaded for it. The broker
is the session's stock standalone (1 s delayed-delivery tick, not strict).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

import pulsar_nack
from pulsar_nack.consumer.retry import (
    DELAY_TIME,
    ORIGIN_MESSAGE_ID,
    REAL_SUBSCRIPTION,
    REAL_TOPIC,
    RECONSUMETIMES,
    RetryMessage,
    due_time_ms,
    java_message_id,
)
from pulsar_nack.testing.distribution import ensure_distribution

pytestmark = pytest.mark.broker

SOURCE = Path(__file__).parent / "java" / "RetryPeer.java"
SHARED = pulsar.ConsumerType.Shared
EARLIEST = pulsar.InitialPosition.Earliest


class JavaPeer:
    """Runs ``RetryPeer`` (see its header) and returns the messages it printed."""

    def __init__(self, java_home: Path, classpath: str, url: str) -> None:
        self.java, self.classpath, self.url = java_home / "bin" / "java", classpath, url

    def run(self, topic: str, count: int, action: str, delay_ms: int = 0, max_redeliver: int = 0) -> list[dict[str, Any]]:
        argv = [str(self.java), "-Xmx128m", "-cp", self.classpath, "RetryPeer", self.url, topic, "sub",
                str(max_redeliver), str(count), action, str(delay_ms)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        lines = [json.loads(line[2:]) for line in done.stdout.splitlines() if line.startswith("@@")]
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        messages = [line for line in lines if "data" in line]
        assert len(messages) == count, lines
        return messages


@pytest.fixture(scope="module")
def java_peer(session_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> JavaPeer:
    java_home = Path(session_broker.java_home)
    javac = java_home / "bin" / "javac"
    if not javac.exists():
        javac = Path(shutil.which("javac") or "javac")
    lib = ensure_distribution(session_broker.release) / "lib"
    out = tmp_path_factory.mktemp("java")
    classpath = f"{lib}/*"
    subprocess.run([str(javac), "-d", str(out), "-cp", classpath, str(SOURCE)], check=True, timeout=300)
    return JavaPeer(java_home, f"{classpath}:{out}", session_broker.url)


def python_consumer(client: Any, topic: str, **kwargs: Any) -> pulsar_nack.NackingConsumer:
    return pulsar_nack.subscribe(
        client, topic, "sub", consumer_type=SHARED, initial_position=EARLIEST, retry_enable=True, **kwargs
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_java_reconsumes_and_python_receives_it_on_time(pulsar_client, topic, java_peer):
    pulsar_client.create_producer(topic).send(b"from java", partition_key="k", properties={"app": "1"})
    (original,) = java_peer.run(topic, 1, "reconsume", delay_ms=4_000)  # Java closes; the retry stays
    consumer = python_consumer(pulsar_client, topic)
    copy = consumer.receive(30_000)
    arrived = now_ms()
    assert isinstance(copy, RetryMessage) and copy.topic_name() == topic
    assert copy.retry_topic_name() == f"{topic}-sub-RETRY"  # the name the Java client chose
    props = copy.properties()
    assert props[RECONSUMETIMES] == "1" and props[DELAY_TIME] == "4000" and props["app"] == "1"
    assert props[ORIGIN_MESSAGE_ID] == original["message_id"] and props[REAL_TOPIC] == topic
    assert copy.partition_key() == "k"
    assert arrived >= due_time_ms(copy), "handed over before due"
    consumer.acknowledge(copy)
    consumer.close()


def test_python_reconsumes_and_java_receives_the_same_copy_java_would_send(pulsar_client, topic, java_peer):
    pulsar_client.create_producer(topic).send(b"from python", partition_key="k2", event_timestamp=777)
    consumer = python_consumer(pulsar_client, topic)
    message = consumer.receive(15_000)
    origin = java_message_id(message.message_id())
    consumer.reconsume_later(message, 1_500, {"why": "timeout"})
    consumer.close()
    (copy,) = java_peer.run(topic, 1, "ack")
    assert copy["topic"] == f"{topic}-sub-RETRY" and copy["data"] == "from python"
    assert copy["key"] == "k2" and copy["event_time"] == 777
    assert copy["properties"] == {
        "why": "timeout",
        REAL_TOPIC: topic,
        REAL_SUBSCRIPTION: "sub",
        ORIGIN_MESSAGE_ID: origin,
        "ORIGIN_MESSAGE_IDY_TIME": origin,
        RECONSUMETIMES: "1",
        DELAY_TIME: "1500",
    }
    assert copy["received"] >= copy["publish_time"] + 1_500 - 1_000  # the broker's own tick: Java holds nothing


def test_python_dead_letters_after_java_reconsumed_once(pulsar_client, topic, java_peer):
    """Java's first copy comes to Python: the next reconsume (the second) is a retry, the third a dead letter."""
    pulsar_client.create_producer(topic).send(b"poison")
    (first,) = java_peer.run(topic, 1, "reconsume", delay_ms=0, max_redeliver=2)
    policy = pulsar.ConsumerDeadLetterPolicy(2, None, "dlq-reader")
    consumer = python_consumer(pulsar_client, topic, dead_letter_policy=policy)
    copy = consumer.receive(15_000)
    assert copy.properties()[RECONSUMETIMES] == "1"  # Java's reconsume
    consumer.reconsume_later(copy, 0)  # the second: max 2 allows it
    assert consumer.stats()["retry_dead_lettered"] == 0, "the second reconsume went to the DLQ"
    copy = consumer.receive(15_000)
    assert copy.properties()[RECONSUMETIMES] == "2"
    consumer.reconsume_later(copy, 0)  # the third: past max 2, to the DLQ
    assert consumer.stats()["retry_dead_lettered"] == 1
    consumer.close()
    dlq = pulsar_client.subscribe(f"{topic}-sub-DLQ", "dlq-reader")
    letter = dlq.receive(15_000)
    assert letter.data() == b"poison" and letter.properties()[RECONSUMETIMES] == "3"
    assert letter.properties()[ORIGIN_MESSAGE_ID] == first["message_id"]
    dlq.acknowledge(letter)
    dlq.close()


def test_java_dead_letters_after_python_reconsumed_twice(pulsar_client, topic, java_peer):
    pulsar_client.create_producer(topic).send(b"poison too")
    consumer = python_consumer(pulsar_client, topic, dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    message = consumer.receive(15_000)
    origin = java_message_id(message.message_id())
    for _ in range(2):
        consumer.reconsume_later(message, 0)
        message = consumer.receive(15_000)
    assert message.properties()[RECONSUMETIMES] == "2"
    consumer.close(redeliver_pending=False)  # the second copy stays unacked, for Java
    (copy,) = java_peer.run(topic, 1, "reconsume", delay_ms=0, max_redeliver=2)  # Java's DLQ: past max 2
    assert copy["properties"][RECONSUMETIMES] == "2"
    dlq = pulsar_client.subscribe(f"{topic}-sub-DLQ", "dlq-reader")  # Java's initialSubscriptionName
    letter = dlq.receive(15_000)
    assert letter.data() == b"poison too" and letter.properties()[RECONSUMETIMES] == "3"
    assert letter.properties()[ORIGIN_MESSAGE_ID] == origin
    dlq.acknowledge(letter)
    dlq.close()

