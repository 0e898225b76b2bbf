"""Message keys: what the trackers store, and how pulsar objects map to them.

A message is identified by ``(topic, ledger_id, entry_id, batch_index)``, with
``batch_index == -1`` for a message that is not part of a batch. The partition is part
of the topic name (``persistent://t/ns/x-partition-3``), so keys of different topics or
partitions never collide even where ledger ids repeat.

:func:`key_of` accepts ``pulsar.Message``, ``_pulsar.Message``, ``pulsar.MessageId`` and
``_pulsar.MessageId`` by duck typing: this module never imports pulsar.
"""

from __future__ import annotations

import re
from typing import Any

from .._validate import check_int

__all__ = [
    "MAX_BATCH_INDEX",
    "MAX_ID",
    "PARTITION_SUFFIX",
    "MessageKey",
    "checked_key",
    "key_of",
    "redelivery_count_of",
    "validate_key",
]

MessageKey = tuple[str, int, int, int]
"""``(topic, ledger_id, entry_id, batch_index)``; ``batch_index == -1`` if not batched."""

MAX_ID = 2**63 - 1
"""Largest ledger or entry id (Pulsar ids are signed 64-bit; negative ones are refused)."""
MAX_BATCH_INDEX = 2**31 - 1
"""Largest batch index (signed 32-bit in the Pulsar protocol)."""
PARTITION_SUFFIX = re.compile(r"-partition-(\d+)$")
"""The ``-partition-N`` suffix of a partition's topic name; group 1 is N."""


def validate_key(key: object) -> MessageKey:
    """Return *key* as a plain ``MessageKey`` tuple, or raise.

    Raises
    ------
    TypeError
        If *key* is not a 4-tuple of ``(str, int, int, int)`` (``bool`` is refused).
    ValueError
        If an id is negative or above ``MAX_ID``, or ``batch_index`` is below -1 or
        above ``MAX_BATCH_INDEX``.

    >>> validate_key(("t", 1, 2, -1))
    ('t', 1, 2, -1)
    >>> validate_key(("t", -1, 2, -1))
    Traceback (most recent call last):
    ...
    ValueError: ledger_id must be in [0, 2**63), got -1
    """
    if not isinstance(key, tuple) or len(key) != 4:
        raise TypeError(f"a message key is a tuple (topic, ledger_id, entry_id, batch_index), not {key!r}")
    topic, ledger_id, entry_id, batch_index = key
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, not {type(topic).__name__}")
    for name, value in (("ledger_id", ledger_id), ("entry_id", entry_id), ("batch_index", batch_index)):
        check_int(name, value)
    if not 0 <= ledger_id <= MAX_ID:
        raise ValueError(f"ledger_id must be in [0, 2**63), got {ledger_id}")
    if not 0 <= entry_id <= MAX_ID:
        raise ValueError(f"entry_id must be in [0, 2**63), got {entry_id}")
    if not -1 <= batch_index <= MAX_BATCH_INDEX:
        raise ValueError(f"batch_index must be -1 or in [0, 2**31), got {batch_index}")
    # Exact types: str.__str__ copies a str subclass (whose own __str__ may not).
    return (str.__str__(topic), int(ledger_id), int(entry_id), int(batch_index))


def checked_key(key: object) -> MessageKey:
    """:func:`validate_key`, with a fast path for a key that is already a valid plain tuple. O(1).

    >>> checked_key(("t", 1, 2, -1))
    ('t', 1, 2, -1)
    """
    if type(key) is tuple and len(key) == 4:
        topic, ledger_id, entry_id, batch_index = key
        if (
            type(topic) is str
            and type(ledger_id) is int
            and type(entry_id) is int
            and type(batch_index) is int
            and 0 <= ledger_id <= MAX_ID
            and 0 <= entry_id <= MAX_ID
            and -1 <= batch_index <= MAX_BATCH_INDEX
        ):
            return key  # checked field by field just above
    return validate_key(key)


def _is_message_id(obj: Any) -> bool:
    return callable(getattr(obj, "ledger_id", None)) and callable(getattr(obj, "entry_id", None))


def key_of(obj: object, default_topic: str = "") -> MessageKey:
    """The key of a message, a message id, or a key tuple.

    A message (anything with ``message_id()`` and ``topic_name()``) brings its topic. A
    bare message id has none: *default_topic* is used, with ``-partition-N`` appended when
    the id names a partition. Runtime complexity: O(1).

    Raises
    ------
    TypeError
        For an object that is none of these.
    ValueError
        For out-of-range ids, as :func:`validate_key`.

    >>> key_of(("t", 1, 2, 3))
    ('t', 1, 2, 3)
    """
    if isinstance(obj, tuple):
        return validate_key(obj)
    if callable(getattr(obj, "message_id", None)) and callable(getattr(obj, "topic_name", None)):
        topic = obj.topic_name()  # type: ignore[attr-defined]  # (duck-typed pulsar.Message: checked callable just above)
        message_id = obj.message_id()  # type: ignore[attr-defined]  # (duck-typed pulsar.Message: checked callable just above)
    elif _is_message_id(obj):
        message_id, topic = obj, default_topic
        partition = getattr(obj, "partition", None)
        index = partition() if callable(partition) else -1
        if isinstance(index, int) and index >= 0 and topic and not PARTITION_SUFFIX.search(topic):
            topic = f"{topic}-partition-{index}"
    else:
        raise TypeError(
            "expected a pulsar Message or MessageId or a (topic, ledger_id, entry_id, batch_index) "
            f"tuple, not {type(obj).__name__}"
        )
    if not _is_message_id(message_id):
        raise TypeError(f"message_id() returned {type(message_id).__name__}, not a message id")
    return validate_key((topic, message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()))


def redelivery_count_of(obj: object) -> int:
    """``obj.redelivery_count()`` for a message, 0 for anything else. O(1)."""
    method = getattr(obj, "redelivery_count", None)
    count = method() if callable(method) else 0
    return count if isinstance(count, int) and count > 0 else 0
