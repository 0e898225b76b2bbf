"""The broker-agnostic heart of a nacking consumer, shared by the sync and asyncio consumers.

:class:`NackingCore` owns everything between the application's calls and the client's
``negative_acknowledge(MessageId)`` handoff, and calls into no client itself:

* the :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` and its timer;
* the keying of messages and ids (:meth:`NackingCore.key_of`), with the topic taken from
  the message, from the consumer's only topic (plus ``-partition-N``), or kept inside
  the caller's id object when neither is known (a bare id on a multi-topic consumer);
* the handoff: due keys become one entry-level ``_pulsar.MessageId`` per entry, passed
  to the ``hand_off`` callable the consumer supplies (the sync consumer calls
  ``consumer.negative_acknowledge(id)`` for each);
* **admission**: which copies of a message reach the application;
* with a dead-letter policy, how often the application saw each unsettled message, and
  which messages go to the dead-letter topic (sent by the route the consumer supplies,
  :class:`~pulsar_nack.consumer.dead_letter.DeadLetterRoute`).

Admission
    The broker redelivers whole entries, and after any reconnect (topic unload, broker
    restart or failover, a consumer reconnect) or an ack timeout it redelivers every
    unacked message. The C++ client keeps one nack bucket per handoff, so an entry handed
    off in two bursts comes back twice. Per message, :meth:`NackingCore.admit` decides:

    ======================  ===========================================================
    state of the message    a copy of it
    ======================  ===========================================================
    nack pending            swallowed, left unacked: its own handoff brings it back
    handed off              delivered (it is due), and the message becomes *returned*;
                            but before its bucket's time (its entry's last handoff plus
                            the lead, :func:`handoff_lead_ms`), a copy cannot be the
                            handoff's (a reconnect brought it): swallowed, left unacked,
                            since the client still holds the entry and brings it back
    returned (not settled)  swallowed and held; acked with the message when the
                            application acks it (never twice per nack)
    acked                   filtered and acked again, so that a broker without
                            batch-index acks can settle the entry
    anything else           delivered, as the plain client does
    ======================  ===========================================================

    The nack sets (pending, handed off, returned) are :class:`PendingNacks`, a few bytes
    per message. Acked members are known per batch entry in flight: an ``EntryTable``
    (``_msgid.c``) holds the acked and nacked members of entries being processed and the
    last settled entries; an entry whose every member is acked or nacked moves to
    :class:`EntrySet` (a roaring bitmap of entry ids, a bit or two each), where a member
    that is in no nack set is acked.

Guarding, and its cost
    Knowing a copy needs its id, and reading an id costs about half a microsecond, about
    15 % of a receive and acknowledge. So the core *guards* (reads the id of every
    received message and records every ack) only from the start, while any nack is
    pending, handed off or returned, and for ``guard_messages`` deliveries after the last
    one (``START_GUARD_MESSAGES`` at the start); then it is *quiet* (``quiet`` is True) and
    receive and acknowledge cost what they cost in the plain client, until the next nack.
    See ``docs/consumer.md`` for what a quiet consumer does not catch.

A consumer built on it calls :meth:`NackingCore.admit` on every received message,
:meth:`NackingCore.nack` for a negative acknowledgement, :meth:`NackingCore.before_ack`
before an acknowledgement (and :meth:`NackingCore.after_ack` after it),
:meth:`NackingCore.reset` before ``seek`` or ``redeliver_unacknowledged_messages``, and
:meth:`NackingCore.close`.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pyroaring import BitMap64

from .._validate import check_int, check_ms, check_topics
from ..core.base import DueKeys
from ..core.keys import BATCH_BITS, MAX_BATCH_INDEX, PARTITION_SUFFIX, MessageKey, full_topic_name, redelivery_count_of
from ..core.timer import monotonic_ms
from ..core.tracker import NegativeAcksTracker
from ..errors import ClosedError
from ..timing import DEAD_LETTER_RETRY_MS, STALE_MS, handoff_lead_ms
from . import msgid as _msgid
from ._client import RawMessageId, inner_message, is_raw_message_id, raw_id
from ._client import entry_id as raw_entry_id
from .settings import ConsumerSettings

__all__ = [
    "GUARD_MESSAGES",
    "PARTITION_SUFFIX",
    "SETTLED_CAPACITY",
    "START_GUARD_MESSAGES",
    "AgingSet",
    "DeadLetterCallback",
    "EntrySet",
    "HandOff",
    "NackingCore",
    "PendingNacks",
    "TopicMatcher",
    "batch_size_of",
    "full_topic_name",
    "handoff_id",
    "raw_id",
]

GUARD_MESSAGES = 10_000
"""Deliveries a consumer keeps guarding after its last nack state ended."""
START_GUARD_MESSAGES = 1_000
"""Deliveries a new consumer guards before it goes quiet (if it nacks nothing meanwhile)."""
SETTLED_CAPACITY = 8192
"""Settled entries (and acked non-batched messages) remembered while guarding: the client
drops the acks it groups (100 ms) when its connection drops, and the broker then redelivers
them. 8,192 covers a full receive queue (1,000) plus about 100 ms of acks at 70,000 per
second; about 500 kB when full."""

HandOff = Callable[[list[RawMessageId]], None]
"""What a consumer does with due entries: ``negative_acknowledge`` each id on its client."""
DeadLetterCallback = Callable[[Any, bool], None]
"""What a consumer does with a message for the dead-letter topic: ``route(message, stored)``."""
Item = tuple[int, int, int]
"""``(ledger_id, entry_id, batch_index)``: a message, whatever its topic (ledger ids are unique)."""

_BATCH_BITS = BATCH_BITS
_BATCH_LIMIT = 1 << _BATCH_BITS
_PACK_LIMIT = 1 << (64 - _BATCH_BITS)
_UNTITLED = ""  # the tracker topic of a key whose id object carries the real topic


def _is_message(obj: Any) -> bool:
    return not is_raw_message_id(obj) and callable(getattr(obj, "topic_name", None))


def _item_of(message_id: RawMessageId) -> Item:
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


_STASH = "_pulsar_nack_id"
"""The attribute of a delivered ``pulsar.Message`` that holds its serialized id, read when
it was admitted, so that acknowledging it does not read the id again."""


def _stash(message: Any, data: bytes) -> None:
    """Keep the serialized id on a ``pulsar.Message`` wrapper (raw messages take no attributes)."""
    fields = getattr(message, "__dict__", None)
    if fields is not None:
        fields[_STASH] = data


def _stashed(message: Any) -> bytes | None:
    """The serialized id :func:`_stash` kept on *message*, or None."""
    fields = getattr(message, "__dict__", None)
    return None if fields is None else fields.get(_STASH)


def _inner_message(message: Any) -> Any:
    """The ``_pulsar.Message`` inside a ``pulsar.Message`` (:func:`~._client.inner_message`), or *message*."""
    inner = inner_message(message)
    return message if inner is None else inner


def batch_size_of(message_id: RawMessageId) -> int:
    """``batch_size`` of a serialized ``MessageIdData`` (protobuf field 6), or 0 if absent. O(1)."""
    return int(_msgid.parse_id(message_id.serialize())[4])


def handoff_id(topic: str, ledger_id: int, entry_id: int) -> RawMessageId:
    """The entry-level id the client redelivers: partition from the topic name, topic set.

    The multi-topic C++ consumer routes ids by topic name and silently drops ids without one.
    """
    match = PARTITION_SUFFIX.search(topic)
    return raw_entry_id(int(match.group(1)) if match else -1, ledger_id, entry_id, topic)


class TopicMatcher:
    """Which topics a consumer reads: a list of names, or a regular expression.

    ``partition`` topics of a listed topic match too. Runtime complexity: O(1) for a list
    (a set lookup), the regex's cost for a pattern.
    """

    __slots__ = ("names", "pattern")

    names: frozenset[str]
    pattern: re.Pattern[str] | None

    def __init__(self, topics: Iterable[str] | re.Pattern[str]) -> None:
        if isinstance(topics, re.Pattern):
            if not isinstance(topics.pattern, str):
                raise TypeError("a topic pattern must be a str pattern, not bytes")
            self.names, self.pattern = frozenset(), topics
            return
        topic_list = check_topics("topics", topics)
        self.names, self.pattern = frozenset(full_topic_name(t) for t in topic_list), None

    @property
    def single(self) -> str | None:
        """The consumer's one topic, or None for several topics or a pattern."""
        return next(iter(self.names)) if len(self.names) == 1 else None

    def __contains__(self, topic: str) -> bool:
        base = PARTITION_SUFFIX.sub("", topic)
        if self.pattern is not None:
            return bool(self.pattern.fullmatch(base) or self.pattern.fullmatch(base.split("://", 1)[-1]))
        return topic in self.names or base in self.names

    def __repr__(self) -> str:
        return f"TopicMatcher({self.pattern.pattern!r})" if self.pattern else f"TopicMatcher({sorted(self.names)})"


