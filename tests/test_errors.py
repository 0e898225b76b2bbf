"""One error hierarchy, and the same bad argument raising the same error everywhere (issue 11).

No broker: ``subscribe`` validates before it talks to one, and ``NackingConsumer`` is
built on a stand-in consumer (its constructor only records what it wraps).
"""

from __future__ import annotations

import re
from pathlib import Path

import pulsar
import pytest

import pulsar_nack
from pulsar_nack import (
    ClosedError,
    ConsumerClosedError,
    NackingConsumer,
    NegativeAcksTracker,
    PulsarNackError,
    TrackerClosedError,
)
from pulsar_nack.core import HashMapNegativeAcksTracker
from pulsar_nack.errors import BrokerError
from pulsar_nack.spark import ConsumerConfig

PACKAGE = Path(pulsar_nack.__file__).parent


class StandInConsumer(pulsar.Consumer):
    """Stand-in for a subscribed consumer: the constructor under test never calls it."""

    def __init__(self) -> None:  # no client behind it
        pass

    def close(self) -> None:
        pass


def test_hierarchy():
    for error in (ClosedError, TrackerClosedError, ConsumerClosedError, BrokerError):
        assert issubclass(error, PulsarNackError) and issubclass(error, RuntimeError)
    assert issubclass(TrackerClosedError, ClosedError) and issubclass(ConsumerClosedError, ClosedError)
    from pulsar_nack import consumer

    assert consumer.ConsumerClosedError is ConsumerClosedError  # the old import path still works


@pytest.mark.parametrize("cls", [NegativeAcksTracker, HashMapNegativeAcksTracker])
def test_a_closed_tracker_raises_tracker_closed_error(cls):
    tracker = cls(lambda due: None)
    tracker.close()
    with pytest.raises(TrackerClosedError, match="closed"):
        tracker.add(("t", 1, 1, -1))


def test_a_closed_consumer_raises_consumer_closed_error():
    consumer = NackingConsumer(StandInConsumer(), ["t"])
    consumer.close()
    with pytest.raises(ConsumerClosedError):
        consumer.receive(0)
    with pytest.raises(PulsarNackError):
        consumer.negative_acknowledge(object())


def test_no_closed_state_error_outside_the_hierarchy():
    """The issue's acceptance grep: no bare ``RuntimeError(`` about a closed state in the package."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bRuntimeError\(", line) and "closed" in line.lower():
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


# A bad topic list, given to each of the three places that take one.
BAD_TOPICS = [
    ([], ValueError),
    ("", ValueError),
    (["a", ""], ValueError),
    (None, TypeError),
    (42, TypeError),
    (["a", 5], TypeError),
    ({"a": 1}, TypeError),
    (b"a", TypeError),
]


def _nacking_consumer(topics: object) -> None:
    NackingConsumer(StandInConsumer(), topics).close()  # type: ignore[arg-type]


def _subscribe(topics: object) -> None:
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: validation comes first
    try:
        pulsar_nack.subscribe(client, topics, "s")  # type: ignore[arg-type]
    finally:
        client.close()


def _consumer_config(topics: object) -> None:
    ConsumerConfig("pulsar://127.0.0.1:1", topics, "s")  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", [_nacking_consumer, _subscribe, _consumer_config])
@pytest.mark.parametrize(("topics", "error"), BAD_TOPICS)
def test_a_bad_topic_list_raises_the_same_error_everywhere(entry, topics, error):
    with pytest.raises(error, match="topic"):
        entry(topics)


@pytest.mark.parametrize("topics", ["t", ["t"], ("t", "u")])
def test_good_topic_lists_are_accepted(topics):
    _nacking_consumer(topics)
    assert ConsumerConfig("pulsar://127.0.0.1:1", topics, "s").topics == ((topics,) if isinstance(topics, str) else tuple(topics))


async def _async_subscribe(subscription: object, **kwargs: object) -> None:
    import pulsar.asyncio

    import pulsar_nack.asyncio

    client = pulsar.asyncio.Client("pulsar://127.0.0.1:1")  # never connects: validation comes first
    try:
        await pulsar_nack.asyncio.subscribe(client, "t", subscription, **kwargs)  # type: ignore[arg-type]
    finally:
        await client.close()


def _blocking_subscribe(subscription: object, **kwargs: object) -> None:
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: validation comes first
    try:
        pulsar_nack.subscribe(client, "t", subscription, **kwargs)  # type: ignore[arg-type]
    finally:
        client.close()


def _run_subscribe(entry: str, subscription: object, **kwargs: object) -> None:
    import asyncio

    if entry == "asyncio":
        asyncio.run(_async_subscribe(subscription, **kwargs))
    else:
        _blocking_subscribe(subscription, **kwargs)


@pytest.mark.parametrize("entry", ["blocking", "asyncio"])
@pytest.mark.parametrize(("subscription", "error"), [("", ValueError), (None, TypeError), (b"s", TypeError)])
def test_a_bad_subscription_name_raises_value_error_when_empty_and_type_error_otherwise(entry, subscription, error):
    with pytest.raises(error, match="subscription_name"):
        _run_subscribe(entry, subscription)
    with pytest.raises(error, match="subscription"):
        ConsumerConfig("pulsar://127.0.0.1:1", "t", subscription)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", ["blocking", "asyncio"])
def test_a_negative_fixed_delay_is_reported_under_its_own_name(entry):
    with pytest.raises(ValueError, match=r"^negative_ack_redelivery_delay_ms must be >= 0, got -5$"):
        _run_subscribe(entry, "s", negative_ack_redelivery_delay_ms=-5)
    with pytest.raises(TypeError, match=r"^negative_ack_redelivery_delay_ms must be int"):
        _run_subscribe(entry, "s", negative_ack_redelivery_delay_ms=1.5)
