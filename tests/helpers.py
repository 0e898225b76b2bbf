"""Shared test helpers: waiting on conditions with a deadline (never bare sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll *condition* until it is truthy; return its final truthiness after *timeout_s*."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())
