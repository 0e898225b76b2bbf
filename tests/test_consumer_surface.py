"""Every public call of NackingConsumer that had no broker test, on Apache Pulsar standalone.

``acknowledge_cumulative``, ``batch_receive``, ``unsubscribe``, ``pause_message_listener``
and ``resume_message_listener``, plus issue 11's defect 1 through the consumer: a nack
with a huge delay is refused and later nacks still come back.

Every test runs on the session's Apache Pulsar standalone. Waits are
conditions with deadlines; the one wait that must time out (nothing reaches a paused
listener) says so.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

import pulsar_nack
from helpers import produce, wait_for
from pulsar_nack import ConsumerClosedError, NackingConsumer
from pulsar_nack.testing import quiet_client

pytestmark = pytest.mark.broker

SHARED = pulsar.ConsumerType.Shared
EXCLUSIVE = pulsar.ConsumerType.Exclusive
HUGE = 2**1100


@pytest.fixture
def client(apache_broker: Any) -> Iterator[Any]:
    c = quiet_client(apache_broker.url)
    yield c
    c.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/surface-{uuid.uuid4().hex[:10]}"


def receive_all(consumer: NackingConsumer, n: int, timeout_s: float = 30) -> list[Any]:
    """Receive *n* messages (raises pulsar.Timeout past *timeout_s*)."""
    end = time.monotonic() + timeout_s
    got: list[Any] = []
    while len(got) < n:
        got.append(consumer.receive(max(int((end - time.monotonic()) * 1000), 1)))
    return got


def nothing_more(consumer: NackingConsumer, within_ms: int = 1_500) -> bool:
    """True if no message arrives within *within_ms* (a wait that must time out)."""
    try:
        consumer.receive(within_ms)
    except pulsar.Timeout:
        return True
    return False


def test_acknowledge_cumulative_settles_everything_up_to_the_message(client, topic, apache_broker):
    """Cumulative acks need an Exclusive (or Failover) subscription: this one is Exclusive."""
    consumer = pulsar_nack.subscribe(client, topic, "cumulative", consumer_type=EXCLUSIVE)
    try:
        produce(client, topic, [b"%d" % i for i in range(10)], batch_size=5)
        messages = receive_all(consumer, 10)
        consumer.acknowledge_cumulative(messages[-1])
        assert wait_for(lambda: apache_broker.admin.backlog(topic, "cumulative") == 0, 30)
    finally:
        consumer.close()
    again = pulsar_nack.subscribe(client, topic, "cumulative", consumer_type=EXCLUSIVE)
    try:
        assert nothing_more(again)  # all ten stayed acknowledged
        with pytest.raises(TypeError):
            again.acknowledge_cumulative("not a message")
    finally:
        again.close()
    with pytest.raises(ConsumerClosedError):
        again.acknowledge_cumulative(messages[-1])


def test_batch_receive_admits_messages_and_never_returns_acked_siblings(client, topic):
    """A batch of 4: three acked, one nacked; the redelivered entry yields only the nacked one."""
    policy = pulsar.ConsumerBatchReceivePolicy(4, -1, 200)
    consumer = pulsar_nack.subscribe(client, topic, "batch-receive", consumer_type=SHARED, batch_receive_policy=policy)
    try:
        produce(client, topic, [b"a", b"b", b"c", b"d"], batch_size=4)
        first: list[Any] = []
        assert wait_for(lambda: first.extend(consumer.batch_receive()) or len(first) >= 4, 30)
        assert sorted(m.data() for m in first) == [b"a", b"b", b"c", b"d"]
        for message in first:
            if message.data() == b"c":
                consumer.negative_acknowledge(message, delay_ms=0)
            else:
                consumer.acknowledge(message)
        again: list[Any] = []
        assert wait_for(lambda: again.extend(consumer.batch_receive()) or again, 30)
        assert [m.data() for m in again] == [b"c"]
        assert again[0].redelivery_count() >= 1
        consumer.acknowledge(again[0])
        # a, b and d are not in the copy: the broker's ack set (batch-index acks) leaves them out
        assert nothing_more(consumer)
    finally:
        consumer.close()
    with pytest.raises(ConsumerClosedError):
        consumer.batch_receive()


def test_unsubscribe_removes_the_subscription_and_closes(client, topic, apache_broker):
    consumer = pulsar_nack.subscribe(client, topic, "leaving", consumer_type=SHARED)
    produce(client, topic, [b"x", b"y"])
    x, _ = receive_all(consumer, 2)
    consumer.negative_acknowledge(x, delay_ms=3_600_000)
    assert len(consumer.tracker) == 1
    assert "leaving" in apache_broker.admin.topic_stats(topic)["subscriptions"]
    consumer.unsubscribe()
    assert consumer.closed and consumer.tracker.closed and len(consumer.tracker) == 0
    assert "leaving" not in apache_broker.admin.topic_stats(topic)["subscriptions"]
    with pytest.raises(ConsumerClosedError):
        consumer.unsubscribe()
    with pytest.raises(ConsumerClosedError):
        consumer.receive(10)
    consumer.close()  # idempotent after unsubscribe


def test_pause_and_resume_message_listener(client, topic):
    seen: list[bytes] = []
    lock = threading.Lock()

    def listener(consumer: NackingConsumer, message: Any) -> None:
        with lock:
            seen.append(message.data())
        consumer.acknowledge(message)

    consumer = pulsar_nack.subscribe(client, topic, "listening", consumer_type=SHARED, message_listener=listener)
    try:
        produce(client, topic, [b"1"])
        assert wait_for(lambda: seen == [b"1"], 30)
        consumer.pause_message_listener()
        produce(client, topic, [b"2", b"3"])
        # A wait that must time out: a paused listener gets nothing.
        assert not wait_for(lambda: len(seen) > 1, 1.5)
        consumer.resume_message_listener()
        assert wait_for(lambda: sorted(seen) == [b"1", b"2", b"3"], 30)
    finally:
        consumer.close()
    for call in (consumer.pause_message_listener, consumer.resume_message_listener):
        with pytest.raises(ConsumerClosedError):
            call()


@pytest.mark.parametrize("batch_size", [0, 2], ids=["plain", "batched"])
def test_huge_nack_delay_is_refused_and_later_nacks_come_back(client, topic, batch_size):
    """Issue 11, defect 1: ``negative_acknowledge(msg, delay_ms=2**1100)`` was accepted and
    killed the tracker's timer thread, so later nacks were never handed off."""
    consumer = pulsar_nack.subscribe(client, topic, "huge", consumer_type=SHARED)
    try:
        produce(client, topic, [b"p", b"q"], batch_size=batch_size)
        p, q = sorted(receive_all(consumer, 2), key=lambda m: m.data())
        with pytest.raises(ValueError, match="delay_ms"):
            consumer.negative_acknowledge(p, delay_ms=HUGE)
        with pytest.raises(ValueError, match="delay_ms"):
            consumer.negative_acknowledge(p, delay_ms=pulsar_nack.MAX_DELAY_MS + 1)
        assert len(consumer.tracker) == 0 and consumer.stats()["nacked"] == 0  # nothing changed
        consumer.acknowledge(p)  # still in flight: the refused nack left no state behind
        consumer.negative_acknowledge(q, delay_ms=50)
        back = consumer.receive(30_000)
        assert back.data() == b"q" and back.redelivery_count() >= 1
        consumer.acknowledge(back)
        assert nothing_more(consumer)
    finally:
        consumer.close()
