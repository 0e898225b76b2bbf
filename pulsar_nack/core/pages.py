"""Sealed pages: the compact, immutable form of time buckets that take no more adds.

A page is one ``bytes`` object holding one or more sealed buckets, in deadline order::

    page    := uvarint(key - base) record+
    record  := uvarint(deadline - base) uvarint(len(body)) body
    body    := uvarint(streams) stream{streams}
    stream  := uvarint(sid << 2 | codec) uvarint(len(payload)) payload

``key`` is the page's key in the bucket map (the deadline of its first record) and
``base`` an earlier time the deltas count from, so a page's tail is a new page without
re-encoding: a new header plus a slice. Each stream's values (the bitmap values of
:mod:`pulsar_nack.core.buckets`) take the smallest of two codecs:

* ``ROARING32`` / ``ROARING64``: the portable Roaring serialization after
  ``run_optimize()`` (a few bytes per *run* of consecutive values);
* ``GAPS``: ``uvarint(first)`` then ``uvarint(value - previous)`` per further value:
  one byte per value while the gaps stay below 128, which is what sparse selections
  (a random 10 % of entries) cost, against two bytes in a Roaring array container.

Many small buckets share one page (up to :data:`PAGE_BYTES`), so a bucket's fixed cost
is a few bytes instead of a dict slot, an int key and an object header.

This module defines the format and is its only writer and reader. Its framing loops
(:func:`pack`, the body of :func:`encode_body`) and the GAPS codec's run in C when the
extension is built (``pack``, ``frame_body``, ``encode_gaps``, ``decode_gaps`` in
``_speedups.c``, which the C tail log writes its pages with too) and in the Python here
otherwise: the same bytes, held equal by ``tests/test_pages.py``. Stream tags
(:func:`tag`) and the page size are decided here only.

Runtime complexity: encoding and decoding are O(values + bytes); every page operation
is O(page bytes), and a page is at most :data:`PAGE_BYTES` unless one bucket alone is
larger.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise
from operator import sub
from typing import Any, Union

from pyroaring import BitMap, BitMap64

from . import accel as _accel

__all__ = [
    "GAPS",
    "PAGE_BYTES",
    "ROARING32",
    "ROARING64",
    "body_streams",
    "decode_values",
    "encode_body",
    "encode_values",
    "iter_records",
    "pack",
    "read_uvarint",
    "records",
    "tag",
    "tail",
    "uvarint",
]

ROARING32 = 0
ROARING64 = 1
GAPS = 2
PAGE_BYTES = 4096
"""Pages grow up to this many bytes; a bucket that is larger alone is a page of its own."""

_Bitmap = Union[BitMap, BitMap64]  # noqa: UP007 (a runtime alias)
Record = tuple[int, int, int, int]
"""``(deadline, record_offset, body_start, body_end)`` of one sealed bucket in a page."""


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def uvarint(value: int) -> bytes:
    """LEB128 encoding of a non-negative int (7 bits a byte, low first). O(log value)."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode the uvarint at *pos*; return ``(value, position after it)``."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7


def _encode_gaps(bitmap: _Bitmap) -> bytes:
    """GAPS payload of a bitmap's values (at least one); in C when the extension is built."""
    array = bitmap.to_array()
    if _accel.encode_gaps is not None:
        return _accel.encode_gaps(array)
    return _encode_gaps_py(array)


def _encode_gaps_py(array: Any) -> bytes:
    """:func:`_encode_gaps` in Python, from ``BitMap.to_array()``."""
    first = array[0]
    gaps = list(map(sub, array[1:], array[:-1]))
    head = uvarint(first)
    if not gaps or max(gaps) < 0x80:
        return head + bytes(gaps)
    out = bytearray(head)
    for gap in gaps:
        if gap < 0x80:
            out.append(gap)
        else:
            out += uvarint(gap)
    return bytes(out)


def _encode_gaps_list(values: list[int]) -> bytes:
    """GAPS payload of a list of ascending values (at least two)."""
    return uvarint(values[0]) + b"".join(uvarint(b - a) for a, b in pairwise(values))


def _decode_gaps(payload: bytes) -> list[int]:
    """Values of a GAPS payload, ascending; in C when the extension is built."""
    if _accel.decode_gaps is not None:
        return _accel.decode_gaps(payload)
    return _decode_gaps_py(payload)


def _decode_gaps_py(payload: bytes) -> list[int]:
    """:func:`_decode_gaps` in Python."""
    first, pos = read_uvarint(payload, 0)
    rest = payload[pos:]
    if rest.isascii():  # every gap fits one byte: a C-speed running sum
        return list(accumulate(rest, initial=first))
    values = [first]
    end = len(payload)
    value = first
    while pos < end:
        gap, pos = read_uvarint(payload, pos)
        value += gap
        values.append(value)
    return values


