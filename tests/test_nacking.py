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
import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import _varint, wait_for
from pulsar_nack import timing
from pulsar_nack.consumer import admission, nacking
from pulsar_nack.consumer._client import raw_id
from pulsar_nack.consumer.message_sets import PendingNacks
from pulsar_nack.consumer.nacking import NackingCore, TopicMatcher, full_topic_name
from pulsar_nack.consumer.settings import ConsumerSettings
from pulsar_nack.consumer.subscription import Sharing

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
    assert len(core.tracker) == 0 and core.counts()["nacked"] == 0 and len(core.ledger.pending) == 0
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


def test_counters_are_exact_under_threads_and_read_without_a_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    """counts() reads the lock-free counters through the iterator protocol, not by parsing their repr."""

    def no_repr(obj: object) -> str:
        raise AssertionError(f"a counter was read from its repr: {obj!r:.0}")

    monkeypatch.setattr(nacking, "repr", no_repr, raising=False)
    core = NackingCore(Recorder(), [T])
    message = Stub(T, 1, 1)

    def receive() -> None:
        for _ in range(20_000):
            core.admit(message)  # type: ignore[arg-type]

    threads = [threading.Thread(target=receive) for _ in range(4)]
    for thread in threads:
        thread.start()
    reads = [core.counts()["received"] for _ in range(200)]  # reading while they count
    for thread in threads:
        thread.join()
    assert reads == sorted(reads) and core.counts()["received"] == core.counts()["received"] == 80_000


# ---------------------------------------------------------------- admission (which copies reach the application)


class Member(Stub):
    """A received batch member: its id carries the batch size, as the client's does."""

    def __init__(self, ledger: int, entry: int, index: int, size: int) -> None:
        super().__init__(T, ledger, entry)
        fields = [(1, ledger), (2, entry), (4, index), (6, size)]
        self._id = _pulsar.MessageId.deserialize(b"".join(_varint(n << 3) + _varint(v) for n, v in fields))


def _core(**kwargs: Any) -> tuple[NackingCore, list[Any]]:
    acked: list[Any] = []
    settings = ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0)
    return NackingCore(Recorder(), [T], settings, acknowledge=acked.append, **kwargs), acked


def _ack(core: NackingCore, message: Any) -> None:
    core.before_ack(message)
    core.after_ack()


def test_a_pending_unbatched_nack_is_swallowed_by_default() -> None:
    core, _ = _core()
    message = Stub(T, 5, 1)
    assert core.admit(message)
    core.nack(message, delay_ms=60_000)
    assert not core.admit(message), "a reconnect's copy of a pending nack reached the application"
    assert core.counts()["swallowed"] == 1
    core._check()
    core.close(redeliver_pending=False)


class Wrapper:
    """A ``pulsar.Message`` stand-in around a received stand-in: it keeps the id read on admission."""


def test_the_guarding_path_swallows_a_pending_nacks_copy_and_leaves_fresh_entries_to_the_table() -> None:
    """admit(raw, wrapper), the blocking consumer's call: the table decides unwatched entries, the core the rest."""
    core, _ = _core()
    message, wrapper = Stub(T, 5, 1), Wrapper()
    assert core.admit(message, wrapper)
    core.nack(message, delay_ms=60_000)
    assert not core.admit(Stub(T, 5, 1), Wrapper()), "a reconnect's copy of a pending nack reached the application"
    later, kept = Stub(T, 5, 2), Wrapper()
    assert core.admit(later, kept), "a fresh message above the nacked entry"
    assert core.ledger.entries.ack_message(kept), "its ack is the table's"
    assert not core.ledger.entries.ack_message(wrapper), "the nacked entry's ack is the ledger's"
    assert core.counts()["swallowed"] == 1
    core._check()
    core.close(redeliver_pending=False)


