"""NackingConsumer against Apache Pulsar standalone and the real client.

Each test has its own topic; waits are conditions with deadlines. Bounds are generous:
these tests check behaviour, the benchmarks measure timing.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import uuid

import _pulsar
import pulsar
import pytest

import pulsar_nack
from helpers import out_of_batch_id, wait_for
from pulsar_nack import MultiplierRedeliveryBackoff, NackingConsumer
from pulsar_nack.consumer import ConsumerSettings
from pulsar_nack.consumer.msgid import Gate
from pulsar_nack.consumer.nacking import START_GUARD_MESSAGES
from pulsar_nack.errors import ConsumerClosedError
from pulsar_nack.testing import PulsarStandalone, quiet_client

pytestmark = pytest.mark.broker

SHARED = pulsar.ConsumerType.Shared
BUCKET_MS = 256  # default precision: 8 bits
SLACK_MS = 25  # clock reads on two threads, scheduling


def produce(client, topic: str, n: int, *, batched: bool = False, batch_size: int = 10) -> None:
    if batched:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=batch_size, batching_max_publish_delay_ms=50
        )
        for i in range(n):
            producer.send_async(str(i).encode(), None)
        producer.flush()
    else:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send(str(i).encode())
    producer.close()


def key(message) -> tuple:
    mid = message.message_id()
    return (message.topic_name(), mid.ledger_id(), mid.entry_id(), mid.batch_index())


def receive_until(consumer, predicate, timeout_s: float, on_message) -> None:
    """Receive and hand each message to *on_message* until *predicate()* or timeout."""
    end = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < end:
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            continue
        on_message(message, time.monotonic())


def assert_nothing_more(consumer, wait_ms: int = 800) -> None:
    with pytest.raises(pulsar.Timeout):
        message = consumer.receive(wait_ms)
        pytest.fail(f"unexpected message {key(message)} redelivery_count={message.redelivery_count()}")


def test_each_message_comes_back_once_at_its_own_delay(pulsar_client, topic):
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    produce(pulsar_client, topic, 200)
    nacked: dict = {}
    books_at_start = consumer.stats()["memory_bytes"]
    for i in range(200):
        message = consumer.receive(10_000)
        delay = 200 + i * 14  # 0.2 s .. 3 s
        nacked[key(message)] = (time.monotonic(), delay)
        consumer.negative_acknowledge(message, delay_ms=delay)
    books_with_nacks = consumer.stats()["memory_bytes"]
    assert books_with_nacks > books_at_start  # the pending set holds the 200 nacks
    arrivals: dict = {}

    def record(message, at):
        k = key(message)
        assert k not in arrivals, f"{k} came back twice"
        arrivals[k] = at
        consumer.acknowledge(message)

    receive_until(consumer, lambda: len(arrivals) == 200, 20, record)
    assert set(arrivals) == set(nacked)
    for k, at in arrivals.items():
        start, delay = nacked[k]
        elapsed_ms = (at - start) * 1000
        assert elapsed_ms >= delay - BUCKET_MS - SLACK_MS, (k, elapsed_ms, delay)
        assert elapsed_ms <= delay + 1000, (k, elapsed_ms, delay)
    assert_nothing_more(consumer)
    stats = consumer.stats()
    assert stats["nacked"] == 200 and stats["tracker"]["pending_messages"] == 0
    consumer.close()


def paced_producer(client, topic: str, n: int, interval_s: float) -> threading.Thread:
    """Send *n* messages, one every *interval_s*, from a thread (a steady stream)."""

    def run() -> None:
        producer = client.create_producer(topic, batching_enabled=False)
        next_send = time.monotonic()
        for i in range(n):
            delay = next_send - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the workload's pace, not a wait for a condition
            producer.send(str(i).encode())
            next_send += interval_s
        producer.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_steady_nack_stream_keeps_redelivering(pulsar_client, topic):
    """One nack every 20 ms for 5 s at 500 ms delay: redeliveries flow during the stream."""
    consumer = pulsar_nack.subscribe(
        pulsar_client, topic, "s", consumer_type=SHARED, negative_ack_redelivery_delay_ms=500
    )
    start = time.monotonic()
    producer = paced_producer(pulsar_client, topic, 250, 0.020)
    nack_times: dict = {}
    returned: dict = {}

    def handle(message, at):
        if message.redelivery_count() > 0:
            returned[key(message)] = at
            consumer.acknowledge(message)
        else:
            nack_times[key(message)] = at
            consumer.negative_acknowledge(message)  # the handler failed

    receive_until(consumer, lambda: len(returned) == 250, 30, handle)
    producer.join(10)
    stream_end = max(nack_times.values())
    assert len(nack_times) == 250 and stream_end - start >= 4.5
    assert set(returned) == set(nack_times)
    during = [k for k, at in returned.items() if at < stream_end]
    # Nacks made before stream_end - 0.5 s are due during the stream: ~225 of them.
    assert len(during) >= 150, f"only {len(during)} redeliveries during the stream: starved"
    late = [(returned[k] - nack_times[k]) * 1000 - 500 for k in returned]
    assert max(late) < 1000
    consumer.close()


@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover, SHARED,
                                           pulsar.ConsumerType.KeyShared], ids=lambda t: t.name)  # fmt: skip
def test_batch_siblings_retry_by_the_subscriptions_rule(pulsar_client, topic, consumer_type):
    """Members 2 and 7 of one entry nacked for 300 ms and 1.5 s, the rest acked. With one active consumer
    (Exclusive, Failover) each comes back at its own time; on Shared and Key_Shared, where another consumer
    may get the entry, both come back when the last is due (docs/consumer.md, "Batches")."""
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=consumer_type)
    produce(pulsar_client, topic, 10, batched=True)
    messages = [consumer.receive(10_000) for _ in range(10)]
    assert len({key(m)[:3] for m in messages}) == 1 and sorted(key(m)[3] for m in messages) == list(range(10))
    start = time.monotonic()
    for m in messages:
        index = key(m)[3]
        if index == 2:
            consumer.negative_acknowledge(m, delay_ms=300)
        elif index == 7:
            consumer.negative_acknowledge(m, delay_ms=1500)
        else:
            consumer.acknowledge(m)
    arrivals: list = []

    def record(message, at):
        arrivals.append((key(message)[3], (at - start) * 1000))
        consumer.acknowledge(message)

    receive_until(consumer, lambda: len(arrivals) >= 2, 10, record)
    assert_nothing_more(consumer, 1000)
    assert [index for index, _ in arrivals] == [2, 7], arrivals
    (_, at2), (_, at7) = arrivals
    own_times = consumer_type in (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)
    due2 = 300 if own_times else 1500
    assert due2 - BUCKET_MS - SLACK_MS <= at2 <= due2 + 700
    assert 1500 - BUCKET_MS - SLACK_MS <= at7 <= 1500 + 700
    # The broker's ack set (batch-index acks) drops the acked siblings from each copy; with
    # their own times, the copy that brings index 2 also brings index 7, still pending: that
    # one is swallowed. When the last is due, one copy brings both.
    assert consumer.stats()["swallowed"] == (1 if own_times else 0)
    consumer.close()
    # The entry was settled as a whole: nothing comes back to a new consumer.
    again = pulsar_client.subscribe(topic, "s", consumer_type=consumer_type)
    assert_nothing_more(again, 1000)
    again.close()


def test_handler_failing_three_times_backs_off_exponentially(pulsar_client, topic):
    backoff = MultiplierRedeliveryBackoff(min_delay_ms=300, max_delay_ms=10_000, multiplier=2)
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED, redelivery_backoff=backoff)
    produce(pulsar_client, topic, 1)
    deliveries: list = []

    def handle(message, at):
        deliveries.append((at, message.redelivery_count()))
        if len(deliveries) <= 3:
            consumer.negative_acknowledge(message)  # the handler failed
        else:
            consumer.acknowledge(message)

    receive_until(consumer, lambda: len(deliveries) >= 4, 15, handle)
    assert [count for _, count in deliveries] == [0, 1, 2, 3]
    gaps = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(deliveries)]
    for gap, expected in zip(gaps, (300, 600, 1200)):
        assert expected - BUCKET_MS - SLACK_MS <= gap <= expected + 700, (gaps, expected)
    assert_nothing_more(consumer)
    consumer.close()


@pytest.mark.all_brokers
def test_multi_topic_consumer_redelivers_on_the_right_topic(pulsar_client, topic):
    other = topic + "-other"
    consumer = pulsar_nack.subscribe(pulsar_client, [topic, other], "s", consumer_type=SHARED)
    produce(pulsar_client, topic, 3)
    produce(pulsar_client, other, 3)
    first = [consumer.receive(10_000) for _ in range(6)]
    for m in first:
        consumer.negative_acknowledge(m, delay_ms=300)
    back: list = []

    def record(message, at):
        back.append(key(message))
        consumer.acknowledge(message)

    receive_until(consumer, lambda: len(back) >= 6, 10, record)
    assert sorted(back) == sorted(key(m) for m in first)
    assert {k[0] for k in back} == {topic, other}
    assert_nothing_more(consumer)
    consumer.close()


def test_dead_letter_policy_routes_after_max_redeliveries(pulsar_client, topic):
    consumer = pulsar_nack.subscribe(
        pulsar_client,
        topic,
        "s",
        consumer_type=SHARED,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2),
    )
    dlq = pulsar_client.subscribe(f"{topic}-s-DLQ", "dlq", initial_position=pulsar.InitialPosition.Earliest)
    produce(pulsar_client, topic, 1)
    counts: list = []
    receive_until(
        consumer,
        lambda: len(counts) >= 3,
        10,
        lambda m, at: (counts.append(m.redelivery_count()), consumer.negative_acknowledge(m)),
    )
    assert counts == [0, 1, 2]
    dead = dlq.receive(15_000)
    assert dead.data() == b"0"
    dlq.acknowledge(dead)
    assert_nothing_more(consumer, 1000)
    consumer.close()
    dlq.close()


@pytest.mark.all_brokers
@pytest.mark.parametrize("redeliver_pending", [True, False])
def test_closing_one_of_two_consumers_with_pending_nacks_loses_nothing(pulsar_client, topic, redeliver_pending):
    first = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED, receiver_queue_size=5)
    second = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED, receiver_queue_size=5)
    produce(pulsar_client, topic, 20)
    done: set = set()
    for _ in range(3):
        m = first.receive(10_000)
        first.negative_acknowledge(m, delay_ms=3_600_000)  # far in the future
    assert len(first.tracker) == 3
    first.close(redeliver_pending=redeliver_pending)

    def record(message, at):
        done.add(message.data())
        second.acknowledge(message)

    receive_until(second, lambda: len(done) == 20, 20, record)
    assert done == {str(i).encode() for i in range(20)}
    second.close()


def test_broker_restart_with_pending_nacks_loses_nothing(tmp_path):
    with PulsarStandalone(tmp_path / "broker", batch_index_ack=True) as broker:
        client = quiet_client(broker.url, operation_timeout_seconds=10)
        topic = f"persistent://public/default/restart-{uuid.uuid4().hex[:8]}"
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
        produce(client, topic, 50)
        for _ in range(50):
            consumer.negative_acknowledge(consumer.receive(10_000), delay_ms=1500)
        assert len(consumer.tracker) == 50
        broker.restart()
        acked: dict = {}

        def record(message, at):
            acked[message.data()] = acked.get(message.data(), 0) + 1
            consumer.acknowledge(message)

        receive_until(consumer, lambda: len(acked) == 50 and not len(consumer.tracker), 30, record)
        assert set(acked) == {str(i).encode() for i in range(50)}
        # Drain any late duplicates, then prove the subscription is empty.
        receive_until(consumer, lambda: False, 1.5, record)
        consumer.close()
        check = client.subscribe(topic, "s", consumer_type=SHARED)
        assert_nothing_more(check, 1500)
        client.close()


@pytest.mark.all_brokers
def test_message_listener_gets_the_wrapper_and_retries(pulsar_client, topic):
    seen: list = []

    def listener(consumer, message):
        assert isinstance(consumer, NackingConsumer)
        seen.append(message.redelivery_count())
        if message.redelivery_count() == 0:
            consumer.negative_acknowledge(message, delay_ms=200)
        else:
            consumer.acknowledge(message)

    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED, message_listener=listener)
    produce(pulsar_client, topic, 5)
    assert wait_for(lambda: len(seen) >= 10, 15)
    assert sorted(seen) == [0] * 5 + [1] * 5
    consumer.close()


def test_bad_input_gives_clear_errors_and_changes_nothing(pulsar_client, topic):
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    produce(pulsar_client, topic, 1)
    produce(pulsar_client, topic, 4, batched=True, batch_size=4)
    plain = consumer.receive(10_000)
    batch = [consumer.receive(10_000) for _ in range(4)]
    consumer.negative_acknowledge(batch[0], delay_ms=60_000)
    before = (len(consumer.tracker), consumer.stats()["nacked"])

    for bad, error in [("id", TypeError), (42, TypeError), (None, TypeError), (key(plain), TypeError)]:
        with pytest.raises(error):
            consumer.negative_acknowledge(bad)
        with pytest.raises(error):
            consumer.acknowledge(bad)
    with pytest.raises(TypeError):
        consumer.negative_acknowledge(plain, delay_ms="5")
    with pytest.raises(ValueError):
        consumer.negative_acknowledge(plain, delay_ms=-1)
    with pytest.raises(ValueError, match="NACKED"):
        consumer.negative_acknowledge(batch[0])  # already pending
    consumer.acknowledge(batch[1])
    # A batch index outside its batch (an id deserialized with batch_size 4, index 50).
    outside = out_of_batch_id(batch[1].message_id(), 50)
    for call in (consumer.negative_acknowledge, consumer.acknowledge, consumer.acknowledge_cumulative):
        with pytest.raises(ValueError, match="outside its batch"):
            call(outside)
    other_topic = topic + "-foreign"
    foreign_consumer = pulsar_client.subscribe(other_topic, "s", consumer_type=SHARED)
    produce(pulsar_client, other_topic, 1)
    foreign = foreign_consumer.receive(10_000)
    with pytest.raises(ValueError, match="does not belong"):
        consumer.negative_acknowledge(foreign)
    assert (len(consumer.tracker), consumer.stats()["nacked"]) == before

    # The wrapped pulsar.MessageId works too.
    consumer.negative_acknowledge(pulsar.MessageId.wrap(plain.message_id()), delay_ms=60_000)
    assert len(consumer.tracker) == before[0] + 1
    consumer.close(redeliver_pending=False)
    for call in (
        lambda: consumer.receive(10),
        lambda: consumer.negative_acknowledge(plain),
        lambda: consumer.acknowledge(plain),
    ):
        with pytest.raises(ConsumerClosedError):
            call()
    consumer.close()  # idempotent
    foreign_consumer.close()


def test_a_quiet_consumer_refuses_receive_and_ack_once_closed(pulsar_client, topic):
    """After ``START_GUARD_MESSAGES`` deliveries with no nack the consumer is quiet: receive and
    acknowledge take the common path, built once per consumer. Closing routes them to the
    checks again, so they raise ``ConsumerClosedError`` as before, not the client's error."""
    n = START_GUARD_MESSAGES + 10
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    produce(pulsar_client, topic, n)
    messages = [consumer.receive(10_000) for _ in range(n)]
    for message in messages[:-1]:
        consumer.acknowledge(message)
    consumer.close()
    for call in (lambda: consumer.receive(10), lambda: consumer.acknowledge(messages[-1])):
        with pytest.raises(ConsumerClosedError):
            call()
    assert consumer.stats()["acked"] == n - 1


