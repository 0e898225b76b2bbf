"""The task runner: one consumer task on this worker's consumer, and its Spark wrapper.

:func:`consume_partition` receives, calls the handler, acks, nacks or dead-letters per
:func:`~pulsar_nack.spark.policy.retry_action`, flushes its acks and returns
:class:`~pulsar_nack.spark.TaskStats`. :func:`consumer_task` wraps it for
``rdd.mapPartitions`` / ``rdd.foreachPartition``. The loop itself is :class:`_TaskRun`.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .._validate import check_ms
from ..core.keys import message_key
from ..timing import (
    DURABLE_GRACE_S,
    HARVEST_TIMEOUT_S,
    HELD_GRACE_S,
    HOUSEKEEPING_S,
    RECONNECT_POLL_S,
    RESUBSCRIBE_WAIT_S,
)
from .config import ConsumerConfig, TaskBudget
from .policy import retry_action
from .registry import Entry, acquire, discard, next_worker_task
from .stats import TaskStats

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..consumer import NackingConsumer
    from .builtin import BuiltinNackConsumer

__all__ = ["consume_partition", "consumer_task"]

_log = logging.getLogger(__name__)

_COUNTERS = ("received", "acked", "nacked", "redelivered")

Key = tuple[str, int, int, int]


def _message_key(message: Any) -> Key:
    """``(topic, ledger, entry, batch index)`` of a message; of its first message for a retry copy."""
    if callable(getattr(message, "retry_topic_name", None)):  # a RetryMessage (retries="durable")
        from ..consumer.retry import origin_key

        key = origin_key(message)
        if key is not None:
            return key
    return message_key(message)


def _tracker_sample(tracker: Any) -> tuple[int | None, int | None]:
    """(pending nacks, memory bytes) of *tracker*; (None, None) for the built-in's."""
    if tracker is None:
        return None, None
    stats = tracker.stats()
    return stats["pending_messages"], stats["memory_bytes"]


def _peak(a: int | None, b: int | None) -> int | None:
    """The larger of two samples; None when neither is known."""
    return b if a is None else a if b is None else max(a, b)


def _flush_acks(consumer: NackingConsumer | BuiltinNackConsumer, last_ack: float | None, flush_ms: int) -> float:
    """Make sure the client has sent the grouped acks; return the time spent in ms.

    There is no flush in pulsar-client 3.13: the acks go out on the client's 100 ms
    grouping timer. Wait until *flush_ms* have passed since the last ack, then make a
    request/response round trip on the consumer so they are on the wire.
    """
    start = time.monotonic()
    if flush_ms == 0 or last_ack is None:
        # Nothing acked. (And no round trip: a broker may answer get_last_message_id
        # on an empty topic with an error, which the client logs.)
        return 0.0
    remaining = last_ack + flush_ms / 1000 - start
    if remaining > 0:
        time.sleep(remaining)  # the client's ack-grouping period: nothing to poll
    try:
        if consumer.is_connected():  # a broken connection would block for the operation timeout
            consumer.get_last_message_id()
    except Exception:  # e.g. not supported by a multi-topic consumer: the wait did it
        _log.debug("round trip after the ack flush failed", exc_info=True)
    return (time.monotonic() - start) * 1000


def _dead_letter(entry: Entry, config: ConsumerConfig, message: Any, error: BaseException) -> None:
    """Send *message* to its dead-letter topic and wait until it is stored (the one sender, as the consumers)."""
    from ..consumer.dead_letter import DeadLetter

    if entry.dead_letter is None:
        entry.dead_letter = DeadLetter(entry.client, config.subscription)
    entry.dead_letter.send(message, topic=config.dead_letter_topic, properties=_error_property(error))


def _error_property(error: BaseException) -> dict[str, str]:
    """What a dead letter of the task says of the handler's exception."""
    return {"PULSAR_NACK_ERROR": f"{type(error).__name__}: {error}"[:1000]}


