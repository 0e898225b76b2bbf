"""Redelivery delays: a fixed delay, or exponential backoff by redelivery count.

:class:`MultiplierRedeliveryBackoff` has the meaning of Java's class of the same name:
``min(min_delay_ms * multiplier ** redelivery_count, max_delay_ms)``, and
``min_delay_ms`` for a count of zero or less.

Every delay is an int of milliseconds from 0 to ``MAX_DELAY_MS`` (2**40 ms, about 34.8
years); the constructors raise ``ValueError`` above it, and the trackers refuse a delay
above it from any other backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .._validate import check_int, check_ms, check_number

__all__ = ["FixedDelay", "MultiplierRedeliveryBackoff", "RedeliveryBackoff", "resolve_delay"]


@runtime_checkable
class RedeliveryBackoff(Protocol):
    """Anything with ``next_delay_ms(redelivery_count) -> int`` (ms, 0 to ``MAX_DELAY_MS``)."""

    def next_delay_ms(self, redelivery_count: int) -> int: ...


class FixedDelay:
    """The same delay whatever the redelivery count.

    >>> FixedDelay(500).next_delay_ms(7)
    500
    """

    delay_ms: int

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = check_ms("delay_ms", delay_ms)

    def next_delay_ms(self, redelivery_count: int) -> int:
        """Return ``delay_ms``. O(1)."""
        check_int("redelivery_count", redelivery_count)
        return self.delay_ms

    def __repr__(self) -> str:
        return f"FixedDelay({self.delay_ms})"


class MultiplierRedeliveryBackoff:
    """Exponential backoff: ``min(min_delay_ms * multiplier ** count, max_delay_ms)``.

    Parameters
    ----------
    min_delay_ms : int
        Delay for the first nack (redelivery count 0). Java's default is 10 s.
    max_delay_ms : int
        Upper bound. Java's default is 10 min; at most ``MAX_DELAY_MS``.
    multiplier : float
        Growth per redelivery, ``>= 1``. Default 2.

    >>> b = MultiplierRedeliveryBackoff(min_delay_ms=100, max_delay_ms=1000)
    >>> [b.next_delay_ms(n) for n in range(6)]
    [100, 200, 400, 800, 1000, 1000]
    """

    min_delay_ms: int
    max_delay_ms: int
    multiplier: float

    def __init__(self, min_delay_ms: int = 10_000, max_delay_ms: int = 600_000, multiplier: float = 2.0) -> None:
        self.min_delay_ms = check_ms("min_delay_ms", min_delay_ms)
        self.max_delay_ms = check_ms("max_delay_ms", max_delay_ms)
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError(f"max_delay_ms ({max_delay_ms}) must be >= min_delay_ms ({min_delay_ms})")
        self.multiplier = check_number("multiplier", multiplier, 1)

    def next_delay_ms(self, redelivery_count: int) -> int:
        """Delay before the next redelivery of a message redelivered *count* times. O(1)."""
        count = check_int("redelivery_count", redelivery_count)
        if count <= 0 or self.min_delay_ms == 0:
            return self.min_delay_ms
        try:
            delay = self.min_delay_ms * self.multiplier**count
        except OverflowError:
            return self.max_delay_ms
        return int(min(delay, self.max_delay_ms))

    def __repr__(self) -> str:
        return (
            f"MultiplierRedeliveryBackoff(min_delay_ms={self.min_delay_ms}, "
            f"max_delay_ms={self.max_delay_ms}, multiplier={self.multiplier})"
        )


def resolve_delay(
    delay_ms: int | None, backoff: RedeliveryBackoff | None, fixed_ms: int, count: int | Callable[[], int]
) -> int:
    """The delay of one retry: *delay_ms* if given, else the *backoff*'s for the count, else *fixed_ms*.

    The one statement of the rule, for a nack (the trackers; the C hot path of
    ``core/_speedups.c`` keeps a table of it, checked against this function by
    ``tests/test_speedups.py``), a reconsume (``consumer/retry.py``) and a Spark task's
    retry (``spark/config.py``). *count* is the redelivery count, or a callable that reads
    it (called only when the backoff needs it). Raises TypeError or ValueError for a bad
    *delay_ms* or a backoff delay outside ``0..MAX_DELAY_MS``. O(1).

    >>> resolve_delay(None, None, 60_000, 3), resolve_delay(5, None, 60_000, 3)
    (60000, 5)
    >>> resolve_delay(None, MultiplierRedeliveryBackoff(100, 1_000, 2), 60_000, lambda: 3)
    800
    """
    if delay_ms is not None:
        return check_ms("delay_ms", delay_ms)
    if backoff is None:
        return fixed_ms
    return check_ms("backoff delay_ms", backoff.next_delay_ms(count() if callable(count) else count))
