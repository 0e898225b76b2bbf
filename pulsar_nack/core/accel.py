"""The optional C hot path (``pulsar_nack.core._speedups``) and its pure-Python stand-in.

``NegativeAcksTracker.add`` spends most of its time in Python call overhead, not in the
bitmap. The C extension removes that overhead for the common calls, ``add(key)`` (and
``add(key, None, redelivery_count)`` with a multiplier backoff) with a plain or batched
key that belongs in a bitmap a recent add went to:

* :class:`HotSlot` (C or Python, same interface) holds up to 16 bitmaps recent adds
  went to (interleaved topics, batches, the buckets a backoff writes to). It is owned
  by :class:`~pulsar_nack.core.buckets.TimeBuckets`. The C one also keeps a *tail log*: adds of
  one stream that land after every bucket (a new bucket per add, as at precision 0),
  which TimeBuckets flushes into pages before anything else it does.
* :data:`FastAdd` (C only) is the tracker's ``add`` for that call, several times cheaper
  (``bench/client.py`` measures both). Every other call goes to the Python code, which
  it calls back.

The extension is built by ``pip install`` when a C compiler is present; without one the
package installs and runs in pure Python (``SPEEDUPS`` is False). Setting the
environment variable ``PULSAR_NACK_PURE_PYTHON=1`` before import forces pure Python
everywhere; ``NegativeAcksTracker(speedups=False)`` does so for one tracker.
"""

from __future__ import annotations

import os
from typing import Any

from pyroaring import BitMap

__all__ = [
    "SPEEDUPS",
    "FastAdd",
    "HotSlot",
    "PyHotSlot",
    "decode_gaps",
    "encode_gaps",
]


_MAX_SLOTS = 16
_BATCH_BITS = 10
_U32 = 1 << 32
Growth = tuple[int, int]
"""``(messages, entries)`` added through slots that were removed."""
LogTaken = tuple[int, list[tuple[int, bytes]], int, int, int, int, int, list[int]]
"""``(sid, [(key, page)], messages, entries, buckets, last_page_deadline, deadline, values)``:
what ``HotSlot.take_log()`` hands back (see ``pulsar_nack/core/_speedups.c``)."""
LogState = tuple[str, int, int, int, int, list[tuple[int, int]]]
"""``(topic, ledger, kind, sid, floor, [(deadline, value)])``: ``HotSlot.log()``, for checks."""


