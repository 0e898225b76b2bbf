"""The reader of a received message's id and the table of entries in flight: the optional C
``pulsar_nack.consumer._msgid`` and its pure-Python stand-ins, with the same results and errors.

The consumer's nack path reads ``(topic, ledger, entry, batch_index)`` of every message it
is given. The C reader takes them from one ``serialize()`` of the id instead of four
calls (``bench/client.py`` measures both). :class:`PyEntryTable` (C: ``EntryTable``) keeps,
per batch entry in flight, which members the application acked and nacked, and the last
settled entries (see ``_msgid.c``). ``PULSAR_NACK_PURE_PYTHON=1`` before import forces the
stand-ins. Where the installed client allows it, the C reader reads the fields through
libpulsar's C++ accessors instead, with no Python call (:data:`NATIVE_IDS`,
:mod:`~pulsar_nack.consumer.native_ids`); the table then keeps no id on the wrapper and reads
it again at the ack.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from ..core.accel import load_optional
from ..core.keys import message_key as py_message_key
from ..core.timer import monotonic_ms
from . import native_ids

__all__ = [
    "ACKED",
    "COMPLETE",
    "DELIVER",
    "DELIVER_LAST",
    "FRESH",
    "MISSING",
    "MSGID",
    "NACKED",
    "NATIVE_IDS",
    "ROUTE",
    "ROUTE_STORED",
    "SETTLED_FOREIGN",
    "STASH",
    "EntryTable",
    "Gate",
    "Outcome",
    "PyEntryTable",
    "Verdict",
    "first_chunk",
    "log_received",
    "message_key",
    "parse_id",
    "py_log_received",
    "py_message_key",
    "py_parse_id",
    "py_received_key",
    "py_settle_logged",
    "read_id",
    "received_key",
    "settle_logged",
    "take_log",
]


class Verdict(IntEnum):
    """What becomes of a received copy. The table's verdicts (``EntryTable.admit()`` / ``verdict()``,
    C and Python) are the first four; the consumer's core adds the routes to the dead-letter topic.

    The C table (``_msgid.c``) compiles in the same values; :mod:`msgid <pulsar_nack.consumer.msgid>`
    refuses a build whose ``VERDICTS`` differ.
    """

    DELIVER = 0
    """An open record; the member is neither acked nor nacked: hand it to the application."""
    ACKED = 1
    """The member (or its whole entry) was acked: a copy to filter (and acknowledge again)."""
    NACKED = 2
    """The member was nacked: the consumer's nack sets decide (a swallowed copy, left unacked)."""
    FRESH = 3
    """No record: the consumer decides (and opens one for a batch entry)."""
    ROUTE = 4
    """The consumer's core only: send the copy to the dead-letter topic."""
    ROUTE_STORED = 5
    """The consumer's core only: a copy of a stored dead letter; acknowledge it again."""
    DELIVER_LAST = 6
    """The table's ``admit_message()`` only: deliver, and ``guard_left`` ran out (the consumer looks at going quiet)."""


class Outcome(IntEnum):
    """What ``EntryTable.ack()`` / ``nack()`` / ``ack_data()`` did (C and Python).

    Values apart from :class:`Verdict`'s, so that one is never taken for the other.
    """

    NONE = 8
    """Recorded (or nothing to record); the entry is not settled."""
    SETTLED = 9
    """Every member acked: the record is now a settled one."""
    SETTLED_FOREIGN = 10
    """Settled, and some member was acked through an id the client made (no batch acker)."""
    COMPLETE = 11
    """Every member acked or nacked, some nacked: the record is dropped (the entry goes to the complete set)."""
    MISSING = 12
    """No record, and none was created (``create=False``)."""


