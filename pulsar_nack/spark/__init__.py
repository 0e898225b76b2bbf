"""Spark integration: one :class:`~pulsar_nack.consumer.NackingConsumer` per executor Python worker.

A consumer opened and closed inside every Spark task loses its pending retries at the
task boundary: the retries come back at once instead of after their delay, and the
tracker state is rebuilt from scratch each time. This module keeps **one client and one
consumer per Python worker process** per ``(service URL, topics, subscription)``, created
by the first task that needs it and reused by every later task that the worker runs.
PySpark reuses Python workers by default (``spark.python.worker.reuse=true``), so the
pending retries stay on schedule and the tracker's memory stays small.

Pieces
    :class:`ConsumerConfig`
        What to consume and how to retry; a frozen, picklable dataclass.
    :class:`TaskBudget`
        When a task stops receiving: max messages, max time, idle timeout.
    :func:`consume_partition`
        The task body: receive, call ``handler(message)``, ack on success, nack with
        backoff on a retryable exception, handle the rest per
        ``ConsumerConfig.on_non_retryable``, flush the acks, return :class:`TaskStats`.
    :func:`consumer_task`
        Wraps it for ``rdd.mapPartitions`` / ``rdd.foreachPartition``.
    :func:`run_consumer_tasks`
        Driver side: run N such tasks over a SparkSession and aggregate the stats.
    :func:`executor_consumer`, :func:`close_executor_consumers`
        The per-process registry, for custom task code.
    :func:`local_session`, :func:`stop_session`
        A quiet local SparkSession (tests, examples, the demo) and its full shutdown;
        :func:`launch_jvm` starts its JVM first, for a program that starts threads before
        its session.

Delivery semantics: at-least-once
    A message is acked only after ``handler(message)`` returned, so the handler's side
    effects may repeat: make them idempotent. Duplicates come from a worker dying
    between the handler and the flushed ack, from a prefetched message returning when a
    worker is replaced, and from batched entries redelivered to *another* worker by a
    broker that keeps no batch-index ack state (see "Batch-index acknowledgement").

What Spark does to a worker, and what happens to its pending retries
    A Python worker is replaced after a failed task, after about 60 s idle, on job
    cancellation, and for every task with ``spark.python.worker.reuse=false``. Workers
    leave through ``os._exit``, so no ``close()`` and no ``atexit`` hook runs (the hook
    registered here runs only where Python gets the chance, e.g. outside the PySpark
    daemon). When the process dies its connection closes, and the broker puts every
    message the consumer held unacked -- pending retries, prefetched messages, messages
    being handled -- back on the subscription. Nothing is lost; those retries simply
    come **early**, to whichever consumer is free. Acks still buffered in the client are
    lost with the process, which is why every task flushes them before it returns. A
    task that fails closes its consumer itself before the exception propagates.

Idle workers hold prefetched messages
    Between tasks a worker's consumer keeps its permits, so the broker keeps up to
    ``receiver_queue_size`` messages in it until the worker's next task (or its exit).
    To drain a backlog, run rounds of at least one task per worker:
    ``run_consumer_tasks(..., until_drained=True)``.

Ack flush
    ``Consumer.acknowledge`` only queues the ack: the C++ client groups acks and sends
    them every 100 ms (``ackGroupingTimeMs``), or when 1000 are pending. pulsar-client
    3.13 exposes neither a flush nor the grouping time (``Client.subscribe`` has no such
    keyword), and ``close()`` would end the reuse. Measured here (2,500 batched
    messages acked, then the process SIGKILLed): waiting 30-60 ms after the last ack
    lost all 2,500 acks, 90 ms lost them 2 times out of 3, 105 ms and more lost none.
    So a task waits until ``ack_flush_ms`` (default 200 ms, two grouping periods) have
    passed since its last ack -- usually they already have, when the task ended on its
    idle timeout -- and then makes one request/response round trip on the consumer
    (``get_last_message_id``) so the flushed acks are on the wire before it reports
    success.

Batch-index acknowledgement
    Consumers subscribe with ``batch_index_ack_enabled=True`` by default
    (:attr:`ConsumerConfig.batch_index_ack`). On a broker with
    ``acknowledgmentAtBatchIndexLevelEnabled=true`` a redelivered batched entry then
    carries its ack set, so the worker that gets it does not hand already-acked
    siblings to the handler again. Without it, whole entries come back.

Modules, one concept each
    :mod:`~pulsar_nack.spark.config` (ConsumerConfig, TaskBudget),
    :mod:`~pulsar_nack.spark.policy` (retry, ack, dead-letter or raise),
    :mod:`~pulsar_nack.spark.registry` (the per-worker consumers),
    :mod:`~pulsar_nack.spark.task` (the task loop), :mod:`~pulsar_nack.spark.stats`
    (TaskStats, RunStats), :mod:`~pulsar_nack.spark.driver` (run_consumer_tasks) and
    :mod:`~pulsar_nack.spark.session` (local_session, launch_jvm, stop_session).

This package imports neither ``pulsar`` nor ``pyspark`` at import time: pulsar is imported
when a consumer is built, pyspark inside the driver-side functions.
"""

from __future__ import annotations

from .config import NON_RETRYABLE_ACTIONS, ConsumerConfig, TaskBudget, dead_letter_topic
from .driver import run_consumer_tasks
from .policy import retry_action
from .registry import close_executor_consumers, executor_consumer
from .session import LaunchedJvm, launch_jvm, local_session, stop_session
from .stats import RunStats, TaskStats, aggregate_task_stats
from .task import consume_partition, consumer_task

__all__ = [
    "NON_RETRYABLE_ACTIONS",
    "ConsumerConfig",
    "LaunchedJvm",
    "RunStats",
    "TaskBudget",
    "TaskStats",
    "aggregate_task_stats",
    "close_executor_consumers",
    "consume_partition",
    "consumer_task",
    "dead_letter_topic",
    "executor_consumer",
    "launch_jvm",
    "local_session",
    "retry_action",
    "run_consumer_tasks",
    "stop_session",
]
