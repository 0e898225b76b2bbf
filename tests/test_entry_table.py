"""The table of entries in flight (``EntryTable``): the C version against the pure-Python one and
against a plain model, no broker.

The consumer keeps, per batch entry in flight, which members the application acked and
nacked, and the last settled entries; ``pulsar_nack/consumer/_msgid.c`` explains the
records. Both versions must give the same answer to every call.
"""

from __future__ import annotations

import time

import _pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import _varint, wait_for
from pulsar_nack.consumer import msgid

TABLES = [pytest.param(msgid.PyEntryTable, id="python")]
if msgid.MSGID:
    TABLES.append(pytest.param(msgid.EntryTable, id="c"))

_keys = st.tuples(st.sampled_from([3, 2**40]), st.integers(0, 5))
_sizes = st.sampled_from([0, 1, 3, 64, 65, 130])
_ops = st.one_of(
    st.tuples(st.just("ack"), _keys, st.integers(-1, 130), _sizes, st.booleans(), st.booleans()),
    st.tuples(st.just("nack"), _keys, st.integers(-1, 130), _sizes, st.booleans(), st.just(False)),
    st.tuples(st.just("open"), _keys, st.just(0), _sizes, st.just(True), st.just(False)),
    st.tuples(st.just("settle"), _keys, st.just(0), st.just(0), st.just(True), st.just(False)),
    st.tuples(st.sampled_from(["forget_settled", "sweep", "clear_nacks", "clear", "unwatch"]), _keys, st.just(0),
              st.just(0), st.just(True), st.just(False)),
    st.tuples(st.just("watch"), _keys, st.just(0), st.just(0), st.just(True), st.just(False)),
    st.tuples(st.just("ack_message"), _keys, st.integers(-1, 130), _sizes, st.just(True), st.just(False)),
    st.tuples(st.just("ack_completing"), _keys, st.integers(-1, 130), st.just(0), st.just(True), st.just(False)),
    st.tuples(st.just("note_read"), _keys, st.integers(-1, 130), st.just(0), st.just(True), st.just(False)),
    # busy(ledger, entry, drain_ms, held_ms) with bounds no test run reaches or 0: the same answer from both clocks
    st.tuples(st.just("busy"), _keys, st.sampled_from([0, 10**6]), st.sampled_from([0, 10**6]), st.just(True),
              st.just(False)),
)


def _kept(ledger: int, entry: int, index: int = -1, size: int = 0) -> object:
    """A wrapper keeping the serialized id of member *index* of an entry of *size* members, as admit_message keeps it."""
    data = b"\x08" + _varint(ledger) + b"\x10" + _varint(entry)
    if index >= 0:
        data += b"\x20" + _varint(index)
    if size > 0:
        data += b"\x30" + _varint(size)
    wrapper = _Wrapper()
    vars(wrapper)[msgid.STASH] = data
    return wrapper


def _apply(table: object, op: tuple) -> object:
    name, (ledger, entry), index, size, create, foreign = op
    if name == "watch":
        return table.watch(ledger, entry)
    if name == "ack_message":
        return table.ack_message(_kept(ledger, entry, index, size))
    if name == "ack_completing":
        return table.ack_completing(ledger, entry, index)
    if name == "ack":
        return table.ack(ledger, entry, index, size, create=create, foreign=foreign)
    if name == "nack":
        return table.nack(ledger, entry, index, size, create=create)
    if name == "open":
        return table.open(ledger, entry, size)
    if name == "settle":
        return table.settle(ledger, entry)
    if name == "note_read":
        return table.note_read(ledger, entry, index)
    if name == "busy":
        return table.busy(ledger, entry, index, size)
    return getattr(table, name)()


@pytest.mark.skipif(not msgid.MSGID, reason="the C extension was not built")
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_ops, max_size=60), capacity=st.sampled_from([0, 1, 3, 64]))
def test_c_and_python_tables_agree_on_every_call(ops: list[tuple], capacity: int) -> None:
    c_table, py_table = msgid.EntryTable(capacity), msgid.PyEntryTable(capacity)
    for op in ops:
        assert _apply(c_table, op) == _apply(py_table, op), op
        c_table._check()
        py_table._check()
        assert c_table.counts() == py_table.counts() and len(c_table) == len(py_table)
        for ledger in (3, 2**40):
            for entry in range(6):
                assert c_table.size_of(ledger, entry) == py_table.size_of(ledger, entry)
                for index in (-1, 0, 1, 2, 63, 64, 129):
                    assert c_table.verdict(ledger, entry, index) == py_table.verdict(ledger, entry, index)


