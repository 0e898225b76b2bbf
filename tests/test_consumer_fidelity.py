"""Drop-in fidelity of ``pulsar_nack.subscribe`` against the plain ``pulsar.Consumer`` (issue 14),
and the consumer items of issue 11, on Apache Pulsar standalone.

Each test names the gap it covers. Every test here failed on the code before the fix
(commit bcf9b27); the note in the branch report says how. Waits are conditions with
deadlines; timing bounds are behaviour bounds, generous for a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import uuid
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
import pulsar_nack.asyncio
from helpers import out_of_batch_id, produce, wait_for
from pulsar_nack.testing import quiet_client

pytestmark = pytest.mark.broker

SHARED = pulsar.ConsumerType.Shared
BUCKET_MS = 256  # default precision: 8 bits
SLACK_MS = 50


@pytest.fixture
def client(apache_broker: Any) -> Any:
    c = quiet_client(apache_broker.url)
    yield c
    c.close()


def new_topic(prefix: str = "fi") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def drain(consumer: Any, want: int, timeout_s: float) -> list[Any]:
    """Receive until *want* messages arrived or *timeout_s* passed; return them (not acked)."""
    got: list[Any] = []
    end = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < end:
        try:
            got.append(consumer.receive(100))
        except pulsar.Timeout:
            continue
    return got


def assert_quiet(consumer: Any, wait_ms: int = 1_000) -> None:
    with pytest.raises(pulsar.Timeout):
        message = consumer.receive(wait_ms)
        pytest.fail(f"unexpected message {message.data()!r} count={message.redelivery_count()}")


# ---------------------------------------------------------------- gap 1: unsettled siblings


def test_gap1_nack_of_one_batch_message_brings_back_its_unsettled_siblings(client: Any, apache_broker: Any) -> None:
    """Batch of 3, all received, only the last nacked: the plain client returns all three
    (redelivery count 1). The siblings are unsettled, so they must come back too."""
    topic = new_topic()
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED, negative_ack_redelivery_delay_ms=100)
    produce(client, topic, [b"a", b"b", b"c"], batch_size=3)
    first = drain(consumer, 3, 10)
    assert sorted(m.data() for m in first) == [b"a", b"b", b"c"]
    consumer.negative_acknowledge(first[-1])
    again = drain(consumer, 3, 10)
    assert sorted(m.data() for m in again) == [b"a", b"b", b"c"], consumer.stats()
    assert all(m.redelivery_count() == 1 for m in again)
    for m in again:
        consumer.acknowledge(m)
    assert_quiet(consumer)
    assert wait_for(lambda: apache_broker.admin.backlog(topic, "s") == 0, 30)
    consumer.close()


def test_gap1_ack_timeout_brings_back_unsettled_batch_messages(client: Any) -> None:
    """No nack at all: the client's ack timeout redelivers the unacked batch after ~11 s."""
    topic = new_topic()
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED, unacked_messages_timeout_ms=10_000)
    produce(client, topic, [b"a", b"b", b"c"], batch_size=3)
    assert len(drain(consumer, 3, 10)) == 3  # the handler "crashes": nothing is settled
    again = drain(consumer, 3, 25)
    assert sorted(m.data() for m in again) == [b"a", b"b", b"c"]
    for m in again:
        consumer.acknowledge(m)
    consumer.close()


# ---------------------------------------------------------------- gap 2: ack timeout vs nack delay


