"""Time buckets of negatively acknowledged messages (PIP-393 layout).

The structure maps a *trimmed* deadline to the messages due at that time::

    SortedDict  deadline_ms (low `precision_bits` bits cleared)
      │
      ├── 1_700_000_000_000 ─► open bucket: {sid: BitMap, sid: BitMap64, ...}
      ├── 1_700_000_000_256 ─► page: bytes  [bucket 256][bucket 512][bucket 768]...
      └── 1_700_000_001_024 ─► open bucket: {sid: BitMap}

A *stream* is one ``(topic, ledger_id, kind)`` and gets a small integer id (``sid``)
shared by every bucket, so a bucket stores each topic and ledger once, not once per
entry.  Inside a stream, entry ids live in a Roaring bitmap:

* ``PLAIN`` (non-batched message, ``batch_index == -1``): value = ``entry_id``;
* ``BATCHED`` (``0 <= batch_index < 1024`` and ``entry_id < 2**53``):
  value = ``entry_id << BATCH_BITS | batch_index`` (:data:`~pulsar_nack.core.keys.BATCH_BITS`
  is 10), so the messages of one batch sit side by side in one Roaring container;
* ``WIDE`` (any other batched message): a stream per entry, value = ``batch_index``.
  This is the slow path for rare, huge values; it is never an error.

Values below ``2**32`` use :class:`pyroaring.BitMap`; a stream upgrades itself to
:class:`pyroaring.BitMap64` when a larger value arrives.

Only a few buckets receive adds at any time (deadlines grow with the clock).  At most
``max_open_buckets`` buckets are kept *open* (mutable bitmaps, least recently written
first out; when a new bucket opens, the previous one's runs are compressed in place);
every other bucket is *sealed* into a *page* (:mod:`pulsar_nack.core.pages`): one ``bytes``
object holding consecutive sealed buckets, each stream as Roaring runs or as one-byte
gaps, whichever is smaller.  A page is keyed by its first bucket's deadline and holds
only buckets before the next key, so the map stays sorted by deadline; a bucket sealed
right after a page joins it while it has room.  Sealed buckets carry none of the fixed
cost of a dict, an int key and bitmap objects: a bucket with one message costs a few
bytes, consecutive entry ids a few bytes per *run*, a sparse selection about one byte
per message.  An add to a sealed bucket unseals it (and splits its page).

This class owns the trimming rule (:meth:`TimeBuckets.bucket_of`): the C hot path
(:mod:`pulsar_nack.core.accel`) never trims; each hot slot gets the range of deadlines
its bucket holds (:meth:`TimeBuckets.deadlines_of`). At precision 0 (a bucket per ms),
adds that land after every bucket (one nack per ms: every add a new bucket) are appended
by the C hot path to a *tail log* of one stream instead; the next Python operation on the
structure first *flushes* it (:meth:`TimeBuckets._flush_log`): its buckets are sealed
into pages (by :mod:`pulsar_nack.core.pages`, the one page writer) put after the last
bucket, and its last bucket is opened.

This module has no threads and no locks; :class:`~pulsar_nack.core.tracker.NegativeAcksTracker`
adds both.
"""

from __future__ import annotations

import enum
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import Union

from pyroaring import BitMap, BitMap64
from sortedcontainers import SortedDict

from .._validate import check_bool, check_int
from . import accel as _accel
from . import pages as _pages
from .keys import BATCH_BITS, MAX_BATCH_INDEX, MAX_ID, MessageKey, validate_key

__all__ = ["DEFAULT_PRECISION_BITS", "MAX_PRECISION_BITS", "TimeBuckets", "bucket_ms"]

DEFAULT_PRECISION_BITS = 8
"""Default trimming: 256 ms buckets, as Java's ``negativeAckPrecisionBitCnt``."""
MAX_PRECISION_BITS = 30


def bucket_ms(precision_bits: int) -> int:
    """How many ms one bucket spans: deadlines trimmed by *precision_bits* bits. O(1).

    >>> bucket_ms(DEFAULT_PRECISION_BITS), bucket_ms(0)
    (256, 1)
    """
    return 1 << check_int("precision_bits", precision_bits, 0, MAX_PRECISION_BITS)