def _task_context() -> tuple[int, int]:
    """(partition id, attempt number) inside a Spark task, else (-1, 0)."""
    if "pyspark" not in sys.modules:
        return -1, 0
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except Exception:
        return -1, 0
    if context is None:
        return -1, 0
    return context.partitionId(), context.attemptNumber()


def retry_grace_s(config: ConsumerConfig, delay_ms: int, message: Any) -> float:
    """How long after its due time a task waits for a durable retry it scheduled (see :data:`~pulsar_nack.timing.DURABLE_GRACE_S`).

    The held grace for a retry the consumers hold (:func:`~pulsar_nack.consumer.retry.is_held`,
    the consumers' own rule), the broker's otherwise. O(1) (a payload's length).
    """
    from ..consumer.retry import is_held  # loaded already: a durable retry has a NackingConsumer

    return HELD_GRACE_S if is_held(delay_ms, config.retry_hold_ms, len(message.data())) else DURABLE_GRACE_S


class _TaskTallies:
    """What one consumer task records for its stats: counters, peaks, timings, progress reports.

    Every call is O(1) (a progress report calls the callback).
    """

    def __init__(self, options: dict[str, Any], start: float, tracker: Any) -> None:
        self.record_timings: bool = options.get("record_timings", False)
        self.collect: Callable[[Any], Any] | None = options.get("collect")
        self.progress: Callable[[dict[str, int]], None] | None = options.get("progress")
        self.progress_every = options.get("progress_interval_ms", 500) / 1000
        self.next_progress = start + self.progress_every
        self.partition, self.attempt = _task_context()
        self.started_at_ms = time.time() * 1000
        self.first_received_at_ms: float | None = None
        self.counts = dict.fromkeys(("received", "acked", "nacked", "redelivered", "non_retryable", "dead_lettered"), 0)
        self.reported = dict.fromkeys(_COUNTERS, 0)
        self.handler_errors: dict[str, int] = {}
        self.nacks: list[tuple[Key, float, float]] = []
        self.arrivals: list[tuple[Key, float, int]] = []
        self.retry_stages: list[tuple[int | None, int | None, float]] = []  # durable: (due, at the consumer, handed over)
        self.collected: list[Any] = []
        self.peak_pending: int | None = None if tracker is None else len(tracker)
        self.peak_memory: int | None = None if tracker is None else 0

    def received(self, message: Any, count: int, durable: bool) -> None:
        """A message reached the task (its redelivery count *count*)."""
        if not self.counts["received"]:
            self.first_received_at_ms = time.time() * 1000
        self.counts["received"] += 1
        if not count:
            return
        self.counts["redelivered"] += 1
        if self.record_timings:
            arrived = time.time() * 1000
            self.arrivals.append((_message_key(message), arrived, count))
            if durable and callable(getattr(message, "due_at_ms", None)):
                self.retry_stages.append((message.due_at_ms(), message.arrived_at_ms, arrived))

    def handler_failed(self, error: BaseException) -> None:
        """The handler raised *error* (an ``Exception`` is counted by its class name)."""
        if isinstance(error, Exception):
            name = type(error).__name__
            self.handler_errors[name] = self.handler_errors.get(name, 0) + 1

    def retried(self, message: Any, called_ms: float, delay_ms: Callable[[], int]) -> None:
        """A retry of *message* asked at *called_ms* (epoch ms); *delay_ms* reads its delay (only when timings are recorded)."""
        self.counts["nacked"] += 1
        if self.record_timings:
            self.nacks.append((_message_key(message), called_ms, called_ms + delay_ms()))

    def handled(self, message: Any) -> None:
        """The handler returned: collect what the caller asked for."""
        if self.collect is not None:
            self.collected.append(self.collect(message))

    def sample(self, pending: int | None, memory: int | None) -> None:
        """Keep the peaks of the tracker's size and memory."""
        self.peak_memory = _peak(self.peak_memory, memory)
        self.peak_pending = _peak(self.peak_pending, pending)

    def report(self, now: float | None = None) -> None:
        """Hand the counts since the last report to the progress callback, if any (with *now*: when due)."""
        if now is not None:
            if now < self.next_progress:
                return
            self.next_progress = now + self.progress_every
        delta = {k: self.counts[k] - self.reported[k] for k in _COUNTERS}
        self.reported.update({k: self.counts[k] for k in _COUNTERS})
        if self.progress is not None and any(delta.values()):
            try:
                self.progress({**delta, "pid": os.getpid()})
            except Exception:
                _log.warning("progress callback failed", exc_info=True)


