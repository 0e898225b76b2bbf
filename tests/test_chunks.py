"""Chunked messages retried (issue 33), on Apache Pulsar 4.0.8 and 3.0.7 with ``maxMessageSize=102400``.

A producer with ``chunking_enabled=True`` (batching off) sends 300 KB payloads in three
chunks, each an entry. Each scenario checks that every message comes back whole (the
same bytes), once, on time, with ours; the plain client runs the nack scenario beside
it as the control: pulsar-client 3.13.0's own tracker hands the last chunk's entry alone
to the broker, the client cannot reassemble it, and the message never comes back.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

import pulsar_nack
from helpers import read_all, wait_for
from pulsar_nack.consumer import msgid as _msgid
from pulsar_nack.testing import quiet_client
from pulsar_nack.testing.admin import PulsarAdmin

pytestmark = pytest.mark.broker

MAX_MESSAGE_SIZE = 102_400
BIG = 300_000  # three chunks
DELAY_MS = 500
EARLY_MS = 255 + 25  # 8-bit buckets may be up to 255 ms early, plus clock reads on two threads
LATE_MS = 2_000
Shared = pulsar.ConsumerType.Shared


@pytest.fixture(scope="module", params=["4.0.8", "3.0.7"], ids=lambda v: f"apache-{v}")
def chunk_broker(request: pytest.FixtureRequest, broker_pool: dict[str, Any]) -> Any:
    """Apache Pulsar standalone of that version with a 100 KB ``maxMessageSize`` (stopped with the session's brokers)."""
    from pulsar_nack.errors import BrokerError
    from pulsar_nack.testing import PulsarStandalone
    from pulsar_nack.testing.distribution import choose_release

    try:
        choose_release(version=request.param)
    except BrokerError as exc:
        pytest.skip(f"Apache Pulsar {request.param}: {exc}")
    key = f"chunks-{request.param}"
    if key not in broker_pool:
        broker_pool[key] = PulsarStandalone(version=request.param, config={"maxMessageSize": str(MAX_MESSAGE_SIZE)}).start()
    return broker_pool[key]


@pytest.fixture
def client(chunk_broker: Any) -> Iterator[Any]:
    made = quiet_client(chunk_broker.url)
    yield made
    made.close()


def new_topic() -> str:
    return f"persistent://public/default/chunks-{uuid.uuid4().hex[:10]}"


def payloads(big: int, small: int) -> dict[bytes, bytes]:
    """Name (the first 8 bytes) -> payload: *big* chunked ones (random bytes), *small* ones."""
    made = {f"big-{i:04d}".encode(): f"big-{i:04d}".encode() + os.urandom(BIG - 8) for i in range(big)}
    made.update({f"sml-{i:04d}".encode(): f"sml-{i:04d}".encode() for i in range(small)})
    return made


def produce(client: Any, topic: str, messages: dict[bytes, bytes]) -> None:
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    for payload in messages.values():
        producer.send(payload)
    producer.close()


def receive(consumer: Any, timeout_ms: int) -> Any:
    try:
        return consumer.receive(timeout_ms)
    except pulsar.Timeout:
        return None


def nack_once_then_ack(consumer: Any, messages: dict[bytes, bytes], budget_s: float = 20) -> dict[bytes, list[float]]:
    """Nack every message on its first delivery, ack it on its second; the ms after the nack of each later delivery."""
    nacked_at: dict[bytes, float] = {}
    later: dict[bytes, list[float]] = {name: [] for name in messages}
    end = time.monotonic() + budget_s
    while time.monotonic() < end and not all(later[name] for name in messages):
        message = receive(consumer, 200)
        if message is None:
            continue
        name = message.data()[:8]
        assert message.data() == messages[name], f"{name!r} came back with {len(message.data())} bytes, not whole"
        if name not in nacked_at:
            nacked_at[name] = time.monotonic()
            consumer.negative_acknowledge(message)
        else:
            later[name].append((time.monotonic() - nacked_at[name]) * 1000)
            consumer.acknowledge(message)
    extra = receive(consumer, 800)
    if extra is not None:
        later[extra.data()[:8]].append(-1.0)
    return later


def test_nacked_chunked_messages_come_back_whole_on_time_once(client, chunk_broker):
    """Four 300 KB messages and four small ones, each nacked once (500 ms), acked on return.

    Ours: all eight back, whole, once, within the bucket floor and 2 s. The plain client
    (control, ``negative_ack_redelivery_delay_ms=500``): the small ones back, the chunked
    ones never (pulsar-client 3.13.0 lacks apache/pulsar-client-cpp#604)."""
    messages = payloads(4, 4)
    admin = PulsarAdmin(chunk_broker.admin_url)
    results = {}
    for kind in ("plain", "ours"):
        topic = new_topic()
        subscribe = client.subscribe if kind == "plain" else lambda *a, **k: pulsar_nack.subscribe(client, *a, **k)
        consumer = subscribe(topic, "sub", consumer_type=Shared, negative_ack_redelivery_delay_ms=DELAY_MS)
        produce(client, topic, messages)
        results[kind] = nack_once_then_ack(consumer, messages)
        wait_for(lambda: admin.backlog(topic, "sub") == 0, 5 if kind == "ours" else 0.5, 0.2)  # noqa: B023
        results[kind + "-backlog"] = admin.backlog(topic, "sub")
        consumer.close()
    ours = results["ours"]
    for name, lateness in ours.items():
        assert len(lateness) == 1, f"{name!r}: {lateness} (ms after the nack of each later delivery)"
        assert DELAY_MS - EARLY_MS <= lateness[0] <= DELAY_MS + LATE_MS, (name, lateness)
    assert results["ours-backlog"] == 0
    plain = results["plain"]
    assert all(len(plain[name]) == 1 for name in messages if name.startswith(b"sml"))
    assert all(not plain[name] for name in messages if name.startswith(b"big")), (
        "the plain client brought a nacked chunked message back: update docs/consumer.md's chunk rows"
    )
    assert results["plain-backlog"] > 0, "the plain client's lost chunked messages stay in the subscription"


def test_reconsumed_chunked_messages_come_back_whole_once(client, chunk_broker):
    """``reconsume_later`` of 300 KB messages: the retry copy is sent in chunks (as Java's), comes back whole, once."""
    messages = payloads(3, 1)
    topic = new_topic()
    consumer = pulsar_nack.subscribe(client, topic, "sub", consumer_type=Shared, retry_enable=True)
    try:
        produce(client, topic, messages)
        reconsumed_at: dict[bytes, float] = {}
        back: dict[bytes, list[float]] = {name: [] for name in messages}
        end = time.monotonic() + 30
        while time.monotonic() < end and not all(back.values()):
            message = receive(consumer, 200)
            if message is None:
                continue
            name = message.data()[:8]
            assert message.data() == messages[name], f"{name!r} not whole"
            if name not in reconsumed_at:
                reconsumed_at[name] = time.monotonic()
                consumer.reconsume_later(message, DELAY_MS)
            else:
                back[name].append((time.monotonic() - reconsumed_at[name]) * 1000)
                consumer.acknowledge(message)
        assert receive(consumer, 1_000) is None, "a message came back twice"
    finally:
        consumer.close()
    for name, lateness in back.items():
        assert len(lateness) == 1 and DELAY_MS - 25 <= lateness[0] <= DELAY_MS + LATE_MS, (name, lateness)


@pytest.mark.parametrize("how", ["reject", "policy"])
def test_chunked_dead_letters_are_stored_whole(client, chunk_broker, how):
    """A 300 KB message rejected, or nacked past ``max_redeliver_count=1``: its dead letter is
    sent in chunks and stored whole; the original is acked."""
    messages = payloads(2, 1)
    topic = new_topic()
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1)
    consumer = pulsar_nack.subscribe(
        client, topic, "sub", consumer_type=Shared, dead_letter_policy=policy, negative_ack_redelivery_delay_ms=200
    )
    admin = PulsarAdmin(chunk_broker.admin_url)
    try:
        produce(client, topic, messages)
        deliveries: dict[bytes, int] = {}
        end = time.monotonic() + 30
        while time.monotonic() < end and admin.backlog(topic, "sub"):
            message = receive(consumer, 200)
            if message is None:
                continue
            name = message.data()[:8]
            assert message.data() == messages[name]
            deliveries[name] = deliveries.get(name, 0) + 1
            if how == "reject":
                consumer.reject(message)
            else:
                consumer.negative_acknowledge(message)
        assert admin.backlog(topic, "sub") == 0, f"originals left unacked; deliveries {deliveries}"
    finally:
        consumer.close()
    assert deliveries == dict.fromkeys(messages, 1 if how == "reject" else 2)
    dead = {m.data()[:8]: m.data() for m in read_all(client, f"{topic}-sub-DLQ", wait_ms=2_000)}
    assert dead == messages