def test_gap2_ack_timeout_does_not_redeliver_a_nacked_message_before_its_delay(client: Any) -> None:
    """Ack timeout 10 s, nack delay 15 s: the plain client takes the nacked message out of
    its ack-timeout tracking, so it comes back once, at about 15 s, not at 11 s."""
    topic = new_topic()
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED, unacked_messages_timeout_ms=10_000)
    produce(client, topic, [b"x"])
    message = consumer.receive(10_000)
    start = time.monotonic()
    consumer.negative_acknowledge(message, delay_ms=15_000)
    back = consumer.receive(30_000)
    waited_ms = (time.monotonic() - start) * 1000
    assert back.data() == b"x"
    assert 15_000 - BUCKET_MS - SLACK_MS <= waited_ms <= 15_000 + 3_000, f"came back after {waited_ms:.0f} ms"
    consumer.acknowledge(back)
    # The consumer keeps the ack timeout itself: the nack took the message out of it (no copy at ~10 s).
    stats = consumer.stats()
    assert stats["swallowed"] == 0 and stats["ack_timeout_in_flight"] == 0
    consumer.close()


# ---------------------------------------------------------------- gap 3: ids on multi-topic consumers


def test_gap3_bare_ids_on_a_multi_topic_consumer_are_routed_by_their_topic(client: Any) -> None:
    t1, t2 = new_topic("m1"), new_topic("m2")
    consumer = pulsar_nack.subscribe(client, [t1, t2], "s", consumer_type=SHARED)
    produce(client, t1, [b"one"])
    produce(client, t2, [b"two"])
    first = drain(consumer, 2, 10)
    for m in first:
        consumer.negative_acknowledge(m.message_id(), delay_ms=300)  # a bare id: no topic readable
    again = drain(consumer, 2, 10)
    assert sorted((m.data(), m.topic_name()) for m in again) == [(b"one", t1), (b"two", t2)]
    for m in again:
        consumer.acknowledge(m.message_id())
    assert_quiet(consumer)
    consumer.close()


def test_gap3_cumulative_ack_of_a_deserialized_id_on_a_multi_topic_consumer(client: Any) -> None:
    t1, t2 = new_topic("c1"), new_topic("c2")
    consumer = pulsar_nack.subscribe(client, [t1, t2], "s", consumer_type=pulsar.ConsumerType.Failover)
    produce(client, t1, [b"one-a", b"one-b"])
    produce(client, t2, [b"two"])
    got = drain(consumer, 3, 10)
    last_of_t1 = max((m for m in got if m.topic_name() == t1), key=lambda m: m.message_id().entry_id())
    stored = last_of_t1.message_id().serialize()
    consumer.acknowledge_cumulative(pulsar.MessageId.deserialize(stored, topic=t1))
    consumer.close()
    check = client.subscribe([t1, t2], "s", consumer_type=pulsar.ConsumerType.Failover)
    left = drain(check, 3, 3)
    assert [m.data() for m in left] == [b"two"], "the cumulative ack of t1 was not applied"
    check.close()


def test_gap3_bare_ids_on_a_partitioned_topic_come_back_on_their_partition(client: Any, apache_broker: Any) -> None:
    topic = apache_broker.create_partitioned_topic(new_topic("pt"), 3)
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
    producer = client.create_producer(
        topic, batching_enabled=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution
    )
    for i in range(6):
        producer.send(f"p{i}".encode())
    producer.close()
    got = drain(consumer, 6, 10)
    first = {m.data(): m.topic_name() for m in got}
    assert len(set(first.values())) == 3
    for m in got:  # nack by bare id: not keyed to the parent topic, not dropped at handoff
        consumer.negative_acknowledge(m.message_id(), delay_ms=300)
    again = drain(consumer, 6, 10)
    assert {m.data(): m.topic_name() for m in again} == first
    for m in again:
        consumer.acknowledge(m)
    consumer.close()


# ---------------------------------------------------------------- gap 4: dead letters of batches


