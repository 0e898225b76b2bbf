"""Message keys: what the trackers store, and how pulsar objects map to them.

A message is identified by ``(topic, ledger_id, entry_id, batch_index)``, with
``batch_index == -1`` for a message that is not part of a batch. The partition is part
of the topic name (``persistent://t/ns/x-partition-3``), so keys of different topics or
partitions never collide even where ledger ids repeat.

This module holds the rules about names and ids that every layer uses: how a topic name
reads (:func:`split_topic`, :func:`full_topic_name`, :data:`PARTITION_SUFFIX`), how a
message's key is read (:func:`message_key`, duck-typed: this module never imports pulsar)
and how a batched key packs into a bitmap value (:data:`BATCH_BITS`).
"""

from __future__ import annotations

import re
from typing import Any

from .._validate import check_int

__all__ = [
    "BATCH_BITS",
    "MAX_BATCH_INDEX",
    "MAX_ID",
    "PARTITION_SUFFIX",
    "MessageKey",
    "checked_key",
    "full_topic_name",
    "key_of",
    "message_key",
    "redelivery_count_of",
    "split_topic",
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
BATCH_BITS = 10
"""A batched message with ``batch_index < 2**BATCH_BITS`` is stored as the bitmap value
``entry_id << BATCH_BITS | batch_index``, so the messages of one batch sit side by side."""


def split_topic(topic: str) -> tuple[str, str, str, str]:
    """``(domain, tenant, namespace, local name)`` of a topic name, short or full, as the client reads it.

    A short name ``orders`` is ``persistent://public/default/orders``; ``t/ns/orders`` is
    ``persistent://t/ns/orders``. O(len(topic)).

    >>> split_topic("orders")
    ('persistent', 'public', 'default', 'orders')
    >>> split_topic("non-persistent://t/ns/x-partition-3")
    ('non-persistent', 't', 'ns', 'x-partition-3')

    Raises
    ------
    TypeError
        For a topic that is not a str.
    ValueError
        For a name that is neither ``local`` nor ``[domain://]tenant/namespace/local``.
    """
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, not {type(topic).__name__}")
    domain, full, rest = topic.partition("://")
    if not full:
        domain, rest = "persistent", topic
    parts = rest.split("/", 2)
    if len(parts) == 1 and not full:
        parts = ["public", "default", rest]
    if not domain or len(parts) != 3 or not all(parts):
        raise ValueError(f"topic must be a topic name (local or tenant/namespace/local), got {topic!r}")
    return domain, parts[0], parts[1], parts[2]


def full_topic_name(topic: str) -> str:
    """``persistent://public/default/orders`` for ``orders``, as the client names it. O(len(topic)).

    >>> full_topic_name("orders"), full_topic_name("t/ns/orders")
    ('persistent://public/default/orders', 'persistent://t/ns/orders')
    """
    domain, tenant, namespace, local = split_topic(topic)
    return f"{domain}://{tenant}/{namespace}/{local}"


def message_key(message: Any) -> MessageKey:
    """``(topic, ledger, entry, batch_index)`` of a message (anything with ``topic_name()`` and
    ``message_id()``), read with the id's four getters, not validated. O(1).

    The one reader of a message's key; :mod:`pulsar_nack.consumer.msgid` has a C version that
    reads the same fields from one ``serialize()`` of the id.
    """
    message_id = message.message_id()
    return message.topic_name(), message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()


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
        try:
            key = message_key(obj)
        except AttributeError:  # its message_id() has no ledger_id() and friends
            raise TypeError(f"message_id() of a {type(obj).__name__} returned no message id") from None
        return validate_key(key)
    if _is_message_id(obj):
        message_id: Any = obj
        topic = default_topic
        partition = getattr(obj, "partition", None)
        index = partition() if callable(partition) else -1
        if isinstance(index, int) and index >= 0 and topic and not PARTITION_SUFFIX.search(topic):
            topic = f"{topic}-partition-{index}"
        return validate_key((topic, message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()))
    raise TypeError(
        "expected a pulsar Message or MessageId or a (topic, ledger_id, entry_id, batch_index) "
        f"tuple, not {type(obj).__name__}"
    )


def redelivery_count_of(obj: object) -> int:
    """``obj.redelivery_count()`` for a message, 0 for anything else. O(1)."""
    method = getattr(obj, "redelivery_count", None)
    count = method() if callable(method) else 0
    return count if isinstance(count, int) and count > 0 else 0
