"""The optional C hot path (``pulsar_nack.core._speedups``) and its pure-Python stand-in.

``NegativeAcksTracker.add`` spends most of its time in Python call overhead, not in the
bitmap. The C extension removes that overhead for every documented call form of ``add``
(``add(key)``, a per-call delay by position or keyword, ``redelivery_count`` by position or
keyword with a multiplier backoff) with a plain or batched key that belongs in a bitmap a
recent add went to:

* :class:`HotSlot` (C or Python, same interface) holds up to :data:`MAX_SLOTS` bitmaps
  recent adds went to (interleaved topics, batches, the buckets a backoff writes to),
  each with the range of deadlines its bucket holds, as
  :class:`~pulsar_nack.core.buckets.TimeBuckets` (its owner, and the owner of the trimming
  rule) gives it. The C one also keeps a *tail log* at precision 0: adds of one stream
  after every bucket (a new bucket per add), which TimeBuckets takes back before anything
  else it does.
* :data:`FastAdd` (C only) is the tracker's ``add``. Every other call goes to the Python
  code, which it calls back.

The extension is built by ``pip install`` when a C compiler is present; without one the
package installs and runs in pure Python (``SPEEDUPS`` is False). Setting the
environment variable ``PULSAR_NACK_PURE_PYTHON=1`` before import forces pure Python
everywhere; ``NegativeAcksTracker(speedups=False)`` does so for one tracker.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Any

from pyroaring import BitMap

from .keys import BATCH_BITS

__all__ = [
    "LOG_CAPACITY",
    "LOG_GROUP",
    "MAX_SLOTS",
    "SPEEDUPS",
    "FastAdd",
    "HotSlot",
    "PyHotSlot",
    "decode_gaps",
    "encode_gaps",
    "frame_body",
    "load_optional",
    "pack",
]

MAX_SLOTS = 16
"""Hot slots (bitmaps recent adds went to) a structure keeps; the oldest makes room."""
LOG_GROUP = 8
"""Records per bucket the C tail log takes; a denser bucket goes back to Python, to get a hot bitmap."""
LOG_CAPACITY = 2048
"""Records the C tail log holds; a full log misses to Python, which takes it back."""
_U32 = 1 << 32
Growth = tuple[int, int]
"""``(messages, entries)`` added through slots that were removed."""
LogTaken = tuple[int, list[tuple[int, bytes]], int, int, int, int, int, list[int]]
"""``(sid, [(key, page)], messages, entries, buckets, last_sealed, deadline, values)``: what
``HotSlot.take_log(tag, page_bytes)`` hands back (see ``pulsar_nack/core/_speedups.c``)."""
LogState = tuple[str, int, int, int, int, list[tuple[int, int]]]
"""``(topic, ledger, kind, sid, floor, [(deadline, value)])``: ``HotSlot.log()``, for checks."""
SlotState = tuple[int, int, str, int, int, BitMap, int]
"""``(first, last, topic, ledger, kind, bitmap, base)``: one entry of ``HotSlot.slots()``."""


class PyHotSlot:
    """Up to 16 open bitmaps recent adds went to, by (deadlines first..last, topic, ledger, kind).

    ``kind`` is 0 for plain ids (value = entry id) and 1 for batched ids (value =
    ``entry << BATCH_BITS | index``); a slot takes only values below 2**32, and a key whose
    deadline is in its range. Adds into a slot's bitmap are not counted one by one: the
    owner counts them as the bitmap's growth since :meth:`set` (for batches, the new
    entries the slot saw too), returned as ``(messages, entries)`` when a slot is removed.
    The oldest slot makes room for a new one.
    """

    __slots__ = ("_by_stream", "_slots")

    _slots: list[list[Any]]  # oldest first: [first, last, topic, ledger, kind, bitmap, base, entries, last_entry]
    _by_stream: dict[tuple[str, int, int], list[list[Any]]]  # (topic, ledger, kind) -> its slots

    def __init__(self) -> None:
        self._slots = []
        self._by_stream = {}

    def set(self, first: int, last: int, topic: str, ledger: int, kind: int, bitmap: BitMap) -> Growth:
        """Make *bitmap* hot for deadlines *first* to *last* (it must not be already); return the growth of a slot evicted for room. O(1)."""
        grown = (0, 0)
        if len(self._slots) == MAX_SLOTS:
            grown = self._remove_where([self._slots[0]])
        slot = [first, last, topic, ledger, kind, bitmap, len(bitmap), 0, -1]
        self._slots.append(slot)
        self._by_stream.setdefault((topic, ledger, kind), []).append(slot)
        return grown

    def add(self, key: tuple[Any, ...], deadline: int) -> bool:
        """Add *key* (a tuple of 4), due at *deadline*, to its hot bitmap; False when no slot takes it. O(1)."""
        topic, ledger, entry, index = key
        if type(entry) is not int or type(index) is not int or type(ledger) is not int or type(topic) is not str:
            return False
        if index == -1:
            kind, value = 0, entry
        elif 0 <= index < 1 << BATCH_BITS:
            kind, value = 1, entry << BATCH_BITS | index
        else:
            return False
        for slot in self._by_stream.get((topic, ledger, kind), ()):
            if slot[0] <= deadline <= slot[1]:
                break
        else:
            return False
        if not 0 <= value < _U32:
            return False
        bitmap = slot[5]
        if kind and entry != slot[8]:
            slot[7] += not bitmap.range_cardinality(entry << BATCH_BITS, (entry + 1) << BATCH_BITS)
            slot[8] = entry
        bitmap.add(value)
        return True

    def _remove_where(self, gone: list[list[Any]]) -> Growth:
        messages = entries = 0
        for slot in gone:
            self._slots.remove(slot)
            stream = self._by_stream[slot[2], slot[3], slot[4]]
            stream.remove(slot)
            if not stream:
                del self._by_stream[slot[2], slot[3], slot[4]]
            grown = len(slot[5]) - slot[6]
            messages += grown
            entries += slot[7] if slot[4] else grown
        return messages, entries

    def forget(self, deadline: int) -> Growth:
        """Remove the slots holding *deadline*; return their growth. O(slots)."""
        return self._remove_where([s for s in self._slots if s[0] <= deadline <= s[1]])

    def forget_bitmap(self, bitmap: object) -> Growth:
        """Remove the slot of *bitmap*, if any; return its growth. O(slots)."""
        return self._remove_where([s for s in self._slots if s[5] is bitmap])

    def clear(self) -> Growth:
        """Remove every slot; return their growth. O(slots)."""
        return self._remove_where(list(self._slots))

    def growth(self) -> int:
        """Messages added through the slots since :meth:`set`. O(slots)."""
        return sum(len(s[5]) - s[6] for s in self._slots)

    def entry_growth(self) -> int:
        """New entries added through the slots since :meth:`set`. O(slots)."""
        return sum(s[7] if s[4] else len(s[5]) - s[6] for s in self._slots)

    def slots(self) -> list[SlotState]:
        """``(first, last, topic, ledger, kind, bitmap, base)`` of every slot, oldest first (for checks)."""
        return [(s[0], s[1], s[2], s[3], s[4], s[5], s[6]) for s in self._slots]

    # The tail log of the C HotSlot (see pulsar_nack/core/_speedups.c): here it never takes a
    # key, so these keep the interface and hold nothing. The content is the same; only
    # the representation (an open bucket per add, sealed later) differs.

    def set_log(self, topic: str, ledger: int, kind: int, sid: int, floor: int) -> None:
        """Where the C log would take adds of one stream after *floor*; nothing here. O(1)."""

    def unset_log(self) -> None:
        """No log stream; nothing here. O(1)."""

    def take_log(self, tag: int, page_bytes: int) -> LogTaken | None:
        """The log's records, sealed into pages but the last deadline's; always None here (no records). O(1)."""
        return None

    def log(self) -> LogState | None:
        """The log's stream and records (for checks); always None here. O(1)."""
        return None


