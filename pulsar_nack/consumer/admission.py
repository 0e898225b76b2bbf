"""The admission ledger: what a consumer knows of each message of an entry in flight, and which copies reach the application.

The broker redelivers whole entries, and after any reconnect (topic unload, broker
restart or failover, a consumer reconnect) or an ack timeout it redelivers every
unacked message. The C++ client keeps one nack bucket per handoff, so an entry handed
off in two bursts comes back twice. :class:`AdmissionLedger` keeps, per message, one
:class:`MessageState` and decides each copy by it (:meth:`AdmissionLedger.screen`):

======================  ===========================================================
state of the message    a copy of it
======================  ===========================================================
``PENDING`` (nack)      swallowed, left unacked: its own handoff brings it back
``HANDED_OFF``          delivered (it is due), and the message becomes *returned*;
                        but before its bucket's time (its entry's last handoff plus
                        the lead, :func:`~pulsar_nack.timing.handoff_lead_ms`), a copy
                        cannot be the handoff's (a reconnect brought it): swallowed,
                        left unacked, since the client still holds the entry
``RETURNED``            swallowed and held; acked with the message when the
                        application acks it (never twice per nack)
``SETTLED`` (acked)     filtered and acked again, so that a broker without
                        batch-index acks can settle the entry
``UNKNOWN``             delivered, as the plain client does
======================  ===========================================================

The states are stored compactly, a few bytes per message: one bitmap set per nack state
(:mod:`~pulsar_nack.consumer.message_sets`), and the settled members of batch entries in
flight in an ``EntryTable`` (``_msgid.c``: acked and nacked members of entries being
processed, and the last settled entries); an entry whose every member is acked or nacked
moves to an :class:`~pulsar_nack.consumer.message_sets.EntrySet`, where a member in no
nack set is acked. A message is in one state at a time.

Every change is one atomic step under the ledger's lock: the screen of a copy
(:meth:`~AdmissionLedger.screen`, which reads the table's verdict again under the lock),
the note of an ack (:meth:`~AdmissionLedger.note_ack`, :meth:`~AdmissionLedger.note_ack_data`)
or a nack (:meth:`~AdmissionLedger.note_nack`), a handoff (:meth:`~AdmissionLedger.hand_off`)
and the expiry of old knowledge. So two copies of one message received by two threads are
decided one after the other, and a copy decided after an ack sees the ack.

With a dead-letter policy the ledger holds the consumer's
:class:`~pulsar_nack.consumer.delivery_counts.DeliveryCounts` (None without one: the one
place the policy is checked), and a copy may be routed to the dead-letter topic.

Guarding
    Knowing a copy needs its id, and reading an id costs about as much as a receive. So
    the consumer *guards* (reads the id of every received message and records every ack)
    only from the start, while any nack state exists, and for ``guard_messages``
    deliveries after the last one; then the ledger is *quiet* and receive and
    acknowledge keep no books until the next nack (``screening`` is ``Screening.NONE``: quiet, and no
    delivery counts).

Watched entries
    While guarding, most copies are of entries that hold no nack state. Each nack
    *watches* its entry in the table first (a per-ledger mark: the highest nacked entry id
    of its ledger), and the marks are dropped only when no nack state is left. A copy of
    an entry above its ledger's mark is decided by the C table alone, without the lock
    (``entries.admit_message``: delivered, the record of a batch entry opened), and its
    ack recorded there from the id kept on the message (``entries.ack_message``, with the
    C table only: :attr:`AdmissionLedger.atomic_table`). A watched entry's copies and acks are the
    ledger's, one atomic step under its lock, as above, but where its open record settles
    them: every member of an open record that is in a nack set is marked nacked there, so
    the table delivers a copy of a member marked neither acked nor nacked, and records its
    ack unless that ack completes the entry (which then joins the complete entries). Each
    C call is atomic under the GIL, so it is ordered before or after any step of the ledger.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ..core.base import DueKeys
from ..core.keys import PARTITION_SUFFIX, MessageKey
from ..core.timer import monotonic_ms
from ..timing import COPY_DRAIN_MS, SETTLED_MAX_AGE_MS, STALE_MS
from . import msgid as _msgid
from ._client import RawMessageId
from ._client import entry_id as raw_entry_id
from .chunks import chunk_entries
from .delivery_counts import DeliveryCounts
from .entry_handoff import ParkedKeys
from .message_sets import AgingSet, EntrySet, Item, PendingNacks

__all__ = [
    "COMPILED",
    "SETTLED_CAPACITY",
    "UNTITLED",
    "AdmissionLedger",
    "MessageState",
    "Screening",
]

SETTLED_CAPACITY = 8192
"""Settled entries (and acked non-batched messages) remembered while guarding: the client
drops the acks it groups (100 ms) when its connection drops, and the broker then redelivers
them. 8,192 covers a full receive queue (1,000) plus about 100 ms of acks at 70,000 per
second. A record takes 60 bytes with its bucket, and the table grows by doubling."""
COMPILED = not __file__.endswith(".py")
"""True when the ledger runs compiled by mypyc (this module, :mod:`~pulsar_nack.consumer.entry_handoff` and
:mod:`~pulsar_nack.consumer.message_sets`, built together by ``setup.py``); False where it runs as pure Python."""
UNTITLED: Final = ""
"""The tracker topic of a key whose id object carries the real topic (a bare id on a multi-topic consumer)."""

# Final: mypyc keeps each in a C static, not a module-dict lookup per use (these are read on every copy)
_DELIVER: Final = _msgid.DELIVER
_ACKED: Final = _msgid.ACKED
_NACKED: Final = _msgid.NACKED
_FRESH: Final = _msgid.FRESH
_ROUTE: Final = _msgid.ROUTE
_ROUTE_STORED: Final = _msgid.ROUTE_STORED
_COMPLETE: Final = _msgid.COMPLETE
_PARK: Final = -1
"""``_wait_until``: the entry's due keys are parked until a key of a member still pending falls due."""
# The ledger calls its sets (and the table) with an item's three ints, not ``f(*item)``: compiled,
# that is a native call, where the star call builds a tuple and takes the generic call path.


