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


def test_tracker_defaults_to_ours_and_accepts_builtin():
    assert config().tracker == "ours"
    builtin = config(tracker="builtin", negative_ack_redelivery_delay_ms=500)
    assert builtin.tracker == "builtin" and builtin.retry_delay_ms(0) == 500
    # A worker's consumer is rebuilt when the tracker changes.
    assert builtin.consumer_settings() != config(negative_ack_redelivery_delay_ms=500).consumer_settings()


@pytest.mark.parametrize(("tracker", "error"), [(None, TypeError), (1, TypeError), (b"ours", TypeError),
                                                ("Ours", ValueError), ("java", ValueError), ("", ValueError)])
def test_a_bad_tracker_is_refused(tracker, error):
    with pytest.raises(error, match="tracker"):
        config(tracker=tracker)


def test_the_builtin_tracker_refuses_a_backoff_it_cannot_apply():
    from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff

    with pytest.raises(ValueError, match="backoff"):
        config(tracker="builtin", redelivery_backoff=MultiplierRedeliveryBackoff(500, 10_000))
    assert config(redelivery_backoff=MultiplierRedeliveryBackoff(500, 10_000)).tracker == "ours"


def test_a_durable_retry_waits_the_grace_of_whoever_holds_it():
    """The Spark task's grace follows the consumers' own held-retry rule (``retry.is_held``): a
    retry within ``retry_hold_ms`` is held by the consumers (short grace) unless its payload is too
    large to batch, which goes the broker's way (the broker's grace), as does a retry of delay 0."""
    from pulsar_nack.consumer.retry import HELD_MAX_BYTES
    from pulsar_nack.spark.task import retry_grace_s
    from pulsar_nack.timing import DURABLE_GRACE_S, HELD_GRACE_S

    class Payload:
        def __init__(self, size: int) -> None:
            self.size = size

        def data(self) -> bytes:
            return bytes(self.size)

    held = config(retries="durable", retry_hold_ms=1_000)
    assert retry_grace_s(held, 500, Payload(10)) == HELD_GRACE_S
    assert retry_grace_s(held, 500, Payload(HELD_MAX_BYTES + 1)) == DURABLE_GRACE_S
    assert retry_grace_s(held, 0, Payload(10)) == DURABLE_GRACE_S
    assert retry_grace_s(held, 1_001, Payload(10)) == DURABLE_GRACE_S


def test_the_names_of_earlier_releases_still_work_with_a_deprecation_warning():
    """ConsumerConfig takes subscribe's names; nack_delay_ms, precision_bits and backoff (keywords and
    attributes) still work, each with a DeprecationWarning, and the two names of one setting clash."""
    from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff

    backoff = MultiplierRedeliveryBackoff(500, 10_000)
    with pytest.warns(DeprecationWarning, match="nack_delay_ms"):
        old = config(nack_delay_ms=500, precision_bits=4, backoff=backoff)
    assert old == config(negative_ack_redelivery_delay_ms=500, negative_ack_precision_bit_cnt=4, redelivery_backoff=backoff)
    with pytest.warns(DeprecationWarning, match="ConsumerConfig.precision_bits"):
        assert (old.nack_delay_ms, old.precision_bits, old.backoff) == (500, 4, backoff)
    with pytest.raises(TypeError, match="not both"):
        config(nack_delay_ms=500, negative_ack_redelivery_delay_ms=500)


def test_spark_settings_are_checked_by_the_consumers_settings_in_spark_terms():
    """One validation per setting: ConsumerConfig's consumer settings raise the consumers' own errors."""
    with pytest.raises(ValueError, match="negative_ack_precision_bit_cnt must be <= 30"):
        config(negative_ack_precision_bit_cnt=31)
    with pytest.raises(TypeError, match="redelivery_backoff must be a RedeliveryBackoff"):
        config(redelivery_backoff=object())
    with pytest.raises(ValueError, match="retry_hold_ms needs retries='durable'"):
        config(retry_hold_ms=1_000)
