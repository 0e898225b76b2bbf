"""What consumer tasks report, and its aggregate: :class:`TaskStats`, :class:`RunStats`.

:func:`aggregate_task_stats` sums the tasks of a run and pairs each nack with the first
later arrival of the same message on any worker, which gives the retry lateness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

__all__ = ["RunStats", "TaskStats", "aggregate_task_stats"]


class TaskStats(TypedDict):
    """What one consumer task reports (one per Spark task attempt that succeeded).

    Times ending in ``_ms`` are durations; ``*_at_ms`` values are wall-clock
    milliseconds (``time.time() * 1000``), comparable across workers of one machine and,
    on a cluster, as well as the executors' clocks agree.
    """

    partition: int
    attempt: int
    worker_pid: int
    consumer_uid: str
    consumer_created: bool  # this task built the consumer (first task, or a rebuild)
    consumer_tasks: int  # tasks this consumer has served, this one included
    worker_tasks: int  # consumer tasks this worker process has run, this one included
    received: int  # messages handed to the handler
    acked: int
    nacked: int
    redelivered: int  # received with redelivery_count() > 0
    swallowed: int  # batch siblings' copies dropped by the consumer (batch-index state)
    handler_errors: dict[str, int]  # exception type name -> count
    non_retryable: int
    dead_lettered: int
    stop_reason: str  # "max_messages", "max_time", "idle" or "error"
    # The next four are None with tracker="builtin" (the client's tracker is not visible).
    pending_nacks: int | None  # left in this worker's tracker when the task returned
    peak_pending_nacks: int | None
    tracker_memory_bytes: int | None
    peak_tracker_memory_bytes: int | None
    flush_ms: float
    wall_ms: float
    started_at_ms: float
    first_received_at_ms: float | None  # wall-clock ms of this task's first message; None: none came
    nacks: list[tuple[tuple[str, int, int, int], float, float]]  # (key, nacked_at, requested_at)
    arrivals: list[tuple[tuple[str, int, int, int], float, int]]  # (key, arrived_at, count)
    collected: list[Any]


class RunStats(TypedDict):
    """The aggregate of many :class:`TaskStats` (see :func:`aggregate_task_stats`)."""

    tasks: int
    rounds: int
    received: int
    acked: int
    nacked: int
    redelivered: int
    swallowed: int
    handler_errors: dict[str, int]
    non_retryable: int
    dead_lettered: int
    workers: int  # distinct worker processes
    consumers: int  # distinct consumers
    max_tasks_per_consumer: int
    reused_consumers: int  # consumers that served two or more tasks
    consumers_created: int
    peak_pending_nacks: int | None  # the largest per-worker peak; None if no task knew it
    peak_tracker_memory_bytes: int | None
    retries: list[tuple[tuple[str, int, int, int], float, float, float]]  # (key, nacked_at, requested_at, arrived_at)
    unmatched_nacks: int  # nacks with no later arrival recorded (e.g. its task attempt failed)
    lateness_ms: dict[str, float | None]  # arrival - requested: count, min, p50, p99, max
    wall_ms: float
    messages_per_s: float
    collected: list[Any]
    task_stats: list[TaskStats]


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty sequence."""
    index = max(0, math.ceil(fraction * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def _known_max(values: Sequence[int | None]) -> int | None:
    """The largest known value; 0 for no tasks; None if every task reported None.

    >>> _known_max([None, 3, 1]), _known_max([None]), _known_max([])
    (3, None, 0)
    """
    known = [v for v in values if v is not None]
    if known:
        return max(known)
    return None if values else 0


def _match_retries(
    tasks: Sequence[TaskStats],
) -> tuple[list[tuple[tuple[str, int, int, int], float, float, float]], int]:
    """Pair each nack with the first later arrival of the same message, across workers."""
    nacks: dict[tuple[str, int, int, int], list[tuple[float, float]]] = {}
    arrivals: dict[tuple[str, int, int, int], list[float]] = {}
    for task in tasks:
        for key, nacked_at, requested_at in task["nacks"]:
            nacks.setdefault(tuple(key), []).append((nacked_at, requested_at))  # type: ignore[arg-type]  # (keys arrive as lists (JSON/pickle); tuple() of 4 items)
        for key, arrived_at, _count in task["arrivals"]:
            arrivals.setdefault(tuple(key), []).append(arrived_at)  # type: ignore[arg-type]  # (keys arrive as lists (JSON/pickle); tuple() of 4 items)
    retries = []
    unmatched = 0
    for key, events in nacks.items():
        events.sort()
        times = sorted(arrivals.get(key, ()))
        position = 0
        for nacked_at, requested_at in events:
            while position < len(times) and times[position] < nacked_at:
                position += 1
            if position == len(times):
                unmatched += 1
                continue
            retries.append((key, nacked_at, requested_at, times[position]))
            position += 1
    retries.sort(key=lambda r: r[1])
    return retries, unmatched


def aggregate_task_stats(tasks: Sequence[TaskStats], *, wall_ms: float | None = None, rounds: int = 1) -> RunStats:
    """Sum per-task stats; pair nacks with arrivals; compute lateness. O(n log n).

    Retry lateness is ``arrived_at - requested_at`` of each nack paired with the first
    later arrival of the same message (on any worker); negative values are retries
    that came early (up to ``2**precision_bits - 1`` ms by design, more when a worker
    was replaced). It needs tasks run with ``record_timings=True``.

    >>> run = aggregate_task_stats([], wall_ms=1000.0)
    >>> run["tasks"], run["acked"], run["lateness_ms"]["count"]
    (0, 0, 0)
    """
    total = dict.fromkeys(
        ("received", "acked", "nacked", "redelivered", "swallowed", "non_retryable", "dead_lettered"), 0
    )
    errors: dict[str, int] = {}
    per_consumer: dict[str, int] = {}
    created = 0
    collected: list[Any] = []
    for task in tasks:
        for name in total:
            total[name] += task[name]  # type: ignore[literal-required]  # (names are TaskStats' int fields, iterated as str)
        for name, count in task["handler_errors"].items():
            errors[name] = errors.get(name, 0) + count
        per_consumer[task["consumer_uid"]] = max(per_consumer.get(task["consumer_uid"], 0), task["consumer_tasks"])
        created += task["consumer_created"]
        collected.extend(task["collected"])
    retries, unmatched = _match_retries(tasks)
    lateness = sorted(arrived - requested for _, _, requested, arrived in retries)
    if wall_ms is None:
        wall_ms = max((t["started_at_ms"] + t["wall_ms"] for t in tasks), default=0.0) - min(
            (t["started_at_ms"] for t in tasks), default=0.0
        )
    return RunStats(
        tasks=len(tasks),
        rounds=rounds,
        received=total["received"],
        acked=total["acked"],
        nacked=total["nacked"],
        redelivered=total["redelivered"],
        swallowed=total["swallowed"],
        handler_errors=errors,
        non_retryable=total["non_retryable"],
        dead_lettered=total["dead_lettered"],
        workers=len({t["worker_pid"] for t in tasks}),
        consumers=len(per_consumer),
        max_tasks_per_consumer=max(per_consumer.values(), default=0),
        reused_consumers=sum(1 for n in per_consumer.values() if n >= 2),
        consumers_created=created,
        peak_pending_nacks=_known_max([t["peak_pending_nacks"] for t in tasks]),
        peak_tracker_memory_bytes=_known_max([t["peak_tracker_memory_bytes"] for t in tasks]),
        retries=retries,
        unmatched_nacks=unmatched,
        lateness_ms={
            "count": len(lateness),
            "min": round(lateness[0], 1) if lateness else None,
            "p50": round(_percentile(lateness, 0.50), 1) if lateness else None,
            "p99": round(_percentile(lateness, 0.99), 1) if lateness else None,
            "max": round(lateness[-1], 1) if lateness else None,
        },
        wall_ms=round(wall_ms, 1),
        messages_per_s=round(total["acked"] / (wall_ms / 1000), 1) if wall_ms > 0 else 0.0,
        collected=collected,
        task_stats=list(tasks),
    )
