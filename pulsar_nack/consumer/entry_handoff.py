"""When a batch entry with nacked members goes back to the broker: the batch handoff rule.

The broker redelivers whole entries, and on a Shared or Key_Shared subscription
(:attr:`~pulsar_nack.consumer.subscription.Sharing.SHARED`) it may dispatch a redelivered
entry to any consumer of the subscription, which knows nothing of the nacks the first one
is still holding for the entry's other members and delivers them at once. Nothing but the
broker links the consumers, so the one rule that never delivers a member early there is
to hand an entry off when the *last* of its pending nacked members is due: earlier
members come late, never early, and acked members still never come back. With one active
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
    """The latest deadline of the pending nacked members of each batch entry (on a shared subscription).

    Not thread-safe: the ledger holds its lock around every call.

    >>> deadlines = EntryDeadlines()
    >>> deadlines.note((7, 1, 0), 1_000); deadlines.note((7, 1, 1), 4_000); deadlines.note((7, 1, 2), 2_000)
    >>> deadlines.wait_until((7, 1), 900), deadlines.wait_until((7, 1), 4_000)
    (4000, None)
    >>> deadlines.forget((7, 1)); deadlines.wait_until((7, 1), 900)
    """

    __slots__ = ("_latest",)

    _latest: dict[tuple[int, int], int]
    """(ledger, entry) -> the latest deadline (ms, untrimmed) noted for a member since it had none pending."""

    def __init__(self) -> None:
        self._latest = {}

    def __len__(self) -> int:
        return len(self._latest)

    def note(self, item: tuple[int, int, int], deadline_ms: int) -> None:
        """The batch member *item* is pending until *deadline_ms*. O(1)."""
        entry = item[:2]
        if deadline_ms > self._latest.get(entry, -1):
            self._latest[entry] = deadline_ms

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