def test_gap4_batch_message_is_dead_lettered_only_after_max_deliveries_to_the_application(client: Any) -> None:
    """Batch [a, b], max_redeliver_count=2. ``a`` fails fast (100 ms), ``b`` once with a
    long delay: b's copies swallowed meanwhile raise the broker's count of the entry.
    The plain client delivers each message 3 times (counts 0, 1, 2) before the DLQ."""
    topic = new_topic("dlq")
    dlq_topic = f"{topic}-s-DLQ"
    dead = client.subscribe(dlq_topic, "check", consumer_type=SHARED)
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=SHARED, negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2),
    )
    produce(client, topic, [b"a", b"b"], batch_size=2)
    seen: dict[bytes, int] = {b"a": 0, b"b": 0}
    dead_letters: list[Any] = []
    end = time.monotonic() + 60
    while len(dead_letters) < 2 and time.monotonic() < end:
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            try:
                dead_letters.append(dead.receive(10))
            except pulsar.Timeout:
                pass
            continue
        seen[message.data()] += 1
        delay = 2_000 if message.data() == b"b" and seen[b"b"] == 1 else None
        consumer.negative_acknowledge(message, delay_ms=delay)
    consumer.close()
    dead.close()
    assert sorted(m.data() for m in dead_letters) == [b"a", b"b"]
    assert seen == {b"a": 3, b"b": 3}, f"deliveries to the application before the DLQ: {seen}"
    assert all(m.properties()["REAL_TOPIC"] == topic for m in dead_letters)


# ---------------------------------------------------------------- gap 5: missing surface


def test_gap5_seek_resets_pending_batch_state_and_get_last_message_id(client: Any) -> None:
    topic = new_topic("seek")
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
    payloads = [f"s{i}".encode() for i in range(5)]
    produce(client, topic, payloads, batch_size=len(payloads))
    first = drain(consumer, 5, 10)
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (first[0].message_id().ledger_id(), first[0].message_id().entry_id())
    for m in first:
        if m.data() == b"s2":
            consumer.negative_acknowledge(m, delay_ms=3_600_000)
        else:
            consumer.acknowledge(m)
    consumer.seek(pulsar.MessageId.earliest)
    assert len(consumer.tracker) == 0
    again = drain(consumer, 5, 15)
    assert sorted(m.data() for m in again) == payloads, "a message stayed swallowed after seek"
    with pytest.raises(TypeError):
        consumer.seek("earliest")  # a ValueError too, as the plain client raises
    consumer.close()


@pytest.mark.parametrize("kind", ["plain", "blocking", "asyncio"])
def test_seek_takes_and_refuses_what_the_plain_client_does(apache_broker: Any, client: Any, kind: str) -> None:
    """``seek`` with an id, a ``_pulsar`` id or a publish time in ms (an int), on the plain
    consumer and on both of ours; ``seek(1.0)`` raises ``ValueError`` on all three (the
    plain client's ``invalid seek_arg type``; ours is a ``TypeError`` too)."""
    topic = new_topic("seek-as-plain")
    payloads = [f"k{i}".encode() for i in range(4)]
    loop = asyncio.new_event_loop()
    aclient = pulsar.asyncio.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

    def call(result: Any) -> Any:
        return loop.run_until_complete(result) if inspect.isawaitable(result) else result

    if kind == "plain":
        consumer = client.subscribe(topic, "s", consumer_type=SHARED)
    elif kind == "blocking":
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
    else:
        consumer = call(pulsar_nack.asyncio.subscribe(aclient, topic, "s", consumer_type=SHARED))

    def receive_all() -> list[Any]:
        got = [call(asyncio.wait_for(consumer.receive(), 10) if kind == "asyncio" else consumer.receive(10_000))]
        while len(got) < len(payloads) and got[-1].data() != payloads[-1]:
            got.append(call(asyncio.wait_for(consumer.receive(), 10) if kind == "asyncio" else consumer.receive(10_000)))
        return got

    try:
        produce(client, topic, payloads)
        first = receive_all()
        assert [m.data() for m in first] == payloads
        for target, start in ((pulsar.MessageId.earliest, 0), (first[2].publish_timestamp(), 2)):
            call(consumer.seek(target))
            assert [m.data() for m in receive_all()] == payloads[start:]
        if kind != "plain":  # the plain asyncio consumer refuses a _pulsar.MessageId; ours take it
            call(consumer.seek(first[1].message_id()))
            assert [m.data() for m in receive_all()][-1] == payloads[-1]
        with pytest.raises(ValueError, match="invalid seek_arg type"):
            call(consumer.seek(1.0))
    finally:
        call(consumer.close())
        call(aclient.close())
        loop.close()


