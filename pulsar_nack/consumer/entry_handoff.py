"""When a batch entry with nacked members goes back to the broker: the batch handoff rule.

The broker redelivers whole entries, and on a Shared or Key_Shared subscription
(:attr:`~pulsar_nack.consumer.subscription.Sharing.SHARED`) it may dispatch a redelivered
entry to any consumer of the subscription, which knows nothing of the nacks the first one
is still holding for the entry's other members and delivers them at once. Nothing but the
broker links the consumers, so the one rule that never delivers a member early there is
to hand an entry off when the *last* of its pending nacked members is due: earlier
members come late, never early, and acked members still never come back. Nor while the
application may still nack a member of it (the ledger asks the entry table,
``EntryTable.busy``): one nacked after the handoff would be early on another consumer. With one active
consumer (Exclusive, Failover: ``Sharing.ONE_ACTIVE``) the consumer that hands an entry
off receives it, swallows the copies of the members still pending and hands the entry off
again at their time, so each member keeps its own time.

:class:`EntryDeadlines` keeps, per batch entry with pending nacks, the latest deadline
of its members; the admission ledger
(:class:`~pulsar_nack.consumer.admission.AdmissionLedger`) holds one and asks it, at each
handoff, whether an entry waits (:meth:`EntryDeadlines.wait_until`).
"""

from __future__ import annotations

__all__ = ["EntryDeadlines"]


class EntryDeadlines:
    """The latest deadline of the pending nacked members of each batch entry with two or more (on a shared subscription).

    An entry's only pending member needs no record: nothing waits for it. A record is
    made when a second member of the entry is nacked; the first one's deadline is not
    kept, so the record takes the latest deadline noted for any member so far, which is
    never earlier than it: the entry may come late, never early. This keeps the rule's
    memory to the entries with several pending members.

    Not thread-safe: the ledger holds its lock around every call.

    >>> deadlines = EntryDeadlines()
    >>> deadlines.note((7, 1, 0), 1_000, alone=True); deadlines.note((7, 1, 1), 4_000, alone=False)
    >>> deadlines.note((7, 2, 0), 2_000, alone=True); len(deadlines)
    1
    >>> deadlines.wait_until((7, 1), 900), deadlines.wait_until((7, 1), 4_000), deadlines.wait_until((7, 2), 900)
    (4000, None, None)
    >>> deadlines.note((7, 2, 1), 1_500, alone=False); deadlines.wait_until((7, 2), 900)
    4000
    >>> deadlines.forget((7, 1)); deadlines.wait_until((7, 1), 900)
    """

    __slots__ = ("_bound", "_latest")
    _latest: dict[tuple[int, int], int]
    """(ledger, entry) -> the deadline (ms, untrimmed) an entry with several pending members waits for."""
    _bound: int
    """The latest deadline noted for any member: a bound of every pending member's deadline."""

    def __init__(self) -> None:
        self._latest = {}
        self._bound = -1

    def __len__(self) -> int:
        return len(self._latest)

    def note(self, item: tuple[int, int, int], deadline_ms: int, *, alone: bool) -> None:
        """The batch member *item* is pending until *deadline_ms*; *alone*: no other member of its entry is. O(1)."""
        if deadline_ms > self._bound:
            self._bound = deadline_ms
        if alone:
            return
        entry = item[:2]
        if self._bound > self._latest.get(entry, -1):
            self._latest[entry] = self._bound

    def wait_until(self, entry: tuple[int, int], horizon_ms: int) -> int | None:
        """The deadline *entry* waits for, if later than *horizon_ms* (what the handoff releases now), else None.

        A later deadline can be stale (that member was acked since): the entry then comes
        late, never early. O(1).
        """
        latest = self._latest.get(entry)
        return latest if latest is not None and latest > horizon_ms else None

    def forget(self, entry: tuple[int, int]) -> None:
        """*entry* has no pending member left (handed off, acked). O(1)."""
        self._latest.pop(entry, None)

    def clear(self) -> None:
        """Forget every entry (a reset, a close)."""
        self._latest.clear()
        self._bound = -1
