"""Compact sets of messages in flight, a few bytes per message: the storage of the admission ledger.

:class:`PendingNacks` (roaring bitmaps of ``entry_id << 10 | batch_index + 1`` per ledger),
:class:`AgingSet` (two generations of it, forgotten 1 to 2 periods after they joined) and
:class:`EntrySet` (entry ids per ledger). None is thread-safe: the ledger
(:class:`~pulsar_nack.consumer.admission.AdmissionLedger`) holds its lock around every call.
"""

from __future__ import annotations

from typing import Final

from pyroaring import BitMap64

from ..core.keys import BATCH_BITS

__all__ = ["AgingSet", "EntrySet", "Item", "PendingNacks"]

Item = tuple[int, int, int]
"""``(ledger_id, entry_id, batch_index)``: a message, whatever its topic (ledger ids are unique)."""

# Final: mypyc keeps each in a C static, not a module-dict lookup per call
_BATCH_BITS: Final = BATCH_BITS
_BATCH_LIMIT: Final = 1 << _BATCH_BITS
_PACK_LIMIT: Final = 1 << (64 - _BATCH_BITS)


class PendingNacks:
    """The set of nacked messages whose delay is not over, a few bytes each.

    Keyed by ledger id (ledger ids are unique in a cluster, across topics), then one
    :class:`pyroaring.BitMap64` of ``entry_id << 10 | (batch_index + 1)`` values, so the
    messages of consecutive entries share Roaring containers. Values that do not pack
    (a batch index of 1023 or more, an entry id of ``2**54`` or more) go to a plain set.

    Not thread-safe: the admission ledger holds its lock around every call. ``count``
    (the number of messages) may be read without it, as a hint.

    >>> p = PendingNacks()
    >>> p.add(7, 100, 3), p.add(7, 100, 3), (7, 100, 3) in p, (7, 100, 4) in p, len(p)
    (True, False, True, False, 1)
    >>> p.discard(7, 100, 3), p.discard(7, 100, 3), len(p)
    (True, False, 0)
    """

    __slots__ = ("_by_ledger", "_wide", "count")

    _by_ledger: dict[int, BitMap64]
    _wide: set[tuple[int, int, int]]
    count: int
    """How many messages it holds (read-only: an attribute, for the receive path's one check)."""

    def __init__(self) -> None:
        self._by_ledger = {}
        self._wide = set()
        self.count = 0

    def add(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        """Add a message; False if it was there already. O(log n) in the ledger's bitmap."""
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            if bitmap is None:
                bitmap = self._by_ledger[ledger_id] = BitMap64()
            try:
                bitmap.add_checked(entry_id << _BATCH_BITS | (batch_index + 1))  # one call: KeyError if there
            except KeyError:
                return False
        elif (ledger_id, entry_id, batch_index) not in self._wide:
            self._wide.add((ledger_id, entry_id, batch_index))
        else:
            return False
        self.count += 1
        return True

    def discard(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        """Remove a message if present; True if it was. O(log n)."""
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            value = entry_id << _BATCH_BITS | (batch_index + 1)
            if bitmap is None or value not in bitmap:
                return False
            bitmap.discard(value)
            if not bitmap:
                del self._by_ledger[ledger_id]
        elif (ledger_id, entry_id, batch_index) in self._wide:
            self._wide.discard((ledger_id, entry_id, batch_index))
        else:
            return False
        self.count -= 1
        return True

    def __contains__(self, item: tuple[int, int, int]) -> bool:
        ledger_id, entry_id, batch_index = item
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            return bitmap is not None and (entry_id << _BATCH_BITS | (batch_index + 1)) in bitmap
        return item in self._wide

    def __len__(self) -> int:
        return self.count

    def clear(self) -> None:
        self._by_ledger.clear()
        self._wide.clear()
        self.count = 0

    def memory_bytes(self) -> int:
        """Serialized size of the bitmaps plus the dict and set slots (an estimate). O(ledgers)."""
        total = 64 * len(self._by_ledger) + 100 * len(self._wide)
        return total + sum(b.get_statistics()["n_bytes_array_containers"] + b.get_statistics()[
            "n_bytes_bitset_containers"] + b.get_statistics()["n_bytes_run_containers"] for b in self._by_ledger.values())

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """True if some message of the entry is in the set. O(log n) (O(n) for wide values)."""
        bitmap = self._by_ledger.get(ledger_id)
        if bitmap is not None and entry_id < _PACK_LIMIT and bitmap.range_cardinality(
            entry_id << _BATCH_BITS, (entry_id + 1) << _BATCH_BITS
        ):
            return True
        return bool(self._wide) and any(w[0] == ledger_id and w[1] == entry_id for w in self._wide)

    def entry_count(self, ledger_id: int, entry_id: int) -> int:
        """How many messages of the entry are in the set. O(log n) (O(n) for wide values).

        >>> p = PendingNacks(); p.add(7, 100, 0), p.add(7, 100, 5), p.add(7, 101, 0), p.entry_count(7, 100)
        (True, True, True, 2)
        """
        bitmap = self._by_ledger.get(ledger_id)
        packed = 0
        if bitmap is not None and entry_id < _PACK_LIMIT:
            packed = bitmap.range_cardinality(entry_id << _BATCH_BITS, (entry_id + 1) << _BATCH_BITS)
        return packed + (sum(w[0] == ledger_id and w[1] == entry_id for w in self._wide) if self._wide else 0)

    def items(self) -> list[tuple[int, int, int]]:
        """Every ``(ledger, entry, batch_index)`` in the set. O(n)."""
        found = [(ledger, v >> _BATCH_BITS, (v & (_BATCH_LIMIT - 1)) - 1)
                 for ledger, bitmap in self._by_ledger.items() for v in bitmap]
        return found + sorted(self._wide)

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        # The count is the number of stored values; no empty bitmap is kept.
        assert self.count == sum(len(b) for b in self._by_ledger.values()) + len(self._wide)
        assert all(self._by_ledger.values())


class EntrySet:
    """Batch entries whose every member the application acked or nacked, a bit or two each.

    Keyed by ledger id, then one :class:`pyroaring.BitMap64` of entry ids (consecutive
    entries share a container, runs compress). A member of such an entry that is in no
    nack set was acked. Not thread-safe: the admission ledger holds its lock; ``count``
    may be read without it, as a hint.

    >>> e = EntrySet()
    >>> e.add(7, 100); (7, 100) in e, (7, 101) in e, len(e)
    (True, False, 1)
    """

    __slots__ = ("_by_ledger", "count")

    _by_ledger: dict[int, BitMap64]
    count: int

    def __init__(self) -> None:
        self._by_ledger = {}
        self.count = 0

    def add(self, ledger_id: int, entry_id: int) -> None:
        """Add an entry. O(log n)."""
        bitmap = self._by_ledger.get(ledger_id)
        if bitmap is None:
            bitmap = self._by_ledger[ledger_id] = BitMap64()
        if entry_id not in bitmap:
            bitmap.add(entry_id)
            self.count += 1

    def discard(self, ledger_id: int, entry_id: int) -> None:
        """Remove an entry if present. O(log n)."""
        bitmap = self._by_ledger.get(ledger_id)
        if bitmap is not None and entry_id in bitmap:
            bitmap.discard(entry_id)
            self.count -= 1
            if not bitmap:
                del self._by_ledger[ledger_id]

    def __contains__(self, item: tuple[int, int]) -> bool:
        bitmap = self._by_ledger.get(item[0])
        return bitmap is not None and item[1] in bitmap

    def __len__(self) -> int:
        return self.count

    def clear(self) -> None:
        self._by_ledger.clear()
        self.count = 0

    def memory_bytes(self) -> int:
        """Serialized size of the bitmaps plus 64 bytes per ledger (an estimate). O(ledgers)."""
        return sum(64 + len(b.serialize()) for b in self._by_ledger.values())

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        # The count is the number of stored entries; no empty bitmap is kept.
        assert self.count == sum(len(b) for b in self._by_ledger.values())
        assert all(self._by_ledger.values())


class AgingSet:
    """A :class:`PendingNacks` whose members are forgotten 1 to 2 *periods* after they joined.

    Two generations: members join the young one; :meth:`age` drops the old one (and
    returns its members) and makes the young one old. Nothing is kept per member
    beyond its bit, so a burst of a million handoffs costs what the pending set costs.
    Not thread-safe: the admission ledger holds its lock.

    >>> a = AgingSet()
    >>> a.add(1, 2, 3); a.age(); (1, 2, 3) in a
    []
    True
    >>> a.age()
    [(1, 2, 3)]
    """

    __slots__ = ("_old", "_young", "count")

    count: int
    """The number of members (read without the lock, as a hint)."""

    def __init__(self) -> None:
        self._young, self._old = PendingNacks(), PendingNacks()
        self.count = 0

    def add(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        """Add a member (to the young generation). O(log n)."""
        if self._old.count:
            self._old.discard(ledger_id, entry_id, batch_index)
        self._young.add(ledger_id, entry_id, batch_index)
        self.count = self._young.count + self._old.count

    def discard(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        """Remove a member if present; True if it was. O(log n)."""
        # A member is in one generation only (add() takes it out of the old one).
        if self.count and (self._young.discard(ledger_id, entry_id, batch_index)
                           or self._old.discard(ledger_id, entry_id, batch_index)):  # fmt: skip
            self.count -= 1
            return True
        return False

    def __contains__(self, item: tuple[int, int, int]) -> bool:
        return bool(self.count) and (item in self._young or item in self._old)

    def __len__(self) -> int:
        return self.count

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """True if some message of the entry is in the set."""
        young, old = self._young, self._old
        return bool(young.count and young.has_entry(ledger_id, entry_id)) or bool(old.count and old.has_entry(ledger_id, entry_id))

    def items(self) -> list[tuple[int, int, int]]:
        """Every member. O(n)."""
        return self._young.items() + self._old.items()

    def age(self) -> list[tuple[int, int, int]]:
        """Forget the old generation and return its members; the young one becomes old. O(old)."""
        expired = self._old.items()
        self._old, self._young = self._young, PendingNacks()
        self.count = self._old.count
        return expired

    def clear(self) -> None:
        self._young.clear()
        self._old.clear()
        self.count = 0

    def memory_bytes(self) -> int:
        return self._young.memory_bytes() + self._old.memory_bytes()

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        # Both generations are sound, a member is in one of them only, and count is right.
        self._young._check()
        self._old._check()
        assert self.count == self._young.count + self._old.count
        assert not set(self._young.items()) & set(self._old.items())
