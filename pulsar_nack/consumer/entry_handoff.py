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

No deadline is kept per member or per entry: every pending member's key is in the
tracker, under its own deadline, until it falls due. :class:`ParkedKeys` keeps the due
keys of the entries that wait (*parked*, out of the tracker), and the admission ledger
(:class:`~pulsar_nack.consumer.admission.AdmissionLedger`), at each handoff, takes an
entry's parked keys back whenever any key of the entry falls due
(:meth:`ParkedKeys.take`): the entry goes when every pending member is due or parked,
i.e. when its last pending member's own key falls due. An entry with one nacked member
costs nothing here.
"""

from __future__ import annotations

from ..core.keys import MessageKey

__all__ = ["ParkedKeys"]


class ParkedKeys:
    """The due keys of the batch entries that wait for their other pending members (on a shared subscription).

    Each parked key's message stays pending; its entry's other pending members keep their
    keys in the tracker, so a key of the entry falls due again, at the latest at the last
    member's deadline, and brings the parked keys back into the handoff. A member acked
    meanwhile keeps its key in the tracker (the tracker forgets nothing), so the entry is
    looked at again at that member's deadline at the latest: late, never early.

    Not thread-safe: the ledger holds its lock around every call.

    >>> parked = ParkedKeys()
    >>> parked.park([("t", 7, 1, 0), ("t", 7, 1, 2)]); len(parked), parked.count((7, 1))
    (1, 2)
    >>> parked.take((7, 1)), parked.take((7, 1)), len(parked)
    ([('t', 7, 1, 0), ('t', 7, 1, 2)], [], 0)
    """

    __slots__ = ("_keys",)
    _keys: dict[tuple[int, int], list[MessageKey]]
    """(ledger, entry) -> the due keys of its members that wait, parked."""

    def __init__(self) -> None:
        self._keys = {}

    def __len__(self) -> int:
        """The entries that wait."""
        return len(self._keys)

    def park(self, keys: list[MessageKey]) -> None:
        """Keep the due *keys* (of one entry) until a key of their entry falls due again. O(len(keys))."""
        for key in keys:
            self._keys.setdefault((key[1], key[2]), []).append(key)

    def take(self, entry: tuple[int, int]) -> list[MessageKey]:
        """The parked keys of *entry*, which are no longer parked (empty if none). O(1)."""
        return self._keys.pop(entry, []) if self._keys else []

    def count(self, entry: tuple[int, int]) -> int:
        """How many keys of *entry* are parked. O(1)."""
        return len(self._keys.get(entry, ()))

    def all_keys(self) -> list[MessageKey]:
        """Every parked key (a reset drops them with the tracker's). O(n)."""
        return [key for keys in self._keys.values() for key in keys]

    def clear(self) -> None:
        """Forget every parked key (a reset, a close: their nacks are forgotten with them)."""
        self._keys.clear()
