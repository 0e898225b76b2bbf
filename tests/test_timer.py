"""DeadlineTimer: wakes for the earliest deadline only, idles silently, survives errors."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from helpers import wait_for
from pulsar_nack.core.timer import DeadlineTimer, monotonic_ms


class Recorder:
    def __init__(self, following=None):
        self.calls: list[int] = []
        self.following = following
        self.event = threading.Event()

    def __call__(self, now: int):
        self.calls.append(now)
        self.event.set()
        return self.following() if self.following else None


def test_fires_at_the_deadline_not_before():
    rec = Recorder()
    timer = DeadlineTimer(rec)
    try:
        deadline = monotonic_ms() + 150
        timer.request(deadline)
        assert rec.event.wait(10)
        assert rec.calls[0] >= deadline
        assert timer.last_lateness_ms is not None and timer.last_lateness_ms >= 0
    finally:
        timer.close()


def test_earlier_request_wakes_it_and_later_requests_never_postpone():
    rec = Recorder()
    timer = DeadlineTimer(rec)
    try:
        now = monotonic_ms()
        timer.request(now + 60_000)
        timer.request(now + 200)  # earlier: re-plans
        for i in range(50):
            timer.request(now + 300 + i)  # later: ignored
        assert timer.next_deadline == now + 200
        assert rec.event.wait(10)
        assert now + 200 <= rec.calls[0] < now + 60_000
    finally:
        timer.close()


def test_lead_fires_early():
    rec = Recorder()
    timer = DeadlineTimer(rec, lead_ms=5_000)
    try:
        deadline = monotonic_ms() + 5_100
        timer.request(deadline)
        assert rec.event.wait(10)
        assert deadline - 5_000 <= rec.calls[0] < deadline
    finally:
        timer.close()


def test_callback_return_value_is_the_next_deadline():
    fires: list[int] = []

    def on_due(now: int):
        fires.append(now)
        return now + 20 if len(fires) < 3 else None

    timer = DeadlineTimer(on_due)
    try:
        timer.request(monotonic_ms())
        assert wait_for(lambda: len(fires) == 3)
        assert timer.wait_idle(10)
        assert len(fires) == 3 and timer.next_deadline is None
    finally:
        timer.close()


def watch_wakeups(timer: DeadlineTimer, seconds: float) -> int:
    """Largest wakeup count seen while watching the timer for *seconds*."""
    end = time.monotonic() + seconds
    seen = timer.wakeups
    while time.monotonic() < end:
        seen = max(seen, timer.wakeups)
        time.sleep(0.02)
    return max(seen, timer.wakeups)


def test_no_wakeups_when_idle_or_far_future():
    timer = DeadlineTimer(Recorder())
    try:
        # Nothing requested: the thread blocks without a timeout.
        assert watch_wakeups(timer, 0.5) == 0
        # A far-future request wakes it at most once, to re-plan; a poller would keep waking.
        timer.request(monotonic_ms() + 3_600_000)
        assert watch_wakeups(timer, 1.0) <= 1
        assert timer.fires == 0
    finally:
        timer.close()


def test_callback_exception_is_logged_and_timer_lives_on(caplog):
    calls: list[int] = []

    def on_due(now: int):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return

    timer = DeadlineTimer(on_due)
    try:
        with caplog.at_level(logging.ERROR, logger="pulsar_nack.core.timer"):
            timer.request(monotonic_ms())
            assert wait_for(lambda: len(calls) == 1)
            assert wait_for(lambda: any("boom" in (r.exc_text or "") or r.exc_info for r in caplog.records))
        timer.request(monotonic_ms())
        assert wait_for(lambda: len(calls) == 2)
        assert timer.is_alive()
    finally:
        timer.close()


def test_close_is_idempotent_and_joins():
    timer = DeadlineTimer(Recorder())
    timer.request(monotonic_ms() + 60_000)
    timer.close()
    assert not timer.is_alive() and timer.closed
    timer.close()
    assert not timer.is_alive()


def test_close_from_the_callback_does_not_deadlock():
    holder: list[DeadlineTimer] = []
    done = threading.Event()

    def on_due(now: int):
        holder[0].close()
        done.set()
        return

    holder.append(DeadlineTimer(on_due))
    holder[0].request(monotonic_ms())
    assert done.wait(10)
    assert wait_for(lambda: not holder[0].is_alive())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"lead_ms": -1}, ValueError), ({"lead_ms": 1.5}, TypeError), ({"clock": 5}, TypeError)],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        DeadlineTimer(lambda now: None, **kwargs)
    with pytest.raises(TypeError):
        DeadlineTimer(None)  # type: ignore[arg-type]


def test_min_gap_spaces_fires_without_dropping_deadlines():
    fires: list[int] = []
    timer = DeadlineTimer(fires.append, min_gap_ms=100)
    try:
        timer.request(monotonic_ms())
        assert wait_for(lambda: len(fires) == 1)
        timer.request(monotonic_ms())  # due at once, but within the gap: waits for it
        assert wait_for(lambda: len(fires) == 2)
        assert fires[1] - fires[0] >= 100
    finally:
        timer.close()
