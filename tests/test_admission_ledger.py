"""The admission ledger against a small oracle of its promises (no broker: the ledger alone, on an injected clock).

A hypothesis state machine drives :class:`~pulsar_nack.consumer.admission.AdmissionLedger`
with arbitrary interleavings of what a consumer sees: receives and copies of messages (a
reconnect's, a redelivery's, a whole entry again: batch siblings), acks, nacks, handoffs
(some of them refused by the client), the clock moving, expiry of old knowledge, and a
copy whose table verdict was read before another thread's ack (the race of issue 35).
After every step the oracle checks the promises:

* a nacked message is never handed to the application before its deadline (its handoff
  plus the lead, the bucket's time), and is delivered once it is due (nothing is lost);
* it comes back once per nack;
* an acked message never comes back.

Entries whose knowledge expired (``STALE_MS``) are left out of the checks: the ledger
forgets them on purpose, and documents it.
"""

from __future__ import annotations

from typing import Any

import _pulsar
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from helpers import _varint
from pulsar_nack.consumer import admission, msgid
from pulsar_nack.consumer.admission import AdmissionLedger
from pulsar_nack.timing import STALE_MS

T = "persistent://public/default/t"
LEDGER = 7
LEAD_MS = 95
ENTRIES = {1: 3, 2: 0, 3: 2}
"""Entry id -> batch size (0: one non-batched message)."""
MESSAGES = sorted((LEDGER, entry, index) for entry, size in ENTRIES.items() for index in (range(size) if size else [-1]))


class Copy:
    """A received copy of a message: its id carries the batch size, as the client's does."""

    def __init__(self, item: tuple[int, int, int]) -> None:
        ledger, entry, index = item
        fields = [(1, ledger), (2, entry)] + ([(4, index), (6, ENTRIES[entry])] if index >= 0 else [])
        self._id = _pulsar.MessageId.deserialize(b"".join(_varint(n << 3) + _varint(v) for n, v in fields))

    def message_id(self) -> Any:
        return self._id

    def redelivery_count(self) -> int:
        return 0


