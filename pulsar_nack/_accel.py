"""The optional C hot path (``pulsar_nack._speedups``) and its pure-Python stand-in.

``NegativeAcksTracker.add`` spends most of its time in Python call overhead, not in the
bitmap. The C extension removes that overhead for the common call, ``add(key)`` with a
plain key that belongs in the same bucket, topic and ledger as the previous add:

* :class:`HotSlot` (C or Python, same interface) is the bitmap that add went to. It is
  owned by :class:`~pulsar_nack.buckets.TimeBuckets`.
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

__all__ = ["SPEEDUPS", "FastAdd", "HotSlot", "PyHotSlot"]


class PyHotSlot:
    """The open bitmap the previous plain add went to: its bucket, topic and ledger.

    Adds into the bitmap are not counted one by one: the owner counts them as the
    bitmap's growth since :meth:`set`, which :meth:`clear` returns.
    """

    __slots__ = ("base", "bitmap", "deadline", "ledger", "topic")

    deadline: int
    topic: str | None
    ledger: int
    bitmap: BitMap | None
    base: int

    def __init__(self) -> None:
        self.deadline, self.topic, self.ledger, self.bitmap, self.base = -1, None, -1, None, 0

    def set(self, deadline: int, topic: str, ledger: int, bitmap: BitMap) -> None:
        """Make *bitmap* the hot one; the slot must be empty (its growth uncounted otherwise). O(1)."""
        self.deadline, self.topic, self.ledger, self.bitmap, self.base = deadline, topic, ledger, bitmap, len(bitmap)

    def growth(self) -> int:
        """Entries added to the bitmap since :meth:`set` (0 when empty). O(1)."""
        return 0 if self.bitmap is None else len(self.bitmap) - self.base

    def clear(self) -> int:
        """Empty the slot; return :meth:`growth`. O(1)."""
        if self.bitmap is None:
            return 0
        grown = len(self.bitmap) - self.base
        self.deadline, self.topic, self.ledger, self.bitmap, self.base = -1, None, -1, None, 0
        return grown


HotSlot: Any = PyHotSlot
FastAdd: Any = None
SPEEDUPS = False

if not os.environ.get("PULSAR_NACK_PURE_PYTHON"):
    try:
        from ._speedups import FastAdd as _CFastAdd
        from ._speedups import HotSlot as _CHotSlot

        FastAdd, HotSlot = _CFastAdd, _CHotSlot

        SPEEDUPS = True
    except ImportError:  # built without a C compiler: pure Python
        pass