DELIVER, ACKED, NACKED, FRESH, ROUTE, ROUTE_STORED, DELIVER_LAST = (int(v) for v in Verdict)
NONE, SETTLED, SETTLED_FOREIGN, COMPLETE, MISSING = (int(o) for o in Outcome)
# The same values as plain ints, what the tables return: the receive and ack paths compare
# with them (a module global, one lookup) rather than with an enum member.
STASH = "_pulsar_nack_id"
"""The attribute of a delivered ``pulsar.Message`` that keeps its serialized id, written by
``admit_message()`` and read by ``ack_message()``, so that an ack does not read the id again."""

_FIRST_CHUNK_TAG = 0x3A
"""The tag byte of field 7 (``first_chunk_message_id``), length-delimited: without it, no chunk id."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at *pos* and the position after it; ValueError if truncated or too long."""
    value = shift = 0
    while shift < 70 and pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, pos
        shift += 7
    raise ValueError("not a serialized Pulsar message id")


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def py_parse_id(data: bytes) -> tuple[int, int, int, int, int]:
    """``(ledger, entry, partition, batch_index, batch_size)`` of ``MessageId.serialize()`` bytes.

    A ``MessageIdData`` protobuf: 1 ledgerId, 2 entryId (required), 3 partition and
    4 batch_index (default -1), 6 batch_size (default 0); other fields are skipped. The
    stand-in for the C ``parse_id`` of ``pulsar_nack.consumer._msgid``, same results and errors.
    O(len(data)).

    >>> py_parse_id(bytes.fromhex("0894b4e4f4cb03100218032009"))
    (123456789012, 2, 3, 9, 0)
    """
    if not isinstance(data, bytes):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    fields = [0, 0, -1, -1, 0]
    seen, pos = 0, 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            if number in (1, 2):
                fields[number - 1] = _signed(value, 64)
                seen |= number
            elif number in (3, 4, 6):
                fields[2 if number == 3 else 3 if number == 4 else 4] = _signed(value, 32)
            continue
        if wire == 2:
            length, pos = _varint(data, pos)
        elif wire in (1, 5):
            length = 8 if wire == 1 else 4
        else:
            raise ValueError("not a serialized Pulsar message id")
        if length > len(data) - pos:
            raise ValueError("not a serialized Pulsar message id")
        pos += length
    if seen != 3:
        raise ValueError("not a serialized Pulsar message id")
    return fields[0], fields[1], fields[2], fields[3], fields[4]


def first_chunk(data: bytes) -> tuple[int, int] | None:
    """``(ledger, entry)`` of the first chunk in a serialized chunk id, or None for any other id.

    O(len(data)); a byte search alone for most ids.

    >>> first_chunk(bytes.fromhex("0805100218ffffffffffffffffff0120ffffffffffffffffff01"))
    >>> first_chunk(bytes.fromhex("08051002") + bytes([0x3A, 4]) + bytes.fromhex("08051000"))
    (5, 0)
    """
    if _FIRST_CHUNK_TAG not in data:
        return None
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
            continue
        if wire != 2:
            pos += 8 if wire == 1 else 4
            continue
        length, pos = _varint(data, pos)
        if number == 7:
            ledger, entry, _, _, _ = py_parse_id(data[pos : pos + length])
            return ledger, entry
        pos += length
    return None


_INT64_MAX = (1 << 63) - 1


def _not_a_message(ledger: int, entry: int, partition: int, index: int) -> str | None:
    """What makes these fields no message's id (``MessageId.earliest``, ``latest``, a negative field), or None."""
    if ledger == entry == -1:
        return "MessageId.earliest"
    if ledger == entry == _INT64_MAX:  # no broker reaches this entry of this ledger: the "latest" sentinel
        return "MessageId.latest"
    for name, value, least in (("ledger_id", ledger, 0), ("entry_id", entry, 0), ("partition", partition, -1),
                               ("batch_index", index, -1)):
        if value < least:
            return f"an id with {name} {value}"
    return None