@pytest.mark.parametrize("table_type", TABLES)
def test_an_entry_settles_when_every_member_is_acked(table_type) -> None:
    table = table_type(8)
    assert [table.ack(1, 9, i, 3) for i in (0, 2)] == [msgid.Outcome.NONE, msgid.Outcome.NONE]
    assert table.verdict(1, 9, 0) == msgid.Verdict.ACKED and table.verdict(1, 9, 1) == msgid.Verdict.DELIVER
    assert table.ack(1, 9, 1, 3) == msgid.Outcome.SETTLED
    assert table.counts() == (0, 1) and table.verdict(1, 9, 1) == msgid.Verdict.ACKED


@pytest.mark.parametrize("table_type", TABLES)
def test_an_entry_with_a_nacked_member_completes_and_leaves(table_type) -> None:
    table = table_type(8)
    assert table.nack(1, 9, 1, 3) == msgid.Outcome.NONE
    assert table.verdict(1, 9, 1) == msgid.Verdict.NACKED
    assert table.ack(1, 9, 0, 3) == msgid.Outcome.NONE
    assert table.ack(1, 9, 2, 3) == msgid.Outcome.COMPLETE
    assert len(table) == 0 and table.verdict(1, 9, 0) == msgid.Verdict.FRESH


@pytest.mark.parametrize("table_type", TABLES)
def test_a_settled_record_older_than_the_age_bound_leaves_at_the_next_settlement(table_type) -> None:
    table = table_type(1 << 20, 30)  # a capacity never reached here: only the age can drop a record
    assert table.ack(4, 0, -1, 0) == msgid.Outcome.SETTLED
    started = time.monotonic()
    settled = 1

    def first_forgotten() -> bool:  # each settlement drops the settlements older than 30 ms
        nonlocal settled
        table.ack(4, settled, -1, 0)
        settled += 1
        return table.verdict(4, 0, -1) == msgid.Verdict.FRESH

    assert wait_for(first_forgotten, 5.0)
    assert time.monotonic() - started >= 0.03  # not before its age
    assert table.verdict(4, settled - 1, -1) == msgid.Verdict.ACKED  # the newest stays
    table._check()


@pytest.mark.parametrize("table_type", TABLES)
@pytest.mark.parametrize(("args", "error"), [((8, -1), ValueError), ((8, (1 << 30) + 1), ValueError), ((8, 1.5), TypeError)])
def test_a_bad_age_bound_is_refused(table_type, args: tuple, error: type) -> None:
    with pytest.raises(error):
        table_type(*args)


@pytest.mark.parametrize("table_type", TABLES)
def test_settled_records_are_the_last_settlements(table_type) -> None:
    table = table_type(3)
    for entry in range(5):
        assert table.ack(4, entry, -1, 0) == msgid.Outcome.SETTLED
    assert [table.verdict(4, e, -1) for e in range(5)] == [msgid.Verdict.FRESH] * 2 + [msgid.Verdict.ACKED] * 3
    table.forget_settled()
    assert len(table) == 0


@pytest.mark.parametrize("table_type", TABLES)
def test_a_member_acked_through_a_made_up_id_is_reported_at_settlement(table_type) -> None:
    table = table_type(8)
    table.open(2, 3, 2)
    assert table.size_of(2, 3) == 2
    assert table.ack(2, 3, 0, 2, foreign=True) == msgid.Outcome.NONE
    assert table.ack(2, 3, 1, 2) == msgid.Outcome.SETTLED_FOREIGN


@pytest.mark.parametrize("table_type", TABLES)
def test_admit_reads_the_id_of_a_message(table_type) -> None:
    class Message:
        def __init__(self, message_id: _pulsar.MessageId) -> None:
            self._id = message_id

        def message_id(self) -> _pulsar.MessageId:
            return self._id

    table = table_type(8)
    table.ack(11, 12, 1, 4)
    verdict, data = table.admit(Message(_pulsar.MessageId(-1, 11, 12, 1)))
    assert verdict == msgid.Verdict.ACKED and msgid.parse_id(data)[:4] == (11, 12, -1, 1)
    assert table.admit(Message(_pulsar.MessageId(-1, 11, 12, 2)))[0] == msgid.Verdict.DELIVER
    assert table.admit(Message(_pulsar.MessageId(-1, 11, 13, 2)))[0] == msgid.Verdict.FRESH


