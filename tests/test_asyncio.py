"""pulsar_nack.asyncio on Apache Pulsar standalone, with pulsar.asyncio.Client.

Timing bounds as in tests/test_apache_pulsar.py: a nacked message comes back no earlier
than its requested time minus the bucket floor (``2**BITS - 1`` ms) and a few ms of
clock-read skew, and no later than ``LATE_MS`` after it (generous for a loaded 2-core
machine; bench/asyncio_stream.py measures the real figures).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pulsar
import pulsar.asyncio
import pytest
import pytest_asyncio

import pulsar_nack.asyncio
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.errors import ConsumerClosedError
from pulsar_nack.testing.admin import PulsarAdmin

pytestmark = [pytest.mark.broker, pytest.mark.asyncio]

BITS = 6
EARLY_MS = (1 << BITS) - 1 + 5
LATE_MS = 2_000
Shared = pulsar.ConsumerType.Shared
Earliest = pulsar.InitialPosition.Earliest


@pytest_asyncio.fixture
async def aclient(apache_broker: Any) -> AsyncIterator[pulsar.asyncio.Client]:
    client = pulsar.asyncio.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield client
    await client.close()


def new_topic() -> str:
    return f"persistent://public/default/aio-{uuid.uuid4().hex[:10]}"


def now_ms() -> float:
    return time.monotonic() * 1000


async def produce(client: pulsar.asyncio.Client, topic: str, payloads: list[bytes], *, batch: bool = False) -> None:
    """Send *payloads*; with *batch* all in one batched entry."""
    producer = await client.create_producer(
        topic,
        batching_enabled=batch,
        batching_max_messages=max(len(payloads), 2),
        batching_max_publish_delay_ms=1_000,
    )
    if batch:
        await asyncio.gather(*(producer.send(p) for p in payloads))
    else:
        for payload in payloads:
            await producer.send(payload)
    await producer.close()


async def subscribe(client: pulsar.asyncio.Client, topic: str, **kw: Any) -> pulsar_nack.asyncio.AsyncNackingConsumer:
    kw.setdefault("consumer_type", Shared)
    kw.setdefault("initial_position", Earliest)
    kw.setdefault("negative_ack_precision_bit_cnt", BITS)
    return await pulsar_nack.asyncio.subscribe(client, topic, "sub", **kw)


async def receive(consumer: Any, timeout_s: float = 15.0) -> pulsar.Message:
    return await asyncio.wait_for(consumer.receive(), timeout_s)


async def test_per_call_delays_and_backoff(aclient):
    topic = new_topic()
    consumer = await subscribe(aclient, topic, redelivery_backoff=MultiplierRedeliveryBackoff(200, 5_000, 2))
    await produce(aclient, topic, [b"slow", b"fast", b"mid", b"ok", b"backoff"])
    delays = {b"slow": 1_500, b"fast": 300, b"mid": 800}
    nacked_at: dict[bytes, float] = {}
    for _ in range(5):
        message = await receive(consumer)
        payload = message.data()
        if payload == b"ok":
            await consumer.acknowledge(message)
        else:
            await consumer.negative_acknowledge(message, delays.get(payload))  # None: the backoff
            nacked_at[payload] = now_ms()
    delays[b"backoff"] = 200  # redelivery count 0
    arrivals: list[bytes] = []
    backoff_rounds = 0
    while len(arrivals) < 4:
        message = await receive(consumer)
        payload = message.data()
        waited = now_ms() - nacked_at[payload]
        assert delays[payload] - EARLY_MS <= waited <= delays[payload] + LATE_MS, (payload, waited)
        if payload == b"backoff" and backoff_rounds == 0:
            assert message.redelivery_count() == 1
            backoff_rounds += 1
            delays[b"backoff"] = 400  # redelivery count 1: 200 * 2
            await consumer.negative_acknowledge(message)
            nacked_at[payload] = now_ms()
            continue
        arrivals.append(payload)
        await consumer.acknowledge(message)
    assert arrivals.index(b"fast") < arrivals.index(b"mid") < arrivals.index(b"slow")
    assert consumer.stats()["nacked"] == 5
    await consumer.close()


async def test_batch_siblings_retry_on_their_own_and_metrics_count_them(aclient):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from pulsar_nack.metrics import NACK_COUNTER, instrument

    topic = new_topic()
    # One active consumer: each nacked member at its own time (on Shared, when the last is due:
    # tests/test_consumer.py::test_batch_siblings_retry_by_the_subscriptions_rule).
    consumer = await subscribe(aclient, topic, consumer_type=pulsar.ConsumerType.Exclusive)
    reader = InMemoryMetricReader()
    instrument(consumer, MeterProvider(metric_readers=[reader]).get_meter("test"))
    await produce(aclient, topic, [b"0", b"1", b"2", b"3"], batch=True)
    first = [await receive(consumer) for _ in range(4)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in first}) == 1
    assert [m.message_id().batch_index() for m in first] == [0, 1, 2, 3]
    await consumer.acknowledge(first[0])
    await consumer.acknowledge(first[1])
    await consumer.negative_acknowledge(first[2], 300)
    await consumer.negative_acknowledge(first[3], 1_500)
    nacked = now_ms()

    again = await receive(consumer)  # index 2 alone: 0 and 1 are acked, 3 still waits
    assert again.data() == b"2" and 300 - EARLY_MS <= now_ms() - nacked <= 300 + LATE_MS
    await consumer.acknowledge(again)
    last = await receive(consumer)
    assert last.data() == b"3" and 1_500 - EARLY_MS <= now_ms() - nacked <= 1_500 + LATE_MS
    await consumer.acknowledge(last)
    with pytest.raises(asyncio.TimeoutError):  # nothing else comes back
        await asyncio.wait_for(consumer.receive(), 1.0)

    stats = consumer.stats()
    assert stats["swallowed"] >= 1  # the copy of index 3 that came with index 2
    data = reader.get_metrics_data()
    values = {
        m.name: m.data.data_points[0].value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if hasattr(m.data.data_points[0], "value")
    }
    assert values[NACK_COUNTER] == stats["nacked"] == 2
    assert values["pulsar_nack.message.swallowed"] == stats["swallowed"]
    assert values["pulsar_nack.handoff.bursts"] == stats["handoff_bursts"] == 2
    assert values["pulsar_nack.message.redelivered"] == 2
    (point,) = next(m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == NACK_COUNTER).data.data_points
    assert point.attributes["pulsar.topic"] == topic and point.attributes["pulsar.subscription"] == "sub"
    await consumer.close()


async def test_steady_nack_stream_does_not_starve_redeliveries(aclient):
    """A new failure every 20 ms for 2 s (produced at that pace, so no backlog hides the
    copies); each is nacked for 300 ms and must come back during the stream."""
    topic = new_topic()
    consumer = await subscribe(aclient, topic)
    count, delay = 100, 300
    producer = await aclient.create_producer(topic, batching_enabled=False)

    async def produce_steadily() -> None:
        for i in range(count):
            await producer.send(str(i).encode())
            await asyncio.sleep(0.02)

    sending = asyncio.create_task(produce_steadily())
    nacked_at: dict[bytes, float] = {}
    arrived_at: list[float] = []
    lateness: list[float] = []
    while len(lateness) < count:
        message = await receive(consumer)
        payload = message.data()
        if payload in nacked_at:
            arrived_at.append(now_ms())
            lateness.append(arrived_at[-1] - nacked_at[payload] - delay)
            await consumer.acknowledge(message)
        else:
            await consumer.negative_acknowledge(message, delay)
            nacked_at[payload] = now_ms()
    await sending
    await producer.close()
    stream_end = max(nacked_at.values())
    # Starvation would hold every redelivery until the stream stops.
    during_stream = sum(1 for t in arrived_at if t < stream_end)
    assert during_stream > count // 2, (during_stream, max(lateness))
    assert max(lateness) <= LATE_MS and min(lateness) >= -EARLY_MS
    await consumer.close()


@pytest.mark.parametrize("redeliver_pending", [True, False])
async def test_close_with_pending_nacks_loses_nothing(aclient, redeliver_pending):
    topic = new_topic()
    first = await subscribe(aclient, topic)
    payloads = [f"m{i}".encode() for i in range(20)]
    batched = [f"b{i}".encode() for i in range(5)]
    await produce(aclient, topic, payloads)
    await produce(aclient, topic, batched, batch=True)
    for _ in range(25):
        await first.negative_acknowledge(await receive(first), 60_000)
    assert len(first.tracker) == 25
    await first.close(redeliver_pending=redeliver_pending)
    await first.close()  # idempotent
    assert first.stats()["handed_off_entries"] == (21 if redeliver_pending else 0)

    second = await subscribe(aclient, topic)
    seen = set()
    while len(seen) < 25:
        message = await receive(second)  # well before the 60 s delay
        seen.add(message.data())
        await second.acknowledge(message)
    assert seen == set(payloads) | set(batched)
    await second.close()


async def test_a_blocked_loop_does_not_delay_the_handoff(aclient):
    topic = new_topic()
    consumer = await subscribe(aclient, topic)
    await produce(aclient, topic, [b"x"])
    message = await receive(consumer)
    await consumer.negative_acknowledge(message, 200)
    # Block the event loop thread (no await from here on) and read the C++ client's
    # receive queue directly: the copy arrives only if the timer thread handed the
    # entry to the client without the loop's help.
    blocked_at = now_ms()
    copy = consumer._raw.receive(10_000)
    assert copy.data() == b"x" and now_ms() - blocked_at <= 200 + LATE_MS
    consumer._raw.acknowledge(copy)
    await consumer.close()


async def test_a_slow_handoff_does_not_block_the_loop(aclient):
    """Stand-in for the client's negative_acknowledge (a gate in front of the real one):
    no broker makes that call slow on demand."""
    topic = new_topic()
    consumer = await subscribe(aclient, topic)
    real = consumer._raw
    gate = threading.Event()
    entered = threading.Event()

    class SlowRaw:
        def negative_acknowledge(self, message_id: Any) -> None:
            entered.set()
            gate.wait(30)
            real.negative_acknowledge(message_id)

    consumer._raw = SlowRaw()  # type: ignore[assignment]
    await produce(aclient, topic, [b"stuck"])
    stuck = await receive(consumer)
    await consumer.negative_acknowledge(stuck, 0)
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    assert entered.is_set()
    # The timer thread is stuck in the handoff; the loop still receives, acks and nacks.
    await produce(aclient, topic, [b"fresh"])
    fresh = await receive(consumer)
    assert fresh.data() == b"fresh"
    await consumer.negative_acknowledge(fresh, 50)
    assert consumer.stats()["nacked"] == 2
    gate.set()
    back = {(await receive(consumer)).data() for _ in range(2)}
    assert back == {b"stuck", b"fresh"}
    consumer._raw = real
    await consumer.close()


async def test_bad_input_changes_nothing(aclient, apache_broker):
    topic = new_topic()
    other = new_topic()
    await produce(aclient, topic, [b"a"])
    await produce(aclient, other, [b"o"])
    admin = PulsarAdmin(apache_broker.admin_url)
    blocking = pulsar.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        with pytest.raises(TypeError):
            await pulsar_nack.asyncio.subscribe(blocking, topic, "sub")  # type: ignore[arg-type]
    finally:
        blocking.close()
    with pytest.raises(TypeError):
        await pulsar_nack.asyncio.subscribe(aclient, topic, "sub", no_such_keyword=1)
    with pytest.raises(ValueError):
        await pulsar_nack.asyncio.subscribe(aclient, topic, "sub", negative_ack_redelivery_delay_ms=-1)
    with pytest.raises(TypeError):
        await pulsar_nack.asyncio.subscribe(aclient, 42, "sub")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await pulsar_nack.asyncio.subscribe(aclient, topic, "")
    with pytest.raises(TypeError, match="dead_letter_policy"):
        await pulsar_nack.asyncio.subscribe(aclient, topic, "sub", dead_letter_policy="3 times")
    assert admin.topic_stats(topic)["subscriptions"] == {}  # no bad call subscribed

    consumer = await subscribe(aclient, topic)
    stranger_consumer = await subscribe(aclient, other)
    message = await receive(consumer)
    stranger = await receive(stranger_consumer)
    with pytest.raises(TypeError):
        await consumer.negative_acknowledge("not a message")
    with pytest.raises(TypeError):
        await consumer.negative_acknowledge(message, "100")
    with pytest.raises(ValueError):
        await consumer.negative_acknowledge(message, -1)
    with pytest.raises(ValueError):
        await consumer.negative_acknowledge(stranger)
    with pytest.raises(TypeError):
        await consumer.acknowledge(3)
    with pytest.raises(TypeError):
        await consumer.close(redeliver_pending="yes")  # type: ignore[arg-type]
    assert len(consumer.tracker) == 0 and consumer.stats()["nacked"] == 0 and not consumer.closed

    await consumer.negative_acknowledge(message, 100)  # still usable, and the message comes back
    assert (await receive(consumer)).data() == b"a"
    await consumer.close()
    for call in (consumer.receive(), consumer.acknowledge(message), consumer.negative_acknowledge(message)):
        with pytest.raises(ConsumerClosedError):
            await call
    await stranger_consumer.close()


async def test_redeliver_unacknowledged_messages_waits_for_the_grouped_acks(aclient):
    """As the blocking consumer's: the request goes out after the client's 100 ms ack
    grouping, so acked batch siblings never come back; a pending nack comes back now.

    Six rounds: whether an early request beats the grouped acks to the broker depends on
    the grouping timer's phase (without the wait, one round in three failed)."""
    topic = new_topic()
    consumer = await subscribe(aclient, topic)
    for round_ in range(6):
        payloads = [f"r{round_}-{i}".encode() for i in range(5)]
        await produce(aclient, topic, payloads, batch=True)
        got = [await receive(consumer) for _ in payloads]
        for message in got[:3]:
            await consumer.acknowledge(message)
        await consumer.negative_acknowledge(got[3], delay_ms=3_600_000)
        consumer.redeliver_unacknowledged_messages()  # not a coroutine, as in pulsar.asyncio
        again = [await receive(consumer) for _ in range(2)]
        assert sorted(m.data() for m in again) == sorted(m.data() for m in got[3:]), f"round {round_}"
        for message in again:
            await consumer.acknowledge(message)
    extra = asyncio.ensure_future(consumer.receive())
    done, _ = await asyncio.wait({extra}, timeout=1.5)
    assert not done, f"an acked sibling came back: {extra.result().data()!r}"
    extra.cancel()
    await consumer.close()


async def test_every_subscribe_keyword_of_the_async_client_is_accepted():
    ours = pulsar_nack.consumer.async_consumer._SUBSCRIBE_KEYWORDS
    theirs = set(inspect.signature(pulsar.asyncio.Client.subscribe).parameters)
    assert theirs - ours == {"self", "topic", "subscription_name", "negative_ack_redelivery_delay_ms"}
