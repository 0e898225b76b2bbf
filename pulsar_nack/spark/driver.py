"""Driver side: run rounds of consumer tasks over a SparkSession and aggregate their stats."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._validate import check_int
from .config import ConsumerConfig, TaskBudget
from .stats import RunStats, TaskStats, aggregate_task_stats
from .task import consumer_task

__all__ = ["run_consumer_tasks"]


def run_consumer_tasks(
    spark: Any,
    config: ConsumerConfig,
    handler: Callable[[Any], object],
    num_tasks: int,
    budget: TaskBudget | None = None,
    *,
    until_drained: bool = False,
    max_rounds: int = 20,
    record_timings: bool = False,
    collect: Callable[[Any], Any] | None = None,
    progress: Callable[[dict[str, int]], None] | None = None,
    progress_interval_ms: int = 500,
) -> RunStats:
    """Run *num_tasks* consumer tasks on a SparkSession and aggregate their stats.

    One Spark job of *num_tasks* partitions, each running :func:`consume_partition`
    on whichever Python worker Spark gives it (a worker that ran an earlier task reuses
    its consumer). With ``until_drained``, jobs ("rounds") repeat until a round in
    which no task received anything and no worker had retries pending, or
    *max_rounds*: messages that reached an idle worker's receive queue between tasks
    are picked up by its next task.

    Parameters
    ----------
    spark : SparkSession or SparkContext
    config : ConsumerConfig
    handler : callable
        ``handler(message)``; must pickle (cloudpickle): a module-level function of an
        importable module, or a closure.
    num_tasks : int
        Tasks per round. Use at least the number of executor cores.
    budget : TaskBudget, optional
    until_drained : bool
    max_rounds : int
    record_timings, collect, progress, progress_interval_ms
        See :func:`consume_partition`. *progress* runs on the executors.

    Returns
    -------
    RunStats

    Raises
    ------
    pyspark.errors.PythonException
        When a task failed more often than Spark retries it (``spark.task.maxFailures``;
        ``local[N]`` does not retry, ``local[N,F]`` tries F times).
    """
    check_int("num_tasks", num_tasks, 1)
    check_int("max_rounds", max_rounds, 1)
    sc = getattr(spark, "sparkContext", spark)
    task = consumer_task(
        config,
        handler,
        budget,
        record_timings=record_timings,
        collect=collect,
        progress=progress,
        progress_interval_ms=progress_interval_ms,
    )
    start = time.monotonic()
    results: list[TaskStats] = []
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        sc.setJobDescription(f"pulsar-nack consumer tasks: {config.subscription} round {rounds}")
        batch = sc.parallelize(range(num_tasks), num_tasks).mapPartitions(task).collect()
        results.extend(batch)
        if not until_drained:
            break
        if not any(t["received"] or t["pending_nacks"] for t in batch):
            break
    return aggregate_task_stats(results, wall_ms=(time.monotonic() - start) * 1000, rounds=rounds)