def test_a_handed_off_message_comes_back_once_and_its_later_copy_is_acked_with_it() -> None:
    core, acked = _core()
    message = Member(5, 2, 1, 3)
    assert core.admit(message)
    core.nack(message, delay_ms=0)
    assert wait_for(lambda: core.ledger._handed, 10)
    assert core.admit(message), "the copy after the handoff is the one the application sees"
    second = Member(5, 2, 1, 3)
    assert not core.admit(second), "a second copy (the entry handed off twice) must not be delivered"
    core._check()
    _ack(core, message)
    assert acked == [second], "the held copy is acked with the message"
    core._check()
    core.close(redeliver_pending=False)


@pytest.mark.parametrize("never_early", [False, True], ids=["floor", "never_early"])
def test_a_copy_before_its_bucket_deadline_is_swallowed_and_the_clients_redelivery_is_not(
    monkeypatch: pytest.MonkeyPatch, never_early: bool
) -> None:
    """Default settings (8 bits, the client's 100 ms delay): a bucket fires ``lead_ms`` before
    its deadline, so a copy of a handed-off message before the handoff plus that lead comes
    before its bucket; whatever brought it (a reconnect), it is swallowed. From the client's
    delay on, a copy may be the client's own redelivery and is delivered (nothing is lost).

    Stand-in clock (the core's reading of it), since no broker can time a reconnect to the
    millisecond. Issue 23: buckets fired 132 ms early while copies were swallowed only 95 ms
    after the handoff, so a reconnect in between brought a copy up to 37 ms before its bucket.
    """
    clock = [10_000_000]
    monkeypatch.setattr(admission, "monotonic_ms", lambda: clock[0])
    recorder = Recorder()
    core = NackingCore(recorder, [T], ConsumerSettings(never_early=never_early))
    message = Stub(T, 21, 4)
    assert core.admit(message)
    core.nack(message, delay_ms=0)
    assert wait_for(lambda: len(recorder.ids) == 1, 10), "nothing was handed off"
    handed_at = clock[0]  # the core read its clock for the handoff: the bucket's deadline is lead_ms later
    clock[0] = handed_at + core.tracker.lead_ms - 1
    assert not core.admit(Stub(T, 21, 4)), "a copy 1 ms before its bucket's deadline reached the application"
    clock[0] = handed_at + core.handoff_delay_ms
    assert core.admit(Stub(T, 21, 4)), "a copy as soon as the client can redeliver it was swallowed (it would be lost)"
    core.close(redeliver_pending=False)


def test_acked_members_are_filtered_and_acked_again_until_the_entry_settles() -> None:
    core, acked = _core()
    members = [Member(6, 3, i, 3) for i in range(3)]
    assert all(core.admit(m) for m in members)
    _ack(core, members[0])
    core.nack(members[1], delay_ms=60_000)
    _ack(core, members[2])
    assert len(core.ledger._complete) == 1 and len(core.ledger.entries) == 0, "every member acked or nacked: complete"
    copies = [Member(6, 3, i, 3) for i in range(3)]
    assert [core.admit(c) for c in copies] == [False, False, False]
    assert acked == [copies[0], copies[2]], "the acked members' copies are acked again; the pending one is not"
    assert core.counts()["filtered"] == 2 and core.counts()["swallowed"] == 1
    core.reset(forget_counts=False)  # the pending member is forgotten: its copy must be delivered now
    assert core.admit(Member(6, 3, 1, 3))
    core._check()
    core.close(redeliver_pending=False)


def test_an_entry_settles_when_its_nacked_member_is_acked_after_its_return() -> None:
    core, _ = _core()
    members = [Member(7, 4, i, 2) for i in range(2)]
    assert all(core.admit(m) for m in members)
    core.nack(members[0], delay_ms=0)
    _ack(core, members[1])
    assert wait_for(lambda: core.ledger._handed, 10)
    returned = Member(7, 4, 0, 2)
    assert core.admit(returned)
    _ack(core, returned)
    assert len(core.ledger._complete) == 0 and core.ledger.entries.counts() == (0, 1)
    assert not core.admit(Member(7, 4, 0, 2)) and not core.admit(Member(7, 4, 1, 2)), "a settled entry's copy"
    core._check()
    core.close(redeliver_pending=False)


