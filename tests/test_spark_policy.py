"""The consumer task's retry policy, a pure function: no Spark, no broker."""

from __future__ import annotations

import pytest

from pulsar_nack.spark import ConsumerConfig, retry_action
from pulsar_nack.spark.policy import ACTIONS


class Flaky(Exception):
    pass


def config(**kwargs) -> ConsumerConfig:
    return ConsumerConfig("pulsar://h:6650", "t", "s", retryable=(Flaky,), **kwargs)


def test_retryable_errors_retry_forever_without_max_redeliveries():
    assert [retry_action(config(), Flaky(), n) for n in (0, 1, 100, 10**9)] == ["retry"] * 4


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_max_redeliveries_turns_a_retryable_error_into_a_non_retryable_one(limit):
    actions = [retry_action(config(max_redeliveries=limit, on_non_retryable="ack"), Flaky(), n) for n in range(5)]
    assert actions == ["retry"] * limit + ["ack"] * (5 - limit)


@pytest.mark.parametrize("action", ["ack", "dead_letter", "raise"])
def test_non_retryable_errors_get_the_configured_action(action):
    assert retry_action(config(on_non_retryable=action), KeyError("x"), 0) == action
    assert retry_action(config(on_non_retryable=action, max_redeliveries=1), Flaky(), 1) == action


def test_base_exceptions_always_propagate():
    everything = ConsumerConfig("pulsar://h:6650", "t", "s", retryable=(BaseException,), on_non_retryable="ack")
    for error in (KeyboardInterrupt(), SystemExit(1), GeneratorExit()):
        assert retry_action(everything, error, 0) == "raise"


def test_every_answer_is_a_known_action():
    for error in (Flaky(), ValueError(), KeyboardInterrupt()):
        for count in (0, 5):
            assert retry_action(config(max_redeliveries=2), error, count) in ACTIONS


def test_max_redeliveries_is_validated():
    with pytest.raises(TypeError):
        config(max_redeliveries="3")
    with pytest.raises(ValueError):
        config(max_redeliveries=-1)
