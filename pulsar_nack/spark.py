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
        A quiet local SparkSession (tests, examples, the demo) and its full shutdown.

Delivery semantics: at-least-once
    A message is acked only after ``handler(message)`` returned, so the handler's side
    effects may repeat: make them idempotent. Duplicates come from a worker dying
    between the handler and the flushed ack, from a prefetched message returning when a
    worker is replaced, and from batched entries: the batch-index state that swallows
    already-acked siblings lives in one consumer, so when the broker redelivers a
    batched entry to *another* worker, that worker sees every message of the entry.

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

pulsar-lite's consumer-id gap (tests, examples and the demo only)
    The embedded broker refuses a second consumer with the same client-chosen consumer
    id on a subscription, and every process numbers its consumers from 0. So when
    :func:`~pulsar_nack.embedded.is_embedded_broker_url` says the URL is an
    :class:`~pulsar_nack.embedded.EmbeddedBroker` on this machine, the registry calls
    :func:`~pulsar_nack.embedded.apply_embedded_broker_consumer_id_shim` on each new
    client before subscribing. Against any other URL it does nothing. pulsar-lite 0.2.0
    also keeps the consumers of a connection that ended with a reset (a process killed
    while the broker was sending to it) registered, with their unacked messages, until
    it restarts; a subscribe that then collides with such a consumer id is retried with
    a fresh client (another slot).

This module imports neither ``pulsar`` nor ``pyspark`` at import time: pulsar is imported
when a consumer is built, pyspark inside the driver-side functions.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from ._validate import MAX_DELAY_MS, check_int, check_ms, check_optional_int, check_topics
from .backoff import RedeliveryBackoff
from .buckets import DEFAULT_PRECISION_BITS, MAX_PRECISION_BITS
from .keys import PARTITION_SUFFIX as _PARTITION_SUFFIX

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

    from .consumer import NackingConsumer

__all__ = [
    "NON_RETRYABLE_ACTIONS",
    "ConsumerConfig",
    "RunStats",
    "TaskBudget",
    "TaskStats",
    "aggregate_task_stats",
    "close_executor_consumers",
    "consume_partition",
    "consumer_task",
    "dead_letter_topic",
    "executor_consumer",
    "local_session",
    "run_consumer_tasks",
    "stop_session",
]

_log = logging.getLogger(__name__)

NON_RETRYABLE_ACTIONS: tuple[str, ...] = ("ack", "dead_letter", "raise")
"""What :func:`consume_partition` does with a message whose handler raised a
non-retryable exception: ack it (drop), produce it to the dead-letter topic and ack it,
or re-raise (the task fails; the message returns to the subscription)."""

_CONSUMER_TYPES = ("Shared", "KeyShared", "Failover", "Exclusive")
_INITIAL_POSITIONS = ("Earliest", "Latest")
_LOG_LEVELS = ("debug", "info", "warn", "error")
_HOUSEKEEPING_S = 0.2
_RECONNECT_GRACE_S = 2.0
_EMBEDDED_SUBSCRIBE_ATTEMPTS = 3


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------


