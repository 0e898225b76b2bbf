"""Argument checks shared by every module: TypeError for a wrong type, ValueError for a bad value."""

from __future__ import annotations

__all__ = ["check_int", "check_bool"]


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
