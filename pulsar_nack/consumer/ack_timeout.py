"""The ack timeout's deadlines of received messages, kept by the consumer in time buckets.

With ``unacked_messages_timeout_ms`` the client redelivers a message the application
has not settled within that time. The C++ client sends a message at its last delivery
(its dead-letter policy's ``max_redeliver_count``) to the dead-letter topic at that
moment, from the copy it kept, without a further receive. The wrapper sends dead letters
itself (:mod:`~pulsar_nack.consumer.dead_letter`), so it needs the same moment:
:class:`AckTimeout` holds a deadline per such message, ``timeout_ms`` after its delivery,
in a :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` of its own (a few bytes a
message, rounded up: never before the timeout), and calls ``expire(keys)`` on its timer
thread when they fall due. The caller checks that each is still unsettled.
"""

from __future__ import annotations

from collections.abc import Callable

from .._validate import check_ms
from ..core.base import DueKeys
from ..core.keys import MessageKey
from ..core.tracker import NegativeAcksTracker

__all__ = ["AckTimeout"]

PRECISION_BITS = 6
"""64 ms buckets: the client's own ack-timeout tick is coarser (1 s by default)."""


class AckTimeout:
    """Deadlines ``timeout_ms`` after each :meth:`start`; ``expire(keys)`` when they fall due.

    Parameters
    ----------
    timeout_ms : int
        The consumer's ``unacked_messages_timeout_ms``.
    expire : callable
        ``expire([key, ...])``, on the timer thread, no lock held; an exception is logged
        and the keys are tried again a second later (the tracker's failure policy).
    """

    timeout_ms: int
    _tracker: NegativeAcksTracker
    _expire: Callable[[list[MessageKey]], None]

    def __init__(self, timeout_ms: int, expire: Callable[[list[MessageKey]], None]) -> None:
        self.timeout_ms = check_ms("timeout_ms", timeout_ms, 1)
        if not callable(expire):
            raise TypeError("expire must be callable")
        self._expire = expire
        self._tracker = NegativeAcksTracker(
            self._due, delay_ms=self.timeout_ms, precision_bits=PRECISION_BITS, round_up=True
        )

    def start(self, key: MessageKey) -> None:
        """The message *key* was delivered now: it expires ``timeout_ms`` from now. O(1)."""
        self._tracker.add(key)

    def _due(self, due: DueKeys) -> None:
        self._expire([key for keys in due.values() for key in keys])

    def __len__(self) -> int:
        return len(self._tracker)

    def close(self) -> None:
        """Stop the timer; pending deadlines are dropped. Idempotent."""
        self._tracker.close(flush=False)