_BATCH_LIMIT = 1 << BATCH_BITS
_BATCHED_ENTRY_LIMIT = 1 << (63 - BATCH_BITS)  # packed values stay below 2**63
_U32 = 1 << 32


class _Kind(enum.IntEnum):
    """How a stream encodes its messages into bitmap values."""

    PLAIN = 0  # value = entry_id
    BATCHED = 1  # value = entry_id << 10 | batch_index
    WIDE = 2  # one stream per entry; value = batch_index


_Stream = tuple[str, int, _Kind, int]  # (topic, ledger_id, kind, entry_id if WIDE else -1)
_Bitmap = Union[BitMap, BitMap64]  # noqa: UP007 (a runtime alias: X | Y needs 3.10 types)
_OpenBucket = dict[int, _Bitmap]
_Bucket = Union[_OpenBucket, bytes]  # noqa: UP007
_Values = Union[_Bitmap, list[int]]  # noqa: UP007 (a bitmap, or ascending values from a page)


def _encode(key: MessageKey) -> tuple[_Stream, int]:
    """Map a validated key to its stream and bitmap value."""
    topic, ledger_id, entry_id, batch_index = key
    if batch_index < 0:
        return (topic, ledger_id, _Kind.PLAIN, -1), entry_id
    if batch_index < _BATCH_LIMIT and entry_id < _BATCHED_ENTRY_LIMIT:
        return (topic, ledger_id, _Kind.BATCHED, -1), entry_id << BATCH_BITS | batch_index
    return (topic, ledger_id, _Kind.WIDE, entry_id), batch_index


def _decode(stream: _Stream, values: Iterator[int] | _Values) -> Iterator[MessageKey]:
    """Inverse of :func:`_encode` for every value of one stream (ascending)."""
    topic, ledger_id, kind, wide_entry = stream
    if kind is _Kind.PLAIN:
        return zip(repeat(topic), repeat(ledger_id), values, repeat(-1))
    if kind is _Kind.BATCHED:
        return ((topic, ledger_id, v >> BATCH_BITS, v & (_BATCH_LIMIT - 1)) for v in values)
    return zip(repeat(topic), repeat(ledger_id), repeat(wide_entry), values)


def _count_entries(kind: _Kind, bitmap: _Values) -> int:
    """Distinct entries in one stream's bitmap. O(n) for BATCHED, O(1) otherwise."""
    if kind is _Kind.PLAIN:
        return len(bitmap)
    if kind is _Kind.WIDE:
        return 1
    return len({v >> BATCH_BITS for v in bitmap})