needs_gate = pytest.mark.skipif(Gate is None, reason="the C reader is not built (pure Python)")


def _spy_on_the_python_paths(monkeypatch, consumer) -> collections.Counter:
    """Count the copies screened in Python and the acks sent from Python (where the gate did not decide)."""
    calls: collections.Counter = collections.Counter()
    original = NackingConsumer._screen

    def screen(self, *args):
        calls["screened in Python"] += 1
        return original(self, *args)

    def acknowledge_raw(raw, _original=consumer._acknowledge_raw):
        calls["acked from Python"] += 1
        return _original(raw)

    def acknowledge_guarded(message, _original=consumer._acknowledge_guarded):
        calls["acked on the guarded path"] += 1
        return _original(message)

    monkeypatch.setattr(NackingConsumer, "_screen", screen)
    monkeypatch.setattr(consumer, "_acknowledge_raw", acknowledge_raw)
    monkeypatch.setattr(consumer, "_acknowledge_guarded", acknowledge_guarded)
    return calls


@needs_gate
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_guarded_receive_and_ack_of_entries_without_nack_state_are_decided_in_c(pulsar_client, topic, monkeypatch, batched):
    """With a nack pending the consumer guards: every copy is screened and every ack recorded.
    A copy of an entry above every nacked one, and its ack, are the gate's (one C call each):
    the Python paths see none of them, and the counters still count every one."""
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    calls = _spy_on_the_python_paths(monkeypatch, consumer)
    produce(pulsar_client, topic, 10, batched=batched)
    nacked = consumer.receive(10_000)
    consumer.negative_acknowledge(nacked, delay_ms=3_600_000)
    for _ in range(9):  # the rest of the nacked entry's batch: the Python screen's
        consumer.acknowledge(consumer.receive(10_000))
    calls.clear()
    produce(pulsar_client, topic, 40, batched=batched)
    for _ in range(40):
        consumer.acknowledge(consumer.receive(10_000))
    assert calls == {}, f"the gate left {dict(calls)} to the Python paths"
    stats = consumer.stats()
    assert (stats["received"], stats["acked"], stats["nacked"]) == (50, 49, 1)
    assert (stats["delivered"], stats["pending_guarded"]) == (50, 1)
    consumer.close(redeliver_pending=False)