class Screening(enum.Enum):
    """How a consumer's receive and acknowledge treat a copy (:attr:`AdmissionLedger.screening`)."""

    NONE = "none"
    """Quiet without delivery counts: receive and acknowledge keep no books (the common path)."""
    TABLE = "table"
    """Guarding, with the C table and without delivery counts or an ack timeout: each received copy goes to
    ``entries.admit_message(raw, wrapper)`` and, unless it returns DELIVER (decided), to the core's screen;
    an ack to ``entries.ack_message``, else to the core."""
    LEDGER = "ledger"
    """Every copy through the core's ``admit`` (delivery counts, an ack timeout, or the pure-Python table)."""


class MessageState(enum.Enum):
    """What the ledger knows of one message (:meth:`AdmissionLedger.state_of`)."""

    UNKNOWN = "unknown"
    """In no nack set and not known acked: a copy is delivered."""
    PENDING = "pending"
    """Nacked, its delay not over: a copy is swallowed."""
    HANDED_OFF = "handed off"
    """Due and handed to the client: its next copy (after the lead) is delivered."""
    RETURNED = "returned"
    """Delivered again after its handoff, not settled: further copies are swallowed and held."""
    SETTLED = "settled"
    """Acked: a copy is filtered (and acked again)."""
    SENDING = "sending"
    """Its dead letter is on its way (dead-letter policy): a copy is swallowed."""
    DEAD_LETTERED = "dead-lettered"
    """Its dead letter is stored (dead-letter policy): a copy is acked again."""


def handoff_id(topic: str, ledger_id: int, entry_id: int) -> RawMessageId:
    """The entry-level id the client redelivers: partition from the topic name, topic set.

    The multi-topic C++ consumer routes ids by topic name and silently drops ids without one.
    """
    match = PARTITION_SUFFIX.search(topic)
    return raw_entry_id(int(match.group(1)) if match else -1, ledger_id, entry_id, topic)


class RecentHandoffs:
    """When each entry was last handed off, for as long as a copy of it could still be a reconnect's (the lead),
    and, on a shared subscription, the due keys of the batch entries that wait for their other pending members.

    Not thread-safe: the ledger holds its lock.

    >>> recent = RecentHandoffs(95)
    >>> recent.note(1_000, [(7, 1)]); recent.is_recent((7, 1), 1_094), recent.is_recent((7, 1), 1_095)
    (True, False)
    """

    __slots__ = ("_at", "_log", "lead_ms", "parked", "recheck_ms")

    lead_ms: int
    parked: ParkedKeys | None
    """On a shared subscription: the due keys of the batch entries that wait, else None."""
    recheck_ms: int
    """On a shared subscription: how long after a handoff a held-back busy entry is looked at again."""
    _at: dict[tuple[int, int], int]
    _log: deque[tuple[int, list[tuple[int, int]]]]

    def __init__(self, lead_ms: int, parked: ParkedKeys | None = None, recheck_ms: int = 0) -> None:
        self.lead_ms = lead_ms
        self.parked = parked
        self.recheck_ms = recheck_ms
        self._at = {}  # (ledger, entry) -> ms of its last handoff
        self._log = deque()  # (ms, entries handed off then), oldest first

    def note(self, now: int, entries: list[tuple[int, int]]) -> None:
        """*entries* are handed off at *now*; forget handoffs older than the lead."""
        log, at = self._log, self._at
        while log and log[0][0] + self.lead_ms <= now:
            then, old = log.popleft()
            for entry in old:
                if at.get(entry) == then:
                    del at[entry]
        if entries:
            log.append((now, entries))
            for entry in entries:
                at[entry] = now

    def is_recent(self, entry: tuple[int, int], now: int) -> bool:
        """True if *entry* was handed off less than the lead before *now*."""
        then = self._at.get(entry)
        return then is not None and now < then + self.lead_ms


