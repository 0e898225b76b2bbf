"""reconsume_later on Apache Pulsar standalone (stock broker settings): retry letter topics.

Each test has its own topic. "Never early" is checked against the copy's due time, its
publish time + ``DELAY_TIME``, on the same wall clock the producer stamped it with.
Lateness bounds are generous (a loaded 2-core machine); ``bench/retry.py`` measures them.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
import pulsar_nack.asyncio
from helpers import wait_for
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.consumer.retry import (
    DELAY_TIME,
    DELIVER_AT_TIME,
    ORIGIN_MESSAGE_ID,
    REAL_SUBSCRIPTION,
    REAL_TOPIC,
    RECONSUMETIMES,
    RetryMessage,
    due_time_ms,
    java_message_id,
)
from pulsar_nack.testing import quiet_client
from pulsar_nack.testing.admin import topic_path

pytestmark = pytest.mark.broker

SHARED = pulsar.ConsumerType.Shared
EARLIEST = pulsar.InitialPosition.Earliest
LATE_MS = 2_500  # the broker's tick (1 s), a hold's handoff, a busy machine


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def retrying(client: Any, topic: Any, **kwargs: Any) -> pulsar_nack.NackingConsumer:
    kwargs.setdefault("consumer_type", SHARED)
    kwargs.setdefault("initial_position", EARLIEST)
    return pulsar_nack.subscribe(client, topic, kwargs.pop("subscription", "sub"), retry_enable=True, **kwargs)


def receive(consumer: Any, timeout_s: float = 15.0) -> pulsar.Message:
    return consumer.receive(int(timeout_s * 1000))


def test_reconsumed_copy_is_the_message_with_java_properties_and_its_original_topic(pulsar_client, topic):
    consumer = retrying(pulsar_client, topic)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    producer.send(b"payload", properties={"app": "x"}, partition_key="k", ordering_key="ok", event_timestamp=4242)
    first = receive(consumer)
    origin = java_message_id(first.message_id())
    copies = []
    for delay in (0, 200, 300):
        consumer.reconsume_later(first if not copies else copies[-1], delay)
        copies.append(receive(consumer))
    for n, (copy, delay) in enumerate(zip(copies, (0, 200, 300)), 1):
        assert isinstance(copy, RetryMessage) and isinstance(copy, pulsar.Message)
        assert copy.topic_name() == topic  # the application sees the original topic
        assert copy.retry_topic_name() == f"{topic}-sub-RETRY"
        assert copy.data() == b"payload" and copy.value() == b"payload"
        assert (copy.partition_key(), copy.ordering_key(), copy.event_timestamp()) == ("k", "ok", 4242)
        assert copy.properties() == {
            "app": "x",
            REAL_TOPIC: topic,
            ORIGIN_MESSAGE_ID: origin,  # the first message's id, kept across hops
            "ORIGIN_MESSAGE_IDY_TIME": origin,
            REAL_SUBSCRIPTION: "sub",
            RECONSUMETIMES: str(n),
            DELAY_TIME: str(delay),
        }
        assert copy.reconsume_times() == n
    consumer.acknowledge(copies[-1])
    stats = consumer.stats()
    assert stats["reconsumed"] == 3 and stats["retry_dead_lettered"] == 0
    with pytest.raises(pulsar.Timeout):
        consumer.receive(1_000)  # every original was acked after its copy was stored
    consumer.close()


@pytest.mark.parametrize(
    ("delays", "poll_ms"),
    [([500, 1000] * 6, 500), ([40, 80, 110, 140] * 4, 200)],
    ids=["held-by-the-tracker", "held-in-memory"],
)
def test_a_retry_the_broker_delivers_early_is_never_handed_over_early(
    pulsar_client: Any, topic: str, delays: list[int], poll_ms: int
) -> None:
    """A stock broker delivers a retry due within its 1 s tick at once; the consumer holds it until due.

    500 and 1,000 ms retries are held by the tracker (unacked, so still durable); retries of
    40-140 ms, less than ``MEMORY_HOLD_MS`` early, are kept in memory and returned by
    ``receive`` when due (``take_due``). Either way, never before.
    """
    consumer = retrying(pulsar_client, topic)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for i in range(len(delays)):
        producer.send(str(i).encode())
    arrivals: dict[int, int] = {}
    end = time.monotonic() + 30
    while len(arrivals) < len(delays) and time.monotonic() < end:
        try:
            message = consumer.receive(poll_ms)
        except pulsar.Timeout:
            continue
        if isinstance(message, RetryMessage):
            arrivals[int(message.data())] = now_ms() - due_time_ms(message)
            consumer.acknowledge(message)
        else:
            consumer.reconsume_later(message, delays[int(message.data())])
    assert len(arrivals) == len(delays)
    early = {i: late for i, late in arrivals.items() if late < 0}
    assert not early, f"handed over before due (ms): {early}"
    assert max(arrivals.values()) < LATE_MS, arrivals
    assert consumer.stats()["held"] > 0  # the broker did deliver early: the hold is what kept them back
    consumer.close()


def test_dead_letter_after_max_redeliver_count(pulsar_client, topic):
    policy = pulsar.ConsumerDeadLetterPolicy(2, None, "dlq-reader")
    consumer = retrying(pulsar_client, topic, dead_letter_policy=policy)
    pulsar_client.create_producer(topic).send(b"poison", properties={"p": "1"})
    deliveries = []
    message = receive(consumer)
    while True:
        deliveries.append(message.properties().get(RECONSUMETIMES))
        consumer.reconsume_later(message, 0)
        try:
            message = consumer.receive(2_000)
        except pulsar.Timeout:
            break
    assert deliveries == [None, "1", "2"]  # max 2: the first delivery and two retries
    assert consumer.stats()["retry_dead_lettered"] == 1
    dlq = pulsar_client.subscribe(f"{topic}-sub-DLQ", "dlq-reader")  # the policy's initial subscription kept it
    letter = dlq.receive(10_000)
    assert letter.data() == b"poison"
    props = letter.properties()
    assert props[RECONSUMETIMES] == "3" and props[DELAY_TIME] == "0" and props["p"] == "1"
    assert props[REAL_TOPIC] == topic and props[REAL_SUBSCRIPTION] == "sub"
    dlq.acknowledge(letter)
    dlq.close()
    consumer.close()


@pytest.mark.parametrize("hold_ms", [0, 5_000], ids=["broker-held", "consumer-held"])
def test_failed_produce_leaves_the_original_unacked_and_raises(pulsar_client, session_broker, hold_ms):
    """The retry topic refuses our producer (its namespace allows one producer per topic, taken).

    ``consumer-held``: the 1 s retry goes through the batching producer (``retry_hold_ms``).
    """
    namespace = f"public/retry-fail-{uuid.uuid4().hex[:8]}"
    session_broker.admin.request("PUT", f"namespaces/{namespace}")
    session_broker.admin.request("POST", f"namespaces/{namespace}/maxProducersPerTopic", 1)
    topic = f"persistent://{namespace}/t"
    occupant = pulsar_client.create_producer(f"{topic}-sub-RETRY")
    consumer = retrying(pulsar_client, topic, retry_hold_ms=hold_ms)
    pulsar_client.create_producer(topic).send(b"keep me")
    message = receive(consumer)
    with pytest.raises(pulsar.PulsarException):
        consumer.reconsume_later(message, 1_000)
    # An ack would reach the broker within the client's 100 ms ack grouping: give it 1 s.
    assert not wait_for(lambda: session_broker.admin.backlog(topic, "sub") == 0, 1.0, poll_s=0.1)
    consumer.close()
    again = pulsar_nack.subscribe(pulsar_client, topic, "sub", consumer_type=SHARED)
    back = receive(again)  # the original was never acked: it comes back
    assert java_message_id(back.message_id()) == java_message_id(message.message_id())
    again.close()
    assert consumer.stats()["reconsumed"] == 0 and consumer.stats()["acked"] == 0
    occupant.close()  # the next reconsume creates the producer again, and succeeds
    consumer = retrying(pulsar_client, topic)
    consumer.reconsume_later(receive(consumer), 0)
    assert receive(consumer).properties()[RECONSUMETIMES] == "1"
    consumer.close()


def test_delays_follow_the_backoff_by_reconsume_count(pulsar_client, topic):
    backoff = MultiplierRedeliveryBackoff(min_delay_ms=100, max_delay_ms=250, multiplier=2)
    consumer = retrying(pulsar_client, topic, redelivery_backoff=backoff)
    pulsar_client.create_producer(topic).send(b"b")
    message = receive(consumer)
    seen = []
    for _ in range(4):
        consumer.reconsume_later(message)
        message = receive(consumer)
        seen.append(int(message.properties()[DELAY_TIME]))
        assert now_ms() >= due_time_ms(message)
    assert seen == [100, 200, 250, 250]
    consumer.acknowledge(message)
    consumer.close()


def test_partitioned_topic_has_one_retry_topic_and_the_copy_names_the_base_topic(pulsar_client, session_broker):
    base = session_broker.create_partitioned_topic(f"part-{uuid.uuid4().hex[:8]}", 2)
    consumer = retrying(pulsar_client, base)
    producer = pulsar_client.create_producer(base, batching_enabled=False)
    for i in range(4):
        producer.send(str(i).encode(), partition_key=str(i))
    partitions, copies = set(), 0
    for _ in range(8):  # four originals, reconsumed at once, and their four copies
        message = receive(consumer)
        if not isinstance(message, RetryMessage):
            partitions.add(message.topic_name())
            consumer.reconsume_later(message, 0)
            continue
        assert message.topic_name() == base and message.retry_topic_name() == f"{base}-sub-RETRY"
        assert message.properties()[ORIGIN_MESSAGE_ID].split(":")[2] in ("0", "1")  # the partition index
        consumer.acknowledge(message)
        copies += 1
    assert partitions == {f"{base}-partition-0", f"{base}-partition-1"} and copies == 4
    consumer.close()


def test_a_retry_survives_its_consumer_and_is_not_early_for_the_next(pulsar_client, topic):
    consumer = retrying(pulsar_client, topic)
    pulsar_client.create_producer(topic).send(b"later")
    consumer.reconsume_later(receive(consumer), 2_500)
    consumer.close()  # nothing about the retry is left in memory
    successor = retrying(pulsar_client, topic)
    copy = receive(successor)
    assert copy.data() == b"later" and now_ms() >= due_time_ms(copy)
    successor.acknowledge(copy)
    successor.close()


def test_reconsume_needs_retry_enable_and_a_received_message(pulsar_client, topic):
    plain = pulsar_nack.subscribe(pulsar_client, topic, "plain", consumer_type=SHARED, initial_position=EARLIEST)
    pulsar_client.create_producer(topic).send(b"m")
    message = receive(plain)
    with pytest.raises(RuntimeError, match="retry_enable"):
        plain.reconsume_later(message)
    plain.close()
    consumer = retrying(pulsar_client, topic)
    message = receive(consumer)
    with pytest.raises(TypeError):
        consumer.reconsume_later(message.message_id())
    with pytest.raises(TypeError, match="properties"):
        consumer.reconsume_later(message, 10, {"a": 1})
    with pytest.raises(ValueError):
        consumer.reconsume_later(message, -1)
    assert consumer.stats()["reconsumed"] == 0
    consumer.close()


def test_message_listener_gets_retry_copies_when_due(pulsar_client, topic):
    got: list[tuple[Any, int]] = []

    def listener(consumer, message):
        if message.properties().get(RECONSUMETIMES):
            got.append((message, now_ms()))
            consumer.acknowledge(message)
        else:
            consumer.reconsume_later(message, 800)

    consumer = retrying(pulsar_client, topic, message_listener=listener)
    pulsar_client.create_producer(topic).send(b"l")
    assert wait_for(lambda: got, 15)
    message, arrived = got[0]
    assert isinstance(message, RetryMessage) and message.topic_name() == topic
    assert arrived >= due_time_ms(message)
    consumer.close()


@pytest.mark.asyncio
async def test_asyncio_consumer_reconsumes_and_never_hands_over_early(session_broker):
    client = pulsar.asyncio.Client(session_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/aio-retry-{uuid.uuid4().hex[:8]}"
    policy = pulsar.ConsumerDeadLetterPolicy(1, None, "dlq-reader")
    consumer = await pulsar_nack.asyncio.subscribe(
        client, topic, "sub", consumer_type=SHARED, initial_position=EARLIEST, retry_enable=True, dead_letter_policy=policy
    )
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(4):
        await producer.send(str(i).encode(), properties={"i": str(i)})
    for _ in range(4):
        message = await asyncio.wait_for(consumer.receive(), 15)
        assert not isinstance(message, RetryMessage), f"a retry copy handed over {due_time_ms(message) - now_ms()} ms early"
        await consumer.reconsume_later(message, 1_000)
    copies = []
    for _ in range(4):
        copy = await asyncio.wait_for(consumer.receive(), 15)
        assert isinstance(copy, RetryMessage) and copy.topic_name() == topic
        assert now_ms() >= due_time_ms(copy), f"handed over {due_time_ms(copy) - now_ms()} ms before due"
        assert copy.properties()[RECONSUMETIMES] == "1" and copy.properties()["i"] == copy.data().decode()
        copies.append(copy)
    await asyncio.gather(*(consumer.reconsume_later(c, 0) for c in copies))  # max 1: these go to the DLQ
    stats = consumer.stats()
    assert stats["reconsumed"] == 4 and stats["retry_dead_lettered"] == 4
    await consumer.close()
    dlq = await client.subscribe(f"{topic}-sub-DLQ", "dlq-reader")
    letters = sorted([(await asyncio.wait_for(dlq.receive(), 15)).data() for _ in range(4)])
    assert letters == [b"0", b"1", b"2", b"3"]
    await dlq.close()
    await client.close()


def test_reconsume_later_async_acks_once_the_copy_is_stored(pulsar_client, topic):
    consumer = retrying(pulsar_client, topic)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(str(i).encode())
    futures = [consumer.reconsume_later_async(receive(consumer), 300) for _ in range(20)]
    assert all(f.result(timeout=30) == "retry" for f in futures)
    assert consumer.stats()["reconsumed"] == 20 and consumer.stats()["acked"] == 20
    copies = sorted(int(receive(consumer).data()) for _ in range(20))
    assert copies == list(range(20))
    consumer.close()


def test_retries_held_by_the_consumer_are_batched_never_early_and_plain_consumers_get_them_at_once(pulsar_client, topic):
    """``retry_hold_ms``: copies go out batched without a delivery time and the consumer holds them until due.

    Sent 2 ms apart, several copies share a batch, and a batch carries its first message's
    publish time: each copy is due at its own :data:`DELIVER_AT_TIME` (the reconsume's time +
    its delay), which is what is checked here, against the clock read before each call. An
    observer (a plain consumer, as Java's would be) under a second subscription of the
    retry topic gets every copy at once: why this is not the default.
    """
    observed: dict[int, int] = {}  # copy -> DELIVER_AT_TIME - arrival at the observer

    def observe(reader: Any, copy: pulsar.Message) -> None:
        observed[int(copy.data())] = int(copy.properties()[DELIVER_AT_TIME]) - now_ms()
        reader.acknowledge(copy)

    observer = pulsar_client.subscribe(
        f"{topic}-sub-RETRY", "observer", consumer_type=SHARED, initial_position=EARLIEST, message_listener=observe
    )
    consumer = retrying(pulsar_client, topic, retry_hold_ms=2_000)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    delays = [300, 600, 900] * 20
    for i in range(len(delays)):
        producer.send(str(i).encode())
    dues: dict[int, int] = {}
    for _ in delays:
        message = receive(consumer)
        index = int(message.data())
        dues[index] = now_ms() + delays[index]
        consumer.reconsume_later_async(message, delays[index])
        time.sleep(0.002)
    lateness: dict[int, int] = {}
    batched = 0
    while len(lateness) < len(delays):
        copy = receive(consumer)
        assert isinstance(copy, RetryMessage)
        index = int(copy.data())
        lateness[index] = now_ms() - dues[index]
        batched += copy.message_id().batch_index() >= 0
        assert int(copy.properties()[DELIVER_AT_TIME]) >= dues[index] and copy.properties()[DELAY_TIME] == str(delays[index])
        consumer.acknowledge(copy)
    early = {i: late for i, late in lateness.items() if late < 0}
    assert not early, f"handed over before due (ms): {early}"
    assert max(lateness.values()) < LATE_MS, lateness
    assert batched == len(delays)  # every copy came in a batch
    assert wait_for(lambda: len(observed) == len(delays), 15)
    seen_early = sum(ahead > 0 for ahead in observed.values())
    assert seen_early == len(delays), f"only {seen_early} of {len(delays)} copies reached a plain consumer before due"
    observer.close()
    consumer.close()


def test_a_held_retry_survives_its_consumer_and_is_not_early_for_the_next(pulsar_client, topic):
    consumer = retrying(pulsar_client, topic, retry_hold_ms=5_000)
    pulsar_client.create_producer(topic).send(b"later")
    called = now_ms()
    consumer.reconsume_later(receive(consumer), 2_500)
    consumer.close()  # the copy was held unacked in memory: the broker gives it to the next consumer
    successor = retrying(pulsar_client, topic, retry_hold_ms=5_000)
    copy = receive(successor)
    assert copy.data() == b"later" and now_ms() >= called + 2_500 and now_ms() >= due_time_ms(copy)
    successor.acknowledge(copy)
    successor.close()


@pytest.mark.asyncio
async def test_asyncio_consumer_holds_its_held_retries_until_due(session_broker):
    client = pulsar.asyncio.Client(session_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/aio-held-{uuid.uuid4().hex[:8]}"
    consumer = await pulsar_nack.asyncio.subscribe(
        client, topic, "sub", consumer_type=SHARED, initial_position=EARLIEST, retry_enable=True, retry_hold_ms=2_000
    )
    producer = await client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        await producer.send(str(i).encode())
    dues = {}
    for _ in range(6):
        message = await asyncio.wait_for(consumer.receive(), 15)
        assert not isinstance(message, RetryMessage)
        dues[message.data()] = now_ms() + 700
        await consumer.reconsume_later(message, 700)
    for _ in range(6):
        copy = await asyncio.wait_for(consumer.receive(), 15)
        assert isinstance(copy, RetryMessage) and DELIVER_AT_TIME in copy.properties()
        assert now_ms() >= dues[copy.data()], f"handed over {dues[copy.data()] - now_ms()} ms before due"
        await consumer.acknowledge(copy)
    await consumer.close()
    await client.close()


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "failed"])
@pytest.mark.parametrize("times", [0, 1], ids=["original", "retry-copy"])
def test_a_copy_a_reconnect_brings_while_its_reconsume_is_on_its_way_is_kept_until_it_settles(
    pulsar_client: Any, topic: str, monkeypatch: Any, stored: bool, times: int
) -> None:
    """The chaos CI run's duplicate (a retry copy delivered again 80 ms after it was reconsumed, 9 s after a broker
    kill, then two chains of retries): the broker redelivers an unacknowledged message when the connection drops,
    and a reconsume acknowledges its message only once the retry copy is stored.

    The test holds the retry producer (a stand-in for a slow store: ``RetryLetter._producer`` waits for the test)
    and has the broker redeliver the unacknowledged message (``redeliver_unacknowledged_messages``, as a reconnect
    does). The plain client, as control, delivers that copy; ours keeps it while the reconsume is on its way, then
    the reconsume's acknowledgement settles it (``stored``), or, when the reconsume fails, it is delivered again.
    ``retry-copy``: the message reconsumed is itself a retry copy (read by the retry topic's consumer).
    """
    import concurrent.futures

    from pulsar_nack.consumer.retry import RetryLetter

    plain = pulsar_client.subscribe(topic, "control", consumer_type=SHARED, initial_position=EARLIEST)
    consumer = retrying(pulsar_client, topic)
    pulsar_client.create_producer(topic).send(b"once")
    control = plain.receive(15_000)
    plain.redeliver_unacknowledged_messages()
    assert plain.receive(15_000).message_id() == control.message_id(), "the plain client delivers the copy"
    plain.close()

    gate: concurrent.futures.Future[None] = concurrent.futures.Future()
    real = RetryLetter._producer

    def held(letter: RetryLetter, batched: bool = False) -> concurrent.futures.Future[Any]:
        producer: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def release(opened: concurrent.futures.Future[None]) -> None:
            if opened.exception() is not None:
                producer.set_exception(opened.exception())  # type: ignore[arg-type]
                return
            real(letter, batched).add_done_callback(lambda done: producer.set_result(done.result()))

        gate.add_done_callback(release)
        return producer

    message = receive(consumer)
    for _ in range(times):  # reconsumed before the test holds the producer: the message is now a retry copy
        consumer.reconsume_later(message, 0)
        message = receive(consumer)
    monkeypatch.setattr(RetryLetter, "_producer", held)
    outcome = consumer.reconsume_later_async(message, 500)
    consumer.redeliver_unacknowledged_messages()
    with pytest.raises(pulsar.Timeout):
        consumer.receive(2_000)  # the copy came (the control's did within this time) and is kept
    if stored:
        gate.set_result(None)
        assert outcome.result(timeout=30) == "retry"
        retried = receive(consumer)
        assert retried.data() == b"once" and retried.properties()[RECONSUMETIMES] == str(times + 1)
        consumer.acknowledge(retried)
    else:
        gate.set_exception(pulsar.ProducerBusy("held by the test"))
        with pytest.raises(pulsar.ProducerBusy):
            outcome.result(timeout=30)
        again = receive(consumer)
        assert again.message_id() == message.message_id() and again.properties().get(RECONSUMETIMES) == message.properties().get(RECONSUMETIMES)
        consumer.acknowledge(again)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(1_500)  # nothing more: one life of the message
    consumer.close()


@pytest.mark.asyncio
async def test_asyncio_a_copy_kept_while_its_reconsume_was_on_its_way_comes_back_when_it_fails(
    session_broker: Any, monkeypatch: Any
) -> None:
    """The asyncio consumer's receive keeps the copy as the blocking one does (test above), and its redelivery
    after the failed reconsume goes through the ``_pulsar.Consumer`` inside ``pulsar.asyncio``'s."""
    import concurrent.futures

    from pulsar_nack.consumer.retry import RetryLetter

    gate: concurrent.futures.Future[Any] = concurrent.futures.Future()
    monkeypatch.setattr(RetryLetter, "_producer", lambda letter, batched=False: gate)  # held, then failed, by the test
    client = pulsar.asyncio.Client(session_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/aio-in-flight-{uuid.uuid4().hex[:8]}"
    consumer = await pulsar_nack.asyncio.subscribe(
        client, topic, "sub", consumer_type=SHARED, initial_position=EARLIEST, retry_enable=True
    )
    producer = await client.create_producer(topic, batching_enabled=False)
    await producer.send(b"once")
    message = await asyncio.wait_for(consumer.receive(), 15)
    reconsume = asyncio.ensure_future(consumer.reconsume_later(message, 500))
    consumer.redeliver_unacknowledged_messages()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(consumer.receive(), 2)  # the copy came and is kept
    gate.set_exception(pulsar.ProducerBusy("held by the test"))
    with pytest.raises(pulsar.ProducerBusy):
        await reconsume
    again = await asyncio.wait_for(consumer.receive(), 15)
    assert again.message_id() == message.message_id()
    await consumer.acknowledge(again)
    await consumer.close()
    await client.close()


HELD_COPIES = 40


def _reconsume_then_record(
    consumer: Any, name: str, delay_ms: int, dues: dict[bytes, int], seen: list[Any], stop: threading.Event
) -> None:
    """One consumer's loop: reconsume each first delivery for *delay_ms*; record and ack each retry copy."""
    while not stop.is_set():
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        if isinstance(message, RetryMessage):
            seen.append((message.data(), name, now_ms()))
            consumer.acknowledge(message)
        else:
            dues[message.data()] = now_ms() + delay_ms
            consumer.reconsume_later_async(message, delay_ms)


def test_a_copy_held_in_memory_is_not_delivered_by_two_consumers_when_the_retry_topic_moves(apache_broker: Any) -> None:
    """The chaos CI runs' open shape: two consumers of one subscription hold their retry copies in memory
    (``retry_hold_ms``), unacknowledged; the retry topic is unloaded, so both reconnect and the broker sends each
    consumer's unacknowledged copies again, some to the other consumer. A copy kept from before the reconnect must
    not go out beside the broker's new one (as the client's receive queue, which it clears on a reconnect): each
    copy is delivered once, never before its due time. The control, with the broker holding the delays, follows."""
    client = quiet_client(apache_broker.url)
    topic = f"persistent://public/default/held-move-{uuid.uuid4().hex[:8]}"
    consumers = [retrying(client, topic, retry_hold_ms=10_000, consumer_name=f"c{i}") for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(HELD_COPIES):
        producer.send(str(i).encode())
    dues: dict[bytes, int] = {}
    seen: list[Any] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_reconsume_then_record, args=(c, f"c{i}", 4_000, dues, seen, stop))
        for i, c in enumerate(consumers)
    ]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: sum(c.stats()["held"] for c in consumers) >= HELD_COPIES, 20), "copies not held"
        assert not seen, "a copy went out before its 4 s delay"
        apache_broker.admin.request("PUT", f"{topic_path(f'{topic}-sub-RETRY')}/unload")
        assert wait_for(lambda: len({data for data, _, _ in seen}) == HELD_COPIES, 30), f"{len(seen)} delivered"
        # a second delivery of a copy comes when the copy falls due, as the first: wait past the last due
        assert wait_for(lambda: now_ms() > max(dues.values()) + 2_000, 10)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    counts = Counter(data for data, _, _ in seen)
    twice = {data: [(name, at) for d, name, at in seen if d == data] for data, n in counts.items() if n > 1}
    assert not twice, f"delivered more than once: {twice}"
    early = {data: dues[data] - at for data, _, at in seen if at < dues[data]}
    assert not early, f"ms before due: {early}"
    for consumer in consumers:
        consumer.close()
    client.close()


def test_control_the_plain_client_delivers_a_delayed_message_once_when_its_topic_moves(apache_broker: Any) -> None:
    """The control of the test above: plain consumers of one subscription, the broker holding the delays
    (``deliver_after``, as retry copies without ``retry_hold_ms``), the topic unloaded meanwhile."""
    client = quiet_client(apache_broker.url)
    topic = f"persistent://public/default/delayed-move-{uuid.uuid4().hex[:8]}"
    seen: list[bytes] = []

    def record(consumer: Any, message: Any) -> None:
        seen.append(message.data())
        consumer.acknowledge(message)

    consumers = [client.subscribe(topic, "sub", consumer_type=SHARED, message_listener=record) for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(HELD_COPIES):
        producer.send(str(i).encode(), deliver_after=datetime.timedelta(milliseconds=4_000))
    sent = now_ms()
    apache_broker.admin.request("PUT", f"{topic_path(topic)}/unload")
    assert wait_for(lambda: len(set(seen)) == HELD_COPIES, 30), f"{len(seen)} delivered"
    assert wait_for(lambda: now_ms() > sent + 4_000 + 2_000, 10)
    assert sorted(Counter(seen).values()) == [1] * HELD_COPIES
    for consumer in consumers:
        consumer.close()
    client.close()