def load_optional(name: str) -> Any:
    """The optional C extension *name* (``pulsar_nack.core._speedups``), or None.

    None without a build (no C compiler) or with ``PULSAR_NACK_PURE_PYTHON`` set: the
    caller then keeps its pure-Python stand-ins.
    """
    if os.environ.get("PULSAR_NACK_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_c = load_optional("pulsar_nack.core._speedups")
if _c is not None and (_c.MAX_SLOTS, _c.LOG_GROUP, _c.LOG_CAPACITY, _c.BATCH_BITS) != (
    MAX_SLOTS,
    LOG_GROUP,
    LOG_CAPACITY,
    BATCH_BITS,
):  # pragma: no cover - a build from other sources: its sizes are compiled in
    warnings.warn("pulsar_nack.core._speedups was built from other sources: rebuild it; pure Python meanwhile", stacklevel=1)
    _c = None

SPEEDUPS = _c is not None
"""Whether the C extension is in use."""
HotSlot: Any = PyHotSlot if _c is None else _c.HotSlot
FastAdd: Any = None if _c is None else _c.FastAdd
encode_gaps: Any = None if _c is None else _c.encode_gaps
"""C ``encode_gaps(array)`` of :mod:`pulsar_nack.core.pages`' GAPS codec, or None (pure Python)."""
decode_gaps: Any = None if _c is None else _c.decode_gaps
"""C ``decode_gaps(payload)``, or None (pure Python)."""
pack: Any = None if _c is None else _c.pack
"""C ``pack(records, key, page, page_bytes)``: :func:`pulsar_nack.core.pages.pack`'s framing, or None."""
frame_body: Any = None if _c is None else _c.frame_body
"""C ``frame_body(streams)``: :func:`pulsar_nack.core.pages.encode_body`'s framing, or None."""
