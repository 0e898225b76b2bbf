"""Argument checks shared by every module: TypeError for a wrong type, ValueError for a bad value."""

from __future__ import annotations

import math

__all__ = ["check_bool", "check_int", "check_seconds"]


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return *value* if it is an int (not a bool) within ``[minimum, maximum]``, else raise.

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
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Return *value* if it is a bool, else raise TypeError."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be bool, not {type(value).__name__}")
    return value


def check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    """Return *value* as a float of seconds: a finite number, > 0 (or >= 0 with *allow_zero*).

    >>> check_seconds("timeout_s", 2, allow_zero=False)
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return seconds
