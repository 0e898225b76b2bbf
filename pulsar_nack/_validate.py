"""Argument checks shared by every module: TypeError for a wrong type, ValueError for a bad value.

This is the only module that checks ints, milliseconds, seconds and topic lists; every
other module calls it, so the same bad argument raises the same error everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "MAX_DELAY_MS",
    "check_bool",
    "check_int",
    "check_ms",
    "check_name",
    "check_number",
    "check_optional_int",
    "check_properties",
    "check_seconds",
    "check_topics",
]

MAX_DELAY_MS = 2**40
"""Upper bound of every delay and time span in milliseconds (about 34.8 years).

Per-call delays, fixed delays, backoff delays, retry delays and timer spacings above it
raise ``ValueError``. It keeps every deadline (monotonic now + delay) far inside a
signed 64-bit int and every wait a finite float.
"""


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return *value* if it is an int (not a bool) within ``[minimum, maximum]``, else raise. O(1).

    >>> check_int("delay_ms", 5, 0)
    5
    >>> check_int("delay_ms", -1, 0)
    Traceback (most recent call last):
    ...
    ValueError: delay_ms must be >= 0, got -1
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {_short(value)}")
    return int(value)


def check_optional_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int | None:
    """:func:`check_int`, or None for None. O(1).

    >>> check_optional_int("max_redeliveries", None, 0) is None
    True
    """
    if value is None:
        return None
    return check_int(name, value, minimum, maximum)


def check_ms(name: str, value: object, minimum: int = 0) -> int:
    """Return *value* if it is an int of milliseconds in ``[minimum, MAX_DELAY_MS]``, else raise. O(1).

    >>> check_ms("delay_ms", 2**41)
    Traceback (most recent call last):
    ...
    ValueError: delay_ms must be <= 1099511627776, got 2199023255552
    """
    return check_int(name, value, minimum, MAX_DELAY_MS)


def check_number(name: str, value: object, minimum: float) -> float:
    """Return *value* as a float if it is a finite int or float ``>= minimum``, else raise. O(1).

    >>> check_number("multiplier", 2, 1)
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    number = _finite_float(value)
    if number is None or number < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {_short(value)}")
    return number


def check_bool(name: str, value: object) -> bool:
    """Return *value* if it is a bool, else raise TypeError. O(1)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be bool, not {type(value).__name__}")
    return value


def check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    """Return *value* as a float of seconds: a finite number, > 0 (or >= 0 with *allow_zero*). O(1).

    >>> check_seconds("timeout_s", 2, allow_zero=False)
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = _finite_float(value)
    if seconds is None or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {_short(value)}")
    return seconds


def check_name(name: str, value: object) -> str:
    """Return *value* if it is a non-empty str, else raise (a subscription name, say). O(1).

    >>> check_name("subscription_name", "billing")
    'billing'
    >>> check_name("subscription_name", "")
    Traceback (most recent call last):
    ...
    ValueError: subscription_name must be a non-empty str, got ''
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty str, got ''")
    return value


def check_topics(name: str, value: object) -> list[str]:
    """Return one topic name or a list/tuple of them as a list, else raise. O(n).

    Raises
    ------
    TypeError
        If *value* is neither a str nor a list or tuple, or holds something not a str.
    ValueError
        If the list is empty or a name is empty.

    >>> check_topics("topics", "orders"), check_topics("topics", ("a", "b"))
    (['orders'], ['a', 'b'])
    >>> check_topics("topics", [])
    Traceback (most recent call last):
    ...
    ValueError: topics must name at least one topic
    """
    topics = [value] if isinstance(value, str) else value
    if not isinstance(topics, (list, tuple)):
        raise TypeError(f"{name} must be a topic name or a list of topic names, not {type(value).__name__}")
    for topic in topics:
        if not isinstance(topic, str):
            raise TypeError(f"{name} must hold topic names (str), not {type(topic).__name__}")
    if not topics:
        raise ValueError(f"{name} must name at least one topic")
    if not all(topics):
        raise ValueError(f"{name} must not hold an empty topic name")
    return list(topics)


def check_properties(name: str, value: object) -> None:
    """Raise TypeError unless *value* is None or a mapping of str to str (message properties). O(n).

    >>> check_properties("properties", {"a": 1})
    Traceback (most recent call last):
    ...
    TypeError: properties must map str to str
    """
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, not {type(value).__name__}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError(f"{name} must map str to str")


def _finite_float(value: float) -> float | None:
    """*value* as a finite float, or None (an infinity, a NaN, an int beyond the float range)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _short(value: object) -> str:
    """A value for an error message: huge ints (``2**1100``) by their size only."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    return repr(value)