class PendingNacks:
    """The set of nacked messages whose delay is not over, a few bytes each.

    Keyed by ledger id (ledger ids are unique in a cluster, across topics), then one
    :class:`pyroaring.BitMap64` of ``entry_id << 10 | (batch_index + 1)`` values, so the
    messages of consecutive entries share Roaring containers. Values that do not pack
    (a batch index of 1023 or more, an entry id of ``2**54`` or more) go to a plain set.

    Not thread-safe: :class:`NackingCore` holds its lock around every call. ``count``
    (the number of messages) may be read without it, as a hint.

    >>> p = PendingNacks()
    >>> p.add(7, 100, 3), p.add(7, 100, 3), (7, 100, 3) in p, (7, 100, 4) in p, len(p)
    (True, False, True, False, 1)
    >>> p.discard(7, 100, 3); len(p)
    0
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
            value = entry_id << _BATCH_BITS | (batch_index + 1)
            if value in bitmap:
                return False
            bitmap.add(value)
        elif (ledger_id, entry_id, batch_index) not in self._wide:
            self._wide.add((ledger_id, entry_id, batch_index))
        else:
            return False
        self.count += 1
        return True

    def discard(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        """Remove a message if present. O(log n)."""
        if batch_index + 1 < _BATCH_LIMIT and entry_id < _PACK_LIMIT:
            bitmap = self._by_ledger.get(ledger_id)
            value = entry_id << _BATCH_BITS | (batch_index + 1)
            if bitmap is not None and value in bitmap:
                bitmap.discard(value)
                self.count -= 1
                if not bitmap:
                    del self._by_ledger[ledger_id]
        elif (ledger_id, entry_id, batch_index) in self._wide:
            self._wide.discard((ledger_id, entry_id, batch_index))
            self.count -= 1

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
    nack set was acked. Not thread-safe: :class:`NackingCore` holds its lock; ``count``
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
    Not thread-safe: :class:`NackingCore` holds its lock.

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

    def discard(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        """Remove a member if present. O(log n)."""
        if self.count:
            self._young.discard(ledger_id, entry_id, batch_index)
            self._old.discard(ledger_id, entry_id, batch_index)
            self.count = self._young.count + self._old.count

    def __contains__(self, item: tuple[int, int, int]) -> bool:
        return bool(self.count) and (item in self._young or item in self._old)

    def __len__(self) -> int:
        return self.count

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """True if some message of the entry is in the set."""
        return self._young.has_entry(ledger_id, entry_id) or self._old.has_entry(ledger_id, entry_id)

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


class NackingCore:
    """Tracker, nack sets, entry knowledge, keys, handoff and dead-letter counts of one consumer; no client calls.

    Parameters
    ----------
    hand_off : callable
        Called from the tracker's timer thread (and by :meth:`close`) with the
        entry-level ids to redeliver; it must ``negative_acknowledge`` each on the
        client. No lock is held during the call. If it raises, the tracker logs the
        error and retries the keys after ``retry_delay_ms``.
    topics : list of str, str, re.Pattern, or TopicMatcher
        What the consumer reads; messages of other topics are refused.
    settings : ConsumerSettings, optional
        The tracker's settings, the handoff's and the dead-letter policy (defaults:
        ``ConsumerSettings()``).
    acknowledge : callable, optional
        ``acknowledge(message_or_id)`` on the client, without waiting: for the copies
        filtered because the application acked them (acked again, so that a broker
        without batch-index acks can settle the entry), the held copies of a returned
        message, and an entry-level ack when a member was acked through a made-up id.
        None: nothing is acked again (unit tests).
    guard_messages : int
        Deliveries to keep guarding after the last nack state ended (at the start, at
        most ``START_GUARD_MESSAGES``).

    Dead letters
        With a dead-letter policy of ``max_redeliver_count`` N, the core counts how
        often the application saw each unsettled message: the larger of its own count
        of nacks of it and the broker's ``redelivery_count()`` minus the copies of it
        that were swallowed (the broker counts per entry, swallowed copies included,
        and forgets the count when a sibling is acked), the latter never above the
        core's own tally of deliveries (the broker's figure at the first delivery here,
        plus one per delivery since: the broker's count of an entry has been seen above
        the copies that reached the consumer). As in the C++ client, a message seen
        N + 1 times (counts 0 … N) is routed to the dead-letter topic when the
        application nacks it, and a message
        that arrives after that (brought back by an ack timeout, by
        ``redeliver_unacknowledged_messages``, by a sibling's redelivery, or by the
        broker in any other way) is routed there instead of being delivered. The route is the
        callable given to :meth:`route_dead_letters`, called outside the lock; it
        reports back through :meth:`dead_letter_stored` and :meth:`dead_letter_failed`.
    """

    tracker: NegativeAcksTracker
    topics: TopicMatcher
    settings: ConsumerSettings
    quiet: bool
    unguarded: bool
    """True while quiet without a dead-letter count: receive and ack keep no books (the common path)."""
    always_guard: bool
    max_redeliver_count: int | None
    counting: bool
    pending: PendingNacks
    """The nacked messages whose delay is not over (read-only; changed under the core's lock)."""
    _hand_off_ids: HandOff
    _acknowledge: Callable[[Any], None] | None
    _route: DeadLetterCallback | None
    _handed: AgingSet
    _returned: AgingSet
    _complete: EntrySet
    _entries: Any  # msgid.EntryTable
    _atomic_table: bool
    _held: dict[Item, Any]
    _handoffs: dict[tuple[int, int], int]
    _handoff_log: deque[tuple[int, list[tuple[int, int]]]]
    _aged_at: int
    _after_ack: list[Any]
    _bare: dict[tuple[int, int], RawMessageId]
    _copies: dict[Item, int]
    _shown: dict[Item, int]
    _nacks: dict[Item, int]
    _last: dict[Item, Any]
    _sending: set[Item]
    _stored: PendingNacks
    _lock: threading.Lock
    _counts: dict[str, int]
    _reads: dict[str, int]

    def __init__(
        self,
        hand_off: HandOff,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None = None,
        *,
        acknowledge: Callable[[Any], None] | None = None,
        guard_messages: int = GUARD_MESSAGES,
    ) -> None:
        if not callable(hand_off):
            raise TypeError("hand_off must be callable")
        if acknowledge is not None and not callable(acknowledge):
            raise TypeError("acknowledge must be callable or None")
        if settings is None:
            settings = ConsumerSettings()
        elif not isinstance(settings, ConsumerSettings):
            raise TypeError(f"settings must be a ConsumerSettings, not {type(settings).__name__}")
        self._guard_messages = check_int("guard_messages", guard_messages, 0)
        self.settings = settings
        self.topics = topics if isinstance(topics, TopicMatcher) else TopicMatcher(topics)
        self.always_guard = settings.always_guard
        self.max_redeliver_count = settings.max_redeliver_count
        self.counting = self.max_redeliver_count is not None
        self._hand_off_ids = hand_off
        self._acknowledge = acknowledge
        self._route = None
        self.pending, self._handed, self._returned = PendingNacks(), AgingSet(), AgingSet()
        self._complete = EntrySet()
        self._entries = _msgid.EntryTable(SETTLED_CAPACITY)
        self._atomic_table = _msgid.EntryTable is not _msgid.PyEntryTable
        self._held, self._bare = {}, {}
        self._handoffs, self._handoff_log = {}, deque()  # (ledger, entry) -> ms of its last handoff, recent ones
        self._aged_at = monotonic_ms()
        self._after_ack = []
        self._copies, self._shown, self._nacks, self._last = {}, {}, {}, {}
        self._sending = set()
        self._stored = PendingNacks()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("swallowed", "filtered", "dead_lettered", "handed_off_entries", "handoff_bursts"), 0
        )
        # Lock-free counters: any thread steps one with next() (one C call). counts() reads
        # one with next() too and takes off the reads it made before (_reads, under the lock).
        self.received = itertools.count()
        self.acked = itertools.count()
        self._nacked = itertools.count()
        self._reads = {"received": 0, "acked": 0, "nacked": 0}
        self._set_quiet(False)
        self._guard_left = min(self._guard_messages, START_GUARD_MESSAGES)
        bits, never_early = settings.negative_ack_precision_bit_cnt, settings.never_early
        self.tracker = NegativeAcksTracker(
            self._on_due,
            delay_ms=settings.negative_ack_redelivery_delay_ms,
            precision_bits=bits,
            round_up=never_early,
            backoff=settings.redelivery_backoff,
            lead_ms=handoff_lead_ms(settings.handoff_delay_ms),
            coalesce_ms=settings.coalesce_ms,
            default_topic=self.topics.single or "",
        )
        self.handoff_delay_ms = settings.handoff_delay_ms

    def route_dead_letters(self, route: DeadLetterCallback) -> None:
        """Set where messages for the dead-letter topic go: ``route(message, stored)``.

        ``stored`` is False for a message to send (then acknowledge), True for a copy of
        one whose dead letter is already stored (to acknowledge again).
        """
        if not callable(route):
            raise TypeError("route must be callable")
        self._route = route

    # ------------------------------------------------------------------ receiving

    def admit(self, message: Any, wrapper: Any = None) -> bool:
        """Record a received message; False if the application must not see this copy.

        *message* is the received ``_pulsar.Message`` (or a ``pulsar.Message``, whose
        inner message is used); *wrapper*, the ``pulsar.Message`` to hand to the
        application, keeps the id read here for its acknowledgement. See the module
        docstring for the verdicts: a filtered copy is acked again, a returned one held;
        with a dead-letter policy, a message seen often enough is routed to the
        dead-letter topic.

        Runtime complexity: O(1): nothing while quiet; else one id read and a table
        lookup, plus bitmap lookups for a nacked member or an entry seen complete.
        """
        next(self.received)
        if self.unguarded:
            return True
        raw = _inner_message(message)
        if self.quiet and self._quiet_count(raw):
            return True
        if wrapper is None and raw is not message:
            wrapper = message
        if self._atomic_table:  # one C call, atomic under the GIL: no lock for the common verdict
            verdict, data = self._entries.admit(raw)
            if verdict != _msgid.DELIVER or self.counting:
                with self._lock:
                    verdict = self._screen(raw, verdict, data)
        else:
            with self._lock:
                verdict, data = self._entries.admit(raw)
                if verdict != _msgid.DELIVER or self.counting:
                    verdict = self._screen(raw, verdict, data)
        if verdict != _msgid.DELIVER:
            if verdict == _msgid.ACKED:
                self._ack_again(raw)
            elif verdict != _msgid.NACKED:
                self._send_dead_letter(raw, verdict == _msgid.ROUTE_STORED)
            return False
        self._guard_left -= 1  # a guarded delivery; after guard_messages of them with no nack state, go quiet
        if self._guard_left <= 0:
            self._maybe_quiet()
        if wrapper is not None:
            _stash(wrapper, data)
        return True

    def _quiet_count(self, raw: Any) -> bool:
        """While quiet with a dead-letter policy: True if *raw* needs no count (the common path)."""
        limit = self.max_redeliver_count
        assert limit is not None
        return bool(
            raw.redelivery_count() < limit and not (self._nacks or self._shown or self._sending or self._stored.count)
        )

    def _screen(self, raw: Any, verdict: int, data: bytes) -> int:
        """admit() under the lock, for a member the table calls nacked or does not know (or any, counting).

        Returns DELIVER, ACKED (filter it), NACKED (swallow it), or a route to the
        dead-letter topic (``Verdict.ROUTE``, ``Verdict.ROUTE_STORED``).
        """
        ledger, entry, _, index, size = _msgid.parse_id(data)
        item = (ledger, entry, index)
        if self._sending and item in self._sending:  # its dead letter is on the way
            self._counts["swallowed"] += 1
            return _msgid.NACKED
        if self.counting and item in self._stored:
            self._counts["swallowed"] += 1
            return _msgid.ROUTE_STORED  # a copy of a stored dead letter: acknowledge it again
        returned = item in self._returned
        if item in self.pending or (returned and not self._returned_copy_counts(raw, item)):
            self._counts["swallowed"] += 1
            if returned:
                self._held[item] = raw  # acked with the application's ack (the latest copy)
            if self.counting:
                self._copies[item] = self._copies.get(item, 0) + 1
            return _msgid.NACKED
        handed = item in self._handed  # its handoff (or anything after it) brought it back
        if handed and self._before_client_redelivery(ledger, entry):  # a reconnect's copy, early
            self._counts["swallowed"] += 1
            if self.counting:
                self._copies[item] = self._copies.get(item, 0) + 1
            return _msgid.NACKED
        settled = not handed and not returned  # in no nack set
        if settled and (
            verdict == _msgid.ACKED
            or (verdict == _msgid.FRESH and index >= 0 and size > 0 and self._complete.count
                and (ledger, entry) in self._complete)
        ):
            self._counts["filtered"] += 1  # acked (a complete entry's member in no nack set was acked)
            return _msgid.ACKED
        if self.counting and self._counted_over(raw, item):
            self._handed.discard(*item)
            self._returned.discard(*item)
            self._held.pop(item, None)
            self._counts["swallowed"] += 1
            return _msgid.ROUTE
        if handed:
            self._handed.discard(*item)
            self._returned.add(*item)
            self._guard_left = self._guard_messages
        elif verdict == _msgid.FRESH and index >= 0 and size > 0:
            self._entries.open(ledger, entry, size)
        return _msgid.DELIVER

    def _before_client_redelivery(self, ledger_id: int, entry_id: int) -> bool:
        """Under the lock: True if the entry's last handoff is too recent for the client to have redelivered it.

        The C++ client redelivers a nacked entry no sooner than its delay after the
        nack, and keeps it until then whatever else happens (a reconnect, an ack timeout,
        ``redeliver_unacknowledged_messages``): a copy that comes sooner was brought by
        something else and would be early, while the client's redelivery is still to come.
        The window is the handoff's lead (:func:`handoff_lead_ms`): it ends at the bucket's time.
        """
        at = self._handoffs.get((ledger_id, entry_id))
        return at is not None and monotonic_ms() < at + self.tracker.lead_ms

    def _note_handoffs(self, now: int, entries: list[tuple[int, int]]) -> None:
        """Under the lock: *entries* are handed off at *now*; forget handoffs older than the lead."""
        log, handoffs = self._handoff_log, self._handoffs
        lead = self.tracker.lead_ms
        while log and log[0][0] + lead <= now:
            at, old = log.popleft()
            for entry in old:
                if handoffs.get(entry) == at:
                    del handoffs[entry]
        if entries:
            log.append((now, entries))
            for entry in entries:
                handoffs[entry] = now

    def _returned_copy_counts(self, raw: Any, item: Item) -> bool:
        """Under the lock: True if a copy of a returned, unsettled message is a delivery after all.

        It is, with an ack timeout (``always_guard``: redelivering unsettled messages is
        what the application asked for), and, with a dead-letter policy, when the
        plain client would dead-letter it (it goes there, not to the application).
        Otherwise it is swallowed: a message comes back once per nack.
        """
        if self.always_guard:
            return True
        if not self.counting:
            return False
        limit = self.max_redeliver_count
        assert limit is not None
        return self._seen(raw, item) > limit

    def _seen(self, raw: Any, item: Item) -> int:
        """Under the lock, counting: how often the application saw *item* before this copy *raw*.

        The broker's count (``redelivery_count()``, per entry) minus the copies of it this
        consumer swallowed, but never more than this consumer's own tally of its
        deliveries (``_shown``: the broker's figure at the first delivery here, plus one per
        delivery since), nor less than the application's nacks of it. The tally bounds
        a broker count that moved by more than the copies that reached this consumer.
        """
        by_broker = raw.redelivery_count() - self._copies.get(item, 0)
        shown = self._shown.get(item)
        if shown is not None and shown < by_broker:
            by_broker = shown
        return max(self._nacks.get(item, 0), by_broker)

    def _counted_over(self, raw: Any, item: Item) -> bool:
        """Under the lock, counting: True if *raw* was seen too often (it goes to the dead-letter topic).

        False means *raw* is delivered: it joins the tally of deliveries (``_shown``).
        """
        limit = self.max_redeliver_count
        assert limit is not None
        seen = self._seen(raw, item)
        if seen > limit:
            self._sending.add(item)
            self._last.pop(item, None)
            return True
        if seen == limit:  # its last delivery: a nack or a redelivery sends it
            self._last[item] = raw
        self._shown[item] = seen + 1
        return False

    def _maybe_quiet(self) -> None:
        """Go quiet if no nack state is left (forgetting stale ones first); else guard on."""
        with self._lock:
            self._expire(monotonic_ms())
            self._guard_left = self._guard_messages
            if self.always_guard or self.pending.count or self._handed.count or self._returned.count or self._held:
                return
            self._entries.forget_settled()
            if len(self._entries) > 4 * SETTLED_CAPACITY:  # open records of entries never settled
                self._entries.sweep()
            self._set_quiet(True)

    def _set_quiet(self, quiet: bool) -> None:
        """Set ``quiet``, and ``unguarded`` with it."""
        self.quiet = quiet
        self.unguarded = quiet and not self.counting

    def _guard(self) -> None:
        """Start guarding (under the lock): a nack state begins."""
        self._set_quiet(False)
        self._guard_left = self._guard_messages

    def _ack_again(self, message: Any) -> None:
        """Acknowledge a copy (or an id) the application will not see."""
        if self._acknowledge is not None:
            self._acknowledge(message)

    def _send_dead_letter(self, message: Any, stored: bool) -> None:
        route = self._route
        if route is None:
            raise RuntimeError("a dead-letter policy without a route: call route_dead_letters() first")
        route(message, stored)

    def dead_letter_stored(self, message: Any) -> None:
        """The route stored the dead letter of *message*: count it, remember it, forget its counts."""
        message_id = raw_id(message)
        item = _item_of(message_id)
        size = batch_size_of(message_id) if item[2] >= 0 else 0
        with self._lock:
            self._sending.discard(item)
            self._stored.add(*item)
            self._forget_counts(item)
            self._counts["dead_lettered"] += 1
            self._note_ack(item[0], item[1], item[2], size)  # the route acks it: its entry may settle

    def dead_letter_failed(self, message: Any) -> None:
        """The route could not store the dead letter of *message*: it comes back and is tried again.

        The message stays unacknowledged; it is handed to the client after
        ``DEAD_LETTER_RETRY_MS``, and when it arrives it is routed again.
        """
        item = _item_of(raw_id(message))
        limit = self.max_redeliver_count
        with self._lock:
            self._sending.discard(item)
            if limit is not None:  # the next arrival is routed, whatever the broker counts
                self._nacks[item] = max(self._nacks.get(item, 0), limit + 1)
            self._guard()
        try:
            self.tracker.add(self.key_of(message)[0], DEAD_LETTER_RETRY_MS)
        except ClosedError:
            pass  # closing: the broker redelivers it when this consumer is gone

    def forget(self, message: Any) -> None:
        """Drop the delivery counts of a settled message (acked or dead-lettered). O(1)."""
        if self._keeps_counts():
            item = _item_of(raw_id(message))
            with self._lock:
                self._forget_counts(item)

    def _keeps_counts(self) -> bool:
        """True if some message's delivery counts are kept (read without the lock, as a hint).

        Spelled out rather than over :meth:`_count_maps`: it is read on every acknowledgement."""
        return bool(self._copies or self._shown or self._nacks or self._last)

    def _forget_counts(self, item: Item) -> None:
        for counts in self._count_maps():
            counts.pop(item, None)

    def _count_maps(self) -> tuple[dict[Item, Any], ...]:
        """The per-message delivery counts (dead-letter policy): swallowed copies, tally, nacks, last copy."""
        return (self._copies, self._shown, self._nacks, self._last)

    # ------------------------------------------------------------------ settling

    def key_of(self, message: Any) -> tuple[MessageKey, RawMessageId]:
        """The tracker key of a message or id, and its raw id; validates, changes nothing.

        Raises
        ------
        TypeError
            For something that is not a pulsar message or id.
        ValueError
            For a message of a topic this consumer does not read, or a batch index
            outside its entry's batch (from the id, or from the entry in flight).
        """
        inner = inner_message(message)
        if inner is not None:  # a pulsar.Message: the common path, no checks needed
            key = _msgid.message_key(inner)
            if key[0] not in self.topics.names and key[0] not in self.topics:
                raise ValueError(f"message of topic {key[0]!r} does not belong to this consumer ({self.topics!r})")
            return key, inner.message_id()
        raw = raw_id(message)
        batch_index = raw.batch_index()
        if _is_message(message):
            topic = message.topic_name()
            if topic not in self.topics:
                raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")
        else:
            if batch_index > MAX_BATCH_INDEX:
                raise ValueError(f"batch_index must be below 2**31, got {batch_index}")
            if batch_index >= 0:
                size = batch_size_of(raw) or self._entries.size_of(raw.ledger_id(), raw.entry_id())
                if size and batch_index >= size:
                    raise ValueError(f"batch index {batch_index} is outside its batch of {size} messages")
            single = self.topics.single
            if single is None:
                topic = _UNTITLED  # the id object knows its topic; we keep the object
            else:
                partition = raw.partition()
                topic = f"{single}-partition-{partition}" if partition >= 0 else single
        return (topic, raw.ledger_id(), raw.entry_id(), batch_index), raw

    def nack(self, message: Any, delay_ms: int | None = None) -> None:
        """Track a negative acknowledgement: the message comes back after its delay.

        Every nacked message is remembered in the pending set until its handoff, so that
        no copy reaches the application before it is due. With a dead-letter policy, a
        message at its last delivery goes to the dead-letter topic instead (see the
        class notes). Runtime complexity: O(1) (the tracker's add, a bitmap insert, and
        a table update for a batch member).

        Raises TypeError or ValueError for bad input (nothing changes then).
        """
        if delay_ms is not None:
            check_ms("delay_ms", delay_ms)
        key, raw, size = self._nack_key(message)
        if self.counting and self._last and self._nack_to_dead_letter(key):
            next(self._nacked)
            return
        count = None
        if delay_ms is None and self.tracker.backoff is not None:
            count = redelivery_count_of(message)
        item = (key[1], key[2], key[3])
        with self._lock:
            if not self._remember_nack(item, size):
                raise ValueError(f"message {key} is already NACKED (its nack is pending)")
            if key[0] is _UNTITLED:
                self._bare[(key[1], key[2])] = raw
        try:
            self.tracker.add(key, delay_ms, count)
        except BaseException:
            with self._lock:
                self.pending.discard(*item)
                self._bare.pop((key[1], key[2]), None)
                if self.counting:
                    self._nacks[item] -= 1
            raise
        next(self._nacked)

    def _nack_key(self, message: Any) -> tuple[MessageKey, Any, int]:
        """The key, raw id (None for a received message) and batch size of a message to nack."""
        inner = inner_message(message)
        if inner is not None:  # a received pulsar.Message: the common call
            data = _stashed(message)
            if data is None:
                key: MessageKey = _msgid.message_key(inner)  # topic and id in one C call
                index = key[3]
                size = batch_size_of(inner.message_id()) if index >= 0 else 0
            else:
                ledger, entry, _, index, size = _msgid.parse_id(data)
                key = (inner.topic_name(), ledger, entry, index)
            if key[0] not in self.topics.names and key[0] not in self.topics:
                raise ValueError(f"message of topic {key[0]!r} does not belong to this consumer ({self.topics!r})")
            raw = None
        else:
            key, raw = self.key_of(message)
            index = key[3]
            size = batch_size_of(raw) if index >= 0 else 0
        if index >= 0 and not size:
            size = int(self._entries.size_of(key[1], key[2]))
        return key, raw, int(size)

    def _nack_to_dead_letter(self, key: MessageKey) -> bool:
        """Route a message at its last delivery to the dead-letter topic; False if it is not there."""
        item = (key[1], key[2], key[3])
        with self._lock:
            last = self._last.pop(item, None)
            if last is None:
                return False
            self._sending.add(item)
            self._leave_state(item)
        self._send_dead_letter(last, False)
        return True

    def _remember_nack(self, item: Item, size: int) -> bool:
        """Under the lock: *item* joins the pending set (and leaves the handed-off and returned ones).

        False, and nothing changes, if its nack is pending already.
        """
        if not self.pending.add(*item):
            return False
        if self.counting:
            self._nacks[item] = self._nacks.get(item, 0) + 1
        if self._handed.count or self._returned.count:
            self._leave_state(item)
        in_flight = item[2] >= 0 and size > 0 and not (self._complete.count and (item[0], item[1]) in self._complete)
        if in_flight and self._entries.nack(item[0], item[1], item[2], size) == _msgid.COMPLETE:
            self._complete.add(item[0], item[1])
        self._set_quiet(False)
        self._guard_left = self._guard_messages
        return True

    def _leave_state(self, item: Item) -> None:
        """Under the lock: *item* leaves the handed-off and returned sets (acked, nacked, or stale)."""
        self._handed.discard(*item)
        self._returned.discard(*item)
        self._held.pop(item, None)

    def before_ack(self, message: Any) -> Any:
        """Validate an acknowledgement and record it; return what to pass to the client's ``acknowledge``.

        That is the received message itself for a ``pulsar.Message`` admitted by this
        core, the raw id otherwise, or None when nothing is to be sent now: the client
        acks an id built without a batch size (``pulsar.MessageId(p, ledger, entry, i)``)
        as its whole entry, so for an entry in flight the member is only recorded, and
        the whole entry is acked (through :meth:`after_ack`) once every member is. Call
        :meth:`after_ack` after the client's ``acknowledge``.

        Raises TypeError or ValueError for bad input (nothing changes then), e.g. a batch
        index outside its entry's batch. O(1).
        """
        data = _stashed(message)
        if data is not None:
            with self._lock:
                if (self.pending.count or self._handed.count or self._returned.count or self._complete.count
                        or self._keeps_counts()):
                    fields = _msgid.parse_id(data)
                    self._note_ack(fields[0], fields[1], fields[3], fields[4], data=data)
                elif self._entries.ack_data(data) == _msgid.COMPLETE:  # the common path: one C call
                    fields = _msgid.parse_id(data)
                    self._complete.add(fields[0], fields[1])
            return _inner_message(message)
        if self.quiet and not self._keeps_counts() and _is_message(message):
            return raw_id(message)  # a received message while quiet: nothing to record
        key, raw = self.key_of(message)
        topic, ledger, entry, index = key
        size = batch_size_of(raw) if index >= 0 else 0
        made_up = index >= 0 and not size and not _is_message(message) and topic is not _UNTITLED
        with self._lock:
            if index >= 0 and not size:
                size = int(self._entries.size_of(ledger, entry))
            if made_up and (size or (ledger, entry) in self._complete):
                self._note_ack(ledger, entry, index, size, foreign=True, topic=topic)
                return None
            self._note_ack(ledger, entry, index, size, topic=topic)
        return raw

    def _note_ack(
        self, ledger: int, entry: int, index: int, size: int, *, data: bytes | None = None,
        foreign: bool = False, topic: str = _UNTITLED,
    ) -> None:
        """Under the lock: an acked member leaves the nack sets and joins the entry knowledge."""
        item = (ledger, entry, index)
        if self.pending.count or self._handed.count or self._returned.count:
            self.pending.discard(*item)
            held = self._held.get(item)
            if held is not None:
                self._after_ack.append(held)
            self._leave_state(item)
        if self._keeps_counts():
            self._forget_counts(item)
        if data is not None:
            outcome = self._entries.ack_data(data, create=not self._complete.count)
            if outcome == _msgid.MISSING:
                if index >= 0 and (ledger, entry) in self._complete:
                    self._ack_complete_member(ledger, entry, foreign, topic)
                    return
                outcome = self._entries.ack_data(data)
        elif index >= 0 and self._complete.count and (ledger, entry) in self._complete:
            self._ack_complete_member(ledger, entry, foreign, topic)
            return
        elif (self.quiet and not foreign) or (index >= 0 and size <= 0):
            return  # nothing recorded: quiet, or a member of an entry of unknown size
        else:
            outcome = self._entries.ack(ledger, entry, index, size, foreign=foreign)
        if outcome == _msgid.COMPLETE:
            self._complete.add(ledger, entry)
        elif outcome == _msgid.SETTLED_FOREIGN and topic is not _UNTITLED:
            self._after_ack.append(handoff_id(topic, ledger, entry))  # the client's acker missed a member

    def _ack_complete_member(self, ledger: int, entry: int, foreign: bool, topic: str) -> None:
        """Under the lock: a member of a complete entry was acked; settle the entry if it was the last."""
        if not (self.pending.has_entry(ledger, entry) or self._handed.has_entry(ledger, entry)
                or self._returned.has_entry(ledger, entry)):
            self._complete.discard(ledger, entry)
            self._entries.settle(ledger, entry)
            if foreign and topic is not _UNTITLED:
                self._after_ack.append(handoff_id(topic, ledger, entry))

    def after_ack(self) -> None:
        """Acknowledge what the last acknowledgements left to ack (held copies, whole entries)."""
        while self._after_ack:
            try:
                pending = self._after_ack.pop()
            except IndexError:
                return
            self._ack_again(pending)

    # ------------------------------------------------------------------ handoff

    def _on_due(self, due: DueKeys) -> None:
        """Tracker callback: hand each due entry to the client once, in one burst.

        Its messages leave the pending set *before* the client has the ids: the copy the
        handoff brings can come back at once (the timer thread may wait for the GIL
        longer than the client's 100 ms), and it must find them handed off, not pending.
        If the handoff raises, they are pending again (the tracker retries the keys).
        """
        ids: list[RawMessageId] = []
        moved: list[Item] = []
        bare_ids: dict[tuple[int, int], RawMessageId] = {}
        entries: list[tuple[int, int]] = []
        with self._lock:
            now = monotonic_ms()  # before the client has any of the ids
            for topic, keys in due.items():
                seen: set[tuple[int, int]] = set()
                for _, ledger_id, entry_id, batch_index in keys:
                    item = (ledger_id, entry_id, batch_index)
                    if item in self.pending:
                        self.pending.discard(*item)
                        self._handed.add(*item)
                        moved.append(item)
                    if (ledger_id, entry_id) in seen:
                        continue
                    seen.add((ledger_id, entry_id))
                    entries.append((ledger_id, entry_id))
                    if topic is _UNTITLED or topic == _UNTITLED:
                        bare = self._bare.pop((ledger_id, entry_id), None)
                        if bare is not None:
                            ids.append(bare)
                            bare_ids[(ledger_id, entry_id)] = bare
                    else:
                        ids.append(handoff_id(topic, ledger_id, entry_id))
            self._counts["handed_off_entries"] += len(ids)
            self._counts["handoff_bursts"] += bool(ids)
            self._note_handoffs(now, entries)
            self._expire(now)
        if not ids:
            return
        try:
            self._hand_off_ids(ids)
        except BaseException:
            with self._lock:  # retried by the tracker: pending again, bare ids kept
                for item in moved:
                    if item in self._handed:
                        self._handed.discard(*item)
                        self.pending.add(*item)
                self._bare.update(bare_ids)
            raise

    def _expire(self, now: int) -> None:
        """Under the lock: every ``STALE_MS``, forget handed-off and returned messages of the old generation.

        Their entries leave the complete set: copies of their siblings are then delivered
        (the knowledge is incomplete), never filtered.
        """
        if now - self._aged_at < STALE_MS:
            return
        self._aged_at = now
        for item in self._handed.age() + self._returned.age():
            self._held.pop(item, None)
            self._complete.discard(item[0], item[1])

    # ------------------------------------------------------------------ resets

    def reset(self, forget_counts: bool = True) -> DueKeys:
        """Forget every pending nack; return them.

        Before ``redeliver_unacknowledged_messages`` (``forget_counts=False``: the
        messages come back now, their delivery counts still hold, and acked members of
        entries still being processed stay known, so their copies are filtered) or
        ``seek`` (``True``: the subscription starts afresh, acked messages and dead
        letters included, since the broker delivers acked messages again after a seek
        back).
        """
        with self._lock:
            dropped = self.tracker.drain()
            for nack_set in (self.pending, self._handed, self._returned):
                nack_set.clear()
            self._held.clear()
            self._complete.clear()
            self._bare.clear()
            self._after_ack.clear()
            if forget_counts:
                self._entries.clear()
                for counts in self._count_maps():
                    counts.clear()
                self._stored.clear()
            else:
                self._entries.clear_nacks()
            self._guard()
        return dropped

    def close(self, redeliver_pending: bool) -> None:
        """Stop the tracker: hand every pending nack off now, or leave it unacked."""
        self.tracker.close(flush=redeliver_pending)
        with self._lock:
            for nack_set in (self.pending, self._handed, self._returned):
                nack_set.clear()
            self._held.clear()
            self._complete.clear()
            self._entries.clear()
            self._bare.clear()
            for counts in self._count_maps():
                counts.clear()
            self._stored.clear()

    # ------------------------------------------------------------------ counters

    def counts(self) -> dict[str, int]:
        """Counters: received, delivered, swallowed, filtered, acked, nacked, dead-lettered, handoffs, pending nacks."""
        with self._lock:
            counts = dict(self._counts)
            pending = len(self.pending)
            steps = {}
            for name, counter in (("received", self.received), ("acked", self.acked), ("nacked", self._nacked)):
                steps[name] = next(counter) - self._reads[name]
                self._reads[name] += 1
        return {
            "received": steps["received"],
            "delivered": steps["received"] - counts["swallowed"] - counts["filtered"],
            "acked": steps["acked"],
            "nacked": steps["nacked"],
            **counts,
            "pending_guarded": pending,
        }

    def memory_bytes(self) -> int:
        """Bytes of the admission structures (nack sets, complete entries, entry table): an estimate."""
        with self._lock:
            return (self.pending.memory_bytes() + self._handed.memory_bytes() + self._returned.memory_bytes()
                    + self._complete.memory_bytes() + int(self._entries.memory_bytes()))

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        with self._lock:
            self.pending._check()
            self._handed._check()
            self._returned._check()
            self._stored._check()
            self._complete._check()
            self._entries._check()
            # A message is in one nack set at most; a held copy is of a returned message.
            pending, handed, returned = (set(s.items()) for s in (self.pending, self._handed, self._returned))
            assert not (pending & handed or pending & returned or handed & returned)
            assert set(self._held) <= returned
            # Every bare id waiting for its handoff is a pending key.
            assert len(self._bare) <= len(self.tracker) or not self._bare
            # A message is at most one of: at its last delivery, on its way to the DLQ.
            assert not (set(self._last) & self._sending)