@pytest.mark.parametrize("table_type", TABLES)
def test_wide_entries_keep_every_member(table_type) -> None:
    table = table_type(4)
    for index in range(0, 1000, 7):
        table.ack(5, 6, index, 1000)
    assert all(table.verdict(5, 6, i) == (msgid.Verdict.ACKED if i % 7 == 0 else msgid.Verdict.DELIVER) for i in range(1000))
    for index in range(1000):
        if index % 7:
            outcome = table.ack(5, 6, index, 1000)
    assert outcome == msgid.Outcome.SETTLED and table.counts() == (0, 1)


def test_the_c_table_compiles_in_the_verdicts_and_outcomes_of_the_python_enums() -> None:
    """One table: ``_msgid.c``'s #defines are msgid.Verdict's and msgid.Outcome's values (as it reports
    them, and as written in its source where the source is at hand: a wheel holds none), and no
    verdict shares a value with an outcome."""
    import re
    from pathlib import Path

    path = Path(msgid.__file__).parent / "_msgid.c"
    table_verdicts = {v.name: v.value for v in msgid.Verdict if v not in (msgid.Verdict.ROUTE, msgid.Verdict.ROUTE_STORED)}
    if not path.exists() and not msgid.MSGID:
        pytest.skip("neither the C source nor the built table here: pure Python installed from a package")
    if path.exists():
        source = path.read_text()
        written = {m[1]: int(m[2]) for m in re.finditer(r"#define V_(\w+) (\d+)", source)}
        assert written == table_verdicts
        written = {m[1]: int(m[2]) for m in re.finditer(r"#define R_(\w+) (\d+)", source)}
        assert written == {o.name: o.value for o in msgid.Outcome}
    assert not {v.value for v in msgid.Verdict} & {o.value for o in msgid.Outcome}
    if msgid.MSGID:
        import pulsar_nack.consumer._msgid as c

        assert table_verdicts == c.VERDICTS
        assert {o.name: o.value for o in msgid.Outcome} == c.OUTCOMES


class _Received:
    """A received message stand-in for ``admit_message``: its id only."""

    def __init__(self, ledger: int, entry: int, index: int = -1) -> None:
        self._id = _pulsar.MessageId(-1, ledger, entry, index)

    def message_id(self) -> _pulsar.MessageId:
        return self._id


class _Wrapper:
    """A ``pulsar.Message`` stand-in: it keeps attributes, as the wrapper does."""


@pytest.mark.parametrize("table_type", TABLES)
def test_admit_message_decides_copies_of_unwatched_entries_and_keeps_the_id(table_type) -> None:
    table = table_type(8)
    table.guard_left = 3
    wrapper = _Wrapper()
    assert table.admit_message(_Received(11, 12), wrapper) == msgid.DELIVER
    assert msgid.parse_id(vars(wrapper)[msgid.STASH])[:2] == (11, 12), "the id is kept on the wrapper"
    table.watch(11, 12)
    assert table.watched(11, 5) and table.watched(11, 12) and not table.watched(11, 13) and not table.watched(12, 0)
    assert table.admit_message(_Received(11, 12), _Wrapper()) == msgid.FRESH, "a watched entry's copy is the caller's"
    assert table.admit_message(_Received(11, 13), _Wrapper()) == msgid.DELIVER
    assert table.admit_message(_Received(12, 0), _Wrapper()) == msgid.DELIVER_LAST, "the third delivery ends the count"
    table.ack(11, 14, -1, 0)
    assert table.admit_message(_Received(11, 14), _Wrapper()) == msgid.ACKED
    table.unwatch()
    assert not table.watched(11, 12)
    table.watch_all = True
    assert table.admit_message(_Received(30, 1), _Wrapper()) == msgid.FRESH and table.guard_left == 0
    assert table.watched(99, 99)


@pytest.mark.skipif(not msgid.MSGID, reason="the C extension is not built")
@pytest.mark.parametrize("bad", [(11,), (11, 12, 13), ("11", 12), (11, 1.5), (2**64, 1)])
def test_watch_and_watched_refuse_a_bad_call_by_name_and_change_nothing(bad) -> None:
    """They read their two ints themselves (METH_FASTCALL): a wrong count or type is a TypeError, an int too
    large an OverflowError, as the format parser gave, and no mark is set."""
    table = msgid.EntryTable(8)
    for method in ("watch", "watched"):
        with pytest.raises((TypeError, OverflowError)) as raised:
            getattr(table, method)(*bad)
        if len(bad) != 2:
            assert f"{method}()" in str(raised.value)
    assert not table.watched(11, 0) and not table.watched(2**63 - 1, 0), "a refused call set a mark"