def encode_values(bitmap: _Bitmap | list[int]) -> tuple[int, bytes]:
    """``(codec, payload)`` for one stream's bitmap (not empty): the smaller encoding.

    Runs the bitmap's ``run_optimize()`` (it is being sealed). A list of ascending values
    (at most a few, from the tail log) is GAPS, smaller than Roaring's headers. O(values).
    """
    if isinstance(bitmap, list):
        return GAPS, uvarint(bitmap[0]) if len(bitmap) == 1 else _encode_gaps_list(bitmap)
    if len(bitmap) == 1:
        return GAPS, uvarint(bitmap.min())
    bitmap.run_optimize()
    roaring = bitmap.serialize()
    if len(roaring) <= len(bitmap):  # runs: fewer bytes than one per value
        return (ROARING64 if type(bitmap) is BitMap64 else ROARING32), roaring
    gaps = _encode_gaps(bitmap)
    if len(gaps) < len(roaring):
        return GAPS, gaps
    return (ROARING64 if type(bitmap) is BitMap64 else ROARING32), roaring


def decode_values(codec: int, payload: bytes) -> _Bitmap | list[int]:
    """The values of one stream: a bitmap (Roaring codecs) or an ascending list (GAPS)."""
    if codec == GAPS:
        return _decode_gaps(payload)
    return (BitMap64 if codec == ROARING64 else BitMap).deserialize(payload)


def tag(sid: int, codec: int) -> int:
    """The tag of a stream in a body: its sid and its codec. O(1)."""
    return sid << 2 | codec


def encode_body(streams: Iterable[tuple[int, _Bitmap | list[int]]]) -> bytes:
    """The body of one sealed bucket from its ``(sid, bitmap or ascending values)`` pairs. O(values)."""
    framed = []
    for sid, values in streams:
        codec, payload = encode_values(values)
        framed.append((tag(sid, codec), payload))
    return _frame_body(framed)


def _frame_body_py(streams: list[tuple[int, bytes]]) -> bytes:
    """``body := uvarint(streams) [uvarint(tag) uvarint(len(payload)) payload]...``; the C ``frame_body``'s stand-in."""
    parts = [uvarint(len(streams))]
    for stream_tag, payload in streams:
        parts += (uvarint(stream_tag), uvarint(len(payload)), payload)
    return b"".join(parts)


def body_streams(page: bytes, start: int, end: int) -> Iterator[tuple[int, int, bytes]]:
    """``(sid, codec, payload)`` of each stream in the body at ``page[start:end]``."""
    count, pos = read_uvarint(page, start)
    for _ in range(count):
        stream_tag, pos = read_uvarint(page, pos)
        length, pos = read_uvarint(page, pos)
        yield stream_tag >> 2, stream_tag & 3, page[pos : pos + length]
        pos += length
    if pos != end:
        raise ValueError("corrupt page: a body does not end where its record says")


def pack(bodies: list[tuple[int, bytes]], key: int = -1, page: bytes | None = None) -> list[tuple[int, bytes]]:
    """``[(key, page)]``: *page* (keyed by *key*; None for none) followed by the records of
    ``(deadline, body)`` pairs (ascending, after every record of *page*), in pages of up to
    :data:`PAGE_BYTES` (a larger record alone). The first item is *page* grown, when its
    first new record fits in it. O(bytes).
    """
    return _pack(bodies, key, page, PAGE_BYTES)


def _pack_py(bodies: list[tuple[int, bytes]], key: int, page: bytes | None, page_bytes: int) -> list[tuple[int, bytes]]:
    """:func:`pack` in Python: ``page := uvarint(key - base) record+``,
    ``record := uvarint(deadline - base) uvarint(len(body)) body``; the C ``pack``'s stand-in."""
    pages = []
    base = -1 if page is None else base_of(key, page)
    parts = [] if page is None else [page]
    size = 0 if page is None else len(page)
    for deadline, body in bodies:
        record = b"" if base < 0 else uvarint(deadline - base) + uvarint(len(body)) + body
        if base < 0 or size + len(record) > page_bytes:
            if base >= 0:
                pages.append((key, b"".join(parts)))
            key = base = deadline
            record = _ONE_BYTE[0] + uvarint(len(body)) + body
            parts, size = [_ONE_BYTE[0]], 1  # uvarint(key - base): the key is the base
        parts.append(record)
        size += len(record)
    if base >= 0:
        pages.append((key, b"".join(parts)))
    return pages


def base_of(key: int, page: bytes) -> int:
    """The time a page's record deltas count from. O(1)."""
    return key - read_uvarint(page, 0)[0]


def iter_records(key: int, page: bytes) -> Iterator[Record]:
    """The records of a page, in deadline order, read as they are consumed. O(1) each."""
    base = base_of(key, page)
    pos = read_uvarint(page, 0)[1]
    end = len(page)
    while pos < end:
        start = pos
        delta, pos = read_uvarint(page, pos)
        length, pos = read_uvarint(page, pos)
        yield base + delta, start, pos, pos + length
        pos += length


def records(key: int, page: bytes) -> list[Record]:
    """Every record of a page, in deadline order. O(records)."""
    return list(iter_records(key, page))


def tail(page: bytes, key: int, new_key: int, offset: int) -> bytes:
    """The page of the records from byte *offset* on, keyed by *new_key* (their first deadline). O(page)."""
    return uvarint(new_key - base_of(key, page)) + page[offset:]


_pack: Any = _accel.pack if _accel.pack is not None else _pack_py
_frame_body: Any = _accel.frame_body if _accel.frame_body is not None else _frame_body_py