def test_the_core_goes_quiet_after_guard_messages_and_guards_again_on_a_nack() -> None:
    core, _ = _core(guard_messages=5)
    messages = [Stub(T, 8, e) for e in range(6)]
    for message in messages[:5]:
        assert core.admit(message)
    assert core.ledger.quiet, "no nack state for guard_messages deliveries: quiet"
    core.nack(messages[5], delay_ms=60_000)
    assert not core.ledger.quiet
    assert not core.admit(Stub(T, 8, 5))
    core.close(redeliver_pending=False)


def test_a_handed_off_message_that_never_returns_is_forgotten_and_its_entry_with_it(monkeypatch) -> None:
    from pulsar_nack.consumer import admission

    now = [1_000_000]
    monkeypatch.setattr(admission, "monotonic_ms", lambda: now[0])
    core, _ = _core(guard_messages=1)
    members = [Member(9, 5, i, 2) for i in range(2)]
    assert all(core.admit(m) for m in members)
    core.nack(members[0], delay_ms=0)
    _ack(core, members[1])
    assert wait_for(lambda: core.ledger._handed, 10)
    assert len(core.ledger._complete) == 1
    now[0] += timing.STALE_MS
    assert core.admit(Stub(T, 1, 1))  # a delivery while guarding ages the states once: not yet stale
    assert core.ledger._handed and core.ledger._complete
    now[0] += timing.STALE_MS
    assert core.admit(Stub(T, 1, 2))  # twice: stale
    assert not core.ledger._handed and not core.ledger._complete, "a stale handoff must leave no knowledge behind"
    assert core.admit(Member(9, 5, 1, 2)), "an entry no longer known is delivered, never filtered"
    core._check()
    core.close(redeliver_pending=False)


def test_an_id_built_for_a_member_is_recorded_and_an_out_of_range_one_refused() -> None:
    core, acked = _core()
    members = [Member(10, 6, i, 3) for i in range(3)]
    assert all(core.admit(m) for m in members)
    with pytest.raises(ValueError, match="outside its batch of 3"):
        core.before_ack(_pulsar.MessageId(-1, 10, 6, 3))
    assert core.before_ack(_pulsar.MessageId(-1, 10, 6, 0)) is None, "the client would ack the whole entry"
    _ack(core, members[1])
    _ack(core, members[2])
    whole = acked[-1]
    assert (whole.ledger_id(), whole.entry_id(), whole.batch_index()) == (10, 6, -1), "then the entry is acked"
    core._check()
    core.close(redeliver_pending=False)


def test_a_returned_member_of_a_complete_entry_is_never_taken_for_acked() -> None:
    """With an ack timeout (always_guard) a returned message's copy is delivered again: its
    entry is complete (every member nacked), but a member in a nack set was not acked."""
    acked: list[Any] = []
    settings = ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0, always_guard=True)
    core = NackingCore(Recorder(), [T], settings, acknowledge=acked.append)
    members = [Member(11, 7, i, 2) for i in range(2)]
    assert all(core.admit(m) for m in members)
    for member in members:
        core.nack(member, delay_ms=0)
    assert len(core.ledger._complete) == 1
    assert wait_for(lambda: len(core.ledger._handed) == 2, 10)
    assert core.admit(Member(11, 7, 0, 2)) and core.admit(Member(11, 7, 1, 2))  # returned
    assert core.admit(Member(11, 7, 0, 2)), "an ack timeout's copy of an unsettled message must be delivered"
    assert not acked, "nothing the application did not ack may be acked"
    core._check()
    core.close(redeliver_pending=False)


def test_a_copy_that_comes_back_while_the_handoff_runs_is_delivered() -> None:
    """The client may redeliver before the timer thread gets the GIL back: the copy must find
    the message handed off, not pending (else it is swallowed and nothing brings it back)."""
    admitted: list[bool] = []
    holder: list[NackingCore] = []

    def hand_off(ids: list[_pulsar.MessageId]) -> None:
        admitted.append(holder[0].admit(Stub(T, 12, 8)))  # the copy, inside the handoff

    core = NackingCore(hand_off, [T], ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0))
    holder.append(core)
    message = Stub(T, 12, 8)
    assert core.admit(message)
    core.nack(message, delay_ms=0)
    assert wait_for(lambda: admitted, 10)
    assert admitted == [True], "the copy brought by the handoff was swallowed"
    core._check()
    core.close(redeliver_pending=False)