def py_received_key(message: Any, wrapper: Any) -> tuple[str, int, int, int, int, tuple[int, int] | None]:
    """``(topic, ledger, entry, batch_index, batch_size, first_chunk)`` of a received message.

    The id from the serialized one *wrapper* (its ``pulsar.Message``) keeps (:data:`STASH`),
    else read once; the topic from ``topic_name()``; *first_chunk* as :func:`first_chunk`
    reads it from the same bytes. The stand-in for the C ``received_key``.
    """
    data = getattr(wrapper, "__dict__", {}).get(STASH)
    if not isinstance(data, bytes):
        data = message.message_id().serialize()
    ledger, entry, _, index, size = py_parse_id(data)
    return message.topic_name(), ledger, entry, index, size, first_chunk(data)


class _Record:
    """One entry: its batch size (0: a non-batched message), acked and nacked members as int bit sets,
    and (open) the member last delivered here and when a member was last read, delivered or settled."""

    __slots__ = ("acked", "foreign", "gen", "last_read", "nacked", "settled", "size", "touched_ms")

    def __init__(self, size: int, gen: int) -> None:
        self.size, self.gen = size, gen
        self.acked = self.nacked = 0
        self.settled = self.foreign = False
        self.touched_ms, self.last_read = monotonic_ms(), -1

    def touch(self, index: int, given: bool) -> None:
        """A member was read (*given*: delivered to the application) or settled."""
        if self.settled or self.size <= 0:
            return
        self.touched_ms = monotonic_ms()
        if given and 0 <= index < self.size:
            self.last_read = index

    def coverage(self) -> int:
        """1 if every member is acked, 2 if every member is acked or nacked, else 0."""
        full = (1 << self.size) - 1
        if self.acked & full == full:
            return 1
        return 2 if (self.acked | self.nacked) & full == full else 0


_RECORDED, _COMPLETES = 1, 2
"""What the ack of a watched entry's member did (``_ack_watched_member``; 0: nothing, the caller's)."""


