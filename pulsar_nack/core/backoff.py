"""Redelivery delays: a fixed delay, or exponential backoff by redelivery count, with jitter.

:class:`MultiplierRedeliveryBackoff` has the meaning of Java's class of the same name:
``min(min_delay_ms * multiplier ** redelivery_count, max_delay_ms)``, and
``min_delay_ms`` for a count of zero or less.

Every delay is an int of milliseconds from 0 to ``MAX_DELAY_MS`` (2**40 ms, about 34.8
years); the constructors raise ``ValueError`` above it, and the trackers refuse a delay
above it from any other backoff.

Jitter
------
Both classes take ``jitter`` (0 to 1, default 0) and ``rng`` (a :class:`random.Random`,
for seeded tests). With jitter, each delay *d* (the delay without jitter) becomes a
uniform draw from ``[d, d * (1 + jitter)]`` (whole ms; for the multiplier, at most
``max_delay_ms``). The floor is *d* itself: a message never comes back earlier than it
would without jitter, and ``min_delay_ms`` stays the least delay. That is AWS's "full
jitter" (``jitter=1``: a spread as wide as the delay) or "equal jitter" (``0.5``) moved
above the delay instead of below it, where it would break the floor. Messages that fail
together then come back spread over ``jitter * d``; once spread they stay spread, even
at ``max_delay_ms`` where a later draw has no room.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .._validate import MAX_DELAY_MS, check_int, check_ms, check_number

__all__ = ["FixedDelay", "MultiplierRedeliveryBackoff", "RedeliveryBackoff", "resolve_delay"]


@runtime_checkable
class RedeliveryBackoff(Protocol):
    """Anything with ``next_delay_ms(redelivery_count) -> int`` (ms, 0 to ``MAX_DELAY_MS``)."""

    def next_delay_ms(self, redelivery_count: int) -> int: ...


class _Jitter:
    """The spread drawn above a delay: one rule for both backoff classes."""

    __slots__ = ("fraction", "rng")

    fraction: float
    rng: random.Random

    def __init__(self, jitter: float, rng: random.Random | None) -> None:
        fraction = check_number("jitter", jitter, 0)
        if fraction > 1:
            raise ValueError(f"jitter must be <= 1, got {jitter!r}")
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a random.Random or None, not {type(rng).__name__}")
        self.fraction = fraction
        self.rng = random.Random() if rng is None else rng

    def draw(self, delay_ms: int, ceiling_ms: int) -> int:
        """A whole-ms delay uniform in ``[delay_ms, min(delay_ms * (1 + fraction), ceiling_ms)]``."""
        if not self.fraction:
            return delay_ms
        top = min(int(delay_ms * (1 + self.fraction)), ceiling_ms)
        return self.rng.randint(delay_ms, max(top, delay_ms))


class FixedDelay:
    """The same delay whatever the redelivery count, optionally with jitter.

    Parameters
    ----------
    delay_ms : int
        The delay, and the floor with jitter.
    jitter : float
        0 (default) to 1: each delay is drawn uniformly from
        ``[delay_ms, delay_ms * (1 + jitter)]`` (see the module's "Jitter").
    rng : random.Random, optional
        The source of the draws (seed one for tests); a fresh ``random.Random()`` if None.

    >>> FixedDelay(500).next_delay_ms(7)
    500
    >>> import random
    >>> 500 <= FixedDelay(500, jitter=0.5, rng=random.Random(1)).next_delay_ms(0) <= 750
    True
    """

    delay_ms: int
    _jitter: _Jitter

    def __init__(self, delay_ms: int, jitter: float = 0.0, rng: random.Random | None = None) -> None:
        self.delay_ms = check_ms("delay_ms", delay_ms)
        self._jitter = _Jitter(jitter, rng)

    @property
    def jitter(self) -> float:
        """The jitter fraction (0 to 1)."""
        return self._jitter.fraction

    def next_delay_ms(self, redelivery_count: int) -> int:
        """Return ``delay_ms``, or a draw above it with jitter. O(1)."""
        check_int("redelivery_count", redelivery_count)
        return self._jitter.draw(self.delay_ms, MAX_DELAY_MS)

    def __repr__(self) -> str:
        tail = f", jitter={self.jitter}" if self.jitter else ""
        return f"FixedDelay({self.delay_ms}{tail})"


class MultiplierRedeliveryBackoff:
    """Exponential backoff: ``min(min_delay_ms * multiplier ** count, max_delay_ms)``, optionally with jitter.

    Parameters
    ----------
    min_delay_ms : int
        Delay for the first nack (redelivery count 0). Java's default is 10 s.
    max_delay_ms : int
        Upper bound. Java's default is 10 min; at most ``MAX_DELAY_MS``.
    multiplier : float
        Growth per redelivery, ``>= 1``. Default 2.
    jitter : float
        0 (default) to 1: each delay *d* above is drawn uniformly from
        ``[d, min(d * (1 + jitter), max_delay_ms)]``; *d* is the floor (see the module's
        "Jitter"). Java's class has none.
    rng : random.Random, optional
        The source of the draws (seed one for tests); a fresh ``random.Random()`` if None.

    >>> b = MultiplierRedeliveryBackoff(min_delay_ms=100, max_delay_ms=1000)
    >>> [b.next_delay_ms(n) for n in range(6)]
    [100, 200, 400, 800, 1000, 1000]
    >>> import random
    >>> j = MultiplierRedeliveryBackoff(100, 1000, jitter=1.0, rng=random.Random(7))
    >>> all(d <= j.next_delay_ms(n) <= min(2 * d, 1000) for n, d in enumerate([100, 200, 400, 800]))
    True
    """

    min_delay_ms: int
    max_delay_ms: int
    multiplier: float
    _jitter: _Jitter

    def __init__(
        self,
        min_delay_ms: int = 10_000,
        max_delay_ms: int = 600_000,
        multiplier: float = 2.0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        self.min_delay_ms = check_ms("min_delay_ms", min_delay_ms)
        self.max_delay_ms = check_ms("max_delay_ms", max_delay_ms)
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError(f"max_delay_ms ({max_delay_ms}) must be >= min_delay_ms ({min_delay_ms})")
        self.multiplier = check_number("multiplier", multiplier, 1)
        self._jitter = _Jitter(jitter, rng)

    @property
    def jitter(self) -> float:
        """The jitter fraction (0 to 1)."""
        return self._jitter.fraction

    def floor_delay_ms(self, redelivery_count: int) -> int:
        """The delay without jitter, the least :meth:`next_delay_ms` returns. O(1)."""
        count = check_int("redelivery_count", redelivery_count)
        if count <= 0 or self.min_delay_ms == 0:
            return self.min_delay_ms
        try:
            delay = self.min_delay_ms * self.multiplier**count
        except OverflowError:
            return self.max_delay_ms
        return int(min(delay, self.max_delay_ms))

    def next_delay_ms(self, redelivery_count: int) -> int:
        """Delay before the next redelivery of a message redelivered *count* times. O(1)."""
        return self._jitter.draw(self.floor_delay_ms(redelivery_count), self.max_delay_ms)

    def __repr__(self) -> str:
        tail = f", jitter={self.jitter}" if self.jitter else ""
        return (
            f"MultiplierRedeliveryBackoff(min_delay_ms={self.min_delay_ms}, "
            f"max_delay_ms={self.max_delay_ms}, multiplier={self.multiplier}{tail})"
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
