"""``for message in consumer`` and ``async for message in consumer`` on Apache Pulsar: every
message in order of arrival, and the end of the loop when the consumer is closed (from
the loop's body, from another thread, from another task)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack.asyncio
from helpers import produce, wait_for
from pulsar_nack import subscribe
from pulsar_nack.testing import quiet_client

pytestmark = pytest.mark.broker

Shared = pulsar.ConsumerType.Shared
PAYLOADS = [b"m0", b"m1", b"m2"]
END_S = 15.0
"""How long a loop may take to end after close() (the close itself hands pending nacks to the client)."""


@pytest.fixture
def client(apache_broker) -> Any:
    client = quiet_client(apache_broker.url)
    yield client
    client.close()


def _blocking(client: Any, topic: str, retry: bool) -> Any:
    return subscribe(client, topic, "iter", consumer_type=Shared, retry_enable=retry,
                     negative_ack_redelivery_delay_ms=100)


@pytest.mark.parametrize("retry", [False, True], ids=["plain", "retry-letter"])
def test_for_loop_ends_when_another_thread_closes_the_consumer(client, topic, retry) -> None:
    """The loop gets every message (a nacked one again), then waits in receive; close() from this thread ends it."""
    consumer = _blocking(client, topic, retry)
    produce(client, topic, PAYLOADS)
    seen: list[bytes] = []
    outcome: list[object] = []

    def loop() -> None:
        try:
            for message in consumer:
                seen.append(message.data())
                if message.data() == b"m1" and message.redelivery_count() == 0:
                    consumer.negative_acknowledge(message)
                else:
                    consumer.acknowledge(message)
            outcome.append("ended")
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    assert wait_for(lambda: len(seen) == 4, 15.0), seen
    assert not outcome  # still waiting in receive
    consumer.close()
    worker.join(END_S)
    assert not worker.is_alive(), "the loop did not end after close()"
    assert outcome == ["ended"]
    assert sorted(seen) == [b"m0", b"m1", b"m1", b"m2"]


def test_for_loop_ends_after_the_body_closes_the_consumer(client, topic) -> None:
    """close() in the loop's body: no further message is handed out, the rest stay unacked (redelivered)."""
    consumer = _blocking(client, topic, False)
    produce(client, topic, PAYLOADS)
    seen = []
    for message in consumer:
        seen.append(message.data())
        consumer.acknowledge(message)
        consumer.close()
    assert len(seen) == 1
    assert list(consumer) == []  # a closed consumer iterates nothing
    other = _blocking(client, topic, False)  # the two unacked messages come to the next consumer
    rest = {other.receive(10_000).data() for _ in range(2)}
    assert rest | set(seen) == set(PAYLOADS)
    other.close()


def test_for_loop_raises_other_errors(apache_broker, topic) -> None:
    """Closing the client, not the consumer, is an error of the loop (the consumer is not closed).

    The client is closed before the loop starts: a client closed while a receive waits does not
    always wake that receive, the plain client's as well. In a scratch run on a loaded machine,
    5 of 40 plain consumers that had waited in ``receive()`` for 0.2 s still waited 10 s after
    ``client.close()`` returned (the cause, in the C++ client, not found).
    """
    own = quiet_client(apache_broker.url)
    consumer = _blocking(own, topic, False)
    outcome: list[object] = []

    def loop() -> None:
        try:
            for _ in consumer:
                pass
            outcome.append("ended")
        except pulsar.PulsarException as error:
            outcome.append(error)

    own.close()
    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    worker.join(END_S)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], pulsar.PulsarException), outcome
    assert not consumer.closed


@pytest.mark.parametrize("retry", [False, True], ids=["plain", "retry-letter"])
def test_async_for_ends_when_another_task_closes_the_consumer(apache_broker, client, retry) -> None:
    topic = f"persistent://public/default/aio-iter-{uuid.uuid4().hex[:10]}"

    async def scenario() -> tuple[list[bytes], str]:
        aclient = pulsar.asyncio.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            consumer = await pulsar_nack.asyncio.subscribe(
                aclient, topic, "iter", consumer_type=Shared, retry_enable=retry,
                initial_position=pulsar.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=100)
            produce(client, topic, PAYLOADS)
            seen: list[bytes] = []
            four = asyncio.Event()

            async def loop() -> str:
                async for message in consumer:
                    seen.append(message.data())
                    if message.data() == b"m1" and message.redelivery_count() == 0:
                        await consumer.negative_acknowledge(message)
                    else:
                        await consumer.acknowledge(message)
                    if len(seen) == 4:
                        four.set()
                return "ended"

            task = asyncio.ensure_future(loop())
            await asyncio.wait_for(four.wait(), 15)
            assert not task.done()  # waiting in receive
            await consumer.close()
            return seen, await asyncio.wait_for(task, END_S)
        finally:
            await aclient.close()

    seen, outcome = asyncio.run(scenario())
    assert outcome == "ended"
    assert sorted(seen) == [b"m0", b"m1", b"m1", b"m2"]


def test_async_for_ends_after_the_body_closes_the_consumer(apache_broker, client) -> None:
    topic = f"persistent://public/default/aio-iter-{uuid.uuid4().hex[:10]}"

    async def scenario() -> list[bytes]:
        aclient = pulsar.asyncio.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            consumer = await pulsar_nack.asyncio.subscribe(
                aclient, topic, "iter", consumer_type=Shared, initial_position=pulsar.InitialPosition.Earliest)
            produce(client, topic, PAYLOADS)
            seen = []
            async for message in consumer:
                seen.append(message.data())
                await consumer.acknowledge(message)
                await consumer.close()
            assert [m async for m in consumer] == []
            return seen
        finally:
            await aclient.close()

    assert len(asyncio.run(scenario())) == 1
