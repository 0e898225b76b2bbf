"""The consumer's own ack timeout (:mod:`pulsar_nack.consumer.ack_timeout`): the logs and their conversion.

Unit tests with stand-in messages (``read_key`` is injected and counts the id reads): which
messages get a deadline, and that a message settled within a tick has its id never read, are
decided off the broker and at a moment no broker test can pin down. The consumers' paths on
Apache Pulsar (blocking, asyncio, listener) are at the end of this file; the plain client's
control for the timeout itself is in ``tests/test_in_progress.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
import pulsar_nack.asyncio
from pulsar_nack.consumer import msgid
from pulsar_nack.consumer.ack_timeout import LOG_LIMIT, AckTimeout
from pulsar_nack.testing.waits import wait_until
from pulsar_nack.timing import ACK_TIMEOUT_TICK_MS

TOPIC = "persistent://public/default/t"
TIMEOUT_MS = 300


class Stub:
    """A received message: only its key, read through ``read_key``."""

    def __init__(self, entry: int, index: int = -1) -> None:
        self.key = (TOPIC, 7, entry, index)


class Harness:
    """An AckTimeout whose expiries and id reads are recorded."""

    def __init__(self, timeout_ms: int = TIMEOUT_MS) -> None:
        self.expired: list[tuple[str, int, int, int]] = []
        self.reads = 0
        self.lock = threading.Lock()
        self.timeout = AckTimeout(timeout_ms, self._expire, self._read)

    def _expire(self, keys: list[Any]) -> None:
        with self.lock:
            self.expired += [key for key, _ in keys]

    def _read(self, message: Stub) -> tuple[Any, None]:
        self.reads += 1
        return message.key, None


@pytest.fixture
def harness():
    made = Harness()
    yield made
    made.timeout.close()


def test_a_message_settled_within_a_tick_never_has_its_id_read_nor_expires(harness):
    messages = [Stub(i) for i in range(100)]
    for message in messages[:50]:  # received and acked one by one: out of the log at once
        harness.timeout.received(message)
        harness.timeout.settled(message)
    for message in messages[50:]:  # received together, then acked: dropped by identity at the conversion
        harness.timeout.received(message)
    for message in messages[50:]:
        harness.timeout.settled(message)
    harness.timeout.convert()
    assert harness.reads == 0, "an id was read for a message settled within its tick"
    assert len(harness.timeout) == 0
    # The whole timeout (and a few ticks) must pass with nothing expiring.
    assert not wait_until(lambda: harness.expired, (TIMEOUT_MS + 3 * ACK_TIMEOUT_TICK_MS) / 1000, 0.01)
    assert harness.reads == 0


def test_an_unsettled_message_expires_at_its_timeout_never_before(harness):
    left, acked = Stub(1), Stub(2)
    start = time.monotonic()
    harness.timeout.received(left)
    harness.timeout.received(acked)
    harness.timeout.settled(acked)
    assert wait_until(lambda: harness.expired, 10, 0.005)
    waited_ms = (time.monotonic() - start) * 1000
    assert harness.expired == [left.key]
    assert TIMEOUT_MS <= waited_ms <= TIMEOUT_MS + 2 * ACK_TIMEOUT_TICK_MS + 500, f"expired after {waited_ms:.0f} ms"
    assert harness.reads == 1, "only the unsettled message's id is read"


def test_an_ack_after_the_conversion_settles_by_id(harness):
    message = Stub(3)
    harness.timeout.received(message)
    harness.timeout.convert()
    assert len(harness.timeout) == 1 and harness.reads == 1
    harness.timeout.settled(message)
    assert len(harness.timeout) == 0, "acked after its conversion, still in flight"
    assert not wait_until(lambda: harness.expired, (TIMEOUT_MS + 3 * ACK_TIMEOUT_TICK_MS) / 1000, 0.01), "it expired"


def test_a_settle_by_id_settles_the_copies_received_before_it_not_after(harness):
    """A nack (by id) of a copy, then its redelivered copy within the same tick: the new copy times out."""
    first, settled_before = Stub(4), Stub(5)
    harness.timeout.received(first)
    harness.timeout.received(settled_before)
    harness.timeout.settle((7, 5, -1))  # settled_before's id: nacked
    copy = Stub(4)
    harness.timeout.settle((7, 4, -1))  # first nacked ...
    harness.timeout.received(copy)  # ... and its copy back, all before a conversion
    harness.timeout.convert()
    assert len(harness.timeout) == 1
    assert wait_until(lambda: harness.expired, 10, 0.005)
    assert harness.expired == [copy.key], "the copy received after the nack must time out, nothing else"


def test_in_progress_on_a_message_received_within_the_tick(harness):
    message = Stub(6)
    harness.timeout.received(message)
    assert harness.timeout.extend(message.key), "a message received within the last tick is in flight"
    harness.timeout.settled(message)
    assert not harness.timeout.extend(message.key), "an acked message is not in flight"


@pytest.mark.parametrize("settle_logged", [msgid.settle_logged, msgid.py_settle_logged], ids=["built", "pure"])
def test_settle_logged_takes_the_last_received_message_out_or_logs_it_settled(settle_logged):
    first, last = Stub(1), Stub(2)
    received, settled = [first, last], []
    settle_logged(received, settled, first)  # not the last entry: logged as settled
    assert received == [first, last] and settled == [first]
    settle_logged(received, settled, last)
    if settle_logged is msgid.settle_logged and msgid.MSGID:  # one C call: the last entry leaves at once
        assert received == [first] and settled == [first]
    else:  # two Python steps would not be atomic: always logged
        assert received == [first, last] and settled == [first, last]
    taken = msgid.take_log(received)
    assert received == [] and taken[0] is first


@pytest.mark.parametrize("log_received", [msgid.log_received, msgid.py_log_received], ids=["built", "pure"])
def test_log_received_converts_on_the_receiving_thread_past_its_limit(log_received):
    converted: list[list[Stub]] = []
    received: list[Stub] = []

    def convert() -> None:
        converted.append(msgid.take_log(received))

    messages = [Stub(i) for i in range(5)]
    for message in messages:
        log_received(received, 3, convert, message)
    assert [len(taken) for taken in converted] == [4], "the log is taken when it grows past its limit, not before"
    assert received == [messages[4]]


def test_an_ack_timeout_holds_few_message_objects(harness):
    """Messages received and never acked: the receiving thread converts the log past LOG_LIMIT."""
    for i in range(10 * LOG_LIMIT):
        harness.timeout.received(Stub(i))
        assert len(harness.timeout._received_log) <= LOG_LIMIT
    assert len(harness.timeout) == 10 * LOG_LIMIT


def test_bad_arguments_change_nothing():
    with pytest.raises(TypeError, match="callable"):
        AckTimeout(1_000, None, lambda m: (m, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_ms"):
        AckTimeout(0, lambda keys: None, lambda m: (m, None))


# ---------------------------------------------------------------- on Apache Pulsar: every consumer's paths

BROKER_TIMEOUT_MS = 10_000  # the plain client refuses less; ours takes the same value


def _produce(client: Any, topic: str, payloads: list[bytes]) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for payload in payloads:
        producer.send(payload)
    producer.close()


def _take(consumer: Any, ms: int) -> Any:
    try:
        return consumer.receive(ms)
    except pulsar.Timeout:
        return None


@pytest.mark.broker
def test_blocking_and_listener_consumers_redeliver_only_the_unacked_message_at_the_timeout(pulsar_client, topic):
    """Ten messages, nine acked: only the tenth comes back, at the timeout (blocking and listener consumers)."""
    payloads = [str(i).encode() for i in range(10)]
    _produce(pulsar_client, topic, payloads)
    ours = pulsar_nack.subscribe(pulsar_client, topic, "blocking", consumer_type=pulsar.ConsumerType.Shared,
                                 initial_position=pulsar.InitialPosition.Earliest,
                                 unacked_messages_timeout_ms=BROKER_TIMEOUT_MS)
    heard: list[tuple[bytes, float]] = []

    def listener(consumer: Any, message: Any) -> None:
        heard.append((message.data(), time.monotonic()))
        if message.data() != b"9" or len([d for d, _ in heard if d == b"9"]) > 1:
            consumer.acknowledge(message)

    listening = pulsar_nack.subscribe(pulsar_client, topic, "listener", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest,
                                      unacked_messages_timeout_ms=BROKER_TIMEOUT_MS, message_listener=listener)
    try:
        start = time.monotonic()
        for _ in payloads:
            message = _take(ours, 10_000)
            assert message is not None
            if message.data() != b"9":
                ours.acknowledge(message)
        back = _take(ours, BROKER_TIMEOUT_MS + 3_000)
        waited_ms = (time.monotonic() - start) * 1000
        assert back is not None and back.data() == b"9", "the unacked message did not come back"
        assert BROKER_TIMEOUT_MS <= waited_ms <= BROKER_TIMEOUT_MS + 1_500, f"back after {waited_ms:.0f} ms"
        ours.acknowledge(back)
        assert _take(ours, 1_000) is None, "an acked message came back"
        assert wait_until(lambda: len(heard) >= 11, 5, 0.05), heard
        assert sorted(d for d, _ in heard) == sorted([*payloads, b"9"]), "the listener got other copies than the tenth"
        assert ours.stats()["ack_timeout_in_flight"] == 0
    finally:
        ours.close()
        listening.close()


@pytest.mark.broker
def test_the_asyncio_consumer_redelivers_the_unacked_message_at_the_timeout(pulsar_client, session_broker, topic):
    _produce(pulsar_client, topic, [b"acked", b"left"])

    async def scenario() -> tuple[list[bytes], float, int]:
        client = pulsar.asyncio.Client(session_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        consumer = await pulsar_nack.asyncio.subscribe(
            client, topic, "asyncio", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, unacked_messages_timeout_ms=BROKER_TIMEOUT_MS)
        try:
            start = time.monotonic()
            for _ in range(2):
                message = await consumer.receive()
                if message.data() == b"acked":
                    await consumer.acknowledge(message)
            back = await asyncio.wait_for(consumer.receive(), (BROKER_TIMEOUT_MS + 3_000) / 1000)
            waited_ms = (time.monotonic() - start) * 1000
            await consumer.acknowledge(back)
            extra = []
            try:
                extra.append((await asyncio.wait_for(consumer.receive(), 1.0)).data())
            except asyncio.TimeoutError:
                pass
            return [back.data(), *extra], waited_ms, consumer.stats()["ack_timeout_in_flight"]
        finally:
            await consumer.close()
            await client.close()

    got, waited_ms, in_flight = asyncio.run(scenario())
    assert got == [b"left"], f"expected only the unacked message back, got {got}"
    assert BROKER_TIMEOUT_MS <= waited_ms <= BROKER_TIMEOUT_MS + 1_500, f"back after {waited_ms:.0f} ms"
    assert in_flight == 0
