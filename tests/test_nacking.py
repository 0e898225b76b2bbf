"""Unit tests of the broker-agnostic consumer core (pulsar_nack.consumer.nacking), no broker.

Stand-in messages are used here only for what needs no broker: the pending set's
encoding against a plain set, keying and the ids handed to the client. Everything a
broker decides is tested on Apache Pulsar in test_consumer_fidelity.py.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import _pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import wait_for
from pulsar_nack.consumer.nacking import NackingCore, PendingNacks, TopicMatcher, full_topic_name, raw_id
from pulsar_nack.consumer.settings import ConsumerSettings

T = "persistent://public/default/t"

# Values near the packing limits: batch index 1022/1023 (the last packable, the first
# wide), entry ids around 2**54 and the container boundary 2**16.
_ids = st.tuples(
    st.sampled_from([0, 1, 7, 2**40]),
    st.one_of(st.integers(0, 70_000), st.sampled_from([2**54 - 1, 2**54, 2**63 - 1])),
    st.one_of(st.integers(-1, 12), st.sampled_from([1021, 1022, 1023, 2**31 - 1])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "discard"]), _ids), max_size=80))
def test_pending_set_matches_a_plain_set(ops: list[tuple[str, tuple[int, int, int]]]) -> None:
    pending, oracle = PendingNacks(), set()
    for op, item in ops:
        if op == "add":
            pending.add(*item)
            oracle.add(item)
        else:
            pending.discard(*item)
            oracle.discard(item)
        pending._check()
        assert len(pending) == len(oracle)
        assert all(i in pending for i in oracle)
        assert (item in pending) == (item in oracle)
    pending.clear()
    pending._check()
    assert len(pending) == 0


def test_pending_set_is_compact_for_one_nack_per_batch() -> None:
    pending = PendingNacks()
    for entry in range(20_000):
        pending.add(5, entry, entry % 10)
    assert pending.memory_bytes() / 20_000 < 4


class Stub:
    """A received message stand-in: topic, id, redelivery count."""

    def __init__(self, topic: str, ledger: int, entry: int, index: int = -1, partition: int = -1) -> None:
        self._topic, self._id = topic, _pulsar.MessageId(partition, ledger, entry, index)

    def topic_name(self) -> str:
        return self._topic

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def redelivery_count(self) -> int:
        return 0


class Recorder:
    def __init__(self) -> None:
        self.ids: list[_pulsar.MessageId] = []
        self.lock = threading.Lock()

    def __call__(self, ids: list[_pulsar.MessageId]) -> None:
        with self.lock:
            self.ids.extend(ids)


def test_a_pending_batch_message_is_swallowed_until_its_handoff_then_delivered() -> None:
    recorder = Recorder()
    core = NackingCore(recorder, [T], ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0))
    a, b = Stub(T, 3, 9, 0), Stub(T, 3, 9, 1)
    assert core.admit(a) and core.admit(b)
    core.nack(b, delay_ms=60_000)
    assert core.admit(a), "an unsettled sibling must be delivered again"
    assert not core.admit(b), "a copy of a pending nack is swallowed"
    with pytest.raises(ValueError, match="already NACKED"):
        core.nack(b)
    core.reset()
    assert core.admit(b)
    core.nack(b, delay_ms=0)
    assert wait_for(lambda: len(recorder.ids) == 1, 10)
    assert wait_for(lambda: core.admit(b), 10)
    handed = recorder.ids[0]
    assert (handed.ledger_id(), handed.entry_id(), handed.batch_index()) == (3, 9, -1)
    core._check()
    core.close(redeliver_pending=False)


def test_bare_ids_on_a_multi_topic_core_hand_off_the_same_id_object() -> None:
    recorder = Recorder()
    core = NackingCore(recorder, [T, T + "2"], ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0))
    bare = _pulsar.MessageId(-1, 4, 2, -1)
    bare.topic_name(T + "2")
    core.nack(bare, delay_ms=0)
    assert wait_for(lambda: len(recorder.ids) == 1, 10)
    assert recorder.ids[0] is bare
    core.close(redeliver_pending=False)


def test_bare_id_on_a_partitioned_topic_is_keyed_to_its_partition() -> None:
    core = NackingCore(Recorder(), [T])
    key, _ = core.key_of(_pulsar.MessageId(2, 4, 2, -1))
    assert key == (f"{T}-partition-2", 4, 2, -1)
    core.close(redeliver_pending=False)


def test_bad_input_changes_nothing() -> None:
    core = NackingCore(Recorder(), [T])
    for bad, error in [("x", TypeError), (None, TypeError), ((T, 1, 2, -1), TypeError)]:
        with pytest.raises(error):
            core.nack(bad)
        with pytest.raises(error):
            core.before_ack(bad)
    with pytest.raises(ValueError, match="does not belong"):
        core.nack(Stub("persistent://public/default/other", 1, 1))
    assert len(core.tracker) == 0 and core.counts()["nacked"] == 0 and len(core.pending) == 0
    core.close(redeliver_pending=False)


def test_topic_matcher_names_partitions_and_patterns() -> None:
    names = TopicMatcher(["t", "persistent://x/y/z"])
    assert T in names and f"{T}-partition-3" in names and "persistent://public/default/u" not in names
    pattern = TopicMatcher(re.compile("persistent://public/default/t.*"))
    assert T in pattern and f"{T}x-partition-1" in pattern and "persistent://public/default/u" not in pattern
    assert full_topic_name("a/b/c") == "persistent://a/b/c"
    with pytest.raises(TypeError):
        TopicMatcher([1])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        TopicMatcher([""])


def test_raw_id_unwraps_every_form() -> None:
    import pulsar

    raw = _pulsar.MessageId(-1, 1, 2, -1)
    wrapped: Any = pulsar.MessageId(-1, 1, 2, -1)
    assert raw_id(raw) is raw
    assert raw_id(wrapped).entry_id() == 2
    with pytest.raises(TypeError):
        raw_id(object())