class TimeBuckets:
    """Sorted time buckets of message keys, PIP-393 style, with sealing.

    Parameters
    ----------
    precision_bits : int
        Low bits cleared from each deadline (0-30). A bucket spans ``2**precision_bits``
        ms. More bits: fewer, fuller buckets and less memory, coarser timing. Leave the
        default (8, 256 ms) until you have measured.
    round_up : bool
        ``False`` (default, Java semantics): a deadline is floored to its bucket, so a
        message may be due up to ``2**precision_bits - 1`` ms early, never late.
        ``True``: rounded up, so it is never early and up to that much late.
    max_open_buckets : int
        Buckets kept mutable; the least recently written beyond this are sealed. Raise
        it if adds spread over many distinct buckets at once (many different delays).
    speedups : bool
        Keep the hot slot in C when ``pulsar_nack.core._speedups`` is built (default); False
        keeps it in Python. Same behaviour either way.

    >>> b = TimeBuckets(precision_bits=8)
    >>> b.add(("t", 7, 1, -1), 1000)
    768
    >>> b.add(("t", 7, 2, -1), 1010)
    768
    >>> len(b), b.peek_deadline()
    (2, 768)
    >>> b.pop_due(767)
    {}
    >>> b.pop_due(768)
    {'t': [('t', 7, 1, -1), ('t', 7, 2, -1)]}
    """

    precision_bits: int
    round_up: bool
    max_open_buckets: int
    _low_mask: int  # the bits trimming clears
    _round: int  # added before clearing them: _low_mask when rounding up, else 0
    _buckets: SortedDict  # deadline -> _Bucket
    _open: dict[int, None]  # open bucket deadlines, least recently written first
    _stream_ids: dict[_Stream, int]
    _streams: list[_Stream | None]  # sid -> stream (None when free)
    _stream_refs: list[int]  # sid -> number of buckets holding it
    _free_sids: list[int]
    _messages: int
    _entries: int
    _sealed_bytes: int
    _sealed_max: int  # no page holds a bucket later than this (an upper bound)
    _sealed_count: int  # buckets in pages
    _log_sid: int  # the stream of the hot slot's tail log, -1 when none (then the log is empty)
    # Whether the bucket written before the last new one held at most LOG_GROUP messages:
    # the tail log's pattern (a new bucket every few adds). Where buckets fill up, the log
    # would take only the first adds of each and hand them back in a flush: not worth it.
    _sparse_tail: bool
    hot_slot: _accel.PyHotSlot
    """The bitmaps recent adds went to: the hot path of add() skips every lookup, and its
    adds are counted as the bitmaps' growth when a slot goes (_settle). Read-only; the
    tracker hands it to the C ``add`` (:data:`pulsar_nack.core.accel.FastAdd`)."""

    def __init__(
        self,
        precision_bits: int = DEFAULT_PRECISION_BITS,
        *,
        round_up: bool = False,
        max_open_buckets: int = 16,
        speedups: bool = True,
    ) -> None:
        self.precision_bits = check_int("precision_bits", precision_bits, 0, MAX_PRECISION_BITS)
        self._low_mask = bucket_ms(self.precision_bits) - 1
        self.round_up = check_bool("round_up", round_up)
        self.max_open_buckets = check_int("max_open_buckets", max_open_buckets, 1)
        self._round = self._low_mask if round_up else 0
        self._buckets = SortedDict()
        self._open = {}
        self._stream_ids = {}
        self._streams = []
        self._stream_refs = []
        self._free_sids = []
        self._messages = 0
        self._entries = 0
        self._sealed_bytes = 0
        self._sealed_max = -1
        self._sealed_count = 0
        self._log_sid = -1
        self._sparse_tail = True
        self.hot_slot = _accel.HotSlot() if check_bool("speedups", speedups) else _accel.PyHotSlot()
        self._hot_add = self.hot_slot.add

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        """Number of pending messages. O(1)."""
        return self._messages + self.hot_slot.growth()

    @property
    def entries(self) -> int:
        """Pending entries (a batch counts once per bucket it appears in). O(1)."""
        return self._entries + self.hot_slot.entry_growth()

    @property
    def bucket_count(self) -> int:
        """Number of buckets, open or sealed (in pages). O(1) amortized (it flushes the tail log)."""
        self._flush_log()
        return len(self._open) + self._sealed_count

    def bucket_of(self, deadline_ms: int) -> int:
        """The bucket a deadline falls into (floored, or rounded up if ``round_up``): the trimming rule. O(1).

        >>> TimeBuckets(8).bucket_of(1000), TimeBuckets(8, round_up=True).bucket_of(1000)
        (768, 1024)
        """
        return (deadline_ms + self._round) & ~self._low_mask

    def deadlines_of(self, bucket: int) -> tuple[int, int]:
        """The first and last deadline that fall into *bucket* (the inverse of :meth:`bucket_of`). O(1).

        >>> TimeBuckets(8).deadlines_of(768), TimeBuckets(8, round_up=True).deadlines_of(1024)
        ((768, 1023), (769, 1024))
        """
        first = bucket - self._round
        return first, first + self._low_mask

    def peek_deadline(self) -> int | None:
        """Earliest bucket deadline, or None when empty. O(1).

        The tail log needs no flush here: its buckets are later than every other one.
        """
        return self._buckets.keys()[0] if self._buckets else None

    def __iter__(self) -> Iterator[tuple[int, MessageKey]]:
        """Yield ``(bucket_deadline, key)`` in deadline order, without changing anything.

        Meant for tests and debugging: O(n) and it decodes sealed buckets.
        """
        for deadline, stream, values in self._contents():
            for key in _decode(stream, values):
                yield deadline, key

    # ------------------------------------------------------------------ updates

    def add(self, key: MessageKey, deadline_ms: int) -> int:
        """Add *key* due at *deadline_ms*; return the bucket deadline it went into.

        Adding a key already in that bucket changes nothing. The same key in two
        different buckets is held twice and comes out twice.

        Runtime complexity: O(1) into an open bucket (the common case), O(log b) to
        create one among b buckets, O(bucket size) to unseal a sealed one.

        Raises
        ------
        TypeError, ValueError
            As :func:`validate_key`, or for a deadline that is not a non-negative int.
            Nothing is stored on error.
        """
        return self.add_at(key, check_int("deadline_ms", deadline_ms, 0))

    def add_at(self, key: MessageKey, deadline_ms: int) -> int:
        """:meth:`add` for a deadline the caller guarantees to be a non-negative int.

        The tracker's hot path (it computes deadlines itself); the key is still checked:
        the common case (a plain message into the bucket, topic and ledger of the previous
        add) checks only what it uses, everything else goes through :func:`validate_key`.
        """
        try:
            topic, ledger_id, entry_id, batch_index = key  # not a 4-tuple: validate_key says why
        except (TypeError, ValueError):
            topic, ledger_id, entry_id, batch_index = key = validate_key(key)
        if type(key) is not tuple:
            key = validate_key(key)
        bucket_deadline = (deadline_ms + self._round) & ~self._low_mask  # bucket_of(), inlined
        # Hot path: a bitmap a recent add went to takes the key (it checks the key itself).
        if self._hot_add(key, deadline_ms):
            return bucket_deadline
        if (
            type(topic) is not str
            or type(ledger_id) is not int
            or type(entry_id) is not int
            or type(batch_index) is not int
            or not (0 <= ledger_id <= MAX_ID and 0 <= entry_id <= MAX_ID and -1 <= batch_index <= MAX_BATCH_INDEX)
        ):
            key = validate_key(key)
        self._add_slow(key, bucket_deadline)
        return bucket_deadline

    def _add_slow(self, key: MessageKey, bucket_deadline: int) -> None:
        """Add a validated key through the full lookup: bucket, stream, bitmap; make the bitmap hot.

        Then the tail log takes this key's stream (the structure's last bucket is its floor)
        when buckets are sparse.
        """
        self._flush_log()
        stream, value = _encode(key)
        bucket = self._open_bucket(bucket_deadline)
        sid = self._stream_ids.get(stream)
        bitmap = None if sid is None else bucket.get(sid)
        if bitmap is None:
            if sid is None:
                sid = self._new_sid(stream)
            bitmap = BitMap() if value < _U32 else BitMap64()
            bucket[sid] = bitmap
            self._stream_refs[sid] += 1
        else:
            self._settle(self.hot_slot.forget_bitmap(bitmap))  # count its hot adds before this one
            if value >= _U32 and type(bitmap) is BitMap:
                bitmap = BitMap64(bitmap)
                bucket[sid] = bitmap  # type: ignore[index]  # (sid is set: the bitmap was found by it)
        kind = stream[2]
        new_entry = (
            kind is _Kind.PLAIN
            or (kind is _Kind.WIDE and not bitmap)
            or (
                kind is _Kind.BATCHED
                and not bitmap.range_cardinality(value & ~(_BATCH_LIMIT - 1), (value | (_BATCH_LIMIT - 1)) + 1)
            )
        )
        try:
            bitmap.add_checked(value)
        except KeyError:
            pass
        else:
            self._messages += 1
            self._entries += new_entry
        if kind is not _Kind.WIDE and type(bitmap) is BitMap:
            self._settle(self.hot_slot.set(*self.deadlines_of(bucket_deadline), key[0], key[1], kind, bitmap))
            if self._sparse_tail and not self._low_mask:  # the log takes buckets of one ms only
                last = self._buckets.keys()[-1]
                self.hot_slot.set_log(key[0], key[1], kind, sid, max(last, self._sealed_max))  # type: ignore[arg-type]  # (sid is set: found or made above)
                self._log_sid = sid  # type: ignore[assignment]  # (as above)
                return
        if self._log_sid >= 0:  # the last bucket may be later now: the log's floor is stale
            self.hot_slot.unset_log()
            self._log_sid = -1

    def _flush_log(self) -> None:
        """Move the tail log's adds into the structure; every other method calls this first.

        The log's buckets (all later than every bucket here) come back sealed into pages
        (by the page framing of :mod:`pulsar_nack.core.pages`), put after the last bucket,
        except the last one, opened as a normal bucket: a dense bucket then gets a hot
        bitmap and Roaring runs, as without the log. O(1) when the log is empty, else
        O(log records + log b).
        """
        if self._log_sid < 0:  # no log stream, so no records: the common case, no C call
            return
        taken = self.hot_slot.take_log(_pages.tag(self._log_sid, _pages.GAPS), _pages.PAGE_BYTES)
        if taken is None:
            return
        sid, pages, messages, entries, sealed, last_sealed, deadline, values = taken
        if pages:
            for key, page in pages:
                self._put_page(key, page)
            self._messages += messages
            self._entries += entries
            self._sealed_count += sealed
            self._stream_refs[sid] += sealed
            self._sealed_max = max(self._sealed_max, last_sealed)
        bucket = self._open_bucket(deadline)  # a new bucket: later than every other one
        bitmap = bucket[sid] = BitMap(values)
        self._stream_refs[sid] += 1
        self._messages += len(values)
        self._entries += _count_entries(self._streams[sid][2], bitmap)  # type: ignore[index]  # (the log's sid is live)

    def pop_due(self, now_ms: int) -> dict[str, list[MessageKey]]:
        """Remove and return every key whose bucket deadline is ``<= now_ms``.

        Keys are grouped by topic; within a topic they are in deadline order.

        Runtime complexity: O(d + k log b) for d due keys in k due buckets among b,
        plus O(page bytes) for a page that is only partly due.
        """
        self._flush_log()
        due: dict[str, list[MessageKey]] = {}
        buckets = self._buckets
        while buckets:
            deadline, bucket = buckets.peekitem(0)
            if deadline > now_ms:
                break
            del buckets[deadline]
            if type(bucket) is dict:
                del self._open[deadline]
                self._settle(self.hot_slot.forget(deadline))
                self._release(bucket.items(), due)
                continue
            self._sealed_bytes -= sys.getsizeof(bucket)
            for record_deadline, offset, start, end in _pages.iter_records(deadline, bucket):
                if record_deadline > now_ms:  # the rest of the page stays, as a page of its own
                    self._put_page(record_deadline, _pages.tail(bucket, deadline, record_deadline, offset))
                    break
                self._release(self._body_values(bucket, start, end), due)
                self._sealed_count -= 1
        return due

    def _release(self, pairs: Iterable[tuple[int, _Values]], due: dict[str, list[MessageKey]]) -> None:
        """Move one removed bucket's ``(sid, values)`` into *due*; update counters and stream refs."""
        streams = self._streams
        for sid, values in pairs:
            stream: _Stream = streams[sid]  # type: ignore[assignment]  # (freed sids are None; a released bucket only holds live ones)
            self._messages -= len(values)
            self._entries -= _count_entries(stream[2], values)
            keys = due.get(stream[0])
            if keys is None:
                keys = due[stream[0]] = []
            keys.extend(_decode(stream, values))
            self._unref(sid)

    def clear(self) -> dict[str, list[MessageKey]]:
        """Remove and return every key, as :meth:`pop_due` at the end of time. O(n)."""
        self._flush_log()
        if not self._buckets:
            return {}
        last, bucket = self._buckets.peekitem(-1)
        if type(bucket) is bytes:
            last = _pages.records(last, bucket)[-1][0]
        return self.pop_due(last)

    # ------------------------------------------------------------------ buckets

    def _open_bucket(self, deadline: int) -> _OpenBucket:
        """The open form of the bucket at *deadline*, creating or unsealing it."""
        buckets = self._buckets
        bucket = buckets.get(deadline)
        if type(bucket) is dict:
            # Mark as most recently written.
            del self._open[deadline]
            self._open[deadline] = None
            return bucket
        body = None
        if bucket is not None:
            body = self._split_page(deadline, bucket, deadline)
        elif deadline <= self._sealed_max:  # a page may hold this bucket or later ones: split it here
            index = buckets.bisect_left(deadline)
            if index:
                key, before = buckets.peekitem(index - 1)
                if type(before) is bytes:
                    body = self._split_page(key, before, deadline)
        opened: _OpenBucket = {}
        if body is not None:
            page, start, end = body
            for sid, values in self._body_values(page, start, end):
                if type(values) is list:
                    values = (BitMap if values[-1] < _U32 else BitMap64)(values)
                opened[sid] = values  # type: ignore[assignment]  # (an open bucket holds bitmaps; values was just made one)
        elif self._open:
            # A new bucket usually means the clock moved on: the most recently written
            # one is likely complete. Compress its runs now (O(its containers)); it
            # stays open, but consecutive ids no longer hold 8 KB bitset containers.
            messages = 0
            for bitmap in buckets[next(reversed(self._open))].values():
                bitmap.run_optimize()
                bitmap.shrink_to_fit()
                messages += len(bitmap)
            self._sparse_tail = messages <= _accel.LOG_GROUP
        else:
            self._sparse_tail = True
        buckets[deadline] = opened
        self._open[deadline] = None
        if len(self._open) > self.max_open_buckets:
            self._seal(next(iter(self._open)))
        return opened

    def _split_page(self, key: int, page: bytes, deadline: int) -> tuple[bytes, int, int] | None:
        """Cut the page at *key* around *deadline*; return the bucket at *deadline*, if any.

        Records before *deadline* stay at *key*, records after it become a page keyed by
        the first of them, and the record at *deadline* (returned as ``(page, body start,
        body end)``) leaves the pages. A page entirely before *deadline* is left alone. O(page).
        """
        found = None
        after = None
        cut = len(page)
        for record_deadline, offset, start, end in _pages.iter_records(key, page):
            if record_deadline < deadline:
                continue
            cut = offset if cut == len(page) else cut
            if record_deadline == deadline:
                found = (page, start, end)
                self._sealed_count -= 1
            else:
                after = (record_deadline, offset)
                break
        if cut == len(page):
            return None
        del self._buckets[key]
        self._sealed_bytes -= sys.getsizeof(page)
        if key < deadline:
            self._put_page(key, page[:cut])
        if after is not None:
            self._put_page(after[0], _pages.tail(page, key, after[0], after[1]))
        return found

    def _put_page(self, key: int, page: bytes) -> None:
        self._buckets[key] = page
        self._sealed_bytes += len(page) + _BYTES_HEADER

    def _seal(self, deadline: int) -> None:
        """Replace the open bucket at *deadline* by its compact form, in a page. O(bucket + page)."""
        buckets = self._buckets
        bucket: _OpenBucket = buckets[deadline]
        del self._open[deadline]
        self._settle(self.hot_slot.forget(deadline))
        body = _pages.encode_body(bucket.items())
        if deadline > self._sealed_max:
            self._sealed_max = deadline
        self._sealed_count += 1
        index = buckets.index(deadline)
        del buckets[deadline]
        key, before = buckets.peekitem(index - 1) if index else (-1, None)
        if type(before) is not bytes:
            key, before = -1, None
        pages = _pages.pack([(deadline, body)], key, before)
        if before is not None and len(pages) == 1:  # it joined the page just before, which now covers it
            self._sealed_bytes -= len(before) + _BYTES_HEADER
        self._put_page(*pages[-1])

    def seal_all(self) -> None:
        """Seal every open bucket (e.g. before measuring memory). O(open buckets)."""
        self._flush_log()
        for deadline in sorted(self._open):
            self._seal(deadline)

    def _body_values(self, page: bytes, start: int, end: int) -> Iterator[tuple[int, _Values]]:
        """``(sid, values)`` of the sealed bucket whose body is ``page[start:end]``."""
        for sid, codec, payload in _pages.body_streams(page, start, end):
            yield sid, _pages.decode_values(codec, payload)

    def _contents(self) -> Iterator[tuple[int, _Stream, _Values]]:
        """``(bucket deadline, stream, values)`` of every bucket, open or sealed, in order."""
        self._flush_log()
        streams = self._streams
        for key, bucket in self._buckets.items():
            if type(bucket) is dict:
                for sid, bitmap in bucket.items():
                    yield key, streams[sid], bitmap  # type: ignore[misc]  # (live sids only (see _check))
                continue
            for deadline, _, start, end in _pages.records(key, bucket):
                for sid, values in self._body_values(bucket, start, end):
                    yield deadline, streams[sid], values  # type: ignore[misc]  # (live sids only (see _check))

    def _unref(self, sid: int) -> None:
        """One bucket fewer holds stream *sid*; free the id when none does."""
        self._stream_refs[sid] -= 1
        if not self._stream_refs[sid]:
            del self._stream_ids[self._streams[sid]]  # type: ignore[arg-type]  # (a referenced sid is live, so its stream is not None)
            self._streams[sid] = None
            self._free_sids.append(sid)
            if sid == self._log_sid:  # (the log is empty: every caller flushed it)
                self.hot_slot.unset_log()
                self._log_sid = -1

    def _new_sid(self, stream: _Stream) -> int:
        """Give *stream* an id, reusing a freed one when possible."""
        if self._free_sids:
            sid = self._free_sids.pop()
            self._streams[sid] = stream
        else:
            sid = len(self._streams)
            self._streams.append(stream)
            self._stream_refs.append(0)
        self._stream_ids[stream] = sid
        return sid

    def forget_hot(self) -> None:
        """Empty every hot slot and the tail log, counting the adds that went through them. O(slots).

        A closed tracker calls it after storing keys again, so that no C ``add`` can go
        past its closed check into a hot slot.
        """
        self._flush_log()
        self._settle(self.hot_slot.clear())
        self.hot_slot.unset_log()
        self._log_sid = -1

    def _settle(self, grown: tuple[int, int]) -> None:
        """Count the ``(messages, entries)`` added through hot slots that were removed. O(1)."""
        self._messages += grown[0]
        self._entries += grown[1]

    # ------------------------------------------------------------------ memory

    def memory_bytes(self) -> int:
        """Estimate of the heap bytes this structure holds.

        Method: ``sys.getsizeof`` of the sorted map (its dict table, its key list and the
        key ints), of every sealed bucket (tracked as buckets are sealed), and of the
        stream table; for the few open buckets, the dict plus each bitmap's container
        bytes from ``BitMap.get_statistics()`` and a fixed per-bitmap overhead.
        Allocator slack is not counted; the memory benchmark compares this estimate
        with the process RSS delta.

        Runtime complexity: O(open buckets + streams + b / 1000).
        """
        self._flush_log()
        buckets = self._buckets
        total = sys.getsizeof(buckets) + self._sealed_bytes
        keys = buckets.keys()
        if keys:
            total += len(keys) * (sys.getsizeof(keys[-1]) + 8)  # key int + its list slot
        for deadline in self._open:
            bucket = buckets[deadline]
            total += sys.getsizeof(bucket)
            for bitmap in bucket.values():
                stats = bitmap.get_statistics()
                total += _BITMAP_OVERHEAD + 8 * stats["n_containers"]
                total += stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"]
                total += stats["n_bytes_bitset_containers"]
        total += sys.getsizeof(self._stream_ids) + sys.getsizeof(self._streams)
        total += sys.getsizeof(self._stream_refs) + sys.getsizeof(self._free_sids)
        total += sum(sys.getsizeof(s) for s in self._streams if s is not None)
        return total

    # ------------------------------------------------------------------ checks

    def _check(self) -> None:
        """Assert every invariant. O(n); for tests. It does not flush the tail log (it checks it)."""
        keys = list(self._buckets.keys())
        # Bucket deadlines are sorted, distinct, and aligned to the precision.
        assert keys == sorted(set(keys))
        assert all(k & self._low_mask == 0 for k in keys)
        # Exactly the open buckets are dicts, and there are not too many of them.
        assert set(self._open) == {k for k in keys if type(self._buckets[k]) is dict}
        assert len(self._open) <= self.max_open_buckets
        sealed = sum(sys.getsizeof(b) for b in self._buckets.values() if type(b) is bytes)
        records = sum(len(_pages.records(k, b)) for k, b in self._buckets.items() if type(b) is bytes)
        assert records == self._sealed_count
        refs = [0] * len(self._streams)
        messages = entries = 0
        latest = -1  # the last bucket's deadline
        for index, key in enumerate(keys):
            bucket = self._buckets[key]
            assert type(bucket) in (dict, bytes)
            if type(bucket) is dict:
                groups = [(key, list(bucket.items()))]
            else:
                # A page: records in deadline order, the first at its key, all before the next key.
                limit = keys[index + 1] if index + 1 < len(keys) else None
                groups = [(d, list(self._body_values(bucket, s, e))) for d, _, s, e in _pages.records(key, bucket)]
                deadlines = [d for d, _ in groups]
                assert deadlines[0] == key and deadlines == sorted(set(deadlines))
                assert limit is None or deadlines[-1] < limit
                assert deadlines[-1] <= self._sealed_max
                assert all(d & self._low_mask == 0 for d in deadlines)
            for group_deadline, pairs in groups:
                latest = max(latest, group_deadline)
                # No empty bucket and no empty bitmap; a stream appears once per bucket.
                assert pairs and all(len(values) for _, values in pairs)
                sids = [sid for sid, _ in pairs]
                assert len(sids) == len(set(sids))
                for sid, values in pairs:
                    stream = self._streams[sid]
                    assert stream is not None
                    refs[sid] += 1
                    messages += len(values)
                    entries += _count_entries(stream[2], values)
                    # A sealed 64-bit bitmap is used only when it must be (open ones upgrade lazily).
                    if type(bucket) is not dict and type(values) is BitMap64:
                        assert values.max() >= _U32
                    if type(values) is list:
                        assert values == sorted(set(values)) and values[0] >= 0
                    for message in _decode(stream, values):
                        # Every stored value decodes to a valid key of its own stream.
                        assert validate_key(message) == message and _encode(message)[0] == stream
        # The tail log: only at precision 0, one live plain or batched stream, only while the
        # structure is not empty; records after every bucket (floor), strictly increasing,
        # at most LOG_GROUP per bucket, 32-bit values. They count as messages (and entries)
        # not yet stored. (set_log() may decline a stream, and PyHotSlot never logs: then
        # log() is None.)
        log = self.hot_slot.log()
        assert self._log_sid < 0 or (self._streams[self._log_sid] is not None and not self._low_mask)
        assert log is None or self._log_sid >= 0
        if log is not None:
            topic, ledger, kind, sid, floor, log_records = log
            assert sid == self._log_sid and self._streams[sid] == (topic, ledger, _Kind(kind), -1)
            assert keys and floor >= latest
            assert all(d > floor and d & self._low_mask == 0 and 0 <= v < _U32 for d, v in log_records)
            assert log_records == sorted(set(log_records))
            assert max(Counter(d for d, _ in log_records).values(), default=0) <= _accel.LOG_GROUP
            messages += len(log_records)
            entries += len({(d, v >> BATCH_BITS if kind == _Kind.BATCHED else v) for d, v in log_records})
        # Reference counts, free list and stream table agree.
        assert refs == self._stream_refs
        assert all(self._streams[s] is None and refs[s] == 0 for s in self._free_sids)
        assert {s: i for i, s in enumerate(self._streams) if s is not None} == self._stream_ids
        assert all(refs[i] > 0 for i, s in enumerate(self._streams) if s is not None)
        # Counters match the content.
        assert (messages, entries, sealed) == (len(self), self.entries, self._sealed_bytes)
        # Each hot bitmap is the live 32-bit bitmap of its plain or batched stream in an open bucket.
        slots = self.hot_slot.slots()
        assert len({id(bitmap) for *_, bitmap, _ in slots}) == len(slots) <= _accel.MAX_SLOTS
        for first, last, topic, ledger, kind, bitmap, base in slots:
            deadline = self.bucket_of(first)
            assert self.deadlines_of(deadline) == (first, last)
            sid = self._stream_ids[(topic, ledger, _Kind(kind), -1)]
            assert self._buckets[deadline][sid] is bitmap and type(bitmap) is BitMap
            assert len(bitmap) >= base


_BYTES_HEADER = sys.getsizeof(b"")
"""``sys.getsizeof`` of a bytes object beyond its length."""
_BITMAP_OVERHEAD = 96
"""Bytes per live bitmap besides its containers: the Python object and roaring header."""
