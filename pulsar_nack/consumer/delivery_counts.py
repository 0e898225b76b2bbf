"""How often the application saw each unsettled message: the tallies that decide a dead letter.

A :class:`DeliveryCounts` exists only when the consumer has a dead-letter policy: the
admission ledger (:class:`~pulsar_nack.consumer.admission.AdmissionLedger`) holds one
then, or None, and that is the one place the policy is checked. It owns:

* per message, the copies of it the consumer swallowed, its own tally of deliveries (on a
  shared subscription the broker's count, which covers the other consumers, is its floor), the
  application's nacks of it, and its copy at its last delivery (so that a redelivery
  request dead-letters it at once, as the C++ client does);
* the messages whose dead letter is on its way, those whose dead letter failed (their next
  copy is routed again), and those whose dead letter is stored;
* two generations of the messages counted lately (:meth:`age`), so that the counts of one
  another consumer settled go, as the ledger forgets handed-off and returned messages.

Not thread-safe: the ledger holds its lock around every call.
"""

from __future__ import annotations

from typing import Any

from .message_sets import Item, PendingNacks
from .subscription import Sharing

__all__ = ["DeliveryCounts"]


class DeliveryCounts:
    """The delivery counts of a consumer with a dead-letter policy of ``max_redeliver_count`` *limit*
    on a subscription of *sharing* (default shared).

    A message seen ``limit + 1`` times (counts 0 … limit) goes to the dead-letter topic
    instead of being delivered again; at its last delivery (count *limit*) a nack or a
    redelivery request sends it. What "seen" means is :meth:`seen`.

    >>> counts = DeliveryCounts(1)
    >>> counts.note_nack((7, 1, -1)); counts.note_nack((7, 1, -1)); counts.keeps_counts()
    True
    >>> counts.forget((7, 1, -1)); counts.keeps_counts()
    False
    """

    __slots__ = ("_copies", "_failed", "_last", "_nacks", "_old", "_sending", "_shown", "_young", "limit", "shared", "stored")

    limit: int
    """The policy's ``max_redeliver_count``."""
    shared: bool
    """Other consumers may receive the messages: the broker's count is the floor of the tally."""
    stored: PendingNacks
    """Messages whose dead letter is stored: a copy of one is acknowledged again."""
    _copies: dict[Item, int]
    _shown: dict[Item, int]
    _nacks: dict[Item, int]
    _last: dict[Item, Any]
    _sending: set[Item]
    _failed: set[Item]
    """Messages whose dead letter failed: their next copy goes to the dead-letter topic again."""
    _young: set[Item]
    """Messages counted since the last :meth:`age`."""
    _old: set[Item]
    """Messages counted in the generation before, not since: :meth:`age` forgets their counts."""

    def __init__(self, limit: int, sharing: Sharing = Sharing.SHARED) -> None:
        self.limit = limit
        self.shared = sharing is Sharing.SHARED
        self.stored = PendingNacks()
        self._copies, self._shown, self._nacks, self._last = {}, {}, {}, {}
        self._sending, self._failed, self._young, self._old = set(), set(), set(), set()

    # ------------------------------------------------------------------ reading

    def idle_for(self, raw: Any) -> bool:
        """True if *raw* needs no count: below the limit, and no message counted (the quiet path)."""
        return bool(
            raw.redelivery_count() < self.limit and not (self._nacks or self._shown or self._sending or self.stored.count)
        )

    def keeps_counts(self) -> bool:
        """True if some message's counts are kept (read on every acknowledgement, as a hint)."""
        return bool(self._copies or self._shown or self._nacks or self._last or self._failed)

    def is_sending(self, item: Item) -> bool:
        """True if the dead letter of *item* is on its way."""
        return bool(self._sending) and item in self._sending

    def take_failed(self, item: Item) -> bool:
        """True if the dead letter of *item* failed: its dead letter is on its way again now."""
        if not self._failed or item not in self._failed:
            return False
        self._failed.discard(item)
        self._sending.add(item)
        return True

    def has_last(self) -> bool:
        """True if some message is at its last delivery."""
        return bool(self._last)

    def seen(self, raw: Any, item: Item) -> int:
        """How often the application saw *item* before this copy *raw*.

        At its first delivery here, the broker's count (``redelivery_count()``, per entry)
        minus the copies of it this consumer swallowed; after that, this consumer's own
        tally of its deliveries (that figure plus one per delivery since), and on a shared
        subscription never less than the broker's figure again; never less than the
        application's nacks of it.
        """
        shown = self._shown.get(item)
        broker = raw.redelivery_count() - self._copies.get(item, 0)
        if shown is None:
            return max(self._nacks.get(item, 0), broker)
        if self.shared:
            # The broker's count is the floor: it also counts the deliveries to the
            # subscription's other consumers, which this tally never sees (the plain client
            # counts by it alone). It never lowers the tally (a batch entry's count starts
            # again when a sibling is acked, a dead letter's ack say).
            return max(self._nacks.get(item, 0), shown, broker)
        # One active consumer: every delivery since the first is in the tally; the broker's
        # count may count copies that never reached this consumer (issue 22), so it neither
        # lowers nor raises it.
        return max(self._nacks.get(item, 0), shown)

    # ------------------------------------------------------------------ counting

    def counted_over(self, raw: Any, item: Item) -> bool:
        """True if *raw* was seen too often: it goes to the dead-letter topic (and is on its way).

        False means *raw* is delivered: it joins the tally of deliveries.
        """
        seen = self.seen(raw, item)
        if seen > self.limit:
            self._sending.add(item)
            self._last.pop(item, None)
            return True
        if seen == self.limit:  # its last delivery: a nack or a redelivery sends it
            self._last[item] = raw
        self._shown[item] = seen + 1
        self._touch(item)
        return False

    def note_swallowed(self, item: Item) -> None:
        """A copy of *item* was swallowed (the broker counted it; the application did not see it)."""
        self._copies[item] = self._copies.get(item, 0) + 1
        self._touch(item)

    def note_nack(self, item: Item) -> None:
        """The application nacked *item*."""
        self._nacks[item] = self._nacks.get(item, 0) + 1
        self._touch(item)

    def _touch(self, item: Item) -> None:
        """*item* was counted: it joins the young generation. O(1)."""
        self._young.add(item)
        if self._old:
            self._old.discard(item)

    def undo_nack(self, item: Item) -> None:
        """The nack of *item* failed after :meth:`note_nack`."""
        self._nacks[item] -= 1

    def take_last(self, item: Item) -> Any:
        """The copy of *item* at its last delivery, now on its way to the dead-letter topic; None if it is not there."""
        last = self._last.pop(item, None)
        if last is not None:
            self._sending.add(item)
        return last

    def reject(self, item: Item) -> None:
        """*item* is rejected: its dead letter is on its way now, whatever its count."""
        self._last.pop(item, None)
        self._sending.add(item)

    def reject_failed(self, item: Item) -> None:
        """The dead letter of a rejected *item* was not stored: it is the application's again."""
        self._sending.discard(item)

    def take_every_last(self) -> list[tuple[Item, Any]]:
        """Every message at its last delivery with its copy, now on its way to the dead-letter topic."""
        taken = list(self._last.items())
        self._last.clear()
        self._sending.update(item for item, _ in taken)
        return taken

    def dead_letter_stored(self, item: Item) -> None:
        """The dead letter of *item* is stored: remember it, forget its counts."""
        self._sending.discard(item)
        self.stored.add(*item)
        self.forget(item)

    def dead_letter_failed(self, item: Item) -> None:
        """The dead letter of *item* could not be stored: its next arrival is routed, whatever the broker counts."""
        self._sending.discard(item)
        self._failed.add(item)
        self._nacks[item] = max(self._nacks.get(item, 0), self.limit + 1)
        self._touch(item)

    def forget(self, item: Item) -> None:
        """Drop the counts of a settled message (acked or dead-lettered)."""
        for counts in (self._copies, self._shown, self._nacks, self._last):
            counts.pop(item, None)
        self._failed.discard(item)
        self._young.discard(item)
        self._old.discard(item)

    def age(self) -> None:
        """Forget the counts of the messages not counted for a generation; the young one becomes old. O(old).

        Called every ``STALE_MS`` by the ledger. A message another consumer of the
        subscription settled is never settled here, so only this forgets its counts. One
        at its last delivery, or whose dead letter is on its way or failed, stays: it is in flight here.
        """
        for item in self._old:
            if item in self._last or item in self._sending or item in self._failed:
                self._young.add(item)  # in flight here: aged again later
                continue
            # Forgotten: if it comes back here, its tally restarts from the broker's
            # redelivery count, which is what the plain client counts anyway.
            for counts in (self._copies, self._shown, self._nacks):
                counts.pop(item, None)
        self._old, self._young = self._young, set()

    def clear(self) -> None:
        """Forget every count and every stored dead letter (a seek, a close)."""
        for counts in (self._copies, self._shown, self._nacks, self._last):
            counts.clear()
        self._failed.clear()
        self._young.clear()
        self._old.clear()
        self.stored.clear()

    def _check(self) -> None:
        """Assert the invariants. For tests."""
        self.stored._check()
        # A message is at most one of: at its last delivery, on its way to the DLQ.
        assert not (set(self._last) & self._sending)
        # A failed dead letter is not on its way (until its next copy takes it again).
        assert not (self._failed & self._sending)
        # A message is in at most one generation, and only while it has counts.
        assert not (self._young & self._old)
        assert (self._young | self._old) <= (self._copies.keys() | self._shown.keys() | self._nacks.keys())