class PyEntryTable:
    """What the consumer knows of the entries in flight: the stand-in for the C ``EntryTable``.

    Keyed by ``(ledger, entry)``. An *open* record is a batch entry with its batch size and
    the members the application acked and nacked; a *settled* record is an entry whose
    every member was acked (or an acked non-batched message), kept in a FIFO of the last
    *settled_capacity* settlements, and with *settled_max_age_ms* (0: no bound) only as
    long. Same results as the C version; every operation O(1) (amortized) but the sweeps.
    Not thread-safe (the consumer's core holds its lock).

    >>> t = PyEntryTable(8)
    >>> t.ack(7, 1, 0, 2), t.verdict(7, 1, 0), t.verdict(7, 1, 1), t.ack(7, 1, 1, 2), t.counts()
    (8, 1, 0, 9, (0, 1))
    """

    def __init__(self, settled_capacity: int, settled_max_age_ms: int = 0) -> None:
        for name, value, top in (("settled_capacity", settled_capacity, 1 << 24),
                                 ("settled_max_age_ms", settled_max_age_ms, 1 << 30)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int")
            if not 0 <= value <= top:
                raise ValueError(f"{name} must be between 0 and 2**{top.bit_length() - 1}")
        self._records: dict[tuple[int, int], _Record] = {}
        self._ring: deque[tuple[tuple[int, int], int, int]] = deque()  # (key, generation, settled at ms)
        self._capacity = settled_capacity
        self._max_age_ms = settled_max_age_ms if settled_capacity else 0
        self._settled = 0
        self._gen = 0
        self._marks: dict[int, int] = {}
        self.watch_all = False
        """True: :meth:`admit_message` and :meth:`ack_message` leave every copy and ack to the caller."""
        self.guard_left = 0
        """Guarded deliveries left before the caller looks at going quiet (:meth:`admit_message` counts it down)."""

    def admit(self, message: Any) -> tuple[int, bytes]:
        """Read a received message's id (its ``serialize()`` bytes) and its verdict."""
        data = message.message_id().serialize()
        if not isinstance(data, bytes):
            raise TypeError("MessageId.serialize() did not return bytes")
        ledger, entry, _, index, _ = py_parse_id(data)
        return self.verdict(ledger, entry, index), data

    def admit_message(self, message: Any, wrapper: Any) -> int:
        """:meth:`admit`, keeping the id on *wrapper* (:data:`STASH`); a copy of an unwatched entry decided here.

        A copy with no record of an entry that is not watched cannot be in a nack set: it is
        delivered (:data:`DELIVER`), the record of a batch entry opened. Each delivery
        decided here counts ``guard_left`` down; the one that takes it to 0 or below is
        :data:`DELIVER_LAST`. Otherwise :meth:`admit`'s verdict. With ``watch_all``, always
        :meth:`admit`'s verdict, nothing opened or counted.
        """
        verdict, data = self.admit(message)
        fields = getattr(wrapper, "__dict__", None)
        if fields is not None:
            fields[STASH] = data
        if self.watch_all:
            return verdict
        ledger, entry, _, index, size = py_parse_id(data)
        if verdict == FRESH:
            if self.watched(ledger, entry):
                return verdict
            if index >= 0 and size > 0:
                self._insert(ledger, entry, size)
            verdict = DELIVER
        record = self._records.get((ledger, entry))
        if record is not None:
            record.touch(index, verdict == DELIVER)
        if verdict == DELIVER:
            self.guard_left -= 1
            if self.guard_left <= 0:
                return DELIVER_LAST
        return verdict

    def ack_message(self, wrapper: Any) -> bool:
        """Record the ack of a message from the id :meth:`admit_message` kept on *wrapper*; True if recorded.

        False, and nothing recorded, when the caller must record it: no id kept,
        ``watch_all``, its record holds a nacked member or one acked through a made-up id;
        for a watched entry, as :meth:`_ack_watched_member` says.
        """
        data = getattr(wrapper, "__dict__", {}).get(STASH)
        if self.watch_all or not isinstance(data, bytes):
            return False
        ledger, entry, _, index, size = py_parse_id(data)
        record = self._records.get((ledger, entry))
        if self.watched(ledger, entry):
            return self._ack_watched_member((ledger, entry), record, index) == _RECORDED
        if record is not None and not record.settled and (record.foreign or record.nacked):
            return False
        self._record(ledger, entry, index, size, False, True, False)
        return True

    def ack_completing(self, ledger: int, entry: int, index: int) -> bool:
        """Record the ack of the member that completes a watched entry with a nacked member.

        When the table says so (:meth:`ack_message` left it to the caller for that reason):
        True, the record dropped as :meth:`ack` drops a complete one (the caller moves the
        entry to its complete set). False, nothing recorded, in any other case.
        """
        if self.watch_all or not self.watched(ledger, entry):
            return False
        record = self._records.get((ledger, entry))
        if self._ack_watched_member((ledger, entry), record, index) != _COMPLETES:
            return False
        self._delete((ledger, entry))
        return True

    def _ack_watched_member(self, key: tuple[int, int], record: _Record | None, index: int) -> int:
        """The ack of member *index* of a watched entry, recorded only where the caller's books cannot change.

        That is: an open record without a member acked through a made-up id, the member
        in neither bit set (every member of an open record in the caller's nack sets is
        marked nacked), and the ack not completing the entry with nacked members:
        :data:`_RECORDED`. :data:`_COMPLETES`, nothing recorded, where it would complete
        it (the caller moves it to its complete set: :meth:`ack_completing`); 0, nothing
        recorded, otherwise.
        """
        if record is None or index < 0 or record.settled or record.foreign or index >= record.size:
            return 0
        bit = 1 << index
        if (record.acked | record.nacked) & bit:
            return 0
        record.acked |= bit
        coverage = record.coverage()
        if coverage == 2:  # complete with nacked members: the caller's
            record.acked &= ~bit
            return _COMPLETES
        if coverage == 1:
            self._settle(key, record)
        else:
            record.touch(index, False)
        return _RECORDED

    def watch(self, ledger: int, entry: int) -> None:
        """Copies and acks of this entry (and of those below it in its ledger) go to the caller."""
        if entry > self._marks.get(ledger, -1):
            self._marks[ledger] = entry

    def watched(self, ledger: int, entry: int) -> bool:
        """Whether copies of the entry go to the caller."""
        return self.watch_all or entry <= self._marks.get(ledger, -1)

    def unwatch(self) -> None:
        """Watch no entry (the caller has no nack state left)."""
        self._marks.clear()

    def verdict(self, ledger: int, entry: int, index: int) -> int:
        """:data:`DELIVER`, :data:`ACKED`, :data:`NACKED` or :data:`FRESH` for a member."""
        record = self._records.get((ledger, entry))
        if record is None:
            return FRESH
        if record.settled:
            return ACKED
        if index < 0 or record.size == 0 or index >= record.size:
            return FRESH
        if record.acked >> index & 1:
            return ACKED
        return NACKED if record.nacked >> index & 1 else DELIVER

    def open(self, ledger: int, entry: int, size: int) -> None:
        """An open record for a batch entry, if it has none."""
        if size > 0 and (ledger, entry) not in self._records:
            self._insert(ledger, entry, size)

    def ack(self, ledger: int, entry: int, index: int, size: int, create: bool = True, foreign: bool = False) -> int:
        """Record an acked member; see the outcome constants."""
        return self._record(ledger, entry, index, size, False, create, foreign)

    def ack_data(self, data: bytes, create: bool = True) -> int:
        """:meth:`ack` for the serialized id of a received message."""
        if not isinstance(data, bytes):
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        ledger, entry, _, index, size = py_parse_id(data)
        return self._record(ledger, entry, index, size, False, create, False)

    def nack(self, ledger: int, entry: int, index: int, size: int, create: bool = True) -> int:
        """Record a nacked member of a batch entry (a non-batched message is not recorded)."""
        return self._record(ledger, entry, index, size, True, create, False)

    def settle(self, ledger: int, entry: int) -> None:
        """A settled record for an entry whose every member is acked."""
        record = self._records.get((ledger, entry))
        if record is not None and record.settled:
            return
        if record is not None:
            self._delete((ledger, entry))
        self._settle((ledger, entry), self._insert(ledger, entry, 0))

    def note_read(self, ledger: int, entry: int, index: int) -> None:
        """The caller delivered this member of an open record to the application."""
        record = self._records.get((ledger, entry))
        if record is not None:
            record.touch(index, True)

    def busy(self, ledger: int, entry: int, drain_ms: int, held_ms: int) -> bool:
        """True if the application may still settle members of the entry here.

        That is: it has an open record (a member unsettled), and the member last delivered
        is unsettled and was given less than *held_ms* ago, or a member was read, delivered
        or settled less than *drain_ms* ago.
        """
        if drain_ms < 0 or held_ms < 0:
            raise ValueError("drain_ms and held_ms must be >= 0")
        record = self._records.get((ledger, entry))
        if record is None or record.settled or record.size <= 0:
            return False
        held = record.last_read >= 0 and not (record.acked | record.nacked) >> record.last_read & 1
        return monotonic_ms() - record.touched_ms < (held_ms if held else drain_ms)

    def size_of(self, ledger: int, entry: int) -> int:
        """The batch size of an open record, else 0."""
        record = self._records.get((ledger, entry))
        return 0 if record is None or record.settled else record.size

    def forget_settled(self) -> None:
        """Drop every settled record."""
        self._sweep(lambda r: not r.settled)

    def sweep(self) -> None:
        """Drop every record without a nacked member (settled ones too)."""
        self._sweep(lambda r: not r.settled and r.nacked != 0)

    def clear_nacks(self) -> None:
        """Forget the nacked members of every open record."""
        for record in self._records.values():
            record.nacked = 0

    def clear(self) -> None:
        """Drop every record."""
        self._records.clear()
        self._ring.clear()
        self._settled = 0

    def counts(self) -> tuple[int, int]:
        """``(open, settled)`` record counts."""
        return len(self._records) - self._settled, self._settled

    def memory_bytes(self) -> int:
        """A rough estimate: about 200 bytes per record (dict slot, key tuple, record)."""
        return 200 * len(self._records) + (12 if self._max_age_ms else 8) * self._capacity

    def __len__(self) -> int:
        return len(self._records)

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        # The settled count is right, every settled record is in the ring, and no open
        # record of a batch entry is covered yet.
        assert self._settled == sum(r.settled for r in self._records.values())
        assert self._settled <= len(self._ring)
        assert all(r.settled or (r.size > 0 and r.coverage() == 0) for r in self._records.values())

    # ------------------------------------------------------------------ private

    def _insert(self, ledger: int, entry: int, size: int) -> _Record:
        self._gen += 1
        record = self._records[(ledger, entry)] = _Record(max(size, 0), self._gen)
        return record

    def _delete(self, key: tuple[int, int]) -> None:
        record = self._records.pop(key)
        self._settled -= record.settled

    def _settle(self, key: tuple[int, int], record: _Record) -> None:
        record.settled = True
        self._settled += 1
        if not self._capacity:
            self._delete(key)
            return
        now = monotonic_ms() if self._max_age_ms else 0
        if len(self._ring) == self._capacity:
            self._ring_pop()
        while self._max_age_ms and self._ring and now - self._ring[0][2] > self._max_age_ms:
            self._ring_pop()
        self._ring.append((key, record.gen, now))

    def _ring_pop(self) -> None:
        """Drop the oldest settlement (its record, unless deleted and made again since)."""
        old_key, gen, _ = self._ring.popleft()
        old = self._records.get(old_key)
        if old is not None and old.gen == gen and old.settled:
            self._delete(old_key)

    def _record(self, ledger: int, entry: int, index: int, size: int, nacked: bool, create: bool, foreign: bool) -> int:
        key = (ledger, entry)
        record = self._records.get(key)
        if index < 0 or size <= 0:  # a non-batched message
            if nacked or record is not None:
                return NONE
            if not create:
                return MISSING
            self._settle(key, self._insert(ledger, entry, 0))
            return SETTLED
        if record is None:
            if not create:
                return MISSING
            record = self._insert(ledger, entry, size)
        if record.settled or index >= record.size:
            return NONE
        if nacked:
            record.nacked |= 1 << index
        else:
            record.acked |= 1 << index
        record.foreign = record.foreign or foreign
        coverage = record.coverage()
        if coverage == 1:
            self._settle(key, record)
            return SETTLED_FOREIGN if record.foreign else SETTLED
        if coverage == 2:
            self._delete(key)
            return COMPLETE
        record.touch(index, False)
        return NONE

    def _sweep(self, keep: Any) -> None:
        for key in [k for k, r in self._records.items() if not keep(r)]:
            self._delete(key)
        if not self._settled:
            self._ring.clear()


_c = load_optional("pulsar_nack.consumer._msgid")
if _c is not None and (getattr(_c, "VERDICTS", None), getattr(_c, "OUTCOMES", None)) != (
    {v.name: v.value for v in Verdict if v not in (Verdict.ROUTE, Verdict.ROUTE_STORED)},
    {o.name: o.value for o in Outcome},
):  # pragma: no cover - a build from other sources: its values are compiled in
    warnings.warn("pulsar_nack.consumer._msgid was built from other sources: rebuild it; pure Python meanwhile", stacklevel=1)
    _c = None
MSGID = _c is not None
"""Whether the C reader is in use."""
NATIVE_IDS = native_ids.bind(_c)
"""Whether the C reader reads received ids through libpulsar's C++ API (:mod:`~pulsar_nack.consumer.native_ids`)."""
EntryTable: Any = PyEntryTable if _c is None else _c.EntryTable
"""``EntryTable(settled_capacity, settled_max_age_ms=0)``: the C table of ``pulsar_nack.consumer._msgid``, or :class:`PyEntryTable`."""
Gate: Any = None if _c is None else _c.Gate
"""``Gate(...)``: a blocking consumer's common receive and acknowledge in C (``_msgid.c``), or None without the C reader."""
message_key: Any = py_message_key if _c is None else _c.message_key
"""``message_key(message)``: ``(topic, ledger, entry, batch_index)`` of a message, read from one
``serialize()`` of its id by the C reader, or :func:`pulsar_nack.core.keys.message_key` (four
getters; about 0.3 µs more per call: ``bench/client.py``)."""
parse_id: Any = py_parse_id if _c is None else _c.parse_id
received_key: Any = py_received_key if _c is None else _c.received_key
"""``received_key(message, wrapper)``: :func:`py_received_key`, in C when built."""
"""``parse_id(data)``: the C parser of ``pulsar_nack.consumer._msgid``, or :func:`py_parse_id`."""


def py_log_received(received: list[Any], limit: int, convert: Callable[[], object], message: Any) -> None:
    """Pure-Python stand-in for the C ``log_received``: *message* appended to *received*, and
    ``convert()`` called if the log is then longer than *limit*."""
    received.append(message)
    if len(received) > limit:
        convert()


def py_settle_logged(received: list[Any], settled: list[Any], message: Any) -> None:
    """Pure-Python stand-in for the C ``settle_logged``: *message* appended to *settled*.

    The C one first removes *message* from *received* when it is its last entry, in one
    step atomic under the GIL; two Python steps would not be, so this one never removes.
    """
    settled.append(message)


def py_take_log(log: list[Any]) -> list[Any]:
    """Pure-Python stand-in for the C ``take_log``: the entries of *log*, removed from it.

    Safe while other threads only append (as with :func:`py_settle_logged`): appends made
    meanwhile stay, after the ones taken. O(n).

    >>> log = [1, 2]; py_take_log(log), log
    ([1, 2], [])
    """
    count = len(log)
    taken = log[:count]
    del log[:count]
    return taken


_logs = _c is not None and hasattr(_c, "log_received")
log_received: Callable[[list[Any], int, Callable[[], object], Any], None] = _c.log_received if _logs else py_log_received
"""``log_received(received, limit, convert, message)``: a received message into the ack timeout's log,
converted on this thread past *limit* entries; the C one when built."""
settle_logged: Callable[[list[Any], list[Any], Any], None] = _c.settle_logged if _logs else py_settle_logged
"""``settle_logged(received, settled, message)``: an acknowledged message leaves the ack timeout's
received log if it is its last entry (freed by the ack), else goes to its settled log; the C one when built."""
take_log: Callable[[list[Any]], list[Any]] = _c.take_log if _logs else py_take_log
"""``take_log(log)``: the entries of an ack-timeout log, removed from it (C when built: atomic against ``settle_logged``)."""


def read_id(message_id: Any, parse: Callable[[bytes], tuple[int, int, int, int, int]] | None = None) -> tuple[int, int, int, int, int]:
    """``(ledger, entry, partition, batch_index, batch_size)`` of a ``_pulsar.MessageId`` that can be a message's.

    One ``serialize()`` of the id, parsed by *parse* (default :data:`parse_id`: the C
    parser, else :func:`py_parse_id`). Raises ValueError, naming the argument
    ``message``, for ``MessageId.earliest``, ``MessageId.latest`` and an id with a
    negative ledger or entry id, or a partition or batch index below -1: positions,
    never a message, which the tracker could not key. O(1).

    >>> import _pulsar
    >>> read_id(_pulsar.MessageId(2, 10, 5, -1))
    (10, 5, 2, -1, 0)
    >>> read_id(_pulsar.MessageId.earliest)
    Traceback (most recent call last):
    ...
    ValueError: message must be the id of a message, not MessageId.earliest
    """
    data = message_id.serialize()
    if not isinstance(data, bytes):
        raise TypeError("MessageId.serialize() did not return bytes")
    fields = (parse_id if parse is None else parse)(data)
    what = _not_a_message(*fields[:4])
    if what is not None:
        raise ValueError(f"message must be the id of a message, not {what}")
    return fields