@pytest.mark.parametrize("table_type", TABLES)
def test_an_entry_is_busy_while_its_member_given_last_is_unsettled_or_it_was_read_from_within_the_drain(table_type) -> None:
    """On a shared subscription the consumer holds back the handoff of a busy entry (tests/test_entry_handoff.py)."""
    table = table_type(8)
    assert table.busy(5, 1, 10**6, 10**6) is False, "no record: nothing of it reaches the application here"
    table.guard_left = 10
    table.open(5, 1, 2)  # an entry of 2 members in flight
    assert table.admit_message(_Received(5, 1, 0), _Wrapper()) == msgid.DELIVER
    assert table.busy(5, 1, 0, 10**6) is True, "member 0 was given to the application and is unsettled"
    assert table.busy(5, 1, 0, 0) is False, "held longer than held_ms: no longer counted"
    table.nack(5, 1, 0, 2)
    assert table.busy(5, 1, 0, 10**6) is False and table.busy(5, 1, 10**6, 0) is True, "settled: busy for the drain only"
    assert wait_for(lambda: not table.busy(5, 1, 20, 10**6), 5.0), "the drain never ended"
    table.note_read(5, 1, 1)  # the caller gave member 1 to the application
    assert table.busy(5, 1, 0, 10**6) is True
    table.ack(5, 1, 1, 2)  # every member settled: the record leaves
    assert table.busy(5, 1, 10**6, 10**6) is False
    with pytest.raises(ValueError, match="drain_ms"):
        table.busy(5, 1, -1, 0)


@pytest.mark.parametrize("table_type", TABLES)
def test_ack_message_records_the_acks_of_unwatched_entries_only(table_type) -> None:
    table = table_type(8)
    kept = _Wrapper()
    table.admit_message(_Received(4, 20), kept)
    assert table.ack_message(kept) is True and table.verdict(4, 20, -1) == msgid.ACKED
    assert table.ack_message(_Wrapper()) is False, "no id kept: the caller reads it"
    watched = _Wrapper()
    table.admit_message(_Received(4, 21), watched)
    table.watch(4, 21)
    assert table.ack_message(watched) is False and table.verdict(4, 21, -1) == msgid.FRESH, "nothing recorded"
    table.watch_all = True
    assert table.ack_message(kept) is False


@pytest.mark.parametrize("table_type", TABLES)
def test_ack_message_records_a_watched_member_only_where_the_callers_books_cannot_change(table_type) -> None:
    table = table_type(8)
    table.open(5, 1, 3)
    table.nack(5, 1, 0, 3)
    table.watch(5, 1)
    assert table.ack_message(_kept(5, 1, 1, 3)) is True and table.verdict(5, 1, 1) == msgid.ACKED, "neither acked nor nacked"
    assert table.ack_message(_kept(5, 1, 0, 3)) is False and table.verdict(5, 1, 0) == msgid.NACKED, "a nacked member"
    assert table.ack_message(_kept(5, 1, 2, 3)) is False and table.verdict(5, 1, 2) == msgid.DELIVER, (
        "the ack completing an entry with a nacked member: the caller's, nothing recorded")
    assert table.ack_completing(5, 1, 1) is False and table.ack_completing(5, 1, 0) is False, "acked, nacked: not it"
    assert table.ack_completing(5, 1, 2) is True and table.verdict(5, 1, 2) == msgid.FRESH, (
        "the ack completing it, once the caller takes it: the record dropped, as ack() drops a complete entry's")
    assert table.ack_completing(5, 1, 2) is False, "no record left"
    table.open(5, 4, 2)
    table.nack(5, 4, 0, 2)
    assert table.ack_completing(5, 4, 1) is False and table.verdict(5, 4, 1) == msgid.DELIVER, "an entry not watched"
    table.watch(5, 2)
    assert table.ack_message(_kept(5, 2, 0, 3)) is False, "a watched entry without an open record"
    table.open(5, 0, 2)
    assert table.ack_message(_kept(5, 0, 0, 2)) is True and table.ack_message(_kept(5, 0, 1, 2)) is True
    assert table.verdict(5, 0, 0) == msgid.ACKED and table.counts() == (1, 1), "every member acked: settled"
    table.ack(5, 3, 0, 2, foreign=True)
    table.watch(5, 3)
    assert table.ack_message(_kept(5, 3, 1, 2)) is False, "a member acked through a made-up id: the caller reports it"
    table._check()