class AdmissionLedger:
    """The state of each message of the entries in flight of one consumer; see the module notes.

    Parameters
    ----------
    counts : DeliveryCounts, optional
        The consumer's delivery counts when it has a dead-letter policy, else None.
    lead_ms : int
        How early buckets fire (:func:`~pulsar_nack.timing.handoff_lead_ms`): a copy of a
        handed-off entry sooner than its handoff plus this is a reconnect's, swallowed.
    always_guard : bool
        Guard every copy all the time (an ack timeout redelivers unsettled messages at
        any moment; such a copy of a returned message is a delivery).
    guard_messages : int
        Deliveries to keep guarding after the last nack state ended.
    start_guard : int
        Deliveries to guard at the start.
    watch_all : bool
        Every copy and ack is the ledger's (an ack timeout), not only those of watched entries.
    wait_for_last : bool
        A batch entry with several pending members is handed off when the last is due,
        and not while the application may still settle members of it here
        (a shared subscription: :mod:`~pulsar_nack.consumer.entry_handoff`, :meth:`hand_off`);
        False: at each member's time.
    recheck_ms : int
        With ``wait_for_last``: how long after a handoff an entry the application may still
        settle members of is looked at again (past the lead and a bucket, so that the
        tracker does not hand it back at once).
    """

    pending: PendingNacks
    """The nacked messages whose delay is not over (read-only; changed under the lock)."""
    counts: DeliveryCounts | None
    """The delivery counts (dead-letter policy), or None."""
    entries: Any
    """The ``EntryTable`` of the entries in flight (``msgid.EntryTable``); its reads are atomic."""
    atomic_table: bool
    """True if a table read is one C call (atomic under the GIL): a verdict may be read without the lock."""
    quiet: bool
    screening: Screening
    """How a consumer's receive and acknowledge treat a copy now (set with ``quiet``)."""
    to_ack_again: list[Any]
    """Copies and ids to acknowledge on the client after the last acks (held copies, whole entries)."""
    stats: dict[str, int]
    """Counters: swallowed, filtered, dead_lettered, handed_off_entries, handoff_bursts."""
    _lock: threading.Lock
    _handed: AgingSet
    _returned: AgingSet
    _complete: EntrySet
    _held: dict[Item, Any]
    _orphans: set[tuple[int, int]]
    """Entries whose next record must carry pending nacks: they left the complete set by expiry while
    members' nacks were still pending, or a member was nacked by an id without a batch size before they had one."""
    _bare: dict[tuple[int, int], RawMessageId]
    _chunks: dict[tuple[int, int], tuple[int, int]]
    """Pending nacks of chunked messages: (ledger, entry) of the last chunk -> of the first."""
    _recent: RecentHandoffs
    _aged_at: int
    _always_guard: bool
    _guard_messages: int

    def __init__(
        self, counts: DeliveryCounts | None, *, lead_ms: int, always_guard: bool, guard_messages: int, start_guard: int,
        watch_all: bool = False, wait_for_last: bool = False, recheck_ms: int = 0,
    ) -> None:
        self.counts = counts
        self._always_guard, self._guard_messages = always_guard, guard_messages
        self._lock = threading.Lock()
        self.pending, self._handed, self._returned = PendingNacks(), AgingSet(), AgingSet()
        self._complete = EntrySet()
        self.entries = _msgid.EntryTable(SETTLED_CAPACITY, SETTLED_MAX_AGE_MS)
        # With delivery counts (or the consumer's ack timeout), every copy and ack is the ledger's.
        self.entries.watch_all = watch_all or counts is not None
        self.atomic_table = _msgid.EntryTable is not _msgid.PyEntryTable
        self._held, self._bare, self._orphans, self._chunks = {}, {}, set(), {}
        self._recent = RecentHandoffs(lead_ms, ParkedKeys() if wait_for_last else None, recheck_ms)
        self._aged_at = monotonic_ms()
        self.to_ack_again = []
        self.stats = dict.fromkeys(("swallowed", "filtered", "dead_lettered", "handed_off_entries", "handoff_bursts"), 0)
        self._set_quiet(False)
        self.entries.guard_left = start_guard

    @property
    def guard_left(self) -> int:
        """Guarded deliveries left before the ledger may go quiet (the table's countdown: its
        ``admit_message`` counts the deliveries it decides, the consumer the others)."""
        return int(self.entries.guard_left)

    @guard_left.setter
    def guard_left(self, value: int) -> None:
        self.entries.guard_left = value

    # ------------------------------------------------------------------ reading

    def state_of(self, item: Item) -> MessageState:
        """The state of one message ``(ledger, entry, batch_index)``. O(1)."""
        with self._lock:
            counts = self.counts
            if counts is not None and counts.is_sending(item):
                return MessageState.SENDING
            if counts is not None and item in counts.stored:
                return MessageState.DEAD_LETTERED
            for nack_set, state in ((self.pending, MessageState.PENDING), (self._handed, MessageState.HANDED_OFF),
                                    (self._returned, MessageState.RETURNED)):
                if item in nack_set:
                    return state
            verdict = self.entries.verdict(item[0], item[1], item[2])
            complete = verdict == _FRESH and item[2] >= 0 and item[:2] in self._complete
            return MessageState.SETTLED if verdict == _ACKED or complete else MessageState.UNKNOWN

    def has_nack_state(self) -> bool:
        """True if some message is pending, handed off or returned (a hint, without the lock)."""
        return bool(self.pending.count or self._handed.count or self._returned.count)

    def keeps_counts(self) -> bool:
        """True if some message's delivery counts are kept (a hint, read on every acknowledgement)."""
        counts = self.counts
        return counts is not None and counts.keeps_counts()

    def idle_for(self, raw: Any) -> bool:
        """While quiet: True if *raw* needs no screen (no delivery counts, or none needed for it)."""
        counts = self.counts
        return counts is None or counts.idle_for(raw)

    def size_of(self, ledger_id: int, entry_id: int) -> int:
        """The batch size of an entry in flight, else 0 (one table read)."""
        return int(self.entries.size_of(ledger_id, entry_id))

    # ------------------------------------------------------------------ copies

    def screen(self, raw: Any, data: bytes | None) -> tuple[int, bytes]:
        """Decide a received copy: one atomic step under the lock.

        *data* is the serialized id if the caller read it (and the table's verdict) without
        the lock, else None. The verdict is read (again) under the lock, so that an ack or
        a nack noted meanwhile is seen. Returns ``(verdict, data)``: a
        :class:`~pulsar_nack.consumer.msgid.Verdict` value (DELIVER, ACKED: filter it,
        NACKED: swallow it, ROUTE or ROUTE_STORED: to the dead-letter topic).
        """
        with self._lock:
            if data is None:
                verdict, data = self.entries.admit(raw)
                ledger, entry, _, index, size = _msgid.parse_id(data)
                if verdict == _DELIVER and self.counts is None:
                    self.entries.note_read(ledger, entry, index)
                    return verdict, data
            else:
                ledger, entry, _, index, size = _msgid.parse_id(data)
                verdict = self.entries.verdict(ledger, entry, index)  # again: an ack or nack may have come meanwhile
            item = (ledger, entry, index)
            counts = self.counts
            pending, returned, handed = item in self.pending, item in self._returned, item in self._handed
            if counts is not None or pending or returned or handed:
                decided = self._screen(raw, verdict, item, (pending, returned, handed))  # a nack state, or counted
                if decided is not None:
                    return decided, data
            if verdict == _ACKED or (  # acked, or a complete entry's member in no nack set (so acked)
                    verdict == _FRESH and index >= 0 and size > 0 and self._complete.count and (ledger, entry) in self._complete):
                self.stats["filtered"] += 1
                return _ACKED, data
            if counts is not None and counts.counted_over(raw, item):
                self.stats["swallowed"] += 1
                return _ROUTE, data
            if verdict == _FRESH and index >= 0 and size > 0:
                self.entries.open(ledger, entry, size)
                if self._orphans:
                    self._renack(ledger, entry, size)
            self.entries.note_read(ledger, entry, index)
            return _DELIVER, data

    def _screen(self, raw: Any, verdict: int, item: Item, states: tuple[bool, bool, bool]) -> int | None:
        """screen() under the lock, for a message in a nack set or with delivery counts; None for one in no
        nack set (screen() then decides it as any other: acked, counted over, or delivered).

        *states*: whether *item* is pending, returned, handed off (read by screen() under the lock).
        """
        counts = self.counts
        if counts is not None and (routed := self._screen_dead_letters(item)) is not None:
            return routed
        pending, returned, handed = states  # handed: its handoff (or anything after it) brought it back
        if pending or (returned and not self._returned_copy_counts(raw, item)):
            if returned:
                self._held[item] = raw  # acked with the application's ack (the latest copy)
            return self._swallow(item)
        if handed and self._before_client_redelivery(item[0], item[1]):  # a reconnect's copy, early
            return self._swallow(item)
        if not handed and not returned:
            return None
        if counts is not None and counts.counted_over(raw, item):
            self._leave_state(item)
            self.stats["swallowed"] += 1
            return _ROUTE
        if handed:  # the delivery its handoff brought: now returned
            self._handed.discard(item[0], item[1], item[2])
            self._returned.add(item[0], item[1], item[2])
            self.entries.guard_left = self._guard_messages
        return _DELIVER

    def _screen_dead_letters(self, item: Item) -> int | None:
        """Under the lock, counting: NACKED if *item*'s dead letter is on its way, ROUTE if it failed (sent
        again now), ROUTE_STORED if stored, else None."""
        counts = self.counts
        assert counts is not None
        if counts.is_sending(item):
            self.stats["swallowed"] += 1
            return _NACKED
        if counts.take_failed(item):  # first: the complete-entry rule would call the member acked
            self.stats["swallowed"] += 1
            return _ROUTE
        if item in counts.stored:
            self.stats["swallowed"] += 1
            return _ROUTE_STORED  # a copy of a stored dead letter: acknowledge it again
        return None

    def _swallow(self, item: Item) -> int:
        """Under the lock: a copy the application must not see; it stays unacked."""
        self.stats["swallowed"] += 1
        if self.counts is not None:
            self.counts.note_swallowed(item)
        return _NACKED

    def _before_client_redelivery(self, ledger_id: int, entry_id: int) -> bool:
        """Under the lock: True if the entry's last handoff is too recent for the client to have redelivered it.

        The C++ client redelivers a nacked entry no sooner than its delay after the
        nack, and keeps it until then whatever else happens (a reconnect, an ack timeout,
        ``redeliver_unacknowledged_messages``): a copy that comes sooner was brought by
        something else and would be early, while the client's redelivery is still to come.
        The window is the handoff's lead: it ends at the bucket's time.
        """
        return self._recent.is_recent((ledger_id, entry_id), monotonic_ms())

    def _returned_copy_counts(self, raw: Any, item: Item) -> bool:
        """Under the lock: True if a copy of a returned, unsettled message is a delivery after all.

        It is, with an ack timeout (``always_guard``: redelivering unsettled messages is
        what the application asked for), and, with a dead-letter policy, when the
        plain client would dead-letter it (it goes there, not to the application).
        Otherwise it is swallowed: a message comes back once per nack.
        """
        if self._always_guard:
            return True
        counts = self.counts
        return counts is not None and counts.seen(raw, item) > counts.limit

    # ------------------------------------------------------------------ nacks

    def note_nack(
        self, item: Item, size: int, bare: RawMessageId | None, first_chunk: tuple[int, int] | None = None
    ) -> bool:
        """A nack of *item* (of an entry of *size* members; *bare*: its id, for a key without topic;
        *first_chunk*: the entry of its first chunk, for a chunked message).

        It joins the pending set (and leaves the handed-off and returned ones), and the
        ledger guards. One atomic step; False, and nothing changes, if its nack is pending already.
        """
        with self._lock:
            self.entries.watch(item[0], item[1])  # first: its entry's copies and acks are the ledger's from now on
            if not self.pending.add(item[0], item[1], item[2]):
                return False
            if self.counts is not None:
                self.counts.note_nack(item)
            if self._handed.count or self._returned.count:
                self._leave_state(item)
            in_flight = item[2] >= 0 and size > 0 and not (self._complete.count and item[:2] in self._complete)
            if in_flight and self.entries.nack(item[0], item[1], item[2], size) == _COMPLETE:
                self._complete.add(item[0], item[1])
            elif in_flight and self._orphans:
                self._renack(item[0], item[1], size)
            elif item[2] >= 0 and size <= 0:  # a batch member of unknown size: its entry's next record must carry it
                self._orphans.add(item[:2])
            if bare is not None:
                self._bare[item[:2]] = bare
            if first_chunk is not None:
                self._chunks[item[:2]] = first_chunk
            if self.quiet:  # a nack state begins: guard
                self._set_quiet(False)
            self.entries.guard_left = self._guard_messages
            return True

    def undo_nack(self, item: Item) -> None:
        """The tracker refused the nack :meth:`note_nack` noted: forget it."""
        with self._lock:
            self.pending.discard(item[0], item[1], item[2])
            self._left_pending(item)
            self._bare.pop(item[:2], None)
            self._chunks.pop(item[:2], None)
            if self.counts is not None:
                self.counts.undo_nack(item)

    def waiting_entries(self) -> int:
        """Batch entries whose due keys wait, parked, for their other pending members (shared subscriptions)."""
        with self._lock:
            return 0 if self._recent.parked is None else len(self._recent.parked)

    def _left_pending(self, item: Item) -> None:
        """Under the lock: *item* left the pending set; its entry's parked keys go with its last pending member."""
        parked = self._recent.parked
        if parked is not None and len(parked) and item[2] >= 0 and not self.pending.has_entry(item[0], item[1]):
            parked.take(item[:2])

    def take_last(self, item: Item) -> Any:
        """The copy of *item* at its last delivery, now on its way to the dead-letter topic; None if there is none."""
        with self._lock:
            counts = self.counts
            last = None if counts is None else counts.take_last(item)
            if last is not None:
                self._leave_state(item)
            return last

    def reject(self, item: Item) -> bool:
        """*item* is rejected: on its way to the dead-letter topic, its copies swallowed; False
        (nothing changes) if its nack is pending. One atomic step; needs delivery counts."""
        with self._lock:
            if item in self.pending:
                return False
            assert self.counts is not None
            self.counts.reject(item)
            self._leave_state(item)
            self._guard()
            return True

    def reject_failed(self, item: Item) -> None:
        """The dead letter of a rejected *item* was not stored: it is the application's again, delivered and unsettled."""
        with self._lock:
            if self.counts is not None:
                self.counts.reject_failed(item)
            if item[2] >= 0:
                # A batch member in no nack set of a complete entry passes for acked: it is returned instead.
                self._returned.add(item[0], item[1], item[2])
                self._guard()

    def take_every_last(self) -> list[Any]:
        """The copies of every message at its last delivery, now on their way to the dead-letter topic.

        One atomic step (a redelivery of them was asked for).
        """
        with self._lock:
            if self.counts is None:
                return []
            taken = self.counts.take_every_last()
            for item, _ in taken:
                self._leave_state(item)
            if taken:
                self._guard()
            return [raw for _, raw in taken]

    def _leave_state(self, item: Item) -> None:
        """Under the lock: *item* leaves the handed-off and returned sets (acked, nacked, or stale)."""
        if not self._handed.discard(item[0], item[1], item[2]):  # a message is in one state at a time
            self._returned.discard(item[0], item[1], item[2])
            if self._held:
                self._held.pop(item, None)

    # ------------------------------------------------------------------ acks

    def note_completing_ack(self, ledger: int, entry: int, index: int) -> bool:
        """The ack the C table left to the ledger because it completes a watched entry with a nacked
        member (the consumer's gate): one atomic step, True; False, nothing recorded, where the
        general path must record it. O(1).

        The table finds the member in neither of its bit sets. That means in no nack set, except
        in a record opened again after its entry's knowledge expired, which marks only the pending
        members nacked (:meth:`_renack`): so the nack sets are asked too, and a member in one is
        the general path's (it leaves its set there, and its held copy is acked). Otherwise only
        the entry's move to the complete set is left.
        """
        item = (ledger, entry, index)
        with self._lock:
            if (self._orphans or item in self.pending or item in self._handed or item in self._returned
                    or not self.entries.ack_completing(ledger, entry, index)):
                return False
            if self.counts is not None and self.counts.keeps_counts():
                self.counts.forget(item)
            self._complete.add(ledger, entry)
            return True

    def note_ack_data(self, data: bytes) -> None:
        """An ack of a delivered message, by its serialized id: one atomic step. O(1)."""
        with self._lock:
            if (self.pending.count or self._handed.count or self._returned.count or self._complete.count
                    or (self.counts is not None and self.counts.keeps_counts())):
                fields = _msgid.parse_id(data)
                self._note_ack(fields[0], fields[1], fields[3], fields[4], data=data)
            elif self.entries.ack_data(data) == _COMPLETE:  # the common path: one C call
                fields = _msgid.parse_id(data)
                self._complete.add(fields[0], fields[1])

    def note_ack(self, ledger: int, entry: int, index: int, size: int, *, made_up: bool, topic: str) -> bool:
        """An ack of a message by its id fields: one atomic step.

        *made_up*: the id was built without a batch size (``pulsar.MessageId(p, l, e, i)``),
        which the client acks as its whole entry. For a member of an entry in flight the
        ack is then only recorded, the entry acked whole once every member is: False
        (send nothing now). True: send the ack.
        """
        with self._lock:
            if index >= 0 and not size:
                size = int(self.entries.size_of(ledger, entry))
            if made_up and (size or (ledger, entry) in self._complete):
                self._note_ack(ledger, entry, index, size, foreign=True, topic=topic)
                return False
            self._note_ack(ledger, entry, index, size, topic=topic)
            return True

    def _note_ack(
        self, ledger: int, entry: int, index: int, size: int, *, data: bytes | None = None,
        foreign: bool = False, topic: str = UNTITLED,
    ) -> None:
        """Under the lock: an acked member leaves the nack sets and joins the entry knowledge."""
        if self.pending.count or self._handed.count or self._returned.count or self.counts is not None:
            self._forget_member((ledger, entry, index))
        if data is not None:
            outcome = self.entries.ack_data(data, create=not self._complete.count)
            if outcome == _msgid.MISSING:
                if index >= 0 and (ledger, entry) in self._complete:
                    self._ack_complete_member(ledger, entry, foreign, topic)
                    return
                outcome = self.entries.ack_data(data)
        elif index >= 0 and self._complete.count and (ledger, entry) in self._complete:
            self._ack_complete_member(ledger, entry, foreign, topic)
            return
        elif (self.quiet and not foreign) or (index >= 0 and size <= 0):
            return  # nothing recorded: quiet, or a member of an entry of unknown size
        else:
            outcome = self.entries.ack(ledger, entry, index, size, foreign=foreign)
        if self._orphans:
            self._renack(ledger, entry, size)
        if outcome == _COMPLETE:
            self._complete.add(ledger, entry)
        elif outcome == _msgid.SETTLED_FOREIGN and topic is not UNTITLED:
            self.to_ack_again.append(handoff_id(topic, ledger, entry))  # the client's acker missed a member

    def _renack(self, ledger: int, entry: int, size: int) -> None:
        """Under the lock: the table has a record again for an entry whose knowledge expired with nacks still pending.

        The record must carry those nacks, or the table would call a copy of a pending
        member deliverable (the receive path trusts its DELIVER without the lock).
        """
        if (ledger, entry) not in self._orphans or size <= 0:
            return
        self._orphans.discard((ledger, entry))
        for index in range(size):
            if (ledger, entry, index) in self.pending and self.entries.nack(ledger, entry, index, size, create=False) == _COMPLETE:
                self._complete.add(ledger, entry)

    def _forget_member(self, item: Item) -> None:
        """Under the lock: an acked *item* leaves every nack set (its held copy is acked with it) and its counts go."""
        if self.pending.count or self._handed.count or self._returned.count:
            if self.pending.discard(item[0], item[1], item[2]):  # a pending message is in no other set, and holds no copy
                self._left_pending(item)
            else:
                held = self._held.get(item)
                if held is not None:
                    self.to_ack_again.append(held)
                self._leave_state(item)
        if self.counts is not None and self.counts.keeps_counts():
            self.counts.forget(item)

    def _ack_complete_member(self, ledger: int, entry: int, foreign: bool, topic: str) -> None:
        """Under the lock: a member of a complete entry was acked; settle the entry if it was the last."""
        if not (self.pending.has_entry(ledger, entry) or self._handed.has_entry(ledger, entry)
                or self._returned.has_entry(ledger, entry)):
            self._complete.discard(ledger, entry)
            self.entries.settle(ledger, entry)
            if foreign and topic is not UNTITLED:
                self.to_ack_again.append(handoff_id(topic, ledger, entry))

    def forget_counts(self, item: Item) -> None:
        """Drop the delivery counts of a settled message (acked or dead-lettered)."""
        with self._lock:
            if self.counts is not None:
                self.counts.forget(item)

    # ------------------------------------------------------------------ dead letters

    def dead_letter_stored(self, item: Item, size: int) -> None:
        """The dead letter of *item* is stored: counted, remembered, and acked (its entry may settle)."""
        with self._lock:
            if self.counts is not None:
                self.counts.dead_letter_stored(item)
            self.stats["dead_lettered"] += 1
            self._note_ack(item[0], item[1], item[2], size)

    def dead_letter_failed(self, item: Item) -> None:
        """The dead letter of *item* could not be stored: it comes back and is routed again."""
        with self._lock:
            if self.counts is not None:
                self.counts.dead_letter_failed(item)
            self._guard()

    # ------------------------------------------------------------------ handoffs and expiry

    def hand_off(
        self, due: DueKeys, hold_back: Callable[[MessageKey, int], bool] | None = None
    ) -> tuple[list[RawMessageId], Callable[[], None]]:
        """Due keys become one entry-level id per entry, in one atomic step; returns the ids and their undo.

        Their messages leave the pending set *before* the client has the ids: the copy the
        handoff brings can come back at once (the timer thread may wait for the GIL
        longer than the client's delay), and it must find them handed off, not pending.
        Call the undo if the client refused the ids: they are pending again.

        With ``wait_for_last`` (a shared subscription), a batch entry with a pending member
        not due yet waits for it: its due keys stay pending and are parked
        (:class:`~pulsar_nack.consumer.entry_handoff.ParkedKeys`) until a key of the entry
        falls due again, which brings them back here. An entry the application may still
        settle members of is looked at again later: its due keys go to
        ``hold_back(key, deadline_ms)`` (the tracker's ``add_at``; False if it refused
        them, and the entry is handed off now).
        """
        ids: list[RawMessageId] = []
        moved: list[Item] = []
        bare_ids: dict[tuple[int, int], RawMessageId] = {}
        chunked: dict[tuple[int, int], tuple[int, int]] = {}
        entries: list[tuple[int, int]] = []
        with self._lock:
            now = monotonic_ms()  # before the client has any of the ids
            due, unparked = self._unpark(due)
            waiting = self._waiting(due, now, hold_back) if hold_back is not None and self._recent.parked is not None else ()
            for topic, keys in due.items():
                seen: set[tuple[int, int]] = set()
                for _, ledger_id, entry_id, batch_index in keys:
                    if waiting and (ledger_id, entry_id) in waiting:
                        continue  # its due members are pending still: parked, or tracked again for a recheck
                    item = (ledger_id, entry_id, batch_index)
                    if self.pending.discard(item[0], item[1], item[2]):
                        self._handed.add(item[0], item[1], item[2])
                        moved.append(item)
                    if (ledger_id, entry_id) in seen:
                        continue
                    seen.add((ledger_id, entry_id))
                    entries.append((ledger_id, entry_id))
                    ids += self._entry_ids(topic, (ledger_id, entry_id), bare_ids, chunked)
            for item in moved:
                self._left_pending(item)
            self.stats["handed_off_entries"] += len(ids)
            self.stats["handoff_bursts"] += bool(ids)
            self._recent.note(now, entries)
            self._expire(now)

        def undo() -> None:
            with self._lock:  # retried by the tracker: pending again, bare ids kept
                for item in moved:
                    if item in self._handed:
                        self._handed.discard(item[0], item[1], item[2])
                        self.pending.add(item[0], item[1], item[2])
                self._bare.update(bare_ids)
                self._chunks.update(chunked)
                self._repark(unparked)

        return ids, undo

    def _entry_ids(
        self, topic: str, entry: tuple[int, int], bare_ids: dict[tuple[int, int], RawMessageId],
        chunked: dict[tuple[int, int], tuple[int, int]],
    ) -> list[RawMessageId]:
        """Under the lock: the ids that hand *entry* off (noted in *bare_ids* and *chunked* for an undo)."""
        if topic is UNTITLED or topic == UNTITLED:
            bare = self._bare.pop(entry, None)
            if bare is None:
                return []
            bare_ids[entry] = bare
            return [bare]
        # A chunked message's chunks in entry order, its last chunk's entry last: the client's nack timer
        # may release the ids in two ticks, and a first chunk must reach it before the later ones.
        return [*self._chunk_ids(topic, entry, chunked), handoff_id(topic, *entry)]

    def _repark(self, unparked: list[MessageKey]) -> None:
        """Under the lock: park again the keys a refused handoff had unparked (the tracker retries only its own)."""
        if unparked and self._recent.parked is not None:
            self._recent.parked.park([key for key in unparked if key[1:] in self.pending])

    def _unpark(self, due: DueKeys) -> tuple[DueKeys, list[MessageKey]]:
        """Under the lock: *due* with the parked keys of its entries (no longer parked), and those keys. O(due keys)."""
        parked = self._recent.parked
        if parked is None or not len(parked):
            return due, []
        unparked: list[MessageKey] = []
        for keys in due.values():
            for key in keys:
                unparked += parked.take((key[1], key[2]))
        if not unparked:
            return due, unparked
        merged = {topic: list(keys) for topic, keys in due.items()}
        for key in unparked:
            merged.setdefault(key[0], []).append(key)
        return merged, unparked

    def _waiting(
        self, due: DueKeys, now: int, hold_back: Callable[[MessageKey, int], bool]
    ) -> set[tuple[int, int]]:
        """Under the lock (``wait_for_last``): the batch entries of *due* that wait.

        Their due keys are parked, or go to *hold_back* with the time the entry is looked
        at again (:meth:`_wait_until`). O(due keys).
        """
        due_members: dict[tuple[int, int], list[MessageKey]] = {}
        for keys in due.values():
            for key in keys:
                if key[3] >= 0 and (key[1], key[2], key[3]) in self.pending:
                    due_members.setdefault((key[1], key[2]), []).append(key)
        waiting: set[tuple[int, int]] = set()
        parked = self._recent.parked
        assert parked is not None
        for entry, keys in due_members.items():
            deadline = self._wait_until(entry, keys, now)
            if deadline == _PARK:
                parked.park(keys)  # a key of a member still pending brings them back
                waiting.add(entry)
            # All or none: an entry whose keys the tracker refused (closing) is handed off now.
            elif deadline is not None and all(hold_back(key, deadline) for key in keys):
                waiting.add(entry)
        return waiting

    def _wait_until(self, entry: tuple[int, int], keys: list[MessageKey], now: int) -> int | None:
        """Under the lock (``wait_for_last``): when a batch entry with due members *keys* is looked at again,
        ``_PARK`` (when a key of the entry falls due again), or None: it goes now.

        It waits while the application may still settle members of it here (one it was
        given is unsettled, or its copy was read from within ``COPY_DRAIN_MS``): a member
        nacked after the handoff could reach another consumer of the subscription first.
        Else it waits, parked, while a member is pending and not due: that member's own
        key in the tracker brings the entry back when it falls due.
        """
        if self._returned.has_entry(*entry) or self.entries.busy(*entry, COPY_DRAIN_MS, STALE_MS):
            return now + self._recent.recheck_ms
        if self.pending.entry_count(*entry) <= len(set(keys)):  # (a key may be due twice)
            return None  # every pending member is due: the entry goes now
        return _PARK

    def _chunk_ids(
        self, topic: str, last: tuple[int, int], chunked: dict[tuple[int, int], tuple[int, int]]
    ) -> list[RawMessageId]:
        """Under the lock: the ids of the other chunks of a chunked message due (noted in *chunked* for an undo)."""
        first = self._chunks.pop(last, None) if self._chunks else None
        if first is None:
            return []
        chunked[last] = first
        return [handoff_id(topic, *e) for e in chunk_entries(first, last)]

    def _expire(self, now: int) -> None:
        """Under the lock: every ``STALE_MS``, forget handed-off and returned messages of the old generation,
        and the delivery counts of messages not counted for a generation.

        Their entries leave the complete set: copies of their siblings are then delivered
        (the knowledge is incomplete), never filtered.
        """
        if now - self._aged_at < STALE_MS:
            return
        self._aged_at = now
        for item in self._handed.age() + self._returned.age():
            self._held.pop(item, None)
            if item[:2] in self._complete:
                self._complete.discard(item[0], item[1])
                if self.pending.count and self.pending.has_entry(item[0], item[1]):
                    self._orphans.add(item[:2])  # its next table record must carry their nacks
        if self.counts is not None:
            self.counts.age()

    # ------------------------------------------------------------------ guarding

    def maybe_quiet(self) -> None:
        """Go quiet if no nack state is left (forgetting stale ones first); else guard on.

        Going quiet forgets the settled entries, and the open records of entries never
        settled when there are many.
        """
        with self._lock:
            self._expire(monotonic_ms())
            self.entries.guard_left = self._guard_messages
            if self._always_guard or self.has_nack_state() or self._held:
                return
            self.entries.forget_settled()
            if len(self.entries) > 4 * SETTLED_CAPACITY:  # open records of entries never settled
                self.entries.sweep()
            if not self._complete.count:  # no nack state left anywhere: no entry to watch
                self.entries.unwatch()
            self._set_quiet(True)

    def _set_quiet(self, quiet: bool) -> None:
        """Set ``quiet``, and ``screening`` with it."""
        self.quiet = quiet
        if quiet and self.counts is None:
            self.screening = Screening.NONE
        elif not quiet and not self.entries.watch_all and self.atomic_table:
            self.screening = Screening.TABLE
        else:
            self.screening = Screening.LEDGER

    def _guard(self) -> None:
        """Start guarding (under the lock): a nack state begins. On every nack: no call it can spare."""
        if self.quiet:
            self._set_quiet(False)
        self.entries.guard_left = self._guard_messages

    # ------------------------------------------------------------------ resets

    def reset(self, forget_counts: bool, drain: Callable[[], DueKeys]) -> DueKeys:
        """Forget every nack state, and *drain* the tracker, in one atomic step; return what it drained.

        ``forget_counts=False`` (before ``redeliver_unacknowledged_messages``: delivery
        counts hold, and acked members of entries still being processed stay known) or
        True (before ``seek``: the subscription starts afresh, dead letters included).
        """
        with self._lock:
            dropped = drain()
            parked = self._recent.parked
            if parked is not None and len(parked):  # pending nacks out of the tracker: dropped too
                dropped = {topic: list(keys) for topic, keys in dropped.items()}
                for key in parked.all_keys():
                    dropped.setdefault(key[0], []).append(key)
            self._clear_nack_state()
            self.to_ack_again.clear()
            if forget_counts:
                self.entries.clear()
                if self.counts is not None:
                    self.counts.clear()
            else:
                self.entries.clear_nacks()
            self._guard()
        return dropped

    def close(self) -> None:
        """Forget everything (the consumer is closed)."""
        with self._lock:
            self._clear_nack_state()
            self.entries.clear()
            if self.counts is not None:
                self.counts.clear()

    def _clear_nack_state(self) -> None:
        """Under the lock: every message leaves the nack sets; entry knowledge beyond the table goes."""
        for nack_set in (self.pending, self._handed, self._returned):
            nack_set.clear()
        self._held.clear()
        self._complete.clear()
        self._orphans.clear()
        self._bare.clear()
        self._chunks.clear()
        if self._recent.parked is not None:
            self._recent.parked.clear()
        self.entries.unwatch()

    # ------------------------------------------------------------------ counters

    def snapshot(self) -> tuple[dict[str, int], int]:
        """``(stats, pending messages)``, read together."""
        with self._lock:
            return dict(self.stats), len(self.pending)

    def memory_bytes(self) -> int:
        """Bytes of the admission structures (nack sets, complete entries, entry table): an estimate."""
        with self._lock:
            return (self.pending.memory_bytes() + self._handed.memory_bytes() + self._returned.memory_bytes()
                    + self._complete.memory_bytes() + int(self.entries.memory_bytes()))

    def _check(self, tracked: int) -> None:
        """Assert the invariants (*tracked*: the keys in the tracker). For tests."""
        with self._lock:
            for part in (self.pending, self._handed, self._returned, self._complete, self.entries):
                part._check()
            if self.counts is not None:
                self.counts._check()
            # A message is in one nack set at most; a held copy is of a returned message.
            pending, handed, returned = (set(s.items()) for s in (self.pending, self._handed, self._returned))
            assert not (pending & handed or pending & returned or handed & returned)
            assert set(self._held) <= returned
            # A parked key's entry has a pending member (the parked keys go with its last one).
            if self._recent.parked is not None:
                assert all(self.pending.has_entry(key[1], key[2]) for key in self._recent.parked.all_keys())
            # Every bare id waiting for its handoff is a pending key.
            assert len(self._bare) <= tracked or not self._bare