class LedgerMachine(RuleBasedStateMachine):
    """The ledger, and what the application was promised."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000
        self._restore = admission.monotonic_ms
        admission.monotonic_ms = lambda: self.now
        self.ledger = AdmissionLedger(None, lead_ms=LEAD_MS, always_guard=False, guard_messages=10, start_guard=10)
        self.holds: set[tuple[int, int, int]] = set()  # delivered, not yet acked or nacked by the application
        self.acked: set[tuple[int, int, int]] = set()
        self.pending: set[tuple[int, int, int]] = set()
        self.handed: set[tuple[int, int, int]] = set()  # handed off, not delivered since
        self.returned: set[tuple[int, int, int]] = set()  # delivered after its nack, not settled
        self.handoff_at: dict[int, int] = {}  # entry -> its last handoff (as the ledger notes it)
        self.forgotten: set[int] = set()  # entries whose knowledge may have expired

    def teardown(self) -> None:
        admission.monotonic_ms = self._restore

    # ------------------------------------------------------------------ the oracle

    def _decided(self, item: tuple[int, int, int], verdict: int) -> None:
        """Check a copy's verdict against the promises, and note a delivery."""
        entry = item[1]
        delivered = verdict == msgid.DELIVER
        if entry not in self.forgotten:
            assert not (delivered and item in self.acked), f"{item} delivered after its ack"
            assert not (delivered and item in self.pending), f"{item} delivered while its nack is pending"
            assert not (delivered and item in self.returned), f"{item} delivered twice for one nack"
            if item in self.handed:
                due = self.now >= self.handoff_at[entry] + LEAD_MS
                assert delivered == due, f"{item} {'delivered before' if delivered else 'swallowed after'} its deadline"
        if delivered:
            self.holds.add(item)
            if item in self.handed:
                self.handed.discard(item)
                self.returned.add(item)

    def _receive(self, item: tuple[int, int, int], outside: bool) -> None:
        """A copy arrives: decided under the lock, or (outside) its table verdict read first, as the C path does."""
        raw = Copy(item)
        if outside:
            verdict, data = self.ledger.entries.admit(raw)
            if verdict != msgid.DELIVER:
                verdict, data = self.ledger.screen(raw, data)
        else:
            verdict, _ = self.ledger.screen(raw, None)
        self._decided(item, verdict)

    # ------------------------------------------------------------------ what a consumer sees

    @rule(item=st.sampled_from(MESSAGES), outside=st.booleans())
    def copy(self, item: tuple[int, int, int], outside: bool) -> None:
        """A copy of one message: its first delivery, a reconnect's, an ack timeout's, a redelivery's."""
        self._receive(item, outside)

    @rule(entry=st.sampled_from(sorted(ENTRIES)), outside=st.booleans())
    def entry_again(self, entry: int, outside: bool) -> None:
        """The broker redelivers a whole entry: every member, batch siblings included."""
        for item in MESSAGES:
            if item[1] == entry:
                self._receive(item, outside)

    @precondition(lambda self: self.holds)
    @rule(data=st.data(), way=st.sampled_from(["data", "fields", "gate"]))
    def ack(self, data: st.DataObject, way: str) -> None:
        item = data.draw(st.sampled_from(sorted(self.holds)))
        ledger, entry, index = item
        if way == "gate" and self.ledger.screening is admission.Screening.TABLE:
            self._ack_as_the_gate(item)
        elif way != "fields":  # a delivered pulsar.Message: its id read when it was admitted
            self.ledger.note_ack_data(Copy(item).message_id().serialize())
        else:
            assert self.ledger.note_ack(ledger, entry, index, ENTRIES[entry] if index >= 0 else 0, made_up=False, topic=T)
        self.holds.discard(item)
        self.returned.discard(item)
        self.acked.add(item)
        self.ledger.to_ack_again.clear()

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(sorted(self.holds)))
        assert self.ledger.note_nack(item, ENTRIES[item[1]] if item[2] >= 0 else 0, None)
        self.holds.discard(item)
        self.returned.discard(item)
        self.acked.discard(item)  # acked, then a copy delivered anyway (a forgotten entry), then nacked
        self.pending.add(item)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), refused=st.booleans())
    def hand_off(self, data: st.DataObject, refused: bool) -> None:
        """Some pending messages come due: the ledger hands their entries to the client (which may refuse)."""
        due = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, unique=True))
        ids, undo = self.ledger.hand_off({T: [(T, *item) for item in due]})
        assert sorted((i.ledger_id(), i.entry_id()) for i in ids) == sorted({item[:2] for item in due})
        for item in due:
            self.handoff_at[item[1]] = self.now  # noted even if refused: the ledger errs on the safe side
        if refused:
            undo()
            return
        self.pending.difference_update(due)
        self.handed.update(due)

    @rule(ms=st.integers(0, 150))
    def clock(self, ms: int) -> None:
        self.now += ms

    @rule()
    def expire(self) -> None:
        """Knowledge older than ``STALE_MS`` may go: the entries of handed-off and returned messages."""
        self.now += STALE_MS
        self.forgotten.update(item[1] for item in self.handed | self.returned)
        self.ledger.hand_off({})

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def copy_racing_an_ack(self, data: st.DataObject) -> None:
        """Thread B reads a copy's table verdict, thread A's ack of the message lands, then B's screen runs."""
        item = data.draw(st.sampled_from(sorted(self.holds)))
        raw = Copy(item)
        verdict, read = self.ledger.entries.admit(raw)  # B, before A's ack
        self.ack_item(item)  # A
        if verdict == msgid.DELIVER:
            return  # a copy the table let through before the ack was received before it, as in the plain client
        verdict, _ = self.ledger.screen(raw, read)  # B, after A's ack: the ack must be seen
        assert verdict != msgid.DELIVER or item[1] in self.forgotten, f"{item} delivered after its ack"

    def _ack_as_the_gate(self, item: tuple[int, int, int]) -> None:
        """The blocking consumer's gate: the C table records the ack where it can (outside the lock),
        the ledger's one step takes the ack that completes a watched entry, else the Python path."""
        if not self.ledger.entries.ack_message(_kept(item)) and not self.ledger.note_completing_ack(*item):
            self.ledger.note_ack_data(Copy(item).message_id().serialize())

    def ack_item(self, item: tuple[int, int, int]) -> None:
        self.ledger.note_ack_data(Copy(item).message_id().serialize())
        self.holds.discard(item)
        self.returned.discard(item)
        self.acked.add(item)
        self.ledger.to_ack_again.clear()

    @invariant()
    def sound(self) -> None:
        self.ledger._check(len(self.pending))
        for item in MESSAGES:  # the ledger's state of each message agrees with the oracle's
            if item[1] in self.forgotten:
                continue
            state = self.ledger.state_of(item)
            if item in self.pending:
                assert state is admission.MessageState.PENDING, (item, state)
            elif item in self.handed:
                assert state is admission.MessageState.HANDED_OFF, (item, state)
            elif item in self.returned:
                assert state is admission.MessageState.RETURNED, (item, state)


LedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_ledger_keeps_its_promises = LedgerMachine.TestCase


def test_a_record_opened_after_a_nack_by_an_id_without_batch_size_carries_that_nack() -> None:
    """The table delivers a copy of a member its open record marks neither acked nor nacked, without the
    lock: a member nacked by an id without a batch size, before its entry had a record, must be marked
    nacked in the record a sibling's copy opens later."""
    ledger = AdmissionLedger(None, lead_ms=LEAD_MS, always_guard=False, guard_messages=10, start_guard=10)
    assert ledger.note_nack((LEDGER, 1, 1), 0, None)  # size 0: a made-up id, the entry not in flight yet
    assert ledger.screen(Copy((LEDGER, 1, 0)), None)[0] == msgid.DELIVER  # a sibling's copy opens the record
    assert ledger.entries.verdict(LEDGER, 1, 1) == msgid.NACKED
    assert ledger.entries.admit_message(Copy((LEDGER, 1, 1)), _Kept()) != msgid.DELIVER, "the pending copy is the screen's"


class _Kept:
    """A ``pulsar.Message`` stand-in that keeps attributes."""


def test_the_ack_completing_an_entry_is_the_general_paths_for_a_returned_member_its_record_lost() -> None:
    """An entry's knowledge expired with a member pending: the record a sibling's copy opens again marks
    only that member nacked (``_renack``), not a member returned meanwhile. The gate's ack of that
    returned member then completes the entry in the table; the ledger's one step must refuse it, so that
    the general path takes the member out of the returned set (and acks its held copy)."""
    now = [1_000_000]
    restore, admission.monotonic_ms = admission.monotonic_ms, lambda: now[0]
    try:
        ledger = AdmissionLedger(None, lead_ms=LEAD_MS, always_guard=False, guard_messages=10, start_guard=10)
        members = [(LEDGER, 1, index) for index in range(ENTRIES[1])]
        for item in members:
            assert ledger.screen(Copy(item), None)[0] == msgid.DELIVER
            assert ledger.note_nack(item, ENTRIES[1], None)

        def come_back(item: tuple[int, int, int]) -> None:  # handed off, and its copy delivered once due
            ledger.hand_off({T: [(T, *item)]})
            now[0] += LEAD_MS + 1
            assert ledger.screen(Copy(item), None)[0] == msgid.DELIVER

        def expire() -> None:
            now[0] += STALE_MS
            ledger.hand_off({})

        come_back(members[0])
        expire()
        come_back(members[2])  # returned in the young generation
        expire()  # member 0 forgotten: the entry leaves the complete set with member 1 pending
        assert ledger.screen(Copy(members[0]), None)[0] == msgid.DELIVER  # its record opened again
        assert ledger.entries.verdict(*members[1]) == msgid.NACKED and ledger.entries.verdict(*members[2]) == msgid.DELIVER
        assert ledger.entries.ack_message(_kept(members[0])), "member 0's ack: the table's"
        assert not ledger.entries.ack_message(_kept(members[2])), "member 2's ack completes the entry: the ledger's"
        assert ledger.state_of(members[2]) is admission.MessageState.RETURNED
        assert not ledger.note_completing_ack(*members[2]), "a returned member: the general path's"
        ledger.note_ack_data(Copy(members[2]).message_id().serialize())
        assert ledger.state_of(members[2]) is not admission.MessageState.RETURNED
    finally:
        admission.monotonic_ms = restore


def _kept(item: tuple[int, int, int]) -> Any:
    """A delivered copy of *item* that keeps the serialized id admission read (``msgid.STASH``)."""
    kept = _Kept()
    vars(kept)[msgid.STASH] = Copy(item).message_id().serialize()
    return kept
