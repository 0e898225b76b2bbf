"""The blocking consumer's gate (``_msgid.Gate``) shared by threads: no copy it receives is lost.

Unit tests with stand-ins for the client's receive and message (a path no broker run can
reach on purpose: two receives interleaved at one exact point). The real-broker check is
``tests/test_faults.py::test_eight_threads_sharing_a_consumer_ten_runs_no_copy_after_an_ack``,
where this race lost a message about once in ten runs of ten.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import _pulsar
import pytest

from helpers import _varint
from pulsar_nack.consumer import msgid
from pulsar_nack.consumer.msgid import EntryTable, Gate

pytestmark = pytest.mark.skipif(Gate is None, reason="the C reader is not built (pure Python)")

LEDGER = 7
SIZE = 3


class Copy:
    """A received copy of member *index* of entry *entry* (a batch of SIZE): what the gate reads of a _pulsar.Message."""

    def __init__(self, entry: int, index: int) -> None:
        fields = [(1, LEDGER), (2, entry), (4, index), (6, SIZE)]
        self._id = _pulsar.MessageId.deserialize(b"".join(_varint(n << 3) + _varint(v) for n, v in fields))

    def message_id(self) -> Any:
        return self._id


class Message:
    """The pulsar.Message stand-in the gate wraps each copy in (it sets attributes on it)."""


class Ledger:
    """What the gate reads of the admission ledger: its screening mode."""

    screening = "table"


def _gate(receive: Any) -> Any:
    table = EntryTable(100)
    table.guard_left = 100  # guarded deliveries left before the ledger looks at going quiet
    table.watch(LEDGER, 10)  # entries 0-10 watched: their copies are the Python screen's
    return Gate(receive, lambda message: None, Message, None, Ledger(), "none", "table", table,
                itertools.count(), itertools.count(), None)  # fmt: skip  (None: no ledger step for acks)


def test_two_threads_receiving_at_once_each_get_the_copy_they_received() -> None:
    """Thread A's copy is left to the screen; thread B's receive returns before A's screen starts.
    Each thread must get its own copy back: with one slot shared by the threads (the gate before
    the fix, ``take()``), B's copy replaced A's, which the client counted delivered and no one saw."""
    both_inside = threading.Barrier(2)
    a_returned = threading.Event()
    copies = {"A": Copy(1, 0), "B": Copy(2, 1)}

    def receive(timeout_millis: int) -> Any:
        name = threading.current_thread().name
        both_inside.wait(10)
        if name == "B":  # B's copy arrives after A's receive returned, before A screens it
            assert a_returned.wait(10)
        return copies[name]

    gate = _gate(receive)
    got: dict[str, Any] = {}
    b_returned = threading.Event()

    def run(name: str) -> None:
        result = gate.receive(1000)
        if name == "A":
            a_returned.set()
            assert b_returned.wait(10)  # A screens only after B's receive returned
        else:
            b_returned.set()
        got[name] = result

    threads = [threading.Thread(target=run, args=(name,), name=name) for name in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert set(got) == {"A", "B"}
    for name, result in got.items():
        assert isinstance(result, tuple), f"{name}: the gate returned {result!r}, not its copy for the screen"
        message, verdict, _ = result
        assert message._message is copies[name], f"{name} got another thread's copy"
        assert verdict == msgid.FRESH, "a watched entry's copy without a record: the ledger's to decide"


def test_a_copy_the_table_delivers_is_returned_as_the_message() -> None:
    gate = _gate(lambda timeout_millis: Copy(20, 2))  # entry 20: not watched, the table decides
    message = gate.receive(1000)
    assert isinstance(message, Message) and message._message.message_id().entry_id() == 20


def test_nothing_is_received_while_the_ledger_screens_in_python() -> None:
    calls = []
    gate = _gate(calls.append)
    Ledger.screening = "python"
    try:
        assert gate.receive(1000) is None and not calls
    finally:
        Ledger.screening = "table"