class _TaskRun:
    """One consumer task: its consumer, its budget, and the receive-handle-settle loop (its tallies: :class:`_TaskTallies`).

    Every step is O(1) apart from the handler and the client calls; ``run`` is
    O(messages received).
    """

    def __init__(self, config: ConsumerConfig, handler: Callable[[Any], object], budget: TaskBudget, options: dict[str, Any]) -> None:
        self.config, self.handler, self.budget = config, handler, budget
        self.start = time.monotonic()
        self.entry, self.created = acquire(config)
        self.entry.tasks += 1
        self.worker_tasks = next_worker_task()
        self.consumer: NackingConsumer | BuiltinNackConsumer = self.entry.consumer
        self.tracker = self.consumer.tracker  # None with tracker="builtin"
        self.tallies = _TaskTallies(options, self.start, self.tracker)
        self.durable = config.retries == "durable"
        self.reconsumes: list[tuple[concurrent.futures.Future[str], Any]] = []  # not yet stored
        self.swallowed_before = self.consumer.stats()["swallowed"]
        self.last_ack: float | None = None
        self.end = math.inf if budget.max_time_ms is None else self.start + budget.max_time_ms / 1000
        self.next_housekeeping = self.start
        self.stop_reason = "error"
        self.flush_ms = 0.0
        self.resubscribe_wait_s = float(config.client_options.get("operation_timeout_seconds", RESUBSCRIBE_WAIT_S))

    # -- the loop ------------------------------------------------------------------

    def run(self) -> TaskStats:
        """Receive and handle until the budget says stop; flush; return the stats."""
        failed = True
        try:
            self._loop()
            failed = False
        finally:
            if failed:
                # The task fails, and PySpark replaces a worker after a failed task.
                # Close the consumer now (acks are flushed on close; pending retries
                # and prefetched messages go back to the subscription at once).
                flush_start = time.monotonic()
                discard(self.config.key, self.entry)
                self.flush_ms = (time.monotonic() - flush_start) * 1000
            else:
                self._harvest(wait=True)
                self.flush_ms = _flush_acks(self.consumer, self.last_ack, self.config.ack_flush_ms)
            self.tallies.report()
        return self._stats()

    def _loop(self) -> None:
        import pulsar

        budget, receive_timeout = self.budget, self.config.receive_timeout_ms
        last_busy = time.monotonic()  # idle from here: subscribing (in __init__) may take seconds
        while True:
            now = time.monotonic()
            self._housekeeping(now)
            if budget.max_messages is not None and self.tallies.counts["received"] >= budget.max_messages:
                self.stop_reason = "max_messages"
                return
            if now >= self.end:
                self.stop_reason = "max_time"
                return
            if not self._connected(now):
                # Its broker is away (a failover). What the receive queue still holds came over
                # the old connection: the client drops it when it reconnects, and the broker
                # redelivers it, maybe to another executor's consumer; handled now, its ack
                # would reach the broker after that redelivery, and the message be handled twice.
                last_busy = now  # not idle: the messages are still there
                time.sleep(RECONNECT_POLL_S)
                continue
            timeout = receive_timeout if self.end == math.inf else max(1, min(receive_timeout, int((self.end - now) * 1000)))
            try:
                message = self.consumer.receive(timeout)
            except pulsar.Timeout:
                now = time.monotonic()
                if budget.drain_pending and self.tracker is not None and len(self.tracker):
                    last_busy = now  # a nack comes back after its handoff: idle counts from then
                elif budget.drain_pending and self._pending_retries(now):
                    continue  # a durable retry not yet due (+ grace): the idle time runs meanwhile
                elif not self._connected(now):
                    last_busy = now  # its broker is away (a failover): not idle, the messages are still there
                elif now - self._idle_from(last_busy) >= budget.idle_timeout_ms / 1000:
                    self.stop_reason = "idle"
                    return
                continue
            last_busy = now
            self.entry.resumed_at = None  # the broker dispatches to it: the subscribe was answered
            self._handle(message)

    def _connected(self, now: float) -> bool:
        """Whether the consumer is connected; notes on its entry when it is away and when it is back (:meth:`_idle_from`). O(1)."""
        entry = self.entry
        if not self.consumer.is_connected():
            entry.resumed_at = math.inf
            return False
        if entry.resumed_at == math.inf:
            entry.resumed_at = now  # back; its subscribe may not be answered yet
        return True

    def _idle_from(self, last_busy: float) -> float:
        """When the task's idle time began: at *last_busy*, or after a reconnect not yet followed by a message,
        at the reconnect plus :data:`~pulsar_nack.timing.RESUBSCRIBE_WAIT_S` (the client's operation timeout).

        The client reports the consumer connected before the broker has answered its subscribe, and the
        broker sends nothing until then: a task that counted that wait as idle could end (and a run with
        ``until_drained`` stop) with the whole backlog left. O(1).
        """
        resumed = self.entry.resumed_at
        return last_busy if resumed is None else max(last_busy, resumed + self.resubscribe_wait_s)

    def _handle(self, message: Any) -> None:
        """Call the handler on one message and settle it: ack, nack, dead-letter or raise."""
        count = message.redelivery_count()
        self.tallies.received(message, count, self.durable)
        try:
            self.handler(message)
        except BaseException as error:
            self._failed(message, count, error)
            return
        self._ack(message)
        self.tallies.handled(message)

    def _failed(self, message: Any, count: int, error: BaseException) -> None:
        """Settle a message whose handler raised, per :func:`retry_action`."""
        self.tallies.handler_failed(error)
        action = retry_action(self.config, error, count)
        if action == "retry":
            self._retry(message, count)
            return
        if isinstance(error, Exception):
            self.tallies.counts["non_retryable"] += 1
        if action == "raise":
            self._nack(message, count)
            raise error
        if action == "dead_letter" and self.durable:
            # Retries go through the retry letter topic: the consumer's reject sends the dead
            # letter where a reconsume past the limit would (Java's topic and form), then acks.
            self.consumer.reject(message, properties=_error_property(error))  # type: ignore[union-attr]  # (durable needs tracker="ours": a NackingConsumer)
            self.tallies.counts["dead_lettered"] += 1
            self._count_ack()
            return
        if action == "dead_letter":
            _dead_letter(self.entry, self.config, message, error)
            self.tallies.counts["dead_lettered"] += 1
        self._ack(message)

    def _ack(self, message: Any) -> None:
        self.consumer.acknowledge(message)
        self._count_ack()

    def _count_ack(self) -> None:
        self.tallies.counts["acked"] += 1
        self.last_ack = time.monotonic()

    def _nack(self, message: Any, count: int) -> None:
        self.consumer.negative_acknowledge(message)
        self.tallies.retried(message, time.time() * 1000, lambda: self.config.retry_delay_ms(count))
        if self.tracker is not None:
            self.tallies.sample(len(self.tracker), None)

    def _retry(self, message: Any, count: int) -> None:
        """Retry later: a nack, or with ``retries="durable"`` a reconsume (its ack follows the stored copy)."""
        if not self.durable:
            self._nack(message, count)
            return
        delay = self.config.retry_delay_ms(count)
        called_ms = time.time() * 1000  # before the call: the copy's due time counts from its send
        future = self.consumer.reconsume_later_async(message, delay)  # type: ignore[union-attr]  # (durable needs tracker="ours": a NackingConsumer)
        self.reconsumes.append((future, message))
        heapq.heappush(self.entry.retry_dues, time.monotonic() + delay / 1000 + retry_grace_s(self.config, delay, message))
        self.tallies.retried(message, called_ms, lambda: delay)

    def _harvest(self, wait: bool) -> None:
        """Settle finished reconsumes (all of them with *wait*): a failed one is nacked instead."""
        pending = []
        for future, message in self.reconsumes:
            if wait:
                concurrent.futures.wait([future], timeout=HARVEST_TIMEOUT_S)
            if not future.done():
                pending.append((future, message))
                continue
            if future.exception() is None:
                self.last_ack = time.monotonic()
                continue
            _log.warning("reconsume failed (%s); nacking the message instead", future.exception())
            try:
                self.consumer.negative_acknowledge(message)
            except Exception:  # the consumer is gone: the message is unacked, it comes back
                _log.debug("nack after a failed reconsume failed", exc_info=True)
        self.reconsumes = pending

    def _pending_retries(self, now: float) -> int:
        """Retries this worker waits for: nacks in its tracker, and durable retries not yet due (+ grace)."""
        pending = len(self.tracker) if self.tracker is not None else 0
        dues = self.entry.retry_dues
        while dues and dues[0] < now:
            heapq.heappop(dues)
        return pending + len(dues)

    # -- bookkeeping ---------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        """Every 200 ms: sample the tracker's size and memory; report progress when due."""
        if now < self.next_housekeeping:
            return
        if self.reconsumes:
            self._harvest(wait=False)
        pending, memory = _tracker_sample(self.tracker)
        if self.durable:
            pending = self._pending_retries(now)
        self.tallies.sample(pending, memory)
        self.next_housekeeping = now + HOUSEKEEPING_S
        self.tallies.report(now)

    def _stats(self) -> TaskStats:
        pending, memory = _tracker_sample(self.tracker)
        if self.durable:
            pending = self._pending_retries(time.monotonic())
        tallies = self.tallies
        counts = tallies.counts
        return TaskStats(
            partition=tallies.partition,
            attempt=tallies.attempt,
            worker_pid=os.getpid(),
            consumer_uid=self.entry.uid,
            consumer_created=self.created,
            consumer_tasks=self.entry.tasks,
            worker_tasks=self.worker_tasks,
            received=counts["received"],
            acked=counts["acked"],
            nacked=counts["nacked"],
            redelivered=counts["redelivered"],
            swallowed=self.consumer.stats()["swallowed"] - self.swallowed_before,
            handler_errors=tallies.handler_errors,
            non_retryable=counts["non_retryable"],
            dead_lettered=counts["dead_lettered"],
            stop_reason=self.stop_reason,
            pending_nacks=pending,
            peak_pending_nacks=_peak(tallies.peak_pending, pending),
            tracker_memory_bytes=memory,
            peak_tracker_memory_bytes=_peak(tallies.peak_memory, memory),
            flush_ms=round(self.flush_ms, 3),
            wall_ms=round((time.monotonic() - self.start) * 1000, 3),
            started_at_ms=tallies.started_at_ms,
            first_received_at_ms=tallies.first_received_at_ms,
            nacks=tallies.nacks,
            arrivals=tallies.arrivals,
            retry_stages=tallies.retry_stages,
            collected=tallies.collected,
        )