def test_gap5_regex_subscription(client: Any) -> None:
    prefix = f"rx-{uuid.uuid4().hex[:8]}"
    t1, t2 = f"persistent://public/default/{prefix}-a", f"persistent://public/default/{prefix}-b"
    produce(client, t1, [b"a"])
    produce(client, t2, [b"b"])
    consumer = pulsar_nack.subscribe(
        client, re.compile(f"persistent://public/default/{prefix}-.*"), "s", consumer_type=SHARED,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    first = drain(consumer, 2, 15)
    assert sorted(m.data() for m in first) == [b"a", b"b"]
    for m in first:
        consumer.negative_acknowledge(m, delay_ms=300)
    again = drain(consumer, 2, 10)
    assert sorted((m.data(), m.topic_name()) for m in again) == [(b"a", t1), (b"b", t2)]
    for m in again:
        consumer.acknowledge(m)
    consumer.close()


# ---------------------------------------------------------------- issue 11 items


def test_subscribe_validates_everything_before_subscribing(client: Any, apache_broker: Any) -> None:
    topic = new_topic("val")
    produce(client, topic, [b"x"])
    bad_calls = [
        ({"negative_ack_precision_bit_cnt": 40}, ValueError),
        ({"negative_ack_redelivery_delay_ms": -1}, ValueError),
        ({"redelivery_backoff": "fast"}, TypeError),
        ({"never_early": 1}, TypeError),
        ({"no_such_keyword": 1}, TypeError),
        ({"message_listener": 5}, TypeError),
        ({"batch_index_ack_enabled": "yes"}, TypeError),
    ]
    for kwargs, error in bad_calls:
        with pytest.raises(error):
            pulsar_nack.subscribe(client, topic, "never", consumer_type=SHARED, **kwargs)
    assert "never" not in apache_broker.admin.topic_stats(topic)["subscriptions"]


def test_out_of_range_batch_index_changes_nothing(client: Any) -> None:
    """Issue 11 defect 2: a batch index outside its batch is refused before any change;
    afterwards the batch settles normally and nothing acked comes back."""
    topic = new_topic("range")
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
    produce(client, topic, [f"r{i}".encode() for i in range(10)], batch_size=10)
    got = drain(consumer, 10, 10)
    bad = out_of_batch_id(got[0].message_id(), 50)
    for call in (consumer.acknowledge, consumer.negative_acknowledge):
        with pytest.raises(ValueError, match="outside its batch"):
            call(bad)
    assert len(consumer.tracker) == 0 and consumer.stats()["nacked"] == 0
    for m in got[:9]:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, "s", consumer_type=SHARED)
    left = drain(again, 10, 3)
    assert [m.data() for m in left] == [got[9].data()], "acked batch messages came back"
    again.close()


def test_redeliver_unacknowledged_messages_never_returns_acked_siblings(client: Any) -> None:
    topic = new_topic("redeliver")
    consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
    payloads = [f"d{i}".encode() for i in range(5)]
    produce(client, topic, payloads, batch_size=len(payloads))
    got = drain(consumer, 5, 10)
    for m in got[:3]:
        consumer.acknowledge(m)
    consumer.negative_acknowledge(got[3], delay_ms=3_600_000)  # pending: comes back now too
    consumer.redeliver_unacknowledged_messages()
    again = drain(consumer, 2, 10)
    assert sorted(m.data() for m in again) == sorted(m.data() for m in got[3:])
    for m in again:
        consumer.acknowledge(m)
    assert_quiet(consumer)
    consumer.close()