def _enum_name(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Accept ``"Shared"`` or ``pulsar.ConsumerType.Shared``; return the name."""
    text = getattr(value, "name", value)
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str or a pulsar enum, not {type(value).__name__}")
    if text == "Key_Shared":
        text = "KeyShared"
    if text not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return text


@dataclasses.dataclass(frozen=True)
class ConsumerConfig:
    """What a Spark task consumes and how it retries; picklable, shipped with each task.

    Every field must pickle (Spark ships the config to the executors): plain values,
    a :class:`~pulsar_nack.backoff.RedeliveryBackoff`, exception classes, and a
    module-level ``client_factory``.

    Parameters
    ----------
    service_url : str
        ``pulsar://host:6650``. An :class:`~pulsar_nack.embedded.EmbeddedBroker` URL
        turns on the pulsar-lite consumer-id shim; nothing else does.
    topics : str or sequence of str
        One topic, or several (one multi-topic consumer). Stored as a tuple.
    subscription : str
        The subscription name; all workers join it.
    subscription_type : str or pulsar.ConsumerType
        ``"Shared"`` (default) spreads messages over the workers and redelivers single
        entries. ``"KeyShared"`` keeps keys on one worker. ``"Failover"`` and
        ``"Exclusive"`` allow one active consumer: the other workers wait, and a nack
        redelivers every unacked message of the consumer.
    nack_delay_ms : int
        Fixed retry delay when no ``backoff`` is given (pulsar's
        ``negative_ack_redelivery_delay_ms``). Default 60 s.
    precision_bits : int
        Retry deadlines are trimmed by this many bits (default 8: 256 ms buckets; a
        retry may come up to ``2**bits - 1`` ms early unless ``never_early``).
    backoff : RedeliveryBackoff, optional
        Delay by redelivery count, e.g.
        :class:`~pulsar_nack.backoff.MultiplierRedeliveryBackoff`.
    never_early : bool
        Round deadlines up instead of down.
    receive_timeout_ms : int
        How long one ``receive`` waits; the task checks its budget at least this often.
        Default 100.
    initial_position : str or pulsar.InitialPosition
        Where a *new* subscription starts. Default ``"Earliest"``: a Spark job usually
        starts after the data was produced and must not skip it (pulsar's own default
        is ``Latest``). No effect on an existing subscription.
    client_options : mapping
        Keywords for ``pulsar.Client`` (e.g. ``operation_timeout_seconds``,
        ``io_threads``); values must pickle.
    consumer_options : mapping
        Extra keywords for ``Client.subscribe`` (e.g. ``receiver_queue_size``,
        ``consumer_name``); not ``negative_ack_redelivery_delay_ms``.
    client_factory : callable, optional
        ``client_factory(service_url) -> pulsar.Client``, a module-level function, for
        what does not pickle (authentication objects, custom loggers). Replaces
        ``client_options``.
    log_level : str
        The C++ client's log level: ``"warn"`` (default; no INFO lines), ``"error"``,
        ``"info"``, ``"debug"``.
    retryable : tuple of exception classes
        Exceptions from the handler that mean "retry later" (nack with backoff).
        Default ``(Exception,)``: every exception retries.
    on_non_retryable : {"dead_letter", "ack", "raise"}
        For any other exception: produce the message to :attr:`dead_letter_topic` and
        ack it (default); ack it (drop it); or nack it, flush and re-raise, failing the
        task (Spark shows a ``PythonException`` with the worker traceback).
    max_redeliveries : int, optional
        A retryable failure of a message already redelivered this many times is
        handled as non-retryable (poison messages). None (default): retry forever.
    dead_letter_topic : str, optional
        Default ``<topic>-<subscription>-DLQ`` of the message's topic, as pulsar's
        client-side dead-letter policy names it.
    ack_flush_ms : int
        A task returns no sooner than this after its last ack, so the client's 100 ms
        ack grouping has sent it. Default 200; 0 disables (acks may then be lost with
        a worker that dies right after the task: they come back as duplicates).

    Examples
    --------
    >>> from pulsar_nack.backoff import MultiplierRedeliveryBackoff
    >>> config = ConsumerConfig("pulsar://127.0.0.1:6650", "orders", "billing",
    ...     backoff=MultiplierRedeliveryBackoff(1000, 60_000))
    >>> config.topics, config.subscription_type, config.key
    (('orders',), 'Shared', ('pulsar://127.0.0.1:6650', ('orders',), 'billing'))
    >>> import pickle; pickle.loads(pickle.dumps(config)).backoff.next_delay_ms(2)
    4000
    """

    service_url: str
    topics: tuple[str, ...]
    subscription: str
    subscription_type: str = "Shared"
    nack_delay_ms: int = 60_000
    precision_bits: int = DEFAULT_PRECISION_BITS
    backoff: RedeliveryBackoff | None = None
    never_early: bool = False
    receive_timeout_ms: int = 100
    initial_position: str = "Earliest"
    client_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    consumer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    client_factory: Callable[[str], Any] | None = None
    log_level: str = "warn"
    retryable: tuple[type[BaseException], ...] = (Exception,)
    on_non_retryable: str = "dead_letter"
    max_redeliveries: int | None = None
    dead_letter_topic: str | None = None
    ack_flush_ms: int = 200

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.service_url, str) or not self.service_url:
            raise TypeError("service_url must be a non-empty str")
        set_(self, "topics", tuple(check_topics("topics", self.topics)))
        if not isinstance(self.subscription, str) or not self.subscription:
            raise TypeError("subscription must be a non-empty str")
        set_(self, "subscription_type", _enum_name("subscription_type", self.subscription_type, _CONSUMER_TYPES))
        set_(self, "initial_position", _enum_name("initial_position", self.initial_position, _INITIAL_POSITIONS))
        check_ms("nack_delay_ms", self.nack_delay_ms)
        check_ms("receive_timeout_ms", self.receive_timeout_ms, 1)
        check_ms("ack_flush_ms", self.ack_flush_ms)
        check_optional_int("max_redeliveries", self.max_redeliveries, 0)
        check_int("precision_bits", self.precision_bits, 0, MAX_PRECISION_BITS)
        if self.backoff is not None and not callable(getattr(self.backoff, "next_delay_ms", None)):
            raise TypeError("backoff must have a next_delay_ms(redelivery_count) method")
        if not isinstance(self.never_early, bool):
            raise TypeError("never_early must be bool")
        for name in ("client_options", "consumer_options"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TypeError(f"{name} must be a mapping, not {type(value).__name__}")
            set_(self, name, dict(value))
        if "negative_ack_redelivery_delay_ms" in self.consumer_options or "pattern" in self.consumer_options:
            raise ValueError("consumer_options must not set negative_ack_redelivery_delay_ms or pattern")
        if self.client_factory is not None and not callable(self.client_factory):
            raise TypeError("client_factory must be callable")
        if not isinstance(self.log_level, str) or self.log_level.lower() not in _LOG_LEVELS:
            raise ValueError(f"log_level must be one of {_LOG_LEVELS}, got {self.log_level!r}")
        retryable = (self.retryable,) if isinstance(self.retryable, type) else tuple(self.retryable)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retryable):
            raise TypeError("retryable must be a tuple of exception classes")
        set_(self, "retryable", retryable)
        if self.on_non_retryable not in NON_RETRYABLE_ACTIONS:
            raise ValueError(f"on_non_retryable must be one of {NON_RETRYABLE_ACTIONS}, got {self.on_non_retryable!r}")
        if self.dead_letter_topic is not None and (not isinstance(self.dead_letter_topic, str) or not self.dead_letter_topic):
            raise TypeError("dead_letter_topic must be a non-empty str or None")

    @property
    def key(self) -> tuple[str, tuple[str, ...], str]:
        """The registry key: ``(service_url, topics, subscription)``."""
        return (self.service_url, self.topics, self.subscription)

    def _consumer_settings(self) -> tuple[Any, ...]:
        """What the worker's consumer was built with; a change rebuilds it."""
        return (
            self.subscription_type,
            self.nack_delay_ms,
            self.precision_bits,
            repr(self.backoff),
            self.never_early,
            self.initial_position,
            sorted(self.client_options.items(), key=lambda kv: kv[0]),
            sorted(self.consumer_options.items(), key=lambda kv: kv[0]),
            self.client_factory,
            self.log_level.lower(),
        )

    def retry_delay_ms(self, redelivery_count: int) -> int:
        """The delay a nack of a message with this redelivery count asks for. O(1).

        >>> ConsumerConfig("pulsar://h:6650", "t", "s", nack_delay_ms=500).retry_delay_ms(3)
        500
        """
        if self.backoff is None:
            return self.nack_delay_ms
        return check_ms("backoff delay_ms", self.backoff.next_delay_ms(max(redelivery_count, 0)))


@dataclasses.dataclass(frozen=True)
class TaskBudget:
    """When a consumer task stops receiving and returns.

    A task stops at the first of: ``max_messages`` handed to the handler;
    ``max_time_ms`` since it started; or ``idle_timeout_ms`` with nothing received
    (and, with ``drain_pending``, nothing waiting in this worker's tracker). Pending
    retries left when a task stops stay in the worker's consumer and fire on time,
    to be handled by whichever task receives them next.

    Parameters
    ----------
    max_messages : int, optional
        None: no limit.
    max_time_ms : int, optional
        Default 60 s. None: no limit (then rely on the idle timeout).
    idle_timeout_ms : int
        Default 1 s. Keep it above ~300 ms with ``drain_pending``: a retry handed to
        the client comes back 100-133 ms later.
    drain_pending : bool
        Keep receiving while this worker has retries pending (default True), so a
        task that ends on its idle timeout leaves nothing scheduled behind it.

    >>> TaskBudget(max_messages=10_000).idle_timeout_ms
    1000
    """

    max_messages: int | None = None
    max_time_ms: int | None = 60_000
    idle_timeout_ms: int = 1_000
    drain_pending: bool = True

    def __post_init__(self) -> None:
        check_optional_int("max_messages", self.max_messages, 1)
        check_optional_int("max_time_ms", self.max_time_ms, 0, MAX_DELAY_MS)
        check_ms("idle_timeout_ms", self.idle_timeout_ms)
        if not isinstance(self.drain_pending, bool):
            raise TypeError("drain_pending must be bool")
        if self.max_time_ms is None and self.idle_timeout_ms == 0 and self.max_messages is None:
            raise ValueError("a budget needs some limit")


def dead_letter_topic(topic: str, subscription: str) -> str:
    """``<topic>-<subscription>-DLQ``, the partition suffix removed, as pulsar names it.

    >>> dead_letter_topic("persistent://public/default/orders-partition-2", "billing")
    'persistent://public/default/orders-billing-DLQ'
    """
    return f"{_PARTITION_SUFFIX.sub('', topic)}-{subscription}-DLQ"


# ---------------------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------------------


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
    shim_slot: int | None  # pulsar-lite consumer-id slot (embedded broker only)
    received: int  # messages handed to the handler
    acked: int
    nacked: int
    redelivered: int  # received with redelivery_count() > 0
    swallowed: int  # batch siblings' copies dropped by the consumer (batch-index state)
    handler_errors: dict[str, int]  # exception type name -> count
    non_retryable: int
    dead_lettered: int
    stop_reason: str  # "max_messages", "max_time", "idle" or "error"
    pending_nacks: int  # left in this worker's tracker when the task returned
    peak_pending_nacks: int
    tracker_memory_bytes: int
    peak_tracker_memory_bytes: int
    flush_ms: float
    wall_ms: float
    started_at_ms: float
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
    peak_pending_nacks: int  # the largest per-worker peak
    peak_tracker_memory_bytes: int
    retries: list[tuple[tuple[str, int, int, int], float, float, float]]  # (key, nacked_at, requested_at, arrived_at)
    unmatched_nacks: int  # nacks with no later arrival recorded (e.g. its task attempt failed)
    lateness_ms: dict[str, float | None]  # arrival - requested: count, min, p50, p99, max
    wall_ms: float
    messages_per_s: float
    collected: list[Any]
    task_stats: list[TaskStats]


# ---------------------------------------------------------------------------------------
# The executor-side registry
# ---------------------------------------------------------------------------------------


class _Entry:
    """One worker's client + consumer for one ``(service_url, topics, subscription)``."""

    __slots__ = ("client", "consumer", "pid", "producers", "settings", "shim_slot", "tasks", "uid")

    settings: tuple[Any, ...]
    pid: int
    client: Any
    consumer: NackingConsumer
    uid: str
    tasks: int
    producers: dict[str, Any]
    shim_slot: int | None

    def close(self, redeliver_pending: bool = True) -> None:
        """Close consumer, dead-letter producers and client; log, never raise."""
        for closer in (
            lambda: self.consumer.close(redeliver_pending=redeliver_pending),
            *(producer.close for producer in self.producers.values()),
            self.client.close,
        ):
            try:
                closer()
            except Exception:  # a broken connection: nothing more to do
                _log.debug("closing %s failed", self.uid, exc_info=True)
        self.producers.clear()


_REGISTRY: dict[tuple[str, tuple[str, ...], str], _Entry] = {}
_REGISTRY_LOCK = threading.Lock()
_REGISTRY_PID: int = os.getpid()
_ABANDONED: list[_Entry] = []  # inherited through fork(): never touched, never collected
_ATEXIT_PID: int | None = None
_CONSUMERS_BUILT = itertools.count(1)
_TASKS_RUN = 0


def _check_fork() -> None:
    """After a fork, forget (but keep alive) what the parent built. Lock held."""
    global _REGISTRY_PID, _TASKS_RUN
    if os.getpid() != _REGISTRY_PID:
        # The parent's client threads do not exist here; closing or collecting its
        # objects could hang. Keep them referenced and start afresh.
        _ABANDONED.extend(_REGISTRY.values())
        _REGISTRY.clear()
        _REGISTRY_PID = os.getpid()
        _TASKS_RUN = 0


def _new_client(config: ConsumerConfig) -> Any:
    if config.client_factory is not None:
        return config.client_factory(config.service_url)
    import pulsar

    level = {"debug": "Debug", "info": "Info", "warn": "Warn", "error": "Error"}[config.log_level.lower()]
    options = dict(config.client_options)
    options.setdefault("logger", pulsar.ConsoleLogger(getattr(pulsar.LoggerLevel, level)))
    return pulsar.Client(config.service_url, **options)


def _build(config: ConsumerConfig) -> _Entry:
    """Create a client (with the pulsar-lite shim where it applies) and a consumer.

    Against an embedded pulsar-lite broker only: a consumer of a process that died
    with a *reset* connection stays registered there (pulsar-lite 0.2.0 skips its
    connection cleanup after a read error), so the consumer id of a slot that process
    freed may still be taken; the broker then drops the connection and the subscribe
    times out (after the client's ``operation_timeout_seconds``, 30 s by default). The
    next attempt uses a fresh client, which claims another slot.
    """
    import pulsar

    from .consumer import subscribe
    from .embedded import apply_embedded_broker_consumer_id_shim, is_embedded_broker_url

    embedded = is_embedded_broker_url(config.service_url)
    attempts = _EMBEDDED_SUBSCRIBE_ATTEMPTS if embedded else 1
    for attempt in range(1, attempts + 1):
        client = _new_client(config)
        try:
            shim_slot = None
            if embedded:
                # Test-only: give this process's consumers ids no other process uses.
                shim_slot = apply_embedded_broker_consumer_id_shim(client, config.service_url)
            consumer = subscribe(
                client,
                list(config.topics) if len(config.topics) > 1 else config.topics[0],
                config.subscription,
                consumer_type=getattr(pulsar.ConsumerType, config.subscription_type),
                initial_position=getattr(pulsar.InitialPosition, config.initial_position),
                negative_ack_redelivery_delay_ms=config.nack_delay_ms,
                negative_ack_precision_bit_cnt=config.precision_bits,
                redelivery_backoff=config.backoff,
                never_early=config.never_early,
                **config.consumer_options,
            )
        except Exception:
            with contextlib.suppress(Exception):
                client.close()
            if attempt == attempts:
                raise
            _log.warning("subscribing to %s failed; retrying with a new client", config.topics, exc_info=True)
            continue
        except BaseException:
            with contextlib.suppress(Exception):
                client.close()
            raise
        break
    entry = _Entry()
    entry.settings = config._consumer_settings()
    entry.pid = os.getpid()
    entry.client = client
    entry.consumer = consumer
    entry.uid = f"{os.getpid()}-{next(_CONSUMERS_BUILT)}-{uuid.uuid4().hex[:6]}"
    entry.tasks = 0
    entry.producers = {}
    entry.shim_slot = shim_slot
    return entry


def _discard(key: tuple[str, tuple[str, ...], str], entry: _Entry) -> None:
    """Drop *entry* from the registry and close it: what it held returns at once."""
    with _REGISTRY_LOCK:
        if _REGISTRY.get(key) is entry:
            del _REGISTRY[key]
    entry.close(redeliver_pending=True)


def _healthy(entry: _Entry) -> bool:
    """False if the consumer is closed, or stays disconnected past a short grace."""
    consumer = entry.consumer
    if consumer.closed:
        return False
    deadline = time.monotonic() + _RECONNECT_GRACE_S
    while True:
        try:
            if consumer.is_connected():
                return True
        except Exception:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # the client reconnects by itself; wait for that, bounded


def _register_atexit() -> None:
    global _ATEXIT_PID
    if os.getpid() != _ATEXIT_PID:
        atexit.register(_close_at_exit, os.getpid())
        _ATEXIT_PID = os.getpid()


def _close_at_exit(pid: int) -> None:
    if pid == os.getpid():
        close_executor_consumers()


def _acquire(config: ConsumerConfig) -> tuple[_Entry, bool]:
    """The worker's entry for *config*, built or rebuilt if needed; (entry, created)."""
    with _REGISTRY_LOCK:
        _check_fork()
        entry = _REGISTRY.get(config.key)
        if entry is not None:
            if entry.settings == config._consumer_settings() and _healthy(entry):
                return entry, False
            del _REGISTRY[config.key]
            # Closing returns whatever it held to the subscription: nothing is lost.
            entry.close(redeliver_pending=True)
        entry = _build(config)
        _REGISTRY[config.key] = entry
        _register_atexit()
        return entry, True


def executor_consumer(config: ConsumerConfig) -> NackingConsumer:
    """This worker process's consumer for *config*: created on first use, then reused.

    One client and one :class:`~pulsar_nack.consumer.NackingConsumer` per process per
    ``config.key``. Rebuilt after a fork (pid check), when the consumer is closed or
    stays disconnected for 2 s, or when a consumer setting of *config* changed.
    Closed by :func:`close_executor_consumers` or at interpreter exit, where Python
    gets to run ``atexit`` (PySpark's forked workers leave through ``os._exit``).

    Runtime complexity: O(1) when it exists; a subscribe round trip otherwise.

    Parameters
    ----------
    config : ConsumerConfig

    Returns
    -------
    NackingConsumer
        Do not close it yourself; use :func:`close_executor_consumers`.
    """
    if not isinstance(config, ConsumerConfig):
        raise TypeError(f"config must be a ConsumerConfig, not {type(config).__name__}")
    return _acquire(config)[0].consumer


def close_executor_consumers(redeliver_pending: bool = True) -> int:
    """Close every consumer and client this process's registry holds. Idempotent.

    ``redeliver_pending=True`` hands pending retries to the client now (they come back
    at once); ``False`` leaves them unacked for the broker to redeliver when the
    consumer is gone. Either way nothing is lost. Returns how many were closed.
    """
    with _REGISTRY_LOCK:
        _check_fork()
        entries = list(_REGISTRY.values())
        _REGISTRY.clear()
    for entry in entries:
        entry.close(redeliver_pending=redeliver_pending)
    return len(entries)


# ---------------------------------------------------------------------------------------
# The task runner
# ---------------------------------------------------------------------------------------


def _message_key(message: Any) -> tuple[str, int, int, int]:
    mid = message.message_id()
    return (message.topic_name(), mid.ledger_id(), mid.entry_id(), mid.batch_index())


def _flush_acks(consumer: NackingConsumer, last_ack: float | None, flush_ms: int) -> float:
    """Make sure the client has sent the grouped acks; return the time spent in ms.

    There is no flush in pulsar-client 3.13: the acks go out on the client's 100 ms
    grouping timer. Wait until *flush_ms* have passed since the last ack, then make a
    request/response round trip on the consumer so they are on the wire.
    """
    start = time.monotonic()
    if flush_ms == 0 or last_ack is None:
        # Nothing acked. (And no round trip: pulsar-lite answers get_last_message_id on
        # an empty topic with an error, which the client logs.)
        return 0.0
    remaining = last_ack + flush_ms / 1000 - start
    if remaining > 0:
        time.sleep(remaining)  # the client's ack-grouping period: nothing to poll
    try:
        if consumer.is_connected():  # a broken connection would block for the operation timeout
            consumer._consumer.get_last_message_id()
    except Exception:  # e.g. not supported by a multi-topic consumer: the wait did it
        _log.debug("round trip after the ack flush failed", exc_info=True)
    return (time.monotonic() - start) * 1000


def _dead_letter(entry: _Entry, config: ConsumerConfig, message: Any, error: BaseException) -> None:
    """Produce *message* to its dead-letter topic (synchronously)."""
    topic = config.dead_letter_topic or dead_letter_topic(message.topic_name(), config.subscription)
    producer = entry.producers.get(topic)
    if producer is None:
        producer = entry.producers[topic] = entry.client.create_producer(topic, batching_enabled=False)
    properties = dict(message.properties())
    properties.update(
        {
            "REAL_TOPIC": message.topic_name(),
            "ORIGIN_MESSAGE_ID": str(message.message_id()),
            "PULSAR_NACK_ERROR": f"{type(error).__name__}: {error}"[:1000],
        }
    )
    kwargs: dict[str, Any] = {"properties": properties}
    if message.partition_key():
        kwargs["partition_key"] = message.partition_key()
    if message.event_timestamp():
        kwargs["event_timestamp"] = message.event_timestamp()
    producer.send(message.data(), **kwargs)


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

    Uses this worker's consumer for *config* (see :func:`executor_consumer`). For each
    message: ``handler(message)``; on return, ack. On an exception that is an instance
    of ``config.retryable`` (and within ``config.max_redeliveries``), nack: the message
    comes back after ``config.backoff``'s delay for its redelivery count (or
    ``config.nack_delay_ms``), to this or another worker. Any other ``Exception`` is
    handled per ``config.on_non_retryable``. Other ``BaseException`` s (e.g.
    ``KeyboardInterrupt``) nack the message and propagate. Before returning (or
    raising) the task flushes its acks (see the module docstring).

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
    global _TASKS_RUN
    if not isinstance(config, ConsumerConfig):
        raise TypeError(f"config must be a ConsumerConfig, not {type(config).__name__}")
    if budget is None:
        budget = TaskBudget()
    elif not isinstance(budget, TaskBudget):
        raise TypeError(f"budget must be a TaskBudget, not {type(budget).__name__}")
    if not callable(handler):
        raise TypeError("handler must be callable")
    check_ms("progress_interval_ms", progress_interval_ms, 1)
    import pulsar

    partition, attempt = _task_context()
    started_at_ms = time.time() * 1000
    start = time.monotonic()
    entry, created = _acquire(config)
    entry.tasks += 1
    with _REGISTRY_LOCK:
        _TASKS_RUN += 1
        worker_tasks = _TASKS_RUN
    consumer = entry.consumer
    tracker = consumer.tracker
    swallowed_before = consumer.stats()["swallowed"]

    receive = consumer.receive
    acknowledge = consumer.acknowledge
    negative_acknowledge = consumer.negative_acknowledge
    retryable = config.retryable
    max_redeliveries = config.max_redeliveries
    receive_timeout = config.receive_timeout_ms
    max_messages = budget.max_messages
    end = math.inf if budget.max_time_ms is None else start + budget.max_time_ms / 1000
    idle_s = budget.idle_timeout_ms / 1000
    drain_pending = budget.drain_pending
    monotonic = time.monotonic
    wall = time.time

    received = acked = nacked = redelivered = non_retryable = dead_lettered = 0
    handler_errors: dict[str, int] = {}
    nacks: list[tuple[tuple[str, int, int, int], float, float]] = []
    arrivals: list[tuple[tuple[str, int, int, int], float, int]] = []
    collected: list[Any] = []
    peak_pending = len(tracker)
    peak_memory = 0
    last_ack: float | None = None
    last_busy = start
    next_housekeeping = start
    reported = {"received": 0, "acked": 0, "nacked": 0, "redelivered": 0}
    progress_every = progress_interval_ms / 1000
    next_progress = start + progress_every
    stop_reason = "error"

    def report() -> None:
        current = {"received": received, "acked": acked, "nacked": nacked, "redelivered": redelivered}
        delta = {k: current[k] - reported[k] for k in current}
        reported.update(current)
        if progress is not None and any(delta.values()):
            try:
                progress({**delta, "pid": os.getpid()})
            except Exception:
                _log.warning("progress callback failed", exc_info=True)

    def nack(message: Any, count: int) -> None:
        nonlocal nacked, peak_pending
        negative_acknowledge(message)
        nacked += 1
        if record_timings:
            now_ms = wall() * 1000
            nacks.append((_message_key(message), now_ms, now_ms + config.retry_delay_ms(count)))
        pending = len(tracker)
        if pending > peak_pending:
            peak_pending = pending

    failed = True
    try:
        while True:
            now = monotonic()
            if now >= next_housekeeping:
                stats = tracker.stats()
                peak_memory = max(peak_memory, stats["memory_bytes"])
                peak_pending = max(peak_pending, stats["pending_messages"])
                next_housekeeping = now + _HOUSEKEEPING_S
                if now >= next_progress:
                    report()
                    next_progress = now + progress_every
            if max_messages is not None and received >= max_messages:
                stop_reason = "max_messages"
                break
            if now >= end:
                stop_reason = "max_time"
                break
            timeout = receive_timeout if end == math.inf else max(1, min(receive_timeout, int((end - now) * 1000)))
            try:
                message = receive(timeout)
            except pulsar.Timeout:
                now = monotonic()
                if drain_pending and len(tracker):
                    last_busy = now
                elif now - last_busy >= idle_s:
                    stop_reason = "idle"
                    break
                continue
            last_busy = now
            received += 1
            count = message.redelivery_count()
            if count:
                redelivered += 1
                if record_timings:
                    arrivals.append((_message_key(message), wall() * 1000, count))
            try:
                handler(message)
            except Exception as error:
                name = type(error).__name__
                handler_errors[name] = handler_errors.get(name, 0) + 1
                if isinstance(error, retryable) and (max_redeliveries is None or count < max_redeliveries):
                    nack(message, count)
                    continue
                non_retryable += 1
                action = config.on_non_retryable
                if action == "raise":
                    nack(message, count)
                    raise
                if action == "dead_letter":
                    _dead_letter(entry, config, message, error)
                    dead_lettered += 1
                acknowledge(message)
                acked += 1
                last_ack = monotonic()
                continue
            except BaseException:
                nack(message, count)
                raise
            acknowledge(message)
            acked += 1
            last_ack = monotonic()
            if collect is not None:
                collected.append(collect(message))
        failed = False
    finally:
        if failed:
            # The task fails, and PySpark replaces a worker after a failed task. Close
            # the consumer now (its acks are flushed on close; pending retries and
            # prefetched messages go back to the subscription at once) rather than
            # leave it to the process exit.
            flush_start = monotonic()
            _discard(config.key, entry)
            flush_ms = (monotonic() - flush_start) * 1000
        else:
            flush_ms = _flush_acks(consumer, last_ack, config.ack_flush_ms)
        report()
    stats = tracker.stats()
    return TaskStats(
        partition=partition,
        attempt=attempt,
        worker_pid=os.getpid(),
        consumer_uid=entry.uid,
        consumer_created=created,
        consumer_tasks=entry.tasks,
        worker_tasks=worker_tasks,
        shim_slot=entry.shim_slot,
        received=received,
        acked=acked,
        nacked=nacked,
        redelivered=redelivered,
        swallowed=consumer.stats()["swallowed"] - swallowed_before,
        handler_errors=handler_errors,
        non_retryable=non_retryable,
        dead_lettered=dead_lettered,
        stop_reason=stop_reason,
        pending_nacks=stats["pending_messages"],
        peak_pending_nacks=max(peak_pending, stats["pending_messages"]),
        tracker_memory_bytes=stats["memory_bytes"],
        peak_tracker_memory_bytes=max(peak_memory, stats["memory_bytes"]),
        flush_ms=round(flush_ms, 3),
        wall_ms=round((time.monotonic() - start) * 1000, 3),
        started_at_ms=started_at_ms,
        nacks=nacks,
        arrivals=arrivals,
        collected=collected,
    )


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


