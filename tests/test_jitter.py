"""Jitter on the backoffs: the floor, the spread, seeding, validation; on the tracker and on Apache Pulsar."""

from __future__ import annotations

import random
import statistics
import time

import pulsar
import pytest

import pulsar_nack
from helpers import FakeClock, PurePythonTracker
from pulsar_nack import FixedDelay, MultiplierRedeliveryBackoff, NegativeAcksTracker

JITTERED = [
    pytest.param(lambda rng: FixedDelay(1_000, jitter=1.0, rng=rng), id="fixed"),
    pytest.param(lambda rng: MultiplierRedeliveryBackoff(1_000, 60_000, 2, jitter=1.0, rng=rng), id="multiplier"),
]


def test_every_draw_is_between_the_floor_and_its_ceiling():
    backoff = MultiplierRedeliveryBackoff(100, 5_000, 2, jitter=0.5, rng=random.Random(3))
    plain = MultiplierRedeliveryBackoff(100, 5_000, 2)
    for count in range(12):
        floor = plain.next_delay_ms(count)
        assert backoff.floor_delay_ms(count) == floor
        draws = [backoff.next_delay_ms(count) for _ in range(500)]
        assert min(draws) >= floor, (count, min(draws), floor)
        assert max(draws) <= min(int(floor * 1.5), 5_000), (count, max(draws))
    fixed = FixedDelay(400, jitter=0.25, rng=random.Random(3))
    assert all(400 <= fixed.next_delay_ms(n) <= 500 for n in range(500))


@pytest.mark.parametrize("make", JITTERED)
def test_draws_are_uniform_over_the_spread(make):
    backoff = make(random.Random(11))
    draws = [backoff.next_delay_ms(0) for _ in range(20_000)]
    # Uniform on [1000, 2000]: mean 1500, sd 1000/sqrt(12) = 289; each tenth holds ~2,000.
    assert abs(statistics.fmean(draws) - 1_500) < 15
    assert abs(statistics.pstdev(draws) - 288.7) < 10
    tenths = [0] * 10
    for draw in draws:
        tenths[min((draw - 1_000) // 100, 9)] += 1
    assert min(tenths) > 1_800 and max(tenths) < 2_200, tenths


def test_seeded_draws_repeat_and_unseeded_ones_differ():
    def draws(rng: random.Random | None) -> list[int]:
        backoff = MultiplierRedeliveryBackoff(1_000, 60_000, 2, jitter=1.0, rng=rng)
        return [backoff.next_delay_ms(n % 5) for n in range(50)]

    assert draws(random.Random(42)) == draws(random.Random(42))
    assert draws(random.Random(42)) != draws(random.Random(43))
    assert draws(None) != draws(None)


def test_no_jitter_is_java_exactly():
    backoff = MultiplierRedeliveryBackoff(1_000, 60_000, 2)
    assert backoff.jitter == 0.0 and "jitter" not in repr(backoff)
    assert [backoff.next_delay_ms(n) for n in range(8)] == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert repr(FixedDelay(5, jitter=0.5)) == "FixedDelay(5, jitter=0.5)"


@pytest.mark.parametrize("cls", [FixedDelay, MultiplierRedeliveryBackoff])
@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"jitter": "0.5"}, TypeError, "jitter"),
        ({"jitter": True}, TypeError, "jitter"),
        ({"jitter": -0.1}, ValueError, "jitter"),
        ({"jitter": 1.5}, ValueError, "jitter"),
        ({"jitter": float("nan")}, ValueError, "jitter"),
        ({"jitter": 0.5, "rng": 7}, TypeError, "rng"),
    ],
)
def test_bad_jitter_arguments_are_refused_by_name(cls, kwargs, error, named):
    with pytest.raises(error, match=named):
        cls(1_000, **kwargs)


@pytest.mark.parametrize("tracker_class", [NegativeAcksTracker, PurePythonTracker], ids=["c", "python"])
@pytest.mark.parametrize("make", JITTERED)
def test_simultaneous_nacks_get_spread_deadlines_on_the_tracker(tracker_class, make):
    clock = FakeClock(0)
    tracker = tracker_class(clock=clock, precision_bits=0, backoff=make(random.Random(5)))
    deadlines = [tracker.add(("t", 1, entry, -1)) for entry in range(1_000)]
    # With the C hot path, a backoff read once as a table would give every key one deadline.
    assert min(deadlines) >= 1_000 and max(deadlines) <= 2_000
    assert len(set(deadlines)) > 500
    assert max(deadlines) - min(deadlines) > 900
    tracker._check()


@pytest.mark.broker
@pytest.mark.parametrize("make", JITTERED)
def test_messages_nacked_together_come_back_spread_never_before_the_floor(pulsar_client, topic, make):
    """60 messages nacked at once with ``jitter=1.0`` on a 1 s delay come back spread over
    about a second, none before the floor; without jitter, within one bucket of each other."""
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    spans = {}
    for jitter in (True, False):
        consumer = pulsar_nack.subscribe(
            pulsar_client,
            topic,
            f"s-{jitter}",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            redelivery_backoff=make(random.Random(9)) if jitter else FixedDelay(1_000),
        )
        if jitter:
            for i in range(60):
                producer.send(str(i).encode())
        nacked_at = {}
        for _ in range(60):
            message = consumer.receive(10_000)
            nacked_at[message.data()] = time.monotonic()
            consumer.negative_acknowledge(message)
        arrivals = {}
        end = time.monotonic() + 15
        while len(arrivals) < 60 and time.monotonic() < end:
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            assert message.data() not in arrivals, "came back twice"
            arrivals[message.data()] = (time.monotonic() - nacked_at[message.data()]) * 1000
            consumer.acknowledge(message)
        assert len(arrivals) == 60
        # The floor: 1 s less the bucket's floor (8 bits: up to 255 ms early) and slack.
        assert min(arrivals.values()) >= 1_000 - 255 - 25, min(arrivals.values())
        assert max(arrivals.values()) <= 2_000 + 1_000, max(arrivals.values())
        spans[jitter] = max(arrivals.values()) - min(arrivals.values())
        consumer.close()
    producer.close()
    assert spans[True] >= 600, spans
    assert spans[False] <= 400, spans