class PyHotSlot:
    """Up to 16 open bitmaps recent adds went to, by (bucket deadline, topic, ledger, kind).

    ``kind`` is 0 for plain ids (value = entry id) and 1 for batched ids (value =
    ``entry << 10 | batch_index``); a slot takes only values below 2**32. Adds into a
    slot's bitmap are not counted one by one: the owner counts them as the bitmap's
    growth since :meth:`set` (for batches, the new entries the slot saw too), returned
    as ``(messages, entries)`` when a slot is removed. The oldest slot makes room for a
    new one.
    """

    __slots__ = ("_slots",)

    _slots: dict[tuple[int, str, int, int], list[Any]]  # key -> [bitmap, base, entries, last_entry]

    def __init__(self) -> None:
        self._slots = {}

    def set(self, deadline: int, topic: str, ledger: int, kind: int, bitmap: BitMap) -> Growth:
        """Make *bitmap* hot (it must not be already); return the growth of a slot evicted for room. O(1)."""
        grown = (0, 0)
        if len(self._slots) == _MAX_SLOTS:
            grown = self._remove(next(iter(self._slots)))
        self._slots[deadline, topic, ledger, kind] = [bitmap, len(bitmap), 0, -1]
        return grown

    def add(self, key: tuple[Any, ...], deadline: int) -> bool:
        """Add *key* (a tuple of 4) to its hot bitmap in bucket *deadline*; False when no slot takes it. O(1)."""
        topic, ledger, entry, index = key
        if type(entry) is not int or type(index) is not int or type(ledger) is not int or type(topic) is not str:
            return False
        if index == -1:
            kind, value = 0, entry
        elif 0 <= index < 1 << _BATCH_BITS:
            kind, value = 1, entry << _BATCH_BITS | index
        else:
            return False
        slot = self._slots.get((deadline, topic, ledger, kind))
        if slot is None or not 0 <= value < _U32:
            return False
        bitmap = slot[0]
        if kind and entry != slot[3]:
            slot[2] += not bitmap.range_cardinality(entry << _BATCH_BITS, (entry + 1) << _BATCH_BITS)
            slot[3] = entry
        bitmap.add(value)
        return True

    def _remove(self, slot_key: tuple[int, str, int, int]) -> Growth:
        bitmap, base, entries, _ = self._slots.pop(slot_key)
        grown = len(bitmap) - base
        return grown, entries if slot_key[3] else grown

    def _remove_where(self, keys: list[tuple[int, str, int, int]]) -> Growth:
        messages = entries = 0
        for slot_key in keys:
            m, e = self._remove(slot_key)
            messages += m
            entries += e
        return messages, entries

    def forget(self, deadline: int) -> Growth:
        """Remove the slots of bucket *deadline*; return their growth. O(slots)."""
        return self._remove_where([k for k in self._slots if k[0] == deadline])

    def forget_bitmap(self, bitmap: object) -> Growth:
        """Remove the slot of *bitmap*, if any; return its growth. O(slots)."""
        return self._remove_where([k for k, slot in self._slots.items() if slot[0] is bitmap])

    def clear(self) -> Growth:
        """Remove every slot; return their growth. O(slots)."""
        return self._remove_where(list(self._slots))

    def growth(self) -> int:
        """Messages added through the slots since :meth:`set`. O(slots)."""
        return sum(len(slot[0]) - slot[1] for slot in self._slots.values())

    def entry_growth(self) -> int:
        """New entries added through the slots since :meth:`set`. O(slots)."""
        return sum(slot[2] if k[3] else len(slot[0]) - slot[1] for k, slot in self._slots.items())

    def slots(self) -> list[tuple[int, str, int, int, BitMap, int]]:
        """``(deadline, topic, ledger, kind, bitmap, base)`` of every slot, oldest first (for checks)."""
        return [(*k, slot[0], slot[1]) for k, slot in self._slots.items()]

    # The tail log of the C HotSlot (see pulsar_nack/core/_speedups.c): here it never takes a
    # key, so these keep the interface and hold nothing. The content is the same; only
    # the representation (an open bucket per add, sealed later) differs.

    def set_log(self, topic: str, ledger: int, kind: int, sid: int, floor: int) -> None:
        """Where the C log would take adds of one stream after *floor*; nothing here. O(1)."""

    def unset_log(self) -> None:
        """No log stream; nothing here. O(1)."""

    def take_log(self, page_bytes: int) -> LogTaken | None:
        """The log's records as pages and a last bucket; always None here (no records). O(1)."""
        return None

    def log(self) -> LogState | None:
        """The log's stream and records (for checks); always None here. O(1)."""
        return None


HotSlot: Any = PyHotSlot
FastAdd: Any = None
encode_gaps: Any = None
"""C ``encode_gaps(array)`` of :mod:`pulsar_nack.core.pages`' GAPS codec, or None (pure Python)."""
decode_gaps: Any = None
"""C ``decode_gaps(payload)``, or None (pure Python)."""
SPEEDUPS = False

if not os.environ.get("PULSAR_NACK_PURE_PYTHON"):
    try:
        from ._speedups import FastAdd as _CFastAdd
        from ._speedups import HotSlot as _CHotSlot
        from ._speedups import decode_gaps as _c_decode_gaps
        from ._speedups import encode_gaps as _c_encode_gaps

        FastAdd, HotSlot = _CFastAdd, _CHotSlot
        encode_gaps, decode_gaps = _c_encode_gaps, _c_decode_gaps

        SPEEDUPS = True
    except ImportError:  # built without a C compiler: pure Python
        pass
