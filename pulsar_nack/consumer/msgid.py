"""The reader of a received message's id: the optional C ``pulsar_nack.consumer._msgid`` and its
pure-Python stand-in, with the same results and errors.

The consumer's nack path reads ``(topic, ledger, entry, batch_index)`` of every message it
is given. The C reader takes them from one ``serialize()`` of the id instead of four
calls (``bench/client.py`` measures both). ``PULSAR_NACK_PURE_PYTHON=1`` before import
forces the stand-in.
"""

from __future__ import annotations

from typing import Any

from ..core.accel import load_optional
from ..core.keys import message_key as py_message_key

__all__ = ["MSGID", "message_key", "parse_id", "py_message_key", "py_parse_id"]


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


_c = load_optional("pulsar_nack.consumer._msgid")
MSGID = _c is not None
"""Whether the C reader is in use."""
message_key: Any = py_message_key if _c is None else _c.message_key
"""``message_key(message)``: ``(topic, ledger, entry, batch_index)`` of a message, read from one
``serialize()`` of its id by the C reader, or :func:`pulsar_nack.core.keys.message_key` (four
getters; about 0.3 µs more per call: ``bench/client.py``)."""
parse_id: Any = py_parse_id if _c is None else _c.parse_id
"""``parse_id(data)``: the C parser of ``pulsar_nack.consumer._msgid``, or :func:`py_parse_id`."""
