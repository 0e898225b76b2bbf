"""Retry letter rules without a broker: Java's names, properties and id text; argument checks."""

from __future__ import annotations

import _pulsar
import pulsar
import pytest

import pulsar_nack
from pulsar_nack.consumer.retry import (
    DELAY_TIME,
    DELIVER_AT_TIME,
    ORIGIN_MESSAGE_ID,
    ORIGIN_MESSAGE_ID_LEGACY,
    REAL_SUBSCRIPTION,
    REAL_TOPIC,
    RECONSUMETIMES,
    due_time_ms,
    java_message_id,
    legacy_topic_names,
    resolve_retry_topics,
    retry_properties,
)


class StandIn:
    """A received message as far as the rules read it."""

    def __init__(self, topic: str, message_id: _pulsar.MessageId, properties: dict[str, str], publish: int = 0):
        self._topic, self._id, self._properties, self._publish = topic, message_id, properties, publish

    def topic_name(self) -> str:
        return self._topic

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def publish_timestamp(self) -> int:
        return self._publish


def test_message_ids_are_written_as_java_prints_them():
    # MessageIdImpl: ledger:entry:partition; BatchMessageIdImpl adds :batchIndex.
    assert java_message_id(_pulsar.MessageId(-1, 27, 0, -1)) == "27:0:-1"
    assert java_message_id(_pulsar.MessageId(3, 11, 0, 0)) == "11:0:3:0"
    assert java_message_id(_pulsar.MessageId(-1, 2**62, 5, 7)) == f"{2**62}:5:-1:7"


def test_first_reconsume_adds_the_java_system_properties():
    message = StandIn("persistent://public/default/orders-partition-2", _pulsar.MessageId(2, 9, 4, -1), {"a": "1"})
    props = retry_properties(message, "billing", 1500)
    assert props == {
        "a": "1",
        REAL_TOPIC: "persistent://public/default/orders",  # the partition suffix removed
        ORIGIN_MESSAGE_ID: "9:4:2",
        ORIGIN_MESSAGE_ID_LEGACY: "9:4:2",
        REAL_SUBSCRIPTION: "billing",
        RECONSUMETIMES: "1",
        DELAY_TIME: "1500",
    }


def test_later_reconsumes_keep_the_origin_and_count_up():
    first = {REAL_TOPIC: "t0", ORIGIN_MESSAGE_ID: "1:1:-1", ORIGIN_MESSAGE_ID_LEGACY: "1:1:-1",
             REAL_SUBSCRIPTION: "s0", RECONSUMETIMES: "4", DELAY_TIME: "10"}
    message = StandIn("persistent://public/default/t0-s0-RETRY", _pulsar.MessageId(-1, 50, 2, -1), first)
    props = retry_properties(message, "other", -5)
    assert props[ORIGIN_MESSAGE_ID] == "1:1:-1" and props[REAL_TOPIC] == "t0" and props[REAL_SUBSCRIPTION] == "s0"
    assert props[RECONSUMETIMES] == "5"
    assert props[DELAY_TIME] == "0"  # a negative delay is sent as 0, as Java


def test_custom_properties_override_system_ones_before_the_count_as_in_java():
    message = StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {RECONSUMETIMES: "2"})
    props = retry_properties(message, "s", 100, {REAL_TOPIC: "mine", RECONSUMETIMES: "7", DELAY_TIME: "x"})
    assert props[REAL_TOPIC] == "mine"
    assert props[RECONSUMETIMES] == "8"  # read after the custom ones, then + 1
    assert props[DELAY_TIME] == "100"  # written last
    with pytest.raises(ValueError, match=RECONSUMETIMES):
        retry_properties(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {RECONSUMETIMES: "two"}), "s", 1)


def test_due_time_is_publish_time_plus_delay():
    assert due_time_ms(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {DELAY_TIME: "250"}, publish=1_000)) == 1_250
    assert due_time_ms(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {}, publish=1_000)) is None
    assert due_time_ms(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {DELAY_TIME: "soon"}, publish=1_000)) is None