@needs_gate
def test_a_copy_the_gate_cannot_decide_is_screened_in_python(pulsar_client, topic, monkeypatch):
    """The copy of a nacked message that comes back is of a watched entry: the gate holds it
    for the Python screen, which delivers it once (its nack is handed off), not a copy more."""
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    calls = _spy_on_the_python_paths(monkeypatch, consumer)
    produce(pulsar_client, topic, 1)
    first = consumer.receive(10_000)
    consumer.negative_acknowledge(first, delay_ms=200)
    back = consumer.receive(10_000)
    assert (back.message_id().ledger_id(), back.message_id().entry_id()) == (
        first.message_id().ledger_id(), first.message_id().entry_id())
    assert calls["screened in Python"] == 1
    consumer.acknowledge(back)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(1_000)
    assert consumer.stats()["acked"] == 1
    consumer.close()


@needs_gate
@pytest.mark.all_brokers
def test_the_ack_that_completes_an_entry_with_a_nacked_member_is_the_gates(session_broker, topic, monkeypatch):
    """In batches of 10 with one member nacked each, the ack of the last member acked completes
    its entry: the gate records it with the ledger's one step (no Python ack path), and the
    ledger's books stay right: each nacked member comes back once, no acked sibling comes back
    (with batch-index acks and without: the broker then sends the whole entry again)."""
    client = quiet_client(session_broker.url)
    try:
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=SHARED)
        calls = _spy_on_the_python_paths(monkeypatch, consumer)
        produce(client, topic, 30, batched=True)
        nacked = set()
        for _ in range(30):
            message = consumer.receive(10_000)
            if message.message_id().batch_index() == 3:
                consumer.negative_acknowledge(message, delay_ms=300)
                nacked.add(message.data())
            else:
                consumer.acknowledge(message)
        assert len(nacked) == 3, "the producer did not send batches of 10"
        assert calls["acked on the guarded path"] == 0, f"the gate left {dict(calls)} to the Python paths"
        back = [consumer.receive(10_000) for _ in range(3)]
        assert {m.data() for m in back} == nacked
        for message in back:
            consumer.acknowledge(message)
        with pytest.raises(pulsar.Timeout):  # no acked sibling comes back
            consumer.receive(1_500)
        assert consumer.stats()["acked"] == 30
        consumer.close()
    finally:
        client.close()


