"""One settings object for both consumers (issue 21, point 3): the same keywords, the same
checks, the same close steps. No broker: the checks come before any client call, and the
close steps are driven by stand-in consumers (a close whose handoff raises
``KeyboardInterrupt`` is something no broker does).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
import pulsar_nack.asyncio
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.consumer import ConsumerSettings, NackingConsumer, SeekArgumentError
from pulsar_nack.consumer.async_consumer import AsyncNackingConsumer
from pulsar_nack.consumer.settings import seek_target, subscribe_settings

TOPIC = "persistent://public/default/settings"
POLICY = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2)
OWN = ("client", "topic", "subscription_name", "message_listener", "subscribe_kwargs")


def own_keywords(function: Any) -> dict[str, Any]:
    """The keywords a subscribe function takes itself (not passed on to the client)."""
    return {
        name: (p.kind, p.default, p.annotation)
        for name, p in inspect.signature(function).parameters.items()
        if name not in OWN
    }


def test_both_subscribe_functions_take_the_same_keywords_with_the_settings_defaults():
    blocking, asyncio_ = own_keywords(pulsar_nack.subscribe), own_keywords(pulsar_nack.asyncio.subscribe)
    assert blocking == asyncio_
    defaults = {f.name: f.default for f in dataclasses.fields(ConsumerSettings)}
    assert {name: default for name, (_, default, _) in blocking.items()} == {name: defaults[name] for name in blocking}


def test_both_consumers_take_the_same_settings_object():
    def parameters(cls: type) -> list[tuple[str, Any]]:
        return [(n, p.kind) for n, p in inspect.signature(cls.__init__).parameters.items() if n != "consumer"]

    assert parameters(NackingConsumer) == parameters(AsyncNackingConsumer)
    assert "settings" in inspect.signature(NackingConsumer.wrap).parameters


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("negative_ack_redelivery_delay_ms", -1, ValueError),
        ("negative_ack_redelivery_delay_ms", 2**41, ValueError),
        ("negative_ack_redelivery_delay_ms", 1.5, TypeError),
        ("negative_ack_precision_bit_cnt", 31, ValueError),
        ("negative_ack_precision_bit_cnt", True, TypeError),
        ("redelivery_backoff", "exponential", TypeError),
        ("never_early", 1, TypeError),
        ("dead_letter_policy", 3, TypeError),
        ("handoff_delay_ms", -5, ValueError),
        ("coalesce_ms", None, TypeError),
        ("always_guard", "yes", TypeError),
    ],
)
def test_a_bad_setting_raises_naming_it(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        ConsumerSettings(**{field: value})


def test_settings_are_frozen_and_replace_validates():
    settings = ConsumerSettings(redelivery_backoff=MultiplierRedeliveryBackoff(100, 1_000), dead_letter_policy=POLICY)
    assert settings.max_redeliver_count == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.never_early = True  # type: ignore[misc]
    with pytest.raises(ValueError, match="coalesce_ms"):
        settings.replace(coalesce_ms=-1)
    assert ConsumerSettings().max_redeliver_count is None


def test_subscribe_settings_is_the_one_place_that_reads_the_client_keywords():
    tracker = {
        "negative_ack_redelivery_delay_ms": 1_000,
        "negative_ack_precision_bit_cnt": 8,
        "redelivery_backoff": None,
        "never_early": False,
    }
    for timeout, kept in ((None, 0), (0, 0), (10_000, 10_000)):
        kwargs: dict[str, Any] = {"unacked_messages_timeout_ms": timeout, "dead_letter_policy": POLICY}
        settings = subscribe_settings(kwargs, **tracker)
        assert settings.ack_timeout_ms == kept and "unacked_messages_timeout_ms" not in kwargs
        assert settings.always_guard is False, "the consumer keeps the ack timeout: no guarding all the time"
        assert settings.dead_letter_policy is POLICY
        assert "dead_letter_policy" not in kwargs and kwargs["batch_index_ack_enabled"] is True
    kwargs = {"batch_index_ack_enabled": "no", "dead_letter_policy": POLICY}
    with pytest.raises(TypeError, match="batch_index_ack_enabled"):
        subscribe_settings(kwargs, **tracker)
    assert kwargs == {"batch_index_ack_enabled": "no", "dead_letter_policy": POLICY}, "a bad call changed the keywords"


def test_seek_takes_what_the_plain_client_takes():
    for target in (0, 1_700_000_000_000, True, pulsar.MessageId.earliest, _pulsar.MessageId(-1, 1, 2, -1)):
        assert seek_target(target) is target
    for bad in (1.0, "1", None):
        with pytest.raises(ValueError, match="invalid seek_arg type"):  # as pulsar.Consumer.seek
            seek_target(bad)
        with pytest.raises(TypeError):  # as this library's other checks
            seek_target(bad)
    assert issubclass(SeekArgumentError, ValueError) and issubclass(SeekArgumentError, TypeError)


# ---------------------------------------------------------------- close, in steps that are retried


class Interrupted:
    """A handoff that raises ``KeyboardInterrupt`` once (Ctrl-C while closing), then records."""

    def __init__(self) -> None:
        self.raised = False
        self.nacked: list[Any] = []

    def negative_acknowledge(self, message_id: Any) -> None:
        if not self.raised:
            self.raised = True
            raise KeyboardInterrupt
        self.nacked.append(message_id)


class StandInConsumer(Interrupted, pulsar.Consumer):
    def __init__(self) -> None:  # no client behind it
        Interrupted.__init__(self)
        self.closes = 0

    def subscription_name(self) -> str:
        return "sub"

    def close(self) -> None:
        self.closes += 1


class StandInAsyncConsumer(Interrupted, pulsar.asyncio.Consumer):
    def __init__(self) -> None:  # no client behind it
        Interrupted.__init__(self)
        self.closes = 0

    def subscription_name(self) -> str:
        return "sub"

    async def close(self) -> None:
        self.closes += 1


@pytest.fixture
def offline_client() -> Iterator[pulsar.Client]:
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: no dead letter is sent
    yield client
    client.close()


class StubMessage(pulsar.Message):
    def __init__(self) -> None:
        self._id = _pulsar.MessageId(-1, 7, 1, -1)

    def topic_name(self) -> str:
        return TOPIC

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def redelivery_count(self) -> int:
        return 0


def dead_letters_closed(consumer: Any) -> bool:
    """True if the consumer's dead-letter sender refuses to send (it was closed)."""
    refused: list[BaseException | None] = []
    consumer._route.sender.send_async(StubLetter(), refused.append)
    return bool(refused) and "closed" in str(refused[0])


