"""Waiting on a condition with a deadline: the one polling loop the tests, the fault
scenarios and the benchmarks share (never "sleep to be safe")."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(condition: Callable[[], object], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll *condition* every *poll_s* until it holds or *timeout_s* passes; its final truth.

    >>> wait_until(lambda: True, 0.1)
    True
    >>> wait_until(lambda: False, 0.01, poll_s=0.005)
    False
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())