def test_a_failed_handoff_leaves_the_message_pending_until_it_is_retried() -> None:
    calls: list[int] = []
    holder: list[NackingCore] = []

    def hand_off(ids: list[_pulsar.MessageId]) -> None:
        calls.append(len(ids))
        if len(calls) == 1:
            assert (12, 9, -1) in holder[0]._handed
            raise RuntimeError("the client is busy")

    settings = ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0)
    core = NackingCore(hand_off, [T], settings)
    holder.append(core)
    core.tracker.retry_delay_ms = 50
    message = Stub(T, 12, 9)
    assert core.admit(message)
    core.nack(message, delay_ms=0)
    assert wait_for(lambda: len(calls) >= 2, 10), "the failed handoff was not retried"
    assert (12, 9, -1) in core.ledger._handed and (12, 9, -1) not in core.ledger.pending
    core._check()
    core.close(redeliver_pending=False)


# ---------------------------------------------------------------- dead-letter counts


class Counted(Member):
    """A batch member copy with the broker's redelivery count for its entry."""

    def __init__(self, count: int) -> None:
        super().__init__(6, 4, 1, 2)
        self._count = count

    def redelivery_count(self) -> int:
        return self._count


@pytest.mark.parametrize(("sharing", "expected"), [(Sharing.ONE_ACTIVE, 3), (Sharing.SHARED, 2)])
def test_a_broker_count_that_jumps_by_two_for_one_copy_does_not_dead_letter_early(sharing: Sharing, expected: int) -> None:
    """With one active consumer, deliveries to the application decide: 3 with max_redeliver_count=2.

    Stand-in, because no broker does this on demand. Seen intermittently in full CI runs
    on Apache Pulsar 4.0.8 (issue 22) as members of a batch dead-lettered after 2
    deliveries: the broker's count for their entry was above the copies that reached the
    consumer. Which redelivery moved it is not pinned down (not reproduced on an idle
    broker); with one active consumer the count that decides is bounded by the deliveries
    the core made. On a shared subscription the broker's count is the floor (it counts the
    other consumers' deliveries, as the plain client counts): the jump then decides, as it
    would for the plain client, after 2 deliveries.
    """
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2)
    settings = ConsumerSettings(negative_ack_precision_bit_cnt=0, handoff_delay_ms=0, dead_letter_policy=policy,
                                sharing=sharing)  # fmt: skip
    routed: list[Any] = []
    recorder = Recorder()
    core = NackingCore(recorder, [T], settings, acknowledge=lambda _m: None)
    core.route_dead_letters(lambda message, stored: routed.append(message))
    deliveries = 0
    for count in (0, 2, 3):  # the second copy's count moved by two
        assert wait_for(lambda n=deliveries: len(recorder.ids) == n, 10), "the handoff did not happen"
        assert core.admit(Counted(count)), f"the copy with count {count} was not delivered"
        deliveries += 1
        core.nack(Counted(count), delay_ms=0)
        if routed:
            break
    assert deliveries == expected and len(routed) == 1, f"dead-lettered after {deliveries} deliveries"
    core.close(redeliver_pending=False)



def test_a_chunked_message_is_handed_off_in_entry_order() -> None:
    """Its first chunk's entry first, its last chunk's entry last: the client's nack timer may release the
    ids in two ticks, and a later chunk that reaches the client before the first is dropped (the C++ client's
    "chunk id is invalid"), so the message never comes back (seen on Apache Pulsar 3.0.7 under load)."""
    ledger = admission.AdmissionLedger(None, lead_ms=0, always_guard=False, guard_messages=1, start_guard=1)
    assert ledger.note_nack((7, 12, -1), 0, None, first_chunk=(7, 9))
    ids, _ = ledger.hand_off({T: [(T, 7, 12, -1)]})
    assert [(i.ledger_id(), i.entry_id()) for i in ids] == [(7, 9), (7, 10), (7, 11), (7, 12)]