class StubLetter:
    """Just enough of a message for the sender to build a dead letter."""

    def data(self) -> bytes:
        return b"x"

    def properties(self) -> dict[str, str]:
        return {}

    def message_id(self) -> _pulsar.MessageId:
        return _pulsar.MessageId(-1, 1, 1, -1)

    def topic_name(self) -> str:
        return TOPIC

    def partition_key(self) -> str:
        return ""

    def ordering_key(self) -> str:
        return ""


def test_close_closes_the_consumer_and_dead_letter_producers_even_when_the_core_raises(offline_client):
    stand_in = StandInConsumer()
    consumer = NackingConsumer(stand_in, [TOPIC], ConsumerSettings(dead_letter_policy=POLICY), client=offline_client)
    consumer.negative_acknowledge(StubMessage(), delay_ms=3_600_000)
    with pytest.raises(KeyboardInterrupt):
        consumer.close()  # the handoff of the pending nack is interrupted
    assert consumer.closed and stand_in.closes == 1, "the Pulsar consumer was left open"
    assert dead_letters_closed(consumer), "the dead-letter producers were left open"
    consumer.close()  # retries the handoff; closes nothing twice
    assert [m.entry_id() for m in stand_in.nacked] == [1] and stand_in.closes == 1
    consumer.close()
    assert stand_in.closes == 1


def test_async_close_takes_the_same_steps(offline_client):
    async def scenario() -> None:
        stand_in = StandInAsyncConsumer()
        consumer = AsyncNackingConsumer(stand_in, [TOPIC], ConsumerSettings(dead_letter_policy=POLICY), client=offline_client)
        await consumer.negative_acknowledge(StubMessage(), delay_ms=3_600_000)
        with pytest.raises(KeyboardInterrupt):
            await consumer.close()
        assert consumer.closed and stand_in.closes == 1, "the Pulsar consumer was left open"
        assert dead_letters_closed(consumer), "the dead-letter producers were left open"
        await consumer.close()
        assert [m.entry_id() for m in stand_in.nacked] == [1] and stand_in.closes == 1

    asyncio.run(scenario())


def test_a_dead_letter_policy_needs_a_client():
    class NoClient(StandInConsumer):
        pass

    with pytest.raises(ValueError, match="client"):
        NackingConsumer(NoClient(), [TOPIC], ConsumerSettings(dead_letter_policy=POLICY))