@pytest.mark.parametrize("guarding", [False, True], ids=["quiet", "guarding"])
def test_receive_refuses_a_bad_timeout_by_name_and_receives_nothing(pulsar_client, topic, guarding):
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=SHARED)
    produce(pulsar_client, topic, START_GUARD_MESSAGES + 2)
    if not guarding:  # past the guard at the start, nothing nacked: quiet
        for _ in range(START_GUARD_MESSAGES + 1):
            consumer.acknowledge(consumer.receive(10_000))
    for bad, error in ((-1, ValueError), ("10", TypeError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="timeout_millis"):
            consumer.receive(bad)
    received = consumer.stats()["received"]
    last = consumer.receive(10_000)  # the next message is still there
    assert consumer.stats()["received"] == received + 1
    consumer.acknowledge(last)
    consumer.close()


def test_subscribe_rejects_bad_arguments(pulsar_client, topic):
    with pytest.raises(TypeError):
        pulsar_nack.subscribe("not a client", topic, "s")
    with pytest.raises(TypeError):
        pulsar_nack.subscribe(pulsar_client, 5, "s")
    with pytest.raises(ValueError):
        pulsar_nack.subscribe(pulsar_client, topic, "")
    with pytest.raises(ValueError):
        pulsar_nack.subscribe(pulsar_client, topic, "s", negative_ack_precision_bit_cnt=40)


def test_wrap_warns_when_the_handoff_delay_is_unknown_or_too_long(pulsar_client, topic):
    raw = pulsar_client.subscribe(topic, "s", consumer_type=SHARED, negative_ack_redelivery_delay_ms=100)
    with pytest.warns(RuntimeWarning, match="unknown"):
        wrapped = NackingConsumer.wrap(raw, [topic])
    wrapped.close()
    raw = pulsar_client.subscribe(topic, "s2", consumer_type=SHARED)
    with pytest.warns(RuntimeWarning, match="late"):
        wrapped = NackingConsumer.wrap(
            raw, [topic], ConsumerSettings(negative_ack_redelivery_delay_ms=1000), handoff_delay_ms=60_000
        )
    wrapped.close()


# ---------------------------------------------------------------------------
# Unit tests with a recording stand-in consumer: they check what the wrapper hands to
# the client, which no broker shows (the handoff ids themselves). Partitioned topics and
# Exclusive/Failover subscriptions on a real broker are in test_apache_pulsar.py.
# ---------------------------------------------------------------------------


class RecordingConsumer(pulsar.Consumer):
    """Stand-in for a subscribed consumer: records what the wrapper hands to the client."""

    def __init__(self) -> None:  # no client behind it
        self.nacked: list = []
        self.acked: list = []

    def negative_acknowledge(self, message) -> None:
        self.nacked.append(message)

    def acknowledge(self, message) -> None:
        self.acked.append(message)

    def close(self) -> None:
        pass


class StubMessage(pulsar.Message):
    def __init__(self, topic: str, message_id: _pulsar.MessageId, redelivery_count: int = 0) -> None:
        self._topic, self._id, self._count = topic, message_id, redelivery_count

    def topic_name(self) -> str:
        return self._topic

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def redelivery_count(self) -> int:
        return self._count


def test_partitioned_topic_handoff_uses_the_partition_and_one_id_per_entry():
    base = "persistent://public/default/orders"
    recorder = RecordingConsumer()
    consumer = NackingConsumer(recorder, [base])
    for partition, entry in [(3, 10), (0, 11), (3, 12)]:
        message = StubMessage(f"{base}-partition-{partition}", _pulsar.MessageId(partition, 7, entry, -1))
        consumer._admit(message)
        consumer.negative_acknowledge(message, delay_ms=0)
    assert wait_for(lambda: len(recorder.nacked) == 3, 10)
    handed = sorted((m.partition(), m.ledger_id(), m.entry_id(), m.batch_index()) for m in recorder.nacked)
    assert handed == [(0, 7, 11, -1), (3, 7, 10, -1), (3, 7, 12, -1)]
    assert all(isinstance(m, _pulsar.MessageId) for m in recorder.nacked)
    consumer.close()


def test_nacked_siblings_of_one_entry_are_handed_off_once_per_burst():
    """Two nacked indexes of one batched entry, due together, make one handoff id (the
    client redelivers whole entries). Subscription-agnostic: no subscription here."""
    topic = "persistent://public/default/one-entry"
    recorder = RecordingConsumer()
    consumer = NackingConsumer(recorder, [topic])
    messages = [StubMessage(topic, _pulsar.MessageId(-1, 5, 1, i)) for i in range(3)]
    for m in messages:
        consumer._admit(m)
    for m in messages[:2]:
        consumer.negative_acknowledge(m, delay_ms=0)
    assert wait_for(lambda: consumer.stats()["handed_off_entries"] >= 1, 10)
    assert wait_for(lambda: not len(consumer.tracker), 10)
    assert [(m.ledger_id(), m.entry_id(), m.batch_index()) for m in recorder.nacked] == [(5, 1, -1)]
    consumer.close()