# ---------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty sequence."""
    index = max(0, math.ceil(fraction * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def _match_retries(
    tasks: Sequence[TaskStats],
) -> tuple[list[tuple[tuple[str, int, int, int], float, float, float]], int]:
    """Pair each nack with the first later arrival of the same message, across workers."""
    nacks: dict[tuple[str, int, int, int], list[tuple[float, float]]] = {}
    arrivals: dict[tuple[str, int, int, int], list[float]] = {}
    for task in tasks:
        for key, nacked_at, requested_at in task["nacks"]:
            nacks.setdefault(tuple(key), []).append((nacked_at, requested_at))  # type: ignore[arg-type]
        for key, arrived_at, _count in task["arrivals"]:
            arrivals.setdefault(tuple(key), []).append(arrived_at)  # type: ignore[arg-type]
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
            total[name] += task[name]  # type: ignore[literal-required]
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
        peak_pending_nacks=max((t["peak_pending_nacks"] for t in tasks), default=0),
        peak_tracker_memory_bytes=max((t["peak_tracker_memory_bytes"] for t in tasks), default=0),
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


# ---------------------------------------------------------------------------------------
# A quiet local SparkSession
# ---------------------------------------------------------------------------------------

_LOG4J2_TEMPLATE = """\
# Written by pulsar_nack.spark.local_session: only {level} and worse, on stderr.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# A logger of its own keeps Spark from printing "Setting default log level to WARN".
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
"""

# Lines the JVM prints whatever the log4j configuration says.
_JVM_NOISE = (
    re.compile(rb"^WARNING: Using incubator modules"),
    re.compile(rb"^Setting default log level to"),
    re.compile(rb"^To adjust logging level use sc\.setLogLevel"),
)

_SESSION_STATE: dict[str, Any] = {}


def _relay_stderr(read_fd: int) -> None:
    """Copy the JVM's stderr to ours line by line, without its fixed noise lines."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not any(p.match(line) for p in _JVM_NOISE))
            if out:
                with contextlib.suppress(OSError):
                    os.write(2, out)
        if pending and not any(p.match(pending) for p in _JVM_NOISE):
            with contextlib.suppress(OSError):
                os.write(2, pending)


def local_session(
    master: str = "local[2]",
    app_name: str = "pulsar-nack",
    *,
    log_level: str = "ERROR",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or get) a quiet local SparkSession on loopback, for tests, examples, demos.

    - ``SPARK_LOCAL_IP=127.0.0.1`` and the driver bound to 127.0.0.1; UI off; no
      console progress bar;
    - ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = this interpreter, so the workers
      import the same packages;
    - log4j2 at *log_level* from a properties file passed with
      ``spark.driver.extraJavaOptions``, ``sc.setLogLevel(log_level)``, and the JVM's
      fixed start-up lines (``WARNING: Using incubator modules``) filtered from its
      stderr.

    If a SparkContext is already running, or the script runs under ``spark-submit``
    (which launched the JVM), the session is ``SparkSession.builder.getOrCreate()``
    and *master*, *log_level* and *conf* are not applied. Stop it with
    :func:`stop_session`, which also ends a JVM started here.

    Parameters
    ----------
    master : str
        ``local[N]``, or ``local[N,F]`` to let a failed task run F times.
    app_name : str
    log_level : str
        log4j level name: ``ERROR`` (default), ``WARN``, ``INFO``, ``FATAL``, ``OFF``.
    conf : mapping, optional
        More Spark settings, e.g. ``{"spark.python.worker.reuse": "false"}``.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    if active is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        # Running already, or under spark-submit: its master and settings apply.
        return SparkSession.builder.getOrCreate()
    level = log_level.upper()
    if level not in ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"):
        raise ValueError(f"unknown log level {log_level!r}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_dir = tempfile.mkdtemp(prefix="pulsar-nack-spark-")
    atexit.register(shutil.rmtree, log_dir, True)  # if stop_session is never called
    log_config = os.path.join(log_dir, "log4j2.properties")
    with open(log_config, "w", encoding="utf-8") as fh:
        fh.write(_LOG4J2_TEMPLATE.format(level=level.lower()))
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    spark_conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        **dict(conf or {}),
    }.items():
        spark_conf.set(key, str(value))
    read_fd, write_fd = os.pipe()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_fd})
    except BaseException:
        os.close(read_fd)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise
    finally:
        os.close(write_fd)
    threading.Thread(target=_relay_stderr, args=(read_fd,), name="spark-stderr", daemon=True).start()
    sc = SparkContext(conf=spark_conf, gateway=gateway)
    sc.setLogLevel(level)
    _SESSION_STATE.update(gateway=gateway, log_dir=log_dir)
    return SparkSession.builder.getOrCreate()


def stop_session(spark: Any, timeout_s: float = 30.0) -> None:
    """Stop the SparkSession and, if :func:`local_session` started it, its JVM.

    ``spark.stop()`` leaves the JVM gateway running until the Python process exits;
    this also ends it (closing its stdin, as PySpark does at exit), which stops the
    PySpark daemon and its Python workers. Idempotent.
    """
    from pyspark import SparkContext

    if spark is not None:
        spark.stop()
    gateway = _SESSION_STATE.pop("gateway", None)
    log_dir = _SESSION_STATE.pop("log_dir", None)
    if gateway is not None and SparkContext._gateway is gateway:
        proc = getattr(gateway, "proc", None)
        with contextlib.suppress(Exception):
            gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the JVM exits when its stdin closes
            try:
                proc.wait(timeout=timeout_s)
            except Exception:
                proc.kill()
                proc.wait()
    if log_dir is not None:
        shutil.rmtree(log_dir, ignore_errors=True)