def test_a_chunked_message_left_to_the_ack_timeout_comes_back_whole(client, chunk_broker):
    """``unacked_messages_timeout_ms`` 10 s, nothing settled: ours brings the 300 KB message back whole
    at the timeout (its handoff names every chunk); the plain client (control) brings the small one
    back and never the chunked one (its tracker redelivers the last chunk's entry alone)."""
    messages = payloads(1, 1)
    back: dict[str, dict[bytes, list[float]]] = {}
    for kind in ("plain", "ours"):
        topic = new_topic()
        options = {"consumer_type": Shared, "unacked_messages_timeout_ms": 10_000}
        consumer = (client.subscribe(topic, "sub", **options) if kind == "plain"
                    else pulsar_nack.subscribe(client, topic, "sub", **options))
        produce(client, topic, messages)
        first: dict[bytes, float] = {}
        back[kind] = {name: [] for name in messages}
        end = time.monotonic() + 25
        while time.monotonic() < end and not all(back[kind].values()):
            message = receive(consumer, 200)
            if message is None:
                continue
            name = message.data()[:8]
            assert message.data() == messages[name], f"{name!r} not whole"
            if name not in first:
                first[name] = time.monotonic()  # left unsettled
            else:
                back[kind][name].append((time.monotonic() - first[name]) * 1000)
                consumer.acknowledge(message)
        consumer.close()
    assert all(len(v) == 1 and 10_000 <= v[0] <= 11_500 for v in back["ours"].values()), back
    assert len(back["plain"][b"sml-0000"]) == 1 and not back["plain"][b"big-0000"], (
        "the plain client's ack timeout brought a chunked message back: update docs/consumer.md"
    )


@pytest.mark.skipif(not _msgid.NATIVE_IDS, reason="native id reads are off (tests/test_msgid.py says why)")
def test_a_chunked_message_is_read_through_serialize(client):
    """Its first chunk is in the serialized id only: the native id reader declines it
    (``pulsar_nack.consumer.native_ids``), and ``received_key`` still finds the first chunk's entry."""
    topic = new_topic()
    consumer = client.subscribe(topic, "ids")
    messages = payloads(1, 1)
    produce(client, topic, messages)
    big, small = (consumer.receive(10_000)._message for _ in messages)

    class Wrapper:
        """A ``pulsar.Message`` stand-in that keeps attributes (none kept here)."""

    assert _msgid._c.native_fields(big) is None
    key = _msgid.received_key(big, Wrapper())
    assert key[5] is not None and key[5] < key[1:3], key  # the first chunk's (ledger, entry): an earlier entry
    assert key == _msgid.py_received_key(big, Wrapper())
    assert _msgid._c.native_fields(small) == _msgid.py_parse_id(small.message_id().serialize())
    consumer.close()
