"""Our own ack timeout and ``in_progress`` (issue 33), on Apache Pulsar standalone.

With ``unacked_messages_timeout_ms`` the wrapper keeps the timeout itself. A message worked
on for three times the timeout, with ``in_progress`` calls, is not redelivered; one left
alone is redelivered at the timeout, as the plain client (the control, same timeout)
redelivers both.
"""

from __future__ import annotations

import time

import pulsar
import pytest

import pulsar_nack

pytestmark = pytest.mark.broker

TIMEOUT_MS = 10_000  # the plain client refuses less
WORK_S = 3 * TIMEOUT_MS / 1000
PROGRESS_EVERY_S = 3.0
Shared = pulsar.ConsumerType.Shared
Earliest = pulsar.InitialPosition.Earliest


def receive(consumer, timeout_ms: int):
    try:
        return consumer.receive(timeout_ms)
    except pulsar.Timeout:
        return None


def test_in_progress_keeps_a_message_past_three_timeouts_and_the_other_comes_back_at_the_timeout(pulsar_client, topic):
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for payload in (b"worked-on", b"left"):
        producer.send(payload)
    producer.close()
    ours = pulsar_nack.subscribe(pulsar_client, topic, "ours", consumer_type=Shared, initial_position=Earliest,
                                 unacked_messages_timeout_ms=TIMEOUT_MS)
    plain = pulsar_client.subscribe(topic, "plain", consumer_type=Shared, initial_position=Earliest,
                                    unacked_messages_timeout_ms=TIMEOUT_MS)
    first: dict[tuple[str, bytes], float] = {}
    held = {}
    for name, consumer in (("ours", ours), ("plain", plain)):
        for _ in range(2):
            message = receive(consumer, 10_000)
            assert message is not None
            first[(name, message.data())] = time.monotonic()
            held[(name, message.data())] = message
    back: dict[tuple[str, bytes], list[float]] = {key: [] for key in first}
    progress_calls = 0
    start = time.monotonic()
    next_progress = start + PROGRESS_EVERY_S
    while time.monotonic() - start < WORK_S:
        if time.monotonic() >= next_progress:
            assert ours.in_progress(held[("ours", b"worked-on")]), "the worked-on message was not in flight"
            progress_calls += 1
            next_progress += PROGRESS_EVERY_S
        for name, consumer in (("ours", ours), ("plain", plain)):
            message = receive(consumer, 50)
            if message is not None:
                key = (name, message.data())
                back[key].append((time.monotonic() - first[key]) * 1000)
                consumer.acknowledge(message)  # settled on its return: no second timeout
    ours.acknowledge(held[("ours", b"worked-on")])
    assert not ours.in_progress(held[("ours", b"worked-on")]), "an acked message is still in flight"
    ours.close()
    plain.close()
    assert progress_calls >= 9
    assert back[("ours", b"worked-on")] == [], "redelivered while in progress"
    # Without in_progress: back once, at the timeout (ours: its bucket rounded up, plus the handoff;
    # the plain client: within its 1 s tick).
    assert len(back[("ours", b"left")]) == 1 and TIMEOUT_MS <= back[("ours", b"left")][0] <= TIMEOUT_MS + 1_000, back
    for payload in (b"worked-on", b"left"):
        assert len(back[("plain", payload)]) == 1 and TIMEOUT_MS <= back[("plain", payload)][0] <= TIMEOUT_MS + 2_500, back


def test_in_progress_needs_an_ack_timeout(pulsar_client, topic):
    consumer = pulsar_nack.subscribe(pulsar_client, topic, "s", consumer_type=Shared)
    producer = pulsar_client.create_producer(topic)
    producer.send(b"x")
    producer.close()
    message = receive(consumer, 10_000)
    with pytest.raises(RuntimeError, match="unacked_messages_timeout_ms"):
        consumer.in_progress(message)
    with pytest.raises(TypeError):
        consumer.in_progress("x")
    consumer.acknowledge(message)
    consumer.close()