def consume_partition(
    config: ConsumerConfig,
    handler: Callable[[Any], object],
    budget: TaskBudget | None = None,
    *,
    record_timings: bool = False,
    collect: Callable[[Any], Any] | None = None,
    progress: Callable[[dict[str, int]], None] | None = None,
    progress_interval_ms: int = 500,
) -> TaskStats:
    """Run one consumer task in this process: receive, handle, ack or nack, flush.

    Uses this worker's consumer for *config* (see :func:`~pulsar_nack.spark.executor_consumer`). For each
    message: ``handler(message)``; on return, ack. On an exception that is an instance
    of ``config.retryable`` (and within ``config.max_redeliveries``), nack: the message
    comes back after ``config.redelivery_backoff``'s delay for its redelivery count (or
    ``config.negative_ack_redelivery_delay_ms``), to this or another worker. Any other ``Exception`` is
    handled per ``config.on_non_retryable``. Other ``BaseException`` s (e.g.
    ``KeyboardInterrupt``) nack the message and propagate. Before returning (or
    raising) the task flushes its acks (see "Ack flush" in :mod:`pulsar_nack.spark`).

    If the task fails (the handler's exception with ``on_non_retryable="raise"``, a
    ``BaseException``, an error of the client), it closes this worker's consumer for
    *config* before the exception propagates: PySpark replaces a worker after a failed
    task anyway, and a clean close returns the consumer's messages to the
    subscription at once. The next task builds a new consumer.

    Works outside Spark too (then partition is -1).

    Parameters
    ----------
    config : ConsumerConfig
    handler : callable
        ``handler(message)`` with a ``pulsar.Message``; its return value is ignored.
    budget : TaskBudget, optional
        When to stop; default ``TaskBudget()``.
    record_timings : bool
        Record ``(key, nacked_at, requested_at)`` for every nack and
        ``(key, arrived_at, redelivery_count)`` for every redelivered message, to
        measure retry lateness across workers (see :func:`aggregate_task_stats`).
    collect : callable, optional
        ``collect(message)`` for every acked message; the results are returned in
        ``collected`` (e.g. event ids, to check that nothing was lost).
    progress : callable, optional
        Called about every *progress_interval_ms* and at the end with the counts since
        the previous call: ``received``, ``acked``, ``nacked``, ``redelivered``, and
        ``pid``. Errors in it are logged and ignored.

    Returns
    -------
    TaskStats

    Raises
    ------
    Exception
        The handler's exception with ``on_non_retryable="raise"``; errors of the
        client (the next task rebuilds a broken consumer).
    """
    if not isinstance(config, ConsumerConfig):
        raise TypeError(f"config must be a ConsumerConfig, not {type(config).__name__}")
    if budget is None:
        budget = TaskBudget()
    elif not isinstance(budget, TaskBudget):
        raise TypeError(f"budget must be a TaskBudget, not {type(budget).__name__}")
    if not callable(handler):
        raise TypeError("handler must be callable")
    check_ms("progress_interval_ms", progress_interval_ms, 1)
    options = {
        "record_timings": record_timings,
        "collect": collect,
        "progress": progress,
        "progress_interval_ms": progress_interval_ms,
    }
    return _TaskRun(config, handler, budget, options).run()


