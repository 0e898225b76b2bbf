"""The broker-agnostic heart of a nacking consumer, shared by the sync and asyncio consumers.

:class:`NackingCore` is the wiring between the application's calls, the tracker, the
admission ledger and the client's ``negative_acknowledge(MessageId)`` handoff, and calls
into no client itself:

* the :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` and its timer;
* the keying of messages and ids (:meth:`NackingCore.key_of`), with the topic taken from
  the message, from the consumer's only topic (plus ``-partition-N``), or kept inside
  the caller's id object when neither is known (a bare id on a multi-topic consumer);
* the handoff: due keys become one entry-level ``_pulsar.MessageId`` per entry, passed
  to the ``hand_off`` callable the consumer supplies (the sync consumer calls
  ``consumer.negative_acknowledge(id)`` for each);
* what to do with a copy the ledger filters (ack it again) or routes to the dead-letter
  topic (by the route the consumer supplies,
  :class:`~pulsar_nack.consumer.dead_letter.DeadLetterRoute`), and the counters.

What is known of each message, and which copies reach the application, is the
:class:`~pulsar_nack.consumer.admission.AdmissionLedger`'s (see its module for the
verdicts and for guarding); with a dead-letter policy, how often the application saw each
message is its :class:`~pulsar_nack.consumer.delivery_counts.DeliveryCounts`'. Imports run
one way: nacking -> admission -> delivery_counts -> message_sets.

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
from collections.abc import Callable, Iterable
from typing import Any

from .._validate import check_int, check_ms, check_topics
from ..core.base import DueKeys
from ..core.buckets import bucket_ms
from ..core.keys import MAX_BATCH_INDEX, PARTITION_SUFFIX, MessageKey, full_topic_name, redelivery_count_of
from ..core.tracker import NegativeAcksTracker
from ..errors import ClosedError
from ..timing import COPY_DRAIN_MS, DEAD_LETTER_RETRY_MS, handoff_lead_ms
from . import msgid as _msgid
from ._client import MESSAGE_TYPE, RawMessageId, inner_message, is_raw_message_id, raw_id, unwrap_message
from .ack_timeout import AckTimeout
from .admission import UNTITLED, AdmissionLedger, Screening
from .delivery_counts import DeliveryCounts
from .message_sets import Item
from .settings import ConsumerSettings
from .subscription import Sharing

__all__ = [
    "START_GUARD_MESSAGES",
    "NackingCore",
    "TopicMatcher",
    "full_topic_name",
]

GUARD_MESSAGES = 10_000
"""Deliveries a consumer keeps guarding after its last nack state ended."""
START_GUARD_MESSAGES = 1_000
"""Deliveries a new consumer guards before it goes quiet (if it nacks nothing meanwhile)."""

HandOff = Callable[[list[RawMessageId]], None]
"""What a consumer does with due entries: ``negative_acknowledge`` each id on its client."""
DeadLetterCallback = Callable[[Any, bool], None]
"""What a consumer does with a message for the dead-letter topic: ``route(message, stored)``."""

_DELIVER, _ACKED, _NACKED, _ROUTE_STORED = _msgid.DELIVER, _msgid.ACKED, _msgid.NACKED, _msgid.ROUTE_STORED
_DELIVER_LAST = _msgid.DELIVER_LAST


def _is_message(obj: Any) -> bool:
    return not is_raw_message_id(obj) and callable(getattr(obj, "topic_name", None))


def _item_of(message_id: RawMessageId) -> Item:
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


_STASH = _msgid.STASH


def _stash(message: Any, data: bytes) -> None:
    """Keep the serialized id on a ``pulsar.Message`` wrapper, as the C table's ``admit_message`` does."""
    fields = getattr(message, "__dict__", None)
    if fields is not None:
        fields[_STASH] = data


def _stashed(message: Any) -> bytes | None:
    """The serialized id the table's ``admit_message`` kept on *message*, or None."""
    fields = getattr(message, "__dict__", None)
    return None if fields is None else fields.get(_STASH)


def _inner_message(message: Any) -> Any:
    """The ``_pulsar.Message`` inside a ``pulsar.Message`` (:func:`~._client.inner_message`), or *message*."""
    inner = inner_message(message)
    return message if inner is None else inner


def _first_chunk(message: Any, raw: RawMessageId | None) -> tuple[int, int] | None:
    """The first chunk's (ledger, entry) of a chunked message or id being nacked; None if not chunked."""
    data = _stashed(message)
    if data is None:
        data = (raw if raw is not None else _inner_message(message).message_id()).serialize()
    return _msgid.first_chunk(data)


