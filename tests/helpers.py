"""Shared test helpers: waiting on conditions with a deadline (never bare sleeps), pure-Python trackers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from pulsar_nack import NegativeAcksTracker, _accel


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll *condition* until it is truthy; return its final truthiness after *timeout_s*."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """Trackers built inside use no C code, as with ``PULSAR_NACK_PURE_PYTHON=1``."""
    with mock.patch.object(_accel, "HotSlot", _accel.PyHotSlot), mock.patch.object(_accel, "FastAdd", None):
        yield


class PurePythonTracker(NegativeAcksTracker):
    """A NegativeAcksTracker without the C hot path (the same code as a build without a compiler)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with pure_python():
            super().__init__(*args, **kwargs)
        assert type(self._buckets._hot) is _accel.PyHotSlot and "add" not in vars(self)
