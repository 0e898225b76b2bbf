"""``reject(message)`` on both consumers, on Apache Pulsar standalone (issue 33).

A rejected message goes to the dead-letter topic at once, whatever its redelivery count,
as the policy's dead letter (its topic and form) or, with ``retry_enable=True``, as a
reconsume past ``max_redeliver_count`` (Java's topic and form); the original is acked
once the dead letter is stored, and never comes back. Without a dead-letter topic the
call raises and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
import pulsar_nack.asyncio
from helpers import read_all, wait_for
from pulsar_nack.consumer.dead_letter import ORIGIN_MESSAGE_ID, REAL_TOPIC
from pulsar_nack.errors import DeadLetterError
from pulsar_nack.testing.admin import PulsarAdmin

pytestmark = pytest.mark.broker

Shared = pulsar.ConsumerType.Shared


def new_topic() -> str:
    return f"persistent://public/default/reject-{uuid.uuid4().hex[:10]}"


def produce(client: Any, topic: str, count: int, batched: bool) -> None:
    producer = client.create_producer(
        topic, batching_enabled=batched, batching_max_messages=max(count, 2), batching_max_publish_delay_ms=500
    )
    for i in range(count):
        producer.send_async(f"m{i}".encode(), None, properties={"n": str(i)})
    producer.flush()
    producer.close()


class Blocking:
    """The blocking consumer behind the calls the scenario makes."""

    def __init__(self, client: Any, broker: Any, topic: str, **kw: Any) -> None:
        self.consumer = pulsar_nack.subscribe(
            client, topic, "sub", consumer_type=Shared, initial_position=pulsar.InitialPosition.Earliest, **kw
        )

    def receive(self, timeout_ms: int) -> Any:
        try:
            return self.consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return None

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        return getattr(self.consumer, name)(*args, **kw)

    def close(self) -> None:
        self.consumer.close()


class Asyncio:
    """The asyncio consumer, on its own loop and ``pulsar.asyncio.Client``."""

    def __init__(self, client: Any, broker: Any, topic: str, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = pulsar.asyncio.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self._pending: asyncio.Task[Any] | None = None
        self.consumer = self.loop.run_until_complete(
            pulsar_nack.asyncio.subscribe(
                self.client, topic, "sub", consumer_type=Shared, initial_position=pulsar.InitialPosition.Earliest, **kw
            )
        )

    def receive(self, timeout_ms: int) -> Any:
        if self._pending is None:  # one receive at a time, never cancelled (that could lose a message)
            self._pending = self.loop.create_task(self.consumer.receive())
        done, _ = self.loop.run_until_complete(asyncio.wait({self._pending}, timeout=timeout_ms / 1000))
        if not done:
            return None
        task, self._pending = self._pending, None
        return task.result()

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        result = getattr(self.consumer, name)(*args, **kw)
        return self.loop.run_until_complete(result) if asyncio.iscoroutine(result) else result

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self.loop.run_until_complete(self.consumer.close())
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


KINDS = {"blocking": Blocking, "asyncio": Asyncio}


def ack_arrivals(driver: Any, acked: list[bytes], seconds: float, done: Callable[[], bool]) -> None:
    """Ack every message that arrives, noting its payload in *acked*, for *seconds* or until *done()*."""
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:
        message = driver.receive(200)
        if message is not None:
            acked.append(message.data())
            driver.call("acknowledge", message)


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("kind", KINDS)
def test_reject_dead_letters_now_and_acks_once_stored(pulsar_client, session_broker, kind, batched):
    """Two of four messages rejected on their first delivery (``max_redeliver_count=5``):
    they are in the policy's dead-letter topic in its form, acked, never delivered again;
    the others are settled as usual (one nacked and acked on its return)."""
    topic = new_topic()
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=5)
    driver = KINDS[kind](pulsar_client, session_broker, topic, dead_letter_policy=policy,
                         negative_ack_redelivery_delay_ms=300)
    admin = PulsarAdmin(session_broker.admin_url)
    try:
        produce(pulsar_client, topic, 4, batched)
        first = {}
        for _ in range(4):
            message = driver.receive(10_000)
            assert message is not None
            first[message.data()] = message
        driver.call("reject", first[b"m1"])
        driver.call("reject", first[b"m2"], properties={"why": "poison"})
        driver.call("acknowledge", first[b"m0"])
        driver.call("negative_acknowledge", first[b"m3"])
        back = driver.receive(10_000)
        assert back is not None and back.data() == b"m3", "the nacked message did not come back"
        driver.call("acknowledge", back)
        assert driver.receive(1_000) is None, "a rejected message came back"
        assert wait_for(lambda: admin.backlog(topic, "sub") == 0, 10, 0.1), "a rejected original was not acked"
        driver.call("redeliver_unacknowledged_messages")
        assert driver.receive(1_500) is None, "a rejected message came back after a redelivery request"
        assert driver.consumer.stats()["dead_lettered"] == 2
    finally:
        driver.close()
    dead = {m.data(): m for m in read_all(pulsar_client, f"{topic}-sub-DLQ", wait_ms=1_500)}
    assert sorted(dead) == [b"m1", b"m2"]
    for payload, letter in dead.items():
        original = first[payload]
        expected = {"n": payload[1:].decode(), ORIGIN_MESSAGE_ID: str(original.message_id()), REAL_TOPIC: topic}
        if payload == b"m2":
            expected["why"] = "poison"
        assert dict(letter.properties()) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_reject_with_retries_on_sends_javas_dead_letter(pulsar_client, session_broker, kind):
    """With ``retry_enable=True`` (no policy) a rejected message, original or retry copy, goes
    to Java's dead letter topic in the reconsume path's form, at once."""
    topic = new_topic()
    driver = KINDS[kind](pulsar_client, session_broker, topic, retry_enable=True)
    admin = PulsarAdmin(session_broker.admin_url)
    try:
        produce(pulsar_client, topic, 2, False)
        got = {}
        for _ in range(2):
            message = driver.receive(10_000)
            got[message.data()] = message
        driver.call("reject", got[b"m0"])
        driver.call("reconsume_later", got[b"m1"], 100)
        copy = driver.receive(10_000)
        assert copy is not None and copy.data() == b"m1"
        driver.call("reject", copy)
        assert driver.receive(1_000) is None
        assert wait_for(lambda: admin.backlog(topic, "sub") == 0, 10, 0.1)
        assert wait_for(lambda: admin.backlog(f"{topic}-sub-RETRY", "sub") == 0, 10, 0.1)
    finally:
        driver.close()
    dead = {m.data(): dict(m.properties()) for m in read_all(pulsar_client, f"{topic}-sub-DLQ", wait_ms=1_500)}
    assert sorted(dead) == [b"m0", b"m1"]
    assert dead[b"m0"]["RECONSUMETIMES"] == "1" and dead[b"m1"]["RECONSUMETIMES"] == "2"
    assert dead[b"m0"]["REAL_TOPIC"] == topic and dead[b"m0"]["REAL_SUBSCRIPTION"] == "sub"


@pytest.mark.parametrize("kind", KINDS)
def test_reject_without_a_dead_letter_topic_raises_and_changes_nothing(pulsar_client, session_broker, kind):
    topic = new_topic()
    driver = KINDS[kind](pulsar_client, session_broker, topic)
    admin = PulsarAdmin(session_broker.admin_url)
    try:
        produce(pulsar_client, topic, 1, False)
        message = driver.receive(10_000)
        with pytest.raises(DeadLetterError, match="dead_letter_policy"):
            driver.call("reject", message)
        driver.call("acknowledge", message)
        assert wait_for(lambda: admin.backlog(topic, "sub") == 0, 10, 0.1)
        assert driver.consumer.stats()["dead_lettered"] == 0
    finally:
        driver.close()
    listed = admin.request("GET", "persistent/public/default")
    assert f"{topic}-sub-DLQ" not in listed


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_member_whose_reject_failed_is_the_applications_again_not_acked(pulsar_client, session_broker, kind):
    """Batch [m0, m1, m2]: m1 acked, m0 and m2 nacked (the entry's knowledge is complete),
    both back; m2's reject fails (its dead-letter topic's namespace does not exist) and m0
    is nacked again. m0's redelivery may bring a copy of m2: m2 is unsettled, not acked,
    so it must not be filtered as acked. Once the application nacks m2 too, both come
    back and are acked; nothing goes to the dead-letter topic."""
    topic = new_topic()
    policy = pulsar.ConsumerDeadLetterPolicy(
        max_redeliver_count=5, dead_letter_topic=f"persistent://public/rj-{uuid.uuid4().hex[:8]}/dead"
    )
    driver = KINDS[kind](pulsar_client, session_broker, topic, dead_letter_policy=policy,
                         negative_ack_redelivery_delay_ms=300)
    admin = PulsarAdmin(session_broker.admin_url)
    try:
        produce(pulsar_client, topic, 3, True)
        first = {m.data(): m for m in (driver.receive(10_000) for _ in range(3))}
        driver.call("acknowledge", first[b"m1"])
        driver.call("negative_acknowledge", first[b"m0"])
        driver.call("negative_acknowledge", first[b"m2"])
        back = {m.data(): m for m in (driver.receive(10_000) for _ in range(2))}
        assert sorted(back) == [b"m0", b"m2"]
        with pytest.raises(DeadLetterError, match="failed"):
            driver.call("reject", back[b"m2"])
        driver.call("negative_acknowledge", back[b"m0"])
        acked: list[bytes] = []
        # m0's redelivery may come (with a copy of m2) while m2 is the application's.
        ack_arrivals(driver, acked, 2, lambda: False)
        driver.call("negative_acknowledge", back[b"m2"])
        ack_arrivals(driver, acked, 20, lambda: sorted(acked) == [b"m0", b"m2"])
        assert sorted(acked) == [b"m0", b"m2"], "m2 was lost: taken for acked after its reject failed"
        assert wait_for(lambda: admin.backlog(topic, "sub") == 0, 10, 0.1)
        assert driver.consumer.stats()["dead_lettered"] == 0
    finally:
        driver.close()


def test_reject_refuses_bad_input_and_a_pending_nack(pulsar_client, session_broker):
    topic = new_topic()
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=5)
    driver = Blocking(pulsar_client, session_broker, topic, dead_letter_policy=policy)
    try:
        produce(pulsar_client, topic, 1, False)
        message = driver.receive(10_000)
        with pytest.raises(TypeError, match="properties"):
            driver.call("reject", message, properties={"a": 1})
        with pytest.raises(TypeError):
            driver.call("reject", "m0")
        driver.call("negative_acknowledge", message, 60_000)
        with pytest.raises(ValueError, match="NACKED"):
            driver.call("reject", message)
        assert driver.consumer.stats()["dead_lettered"] == 0
    finally:
        driver.consumer.close(redeliver_pending=False)