def test_a_held_copy_is_due_at_its_deliver_at_time_unless_publish_time_plus_delay_is_later():
    """A batch's publish time is its first message's: a later member is due at its own DELIVER_AT_TIME.
    A stale one (a Java consumer copies every property into its own retry) never makes a copy earlier."""
    mid = _pulsar.MessageId(-1, 1, 1, 0)
    assert due_time_ms(StandIn("t", mid, {DELAY_TIME: "250", DELIVER_AT_TIME: "1260"}, publish=1_000)) == 1_260
    assert due_time_ms(StandIn("t", mid, {DELAY_TIME: "250", DELIVER_AT_TIME: "900"}, publish=1_000)) == 1_250
    assert due_time_ms(StandIn("t", mid, {DELAY_TIME: "250", DELIVER_AT_TIME: "x"}, publish=1_000)) is None


def test_a_reconsume_drops_an_earlier_deliver_at_time_and_writes_its_own_only_when_held():
    copy = StandIn("persistent://public/default/t-s-RETRY", _pulsar.MessageId(-1, 9, 1, -1),
                   {RECONSUMETIMES: "1", DELAY_TIME: "250", DELIVER_AT_TIME: "1260", REAL_TOPIC: "t"})
    broker_held = retry_properties(copy, "s", 500)
    assert DELIVER_AT_TIME not in broker_held and broker_held[RECONSUMETIMES] == "2"
    held = retry_properties(copy, "s", 500, {DELIVER_AT_TIME: "1"}, deliver_at_ms=5_000)
    assert held[DELIVER_AT_TIME] == "5000"  # ours wins over the caller's, as RECONSUMETIMES and DELAY_TIME do


class Lookups:
    """A stand-in ``_pulsar.Client`` for name resolution: which topics are partitioned."""

    def __init__(self, partitioned: dict[str, int]):
        self.partitioned, self.calls = partitioned, []

    def get_topic_partitions(self, topic: str) -> list[str]:
        self.calls.append(topic)
        n = self.partitioned.get(topic, 0)
        return [f"{topic}-partition-{i}" for i in range(n)] if n else [topic]


def test_default_names_follow_the_first_topic_and_old_names_win_when_found():
    lookups = Lookups({})
    names = resolve_retry_topics(lookups, ["orders", "other"], "billing", None, None)
    assert names.retry_letter_topic == "persistent://public/default/orders-billing-RETRY"
    assert names.dead_letter_topic == "persistent://public/default/orders-billing-DLQ"
    assert names.max_redeliver_count == 16 and names.initial_subscription_name is None
    assert lookups.calls == list(legacy_topic_names("orders", "billing"))

    old_retry, _ = legacy_topic_names("orders", "billing")
    names = resolve_retry_topics(Lookups({old_retry: 2}), ["orders"], "billing", None, None)
    assert names.retry_letter_topic == old_retry == "persistent://public/default/billing-RETRY"
    assert names.dead_letter_topic.endswith("orders-billing-DLQ")


def test_explicit_names_and_policy_win_without_lookups():
    lookups = Lookups({})
    policy = pulsar.ConsumerDeadLetterPolicy(3, "persistent://public/default/my-dlq", "keep")
    names = resolve_retry_topics(lookups, ["orders"], "billing", policy, "my-retry")
    assert (names.retry_letter_topic, names.dead_letter_topic) == (
        "persistent://public/default/my-retry", "persistent://public/default/my-dlq")
    assert (names.max_redeliver_count, names.initial_subscription_name) == (3, "keep")
    assert lookups.calls == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"retry_enable": 1}, TypeError, "retry_enable"),
        ({"retry_enable": True}, ValueError, "Shared or KeyShared"),  # default Exclusive
        ({"retry_enable": True, "consumer_type": pulsar.ConsumerType.Failover}, ValueError, "Failover"),
        ({"retry_letter_topic": "r"}, ValueError, "retry_enable=True"),
        ({"retry_enable": True, "retry_letter_topic": 5, "consumer_type": pulsar.ConsumerType.Shared}, TypeError, "retry_letter_topic"),
        ({"retry_enable": True, "retry_letter_topic": "", "consumer_type": pulsar.ConsumerType.Shared}, ValueError, "retry_letter_topic must not be empty"),
        ({"retry_enable": True, "retry_hold_ms": 1.5, "consumer_type": pulsar.ConsumerType.Shared}, TypeError, "retry_hold_ms"),
        ({"retry_enable": True, "retry_hold_ms": -1, "consumer_type": pulsar.ConsumerType.Shared}, ValueError, "retry_hold_ms"),
        ({"retry_hold_ms": 1_000}, ValueError, "retry_hold_ms needs retry_enable=True"),
    ],
)
def test_subscribe_checks_the_retry_keywords_before_talking_to_a_broker(kwargs, error, match):
    client = pulsar.Client("pulsar://127.0.0.1:1")  # nothing listens: any call to a broker would hang or fail
    try:
        with pytest.raises(error, match=match):
            pulsar_nack.subscribe(client, "t", "s", **kwargs)
    finally:
        client.close()