def _timeout_key(message: Any) -> tuple[MessageKey, tuple[int, int] | None]:
    """A received message's tracker key and, if chunked, its first chunk's entry: the ack timeout's id read."""
    raw = _inner_message(message)
    data = _stashed(message) or raw.message_id().serialize()
    ledger_id, entry_id, _, index, _ = _msgid.parse_id(data)
    return (raw.topic_name(), ledger_id, entry_id, index), _msgid.first_chunk(data)


def batch_size_of(message_id: RawMessageId) -> int:
    """``batch_size`` of a serialized ``MessageIdData`` (protobuf field 6), or 0 if absent. O(1)."""
    return int(_msgid.parse_id(message_id.serialize())[4])


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


class NackingCore:
    """The wiring of one consumer: tracker, keys, ledger, handoff, dead-letter route and counters; no client calls.

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
        Deliveries to keep guarding after the last nack state ended.
    start_guard : int, optional
        Deliveries to guard at the start (default: ``guard_messages``, at most
        ``START_GUARD_MESSAGES``).

    Dead letters
        With a dead-letter policy of ``max_redeliver_count`` N, the ledger's
        :class:`~pulsar_nack.consumer.delivery_counts.DeliveryCounts` count how often the
        application saw each unsettled message (see
        :meth:`~pulsar_nack.consumer.delivery_counts.DeliveryCounts.seen`). As in the C++ client, a message seen
        N + 1 times (counts 0 … N) is routed to the dead-letter topic when the
        application nacks it, and a message
        that arrives after that (brought back by an ack timeout, by
        ``redeliver_unacknowledged_messages``, by a sibling's redelivery, or by the
        broker in any other way) is routed there instead of being delivered. The route is the
        callable given to :meth:`route_dead_letters`, called outside the lock; it
        reports back through :meth:`dead_letter_stored` and :meth:`dead_letter_failed`.
        A message at its last delivery is routed there also, from the copy kept, the
        moment a redelivery of it is asked for (:meth:`reset` before
        ``redeliver_unacknowledged_messages``, or ``ack_timeout_ms`` after its delivery
        while unsettled), as the C++ client sends it, without a further receive.
    """

    tracker: NegativeAcksTracker
    topics: TopicMatcher
    settings: ConsumerSettings
    ledger: AdmissionLedger
    """What is known of each message in flight (its lock guards every change of it)."""
    handoff_delay_ms: int
    _hand_off_ids: HandOff
    _acknowledge: Callable[[Any], None] | None
    _route: DeadLetterCallback | None
    _screen_all: bool
    _ack_timeout: AckTimeout | None
    """With an ack timeout: when each received, unsettled message times out."""
    started: Callable[[Any], None] | None
    """With an ack timeout, ``started(message)`` for each message handed to the application
    outside :meth:`admit` (a consumer's quiet receive path); else None."""
    settled: Callable[[Any], None] | None
    """With an ack timeout, ``settled(message)`` for each received message acknowledged outside
    :meth:`before_ack` (a consumer's common ack path); else None."""
    _reads_lock: threading.Lock
    _reads: dict[str, int]

    def __init__(
        self,
        hand_off: HandOff,
        topics: Iterable[str] | re.Pattern[str] | TopicMatcher,
        settings: ConsumerSettings | None = None,
        *,
        acknowledge: Callable[[Any], None] | None = None,
        guard_messages: int = GUARD_MESSAGES,
        start_guard: int | None = None,
    ) -> None:
        if not callable(hand_off):
            raise TypeError("hand_off must be callable")
        if acknowledge is not None and not callable(acknowledge):
            raise TypeError("acknowledge must be callable or None")
        if settings is None:
            settings = ConsumerSettings()
        elif not isinstance(settings, ConsumerSettings):
            raise TypeError(f"settings must be a ConsumerSettings, not {type(settings).__name__}")
        check_int("guard_messages", guard_messages, 0)
        if start_guard is None:
            start_guard = min(guard_messages, START_GUARD_MESSAGES)
        check_int("start_guard", start_guard, 0)
        self.settings = settings
        self.topics = topics if isinstance(topics, TopicMatcher) else TopicMatcher(topics)
        self._hand_off_ids = hand_off
        self._acknowledge = acknowledge
        self._route = None
        limit = settings.max_redeliver_count
        lead_ms = handoff_lead_ms(settings.handoff_delay_ms)
        timeout = settings.ack_timeout_ms
        self._ack_timeout = AckTimeout(timeout, self._ack_timed_out, _timeout_key) if timeout else None
        self.started = None if self._ack_timeout is None else self._ack_timeout.received
        self.settled = None if self._ack_timeout is None else self._ack_timeout.settled
        self.ledger = ledger = AdmissionLedger(
            None if limit is None else DeliveryCounts(limit, settings.sharing),  # only with a dead-letter policy
            lead_ms=lead_ms, always_guard=settings.always_guard, guard_messages=guard_messages,
            start_guard=start_guard,
            wait_for_last=settings.sharing is Sharing.SHARED,
            # past the lead and a bucket: a held-back entry is not handed back at the next tick
            recheck_ms=COPY_DRAIN_MS + lead_ms + bucket_ms(settings.negative_ack_precision_bit_cnt),
        )
        # The receive path reads the table's verdict without the lock when one C call reads
        # it, and screens under the lock only what the table does not settle (everything with counts).
        self._screen_all = ledger.counts is not None
        if self._ack_timeout is not None:  # every delivery is logged for its deadline, every ack ends it
            self.admit = self._admit_timed  # type: ignore[method-assign]  # (per instance, on purpose: no cost without it)
            self.before_ack = self._before_ack_timed  # type: ignore[method-assign]
        # Lock-free counters: any thread steps one with next() (one C call). counts() reads
        # one with next() too and takes off the reads it made before (_reads, under its lock).
        self.received = itertools.count()
        self.acked = itertools.count()
        self._nacked = itertools.count()
        self._reads_lock = threading.Lock()
        self._reads = {"received": 0, "acked": 0, "nacked": 0}
        self.tracker = NegativeAcksTracker(
            self._on_due,
            delay_ms=settings.negative_ack_redelivery_delay_ms,
            precision_bits=settings.negative_ack_precision_bit_cnt,
            round_up=settings.never_early,
            backoff=settings.redelivery_backoff,
            lead_ms=lead_ms,
            coalesce_ms=settings.coalesce_ms,
            default_topic=self.topics.single or "",
        )
        self.handoff_delay_ms = settings.handoff_delay_ms

    @property
    def counting(self) -> bool:
        """True with a dead-letter policy (the ledger keeps delivery counts)."""
        return self.ledger.counts is not None

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
        application, keeps the id read here for its acknowledgement. The ledger decides
        (:meth:`AdmissionLedger.screen`): a filtered copy is acked again, a swallowed one
        left unacked; with a dead-letter policy, a message seen often enough is routed to
        the dead-letter topic.

        Runtime complexity: O(1): nothing while quiet; else one id read and a table
        lookup, plus bitmap lookups under the ledger's lock for a nacked member or an
        entry seen complete.
        """
        next(self.received)
        ledger = self.ledger
        if ledger.screening is Screening.NONE:
            return True
        raw = message if wrapper is not None else _inner_message(message)
        if ledger.quiet and ledger.idle_for(raw):
            return True
        if wrapper is None and raw is not message:
            wrapper = message
        if wrapper is None or not ledger.atomic_table:  # a raw message, or a pure-Python table: under the lock
            verdict, data = ledger.screen(raw, None)
            if wrapper is not None and verdict == _DELIVER:
                _stash(wrapper, data)
            return self._settle_verdict(raw, verdict)
        verdict = ledger.entries.admit_message(raw, wrapper)  # one C call, atomic under the GIL: unwatched entries decided
        if verdict == _DELIVER and not self._screen_all:
            return True
        return self.screen_kept(raw, wrapper, verdict)

    def screen_kept(self, raw: Any, wrapper: Any, verdict: int) -> bool:
        """admit() for a copy the table's ``admit_message`` (``ledger.entries``) did not decide.

        The id is the one kept on *wrapper*; the ledger reads the verdict again under its
        lock and decides (:meth:`AdmissionLedger.screen`). False if the application must not
        see the copy.
        """
        if verdict == _DELIVER_LAST:  # the table's countdown of guarded deliveries ran out
            self.ledger.maybe_quiet()
            return True
        data = _stashed(wrapper)
        verdict, _ = self.ledger.screen(raw, data)
        return self._settle_verdict(raw, verdict)

    def _settle_verdict(self, raw: Any, verdict: int) -> bool:
        """Act on a screened copy's verdict: filtered copies acked again, dead letters routed; True to deliver."""
        if verdict != _DELIVER:
            self._refuse(raw, verdict)
            return False
        ledger = self.ledger
        ledger.guard_left -= 1  # a guarded delivery; after guard_messages of them with no nack state, go quiet
        if ledger.guard_left <= 0:
            ledger.maybe_quiet()
        return True

    def _refuse(self, raw: Any, verdict: int) -> None:
        """A copy the application does not see: ack it again (filtered), leave it (swallowed), or route it."""
        if verdict == _ACKED:
            self._ack_again(raw)
        elif verdict != _NACKED:
            self._send_dead_letter(raw, verdict == _ROUTE_STORED)

    def _ack_again(self, message: Any) -> None:
        """Acknowledge a copy (or an id) the application will not see."""
        if self._acknowledge is not None:
            self._acknowledge(message)

    def _ack_timed_out(self, keys: list[tuple[MessageKey, tuple[int, int] | None]]) -> None:
        """AckTimeout callback: messages unsettled at their timeout are redelivered now, as by a nack due now.

        One at its last delivery goes to the dead-letter topic instead, from the copy kept,
        as the C++ client sends it when its ack timeout redelivers it, without a further receive.
        """
        for key, first_chunk in keys:
            item = (key[1], key[2], key[3])
            last = self.ledger.take_last(item)
            if last is not None:
                self._send_dead_letter(last, False)
                continue
            size = self.ledger.size_of(key[1], key[2]) if key[3] >= 0 else 0
            if self.ledger.note_nack(item, size, None, first_chunk):  # else a nack of it is pending already
                try:
                    self.tracker.add(key, 0)
                except ClosedError:
                    return  # closing: the broker redelivers it when this consumer is gone

    def in_progress(self, message: Any) -> bool:
        """Push the ack timeout of *message* to ``ack_timeout_ms`` from now; False if it is not in flight.

        Raises RuntimeError without an ack timeout; TypeError or ValueError as :meth:`key_of`. O(1).
        """
        key = self.key_of(message)[0]
        if self._ack_timeout is None:
            raise RuntimeError("in_progress needs a consumer subscribed with unacked_messages_timeout_ms")
        return self._ack_timeout.extend(key)

    def _admit_timed(self, message: Any, wrapper: Any = None) -> bool:
        """:meth:`admit` with the consumer's ack timeout: a delivered copy is logged for its deadline (no id read)."""
        if not NackingCore.admit(self, message, wrapper):
            return False
        assert self._ack_timeout is not None
        self._ack_timeout.received(wrapper if wrapper is not None else message)
        return True

    def _before_ack_timed(self, message: Any) -> Any:
        """:meth:`before_ack` with the consumer's ack timeout: the acked message's deadline ends."""
        result = NackingCore.before_ack(self, message)  # validates first
        assert self._ack_timeout is not None
        if inner_message(message) is not None or _is_message(message):
            self._ack_timeout.settled(message)  # by identity: its id is read only if its deadline was set
        else:
            key = self.key_of(message)[0]
            self._ack_timeout.settle((key[1], key[2], key[3]))
        return result

    def _settle_timeout(self, key: MessageKey) -> None:
        """*key* was settled (acked, nacked, rejected): its ack timeout stops."""
        if self._ack_timeout is not None:
            self._ack_timeout.settle((key[1], key[2], key[3]))

    def _send_dead_letter(self, message: Any, stored: bool) -> None:
        route = self._route
        if route is None:
            raise RuntimeError("a dead-letter policy without a route: call route_dead_letters() first")
        route(message, stored)

    def dead_letter_stored(self, message: Any) -> None:
        """The route stored the dead letter of *message*: count it, remember it, forget its counts."""
        message_id = raw_id(message)
        item = _item_of(message_id)
        self.ledger.dead_letter_stored(item, batch_size_of(message_id) if item[2] >= 0 else 0)

    def dead_letter_failed(self, message: Any) -> None:
        """The route could not store the dead letter of *message*: it comes back and is tried again.

        The message stays unacknowledged; it is handed to the client after
        ``DEAD_LETTER_RETRY_MS``, and when it arrives it is routed again.
        """
        self.ledger.dead_letter_failed(_item_of(raw_id(message)))
        try:
            self.tracker.add(self.key_of(message)[0], DEAD_LETTER_RETRY_MS)
        except ClosedError:
            pass  # closing: the broker redelivers it when this consumer is gone

    def reject(self, message: Any) -> None:
        """Mark *message* as on its way to the dead-letter topic now (``reject``); the caller sends it.

        Its copies are swallowed until :meth:`dead_letter_stored` (then filtered as
        acked) or :meth:`reject_failed`. Needs a dead-letter policy. Raises TypeError or
        ValueError as :meth:`key_of`, and ValueError for a message whose nack is pending
        (nothing changes then). O(1).
        """
        key, _ = self.key_of(message)
        if not self.ledger.reject((key[1], key[2], key[3])):
            raise ValueError(f"message {key} is NACKED (its nack is pending): it cannot be rejected")
        self._settle_timeout(key)

    def reject_failed(self, message: Any) -> None:
        """The dead letter of a rejected *message* was not stored: it is the application's again. O(1)."""
        self.ledger.reject_failed(_item_of(raw_id(message)))

    def forget(self, message: Any) -> None:
        """Drop the delivery counts of a settled message (acked or dead-lettered). O(1)."""
        if self.ledger.keeps_counts():
            self.ledger.forget_counts(_item_of(raw_id(message)))

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
            self._check_topic(key[0])
            return key, inner.message_id()
        raw = raw_id(message)
        ledger, entry, partition, batch_index, size = _msgid.read_id(raw)  # ValueError for earliest, latest, ...
        if _is_message(message):
            topic = message.topic_name()
            if topic not in self.topics:
                raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")
        else:
            if batch_index > MAX_BATCH_INDEX:
                raise ValueError(f"batch_index must be below 2**31, got {batch_index}")
            if batch_index >= 0:
                size = size or self.ledger.size_of(ledger, entry)
                if size and batch_index >= size:
                    raise ValueError(f"batch index {batch_index} is outside its batch of {size} messages")
            single = self.topics.single
            if single is None:
                topic = UNTITLED  # the id object knows its topic; we keep the object
            else:
                topic = f"{single}-partition-{partition}" if partition >= 0 else single
        return (topic, ledger, entry, batch_index), raw

    def _check_topic(self, topic: str) -> None:
        """Raise ValueError for a message of a topic this consumer does not read. O(1) (a pattern: one match)."""
        if topic not in self.topics.names and topic not in self.topics:
            raise ValueError(f"message of topic {topic!r} does not belong to this consumer ({self.topics!r})")

    def nack(self, message: Any, delay_ms: int | None = None) -> None:
        """Track a negative acknowledgement: the message comes back after its delay.

        Every nacked message is remembered in the ledger's pending set until its handoff,
        so that no copy reaches the application before it is due. With a dead-letter
        policy, a message at its last delivery goes to the dead-letter topic instead (see
        the class notes). Runtime complexity: O(1) (the tracker's add, a bitmap insert, and
        a table update for a batch member).

        Raises TypeError or ValueError for bad input (nothing changes then).
        """
        if delay_ms is not None:
            check_ms("delay_ms", delay_ms)
        # a received pulsar.Message (the common call: its exact type needs no checks), else None for an id
        inner = unwrap_message(message) if type(message) is MESSAGE_TYPE else inner_message(message)
        if inner is not None:  # its key and first chunk in one C call (the id kept on admission, or read once)
            topic, ledger_id, entry, index, size, first = _msgid.received_key(inner, message)
            if topic not in self.topics.names:  # (the common case: a topic named at subscribe)
                self._check_topic(topic)
            key: MessageKey = (topic, ledger_id, entry, index)
            bare = None  # a received message's key names its topic
        else:
            key, raw = self.key_of(message)
            topic, ledger_id, entry, index = key
            size = batch_size_of(raw) if index >= 0 else 0
            first = _first_chunk(message, raw) if index < 0 else None  # chunked: its handoff names every chunk
            bare = raw if topic is UNTITLED else None
        ledger = self.ledger
        if index >= 0 and not size:
            size = ledger.size_of(ledger_id, entry)
        item = (ledger_id, entry, index)
        if ledger.counts is not None and self._nacked_at_last(key, item):
            return
        count = None
        if delay_ms is None and self.settings.redelivery_backoff is not None:  # the tracker's backoff
            count = redelivery_count_of(message)
        if not ledger.note_nack(item, size, bare, first):
            raise ValueError(f"message {key} is already NACKED (its nack is pending)")
        try:
            self.tracker.add(key, delay_ms, count)
        except BaseException:
            ledger.undo_nack(item)
            raise
        if self._ack_timeout is not None:
            self._settle_timeout(key)
        next(self._nacked)

    def _nacked_at_last(self, key: MessageKey, item: Item) -> bool:
        """With delivery counts: a nack of a message at its last delivery sends its dead letter instead; True if it did."""
        counts = self.ledger.counts
        last = self.ledger.take_last(item) if counts is not None and counts.has_last() else None
        if last is None:
            return False
        self._settle_timeout(key)
        self._send_dead_letter(last, False)
        next(self._nacked)
        return True

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
        ledger = self.ledger
        if ledger.atomic_table and ledger.entries.ack_message(message):
            return unwrap_message(message)  # recorded by the C table: its entry holds no nack state
        data = _stashed(message)
        if data is not None:
            ledger.note_ack_data(data)
            return unwrap_message(message)  # a pulsar.Message: only those keep an id
        if ledger.quiet and not ledger.keeps_counts() and _is_message(message):
            return raw_id(message)  # a received message while quiet: nothing to record
        if type(message) is MESSAGE_TYPE:  # a received pulsar.Message that kept no id: its fields in one C call
            inner = unwrap_message(message)
            topic, ledger_id, entry, index, size, _ = _msgid.received_key(inner, message)
            self._check_topic(topic)
            ledger.note_ack(ledger_id, entry, index, size, made_up=False, topic=topic)
            return inner
        key, raw = self.key_of(message)
        topic, ledger_id, entry, index = key
        size = batch_size_of(raw) if index >= 0 else 0
        made_up = index >= 0 and not size and not _is_message(message) and topic is not UNTITLED
        return raw if ledger.note_ack(ledger_id, entry, index, size, made_up=made_up, topic=topic) else None

    def after_ack(self) -> None:
        """Acknowledge what the last acknowledgements left to ack (held copies, whole entries)."""
        to_ack = self.ledger.to_ack_again
        while to_ack:
            try:
                pending = to_ack.pop()
            except IndexError:
                return
            self._ack_again(pending)

    # ------------------------------------------------------------------ handoff

    def _on_due(self, due: DueKeys) -> None:
        """Tracker callback: hand each due entry to the client once, in one burst.

        The ledger moves its messages from pending to handed off first
        (:meth:`AdmissionLedger.hand_off`). If the handoff raises, they are pending again
        (the tracker retries the keys).
        """
        ids, undo = self.ledger.hand_off(due, self._hold_back)
        if not ids:
            return
        try:
            self._hand_off_ids(ids)
        except BaseException:
            undo()
            raise

    def _hold_back(self, key: MessageKey, deadline_ms: int) -> bool:
        """Track a due *key* again until *deadline_ms*, its entry's last (the ledger's hand_off); False once closed."""
        try:
            self.tracker.add_at(key, deadline_ms)
        except ClosedError:
            return False  # closing: everything pending is handed off now
        return True

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
        if not forget_counts:  # a redelivery of messages at their last delivery sends their dead letters
            for raw in self.ledger.take_every_last():
                self._send_dead_letter(raw, False)
        return self.ledger.reset(forget_counts, self.tracker.drain)

    def close(self, redeliver_pending: bool) -> None:
        """Stop the tracker: hand every pending nack off now, or leave it unacked."""
        self.tracker.close(flush=redeliver_pending)
        if self._ack_timeout is not None:
            self._ack_timeout.close()
        self.ledger.close()

    # ------------------------------------------------------------------ counters

    def counts(self) -> dict[str, int]:
        """Counters: received, delivered, swallowed, filtered, acked, nacked, dead-lettered, handoffs, pending nacks, bytes."""
        counts, pending = self.ledger.snapshot()
        with self._reads_lock:
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
            "memory_bytes": self.ledger.memory_bytes(),
            **self._ack_timeout_counts(),
        }

    def _ack_timeout_counts(self) -> dict[str, int]:
        """With an ack timeout: the messages in flight under it and its structures' bytes (an estimate)."""
        timeout = self._ack_timeout
        if timeout is None:
            return {}
        return {"ack_timeout_in_flight": len(timeout), "ack_timeout_memory_bytes": timeout.memory_bytes()}

    def memory_bytes(self) -> int:
        """Bytes of the admission structures (nack sets, complete entries, entry table): an estimate."""
        return self.ledger.memory_bytes()

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        self.ledger._check(len(self.tracker))