class _ConsumerTask:
    """The picklable function Spark runs per partition: one :func:`consume_partition`."""

    def __init__(self, config: ConsumerConfig, handler: Callable[[Any], object], budget: TaskBudget | None, options: dict[str, Any]) -> None:
        self.config = config
        self.handler = handler
        self.budget = budget
        self.options = options

    def __call__(self, iterator: Iterable[Any]) -> Iterator[TaskStats]:
        yield consume_partition(self.config, self.handler, self.budget, **self.options)

    def __repr__(self) -> str:
        return f"consumer_task({self.config.key}, {getattr(self.handler, '__name__', self.handler)!r})"


def consumer_task(
    config: ConsumerConfig,
    handler: Callable[[Any], object],
    budget: TaskBudget | None = None,
    **options: Any,
) -> Callable[[Iterable[Any]], Iterator[TaskStats]]:
    """A function for ``rdd.mapPartitions`` or ``rdd.foreachPartition``.

    Each partition runs one :func:`consume_partition` (the partition's own elements are
    ignored) and, under ``mapPartitions``, yields its :class:`TaskStats`.
    *options* are :func:`consume_partition`'s keywords.

    >>> task = consumer_task(ConsumerConfig("pulsar://h:6650", "t", "s"), print)
    >>> callable(task)
    True

    A typical use::

        stats = (spark.sparkContext.parallelize(range(8), 8)
                 .mapPartitions(consumer_task(config, handle)).collect())
    """
    if not isinstance(config, ConsumerConfig):
        raise TypeError(f"config must be a ConsumerConfig, not {type(config).__name__}")
    if not callable(handler):
        raise TypeError("handler must be callable")
    unknown = set(options) - {"record_timings", "collect", "progress", "progress_interval_ms"}
    if unknown:
        raise TypeError(f"unexpected keyword(s): {sorted(unknown)}")
    return _ConsumerTask(config, handler, budget, options)