def test_retries_need_topic_names_not_a_pattern():
    import re

    client = pulsar.Client("pulsar://127.0.0.1:1")
    try:
        with pytest.raises(ValueError, match="pattern"):
            pulsar_nack.subscribe(client, re.compile("t-.*"), "s", retry_enable=True, consumer_type=pulsar.ConsumerType.Shared)
    finally:
        client.close()


def test_spark_durable_retries_are_validated_on_the_driver():
    from pulsar_nack.spark import ConsumerConfig

    config = ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable")
    assert config.retries == "durable" and config.consumer_settings() != ConsumerConfig("pulsar://h:6650", "t", "s").consumer_settings()
    with pytest.raises(TypeError, match="retries"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries=1)
    with pytest.raises(ValueError, match="retries"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries="later")
    with pytest.raises(ValueError, match="tracker='ours'"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable", tracker="builtin")
    with pytest.raises(ValueError, match="Shared or KeyShared"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable", subscription_type="Failover")
    held = ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable", retry_hold_ms=1_000)
    assert held.consumer_settings() != config.consumer_settings()
    with pytest.raises(TypeError, match="retry_hold_ms"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable", retry_hold_ms="1s")
    with pytest.raises(ValueError, match="retry_hold_ms"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retries="durable", retry_hold_ms=-5)
    with pytest.raises(ValueError, match="retry_hold_ms needs retries='durable'"):
        ConsumerConfig("pulsar://h:6650", "t", "s", retry_hold_ms=1_000)


def test_a_retry_copy_is_keyed_as_its_first_message():
    from pulsar_nack.consumer.retry import origin_key

    copy = StandIn("persistent://public/default/t-s-RETRY", _pulsar.MessageId(-1, 99, 0, -1),
                   {REAL_TOPIC: "persistent://public/default/t", ORIGIN_MESSAGE_ID: "5:6:-1:2"})
    assert origin_key(copy) == ("persistent://public/default/t", 5, 6, 2)
    assert origin_key(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {REAL_TOPIC: "t", ORIGIN_MESSAGE_ID: "(1,2,3,4)"})) is None
    assert origin_key(StandIn("t", _pulsar.MessageId(-1, 1, 1, -1), {})) is None


def test_a_copy_due_within_150_ms_is_kept_in_memory_until_due_and_a_later_one_is_nacked():
    from pulsar_nack.consumer.retry import RetryLetter, RetryTopics
    from pulsar_nack.timing import MEMORY_HOLD_MS

    now = [1_000]
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: nothing here talks to a broker
    names = RetryTopics("persistent://public/default/t-s-RETRY", "persistent://public/default/t-s-DLQ", 16)
    retry = RetryLetter(client, "s", names, clock_ms=lambda: now[0])  # not subscribed: holds are not handed off
    try:
        soon = StandIn(names.retry_letter_topic, _pulsar.MessageId(-1, 5, 1, -1), {DELAY_TIME: "200"}, publish=900)
        later = StandIn(names.retry_letter_topic, _pulsar.MessageId(-1, 5, 2, -1), {DELAY_TIME: "900"}, publish=900)
        plain = StandIn("persistent://public/default/t", _pulsar.MessageId(-1, 6, 1, -1), {DELAY_TIME: "900"}, publish=900)
        assert retry.owns(plain) is False and retry.owns(soon) is True
        assert MEMORY_HOLD_MS == 150
        assert not retry.admit(soon, in_memory=True)  # due at 1,101 (+1: publish times are whole ms)
        assert not retry.admit(later, in_memory=True)  # due at 1,801: nacked into the hold tracker
        assert retry.held() == 2 and retry.counts()["held"] == 2
        assert retry.ms_to_next_due() == 101 and retry.pop_due() is None
        now[0] = 1_100
        assert retry.pop_due() is None and retry.ms_to_next_due() == 1
        now[0] = 1_101
        assert retry.pop_due() is soon and retry.pop_due() is None and retry.ms_to_next_due() is None
        assert retry.admit(StandIn(names.retry_letter_topic, _pulsar.MessageId(-1, 5, 3, -1), {DELAY_TIME: "200"}, publish=900))  # due now
    finally:
        retry.close(redeliver_pending=False)
        client.close()


def test_retry_stages_split_the_time_after_due_into_broker_and_consumer():
    from pulsar_nack.spark.stats import retry_stages

    task: dict = {"retry_stages": [(1_000, 950, 1_010.0), (2_000, 2_300, 2_305.0), (3_000, None, 3_020.0), (None, 5, 6.0)]}
    stages = retry_stages([task])
    assert stages["after_due"] == {"count": 3, "min": 10.0, "p50": 20.0, "p99": 305.0, "max": 305.0}
    assert (stages["broker"]["min"], stages["broker"]["max"]) == (-50.0, 300.0)  # 50 ms early (held), 300 ms late
    assert (stages["consumer"]["min"], stages["consumer"]["max"]) == (5.0, 10.0)
    assert retry_stages([{"retry_stages": []}]) == {}  # type: ignore[list-item, typeddict-item]


def test_a_held_copy_is_kept_in_memory_until_due_within_the_hold_and_past_the_cap_in_the_tracker(monkeypatch):
    """``hold_ms``: a copy due within it is kept in memory (not only within ``MEMORY_HOLD_MS``), up to
    ``MEMORY_HOLD_MAX`` copies; the rest go to the hold tracker. A copy due later than the hold is nacked."""
    from pulsar_nack.consumer import memory_hold
    from pulsar_nack.consumer.retry import RetryLetter, RetryTopics
    from pulsar_nack.consumer.settings import ConsumerSettings

    monkeypatch.setattr(memory_hold, "MEMORY_HOLD_MAX", 2)
    now = [10_000]
    client = pulsar.Client("pulsar://127.0.0.1:1")  # never connects: nothing here talks to a broker
    names = RetryTopics("persistent://public/default/t-s-RETRY", "persistent://public/default/t-s-DLQ", 16)
    retry = RetryLetter(client, "s", names, ConsumerSettings(retry_enable=True, retry_hold_ms=1_000), clock_ms=lambda: now[0])
    try:
        def copy(entry: int, deliver_at: int) -> StandIn:
            return StandIn(names.retry_letter_topic, _pulsar.MessageId(-1, 7, entry, 0),
                           {DELAY_TIME: "500", DELIVER_AT_TIME: str(deliver_at)}, publish=now[0])
        first, second, third, beyond = copy(1, 10_600), copy(2, 10_700), copy(3, 10_800), copy(4, 12_000)
        for held in (first, second, third, beyond):
            assert not retry.admit(held, in_memory=True)
        assert retry.held() == 4 and retry.counts()["held"] == 4
        assert retry.ms_to_next_due() == 601
        now[0] = 10_600
        assert retry.pop_due() is None
        now[0] = 10_601
        assert retry.pop_due() is first and retry.pop_due() is None
        now[0] = 10_701
        assert retry.pop_due() is second
        now[0] = 10_801
        assert retry.pop_due() is None and retry.ms_to_next_due() is None  # the third is past the cap: not in memory
        assert retry.held() == 2  # it and the one beyond the hold wait in the hold tracker
    finally:
        retry.close(redeliver_pending=False)
        client.close()
