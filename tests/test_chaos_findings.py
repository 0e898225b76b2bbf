"""Regression tests for what the chaos runs found (bench/chaos.py, docs/benchmarks.md "Chaos and soak").

Each test reproduces one violation of a documented promise outside the chaos harness, on
the session's Apache Pulsar standalone, with the plain client as the control where the
promise is "as the plain client does". A test of a violation that is not fixed yet is a
strict xfail: it fails while the bug is there, and turns into an XPASS (a failure) once it
is fixed, so that the mark gets removed.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import pulsar_nack
from pulsar_nack.testing import quiet_client
from pulsar_nack.testing.waits import wait_until

MAX_REDELIVER = 2
MESSAGES = 40


def _consumers(kind: str, client: Any, topic: str, dlq: str) -> list[Any]:
    import pulsar

    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=MAX_REDELIVER, dead_letter_topic=dlq,
                                             initial_subscription_name="check")  # fmt: skip
    options = {"consumer_type": pulsar.ConsumerType.Shared, "dead_letter_policy": policy,
               "negative_ack_redelivery_delay_ms": 100}  # fmt: skip
    subscribe = client.subscribe if kind == "plain" else lambda *a, **k: pulsar_nack.subscribe(client, *a, **k)
    return [subscribe(topic, "two", consumer_name=f"c{i}", **options) for i in range(2)]


@pytest.mark.broker
@pytest.mark.parametrize(
    "kind",
    [
        "plain",
        pytest.param("ours", marks=pytest.mark.xfail(strict=True, reason=(
            "each consumer's tally counts only its own deliveries, so on a subscription with two consumers a message "
            "is dead-lettered after more than max_redeliver_count + 1 deliveries (found by bench.chaos, seed 11)"))),
    ],
)  # fmt: skip
def test_two_consumers_on_one_shared_subscription_dead_letter_at_the_count(apache_broker: Any, topic: str, kind: str) -> None:
    """Every message nacked at every delivery, by whichever of two consumers gets it: each goes to the
    dead-letter topic after exactly max_redeliver_count + 1 deliveries in all, as with the plain client."""
    import pulsar

    client = quiet_client(apache_broker.url)
    dlq = f"{topic}-DLQ"
    deliveries: Counter[bytes] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        reader = client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest,
                                  consumer_type=pulsar.ConsumerType.Shared)  # the dead-letter sender subscribes too
        consumers = _consumers(kind, client, topic, dlq)

        def pump(consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                with lock:
                    deliveries[message.data()] += 1
                consumer.negative_acknowledge(message)

        threads += [threading.Thread(target=pump, args=(c,), daemon=True) for c in consumers]
        for thread in threads:
            thread.start()
        producer = client.create_producer(topic, batching_enabled=False)
        payloads = [f"m{i:03d}".encode() for i in range(MESSAGES)]
        for payload in payloads:
            producer.send(payload)
        dead: set[bytes] = set()

        def all_dead() -> bool:
            try:
                message = reader.receive(200)
            except pulsar.Timeout:
                return False
            dead.add(message.data())
            reader.acknowledge(message)
            return len(dead) == MESSAGES

        assert wait_until(all_dead, 90), f"{len(dead)} of {MESSAGES} dead-lettered"
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
    wrong = {p.decode(): n for p in payloads if (n := deliveries[p]) != MAX_REDELIVER + 1}
    assert not wrong, f"deliveries before the dead letter (expected {MAX_REDELIVER + 1}): {wrong}"


COPIES = 30


@pytest.mark.broker
@pytest.mark.parametrize(
    "hold_ms",
    [
        pytest.param(0, id="copies-held-by-the-broker"),
        pytest.param(5_000, id="copies-held-by-the-consumer", marks=pytest.mark.xfail(strict=True, reason=(
            "a copy the consumer holds (retry_hold_ms) is unacked, so a reconnect of the retry topic's consumer "
            "brings it again, and the consumer holds and delivers it a second time (found by bench.chaos, seed 12)"))),
    ],
)  # fmt: skip
def test_a_retry_copy_is_delivered_once_across_a_retry_topic_unload(apache_broker: Any, topic: str, hold_ms: int) -> None:
    """30 retries pending (due 3 s later) when the retry topic is unloaded: each copy reaches the application
    once, whether the broker holds it until due or the consumer does (``retry_hold_ms``)."""
    import pulsar

    client = quiet_client(apache_broker.url)
    seen: Counter[tuple[bytes, int]] = Counter()
    try:
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared, retry_enable=True,
                                         retry_hold_ms=hold_ms)  # fmt: skip
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(COPIES):
            producer.send(f"r{i:02d}".encode())
        for _ in range(COPIES):
            consumer.reconsume_later(consumer.receive(10_000), 3_000)
        apache_broker.admin.unload_topic(f"{topic}-s-RETRY")  # every copy pending, some held in the consumer
        while True:
            try:
                message = consumer.receive(5_000)  # a second copy would come within the retry's 3 s
            except pulsar.Timeout:
                break
            seen[(message.data(), message.redelivery_count())] += 1
            consumer.acknowledge(message)
        consumer.close()
    finally:
        client.close()
    assert len(seen) == COPIES, f"{len(seen)} of {COPIES} copies came back"
    twice = {f"{p.decode()} rc {rc}": n for (p, rc), n in seen.items() if n > 1}
    assert not twice, f"retry copies delivered more than once: {twice}"
