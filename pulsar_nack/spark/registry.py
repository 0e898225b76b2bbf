"""The executor-side registry: one client and one consumer per Python worker per config key.

A consumer opened and closed inside every Spark task would lose its pending retries at
the task boundary. So the first task that needs one builds it, and every later task of
the same worker process reuses it (PySpark reuses Python workers by default).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import math
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..timing import RECONNECT_GRACE_S
from .builtin import BuiltinNackConsumer
from .config import ConsumerConfig

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..consumer import NackingConsumer
    from ..consumer.dead_letter import DeadLetter

__all__ = ["Entry", "acquire", "close_executor_consumers", "discard", "executor_consumer", "next_worker_task"]

_log = logging.getLogger(__name__)

_NO_LIMIT = 2**31 - 1
"""A dead-letter count that is never reached (the client's int32 maximum)."""


class Entry:
    """One worker's client + consumer for one ``(service_url, topics, subscription)``."""

    __slots__ = ("client", "consumer", "dead_letter", "pid", "resumed_at", "retry_dues", "settings", "tasks", "uid")

    settings: tuple[Any, ...]
    pid: int
    client: Any
    consumer: NackingConsumer | BuiltinNackConsumer
    uid: str
    tasks: int
    dead_letter: DeadLetter | None  # created by the first dead letter
    retry_dues: list[float]  # retries="durable": a heap of monotonic times its tasks drain until
    resumed_at: float | None  # monotonic time a task saw the consumer connected again after a disconnect
    # (math.inf while it is away), until its next message; None when no reconnect is pending

    def close(self, redeliver_pending: bool = True) -> None:
        """Close consumer, dead-letter producers and client; log, never raise."""
        dead_letter, self.dead_letter = self.dead_letter, None
        for closer in (
            lambda: self.consumer.close(redeliver_pending=redeliver_pending),
            dead_letter.close if dead_letter is not None else None,
            self.client.close,
        ):
            if closer is None:
                continue
            try:
                closer()
            except Exception:  # a broken connection: nothing more to do
                _log.debug("closing %s failed", self.uid, exc_info=True)


_REGISTRY: dict[tuple[str, tuple[str, ...], str], Entry] = {}
_REGISTRY_LOCK = threading.Lock()
_REGISTRY_PID: int = os.getpid()
_ABANDONED: list[Entry] = []  # inherited through fork(): never touched, never collected
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

    from ..consumer.client_log import stderr_logger  # imports pulsar: not at module import

    options = dict(config.client_options)
    options.setdefault("logger", stderr_logger(config.log_level))
    return pulsar.Client(config.service_url, **options)


def _build(config: ConsumerConfig) -> Entry:
    """Create a client (``config.client_factory`` or ``pulsar.Client``) and a consumer."""
    import pulsar

    from ..consumer import subscribe

    client = _new_client(config)
    options: dict[str, Any] = {
        "batch_index_ack_enabled": config.batch_index_ack,
        **config.consumer_options,
        "consumer_type": getattr(pulsar.ConsumerType, config.subscription_type),
        "initial_position": getattr(pulsar.InitialPosition, config.initial_position),
        "negative_ack_redelivery_delay_ms": config.negative_ack_redelivery_delay_ms,
    }
    topics = list(config.topic_names) if len(config.topic_names) > 1 else config.topic_names[0]
    if config.retries == "durable":
        # Retries go to the retry letter topic; the task's retry policy alone decides about
        # dead letters (max_redeliveries, on_non_retryable), so the consumer's own limit is off.
        options["retry_enable"] = True
        options["retry_hold_ms"] = config.retry_hold_ms
        options["dead_letter_policy"] = pulsar.ConsumerDeadLetterPolicy(_NO_LIMIT, config.dead_letter_topic)
    consumer: NackingConsumer | BuiltinNackConsumer
    try:
        if config.tracker == "builtin":
            consumer = BuiltinNackConsumer(client.subscribe(topics, config.subscription, **options))
        else:
            consumer = subscribe(
                client,
                topics,
                config.subscription,
                negative_ack_precision_bit_cnt=config.negative_ack_precision_bit_cnt,
                redelivery_backoff=config.redelivery_backoff,
                never_early=config.never_early,
                **options,
            )
    except BaseException:
        with contextlib.suppress(Exception):
            client.close()
        raise
    entry = Entry()
    entry.settings = config.consumer_settings()
    entry.pid = os.getpid()
    entry.client = client
    entry.consumer = consumer
    entry.uid = f"{os.getpid()}-{next(_CONSUMERS_BUILT)}-{uuid.uuid4().hex[:6]}"
    entry.tasks = 0
    entry.dead_letter = None
    entry.retry_dues = []
    entry.resumed_at = None  # subscribe() returns once the broker has answered
    return entry


def discard(key: tuple[str, tuple[str, ...], str], entry: Entry) -> None:
    """Drop *entry* from the registry and close it: what it held returns at once."""
    with _REGISTRY_LOCK:
        if _REGISTRY.get(key) is entry:
            del _REGISTRY[key]
    entry.close(redeliver_pending=True)


def _healthy(entry: Entry) -> bool:
    """False if the consumer is closed, or stays disconnected past a short grace."""
    consumer = entry.consumer
    if consumer.closed:
        return False
    deadline = time.monotonic() + RECONNECT_GRACE_S
    while True:
        try:
            if consumer.is_connected():
                return True
        except Exception:
            return False
        entry.resumed_at = math.inf  # away: the task notes when it is back (see _TaskRun._loop)
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


def acquire(config: ConsumerConfig) -> tuple[Entry, bool]:
    """The worker's entry for *config*, built or rebuilt if needed; (entry, created)."""
    with _REGISTRY_LOCK:
        _check_fork()
        entry = _REGISTRY.get(config.key)
        if entry is not None:
            if entry.settings == config.consumer_settings() and _healthy(entry):
                return entry, False
            del _REGISTRY[config.key]
            # Closing returns whatever it held to the subscription: nothing is lost.
            entry.close(redeliver_pending=True)
        entry = _build(config)
        _REGISTRY[config.key] = entry
        _register_atexit()
        return entry, True


def executor_consumer(config: ConsumerConfig) -> NackingConsumer | BuiltinNackConsumer:
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
    NackingConsumer or BuiltinNackConsumer
        The latter with ``config.tracker="builtin"``. Do not close it yourself; use :func:`close_executor_consumers`.
    """
    if not isinstance(config, ConsumerConfig):
        raise TypeError(f"config must be a ConsumerConfig, not {type(config).__name__}")
    return acquire(config)[0].consumer


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


def next_worker_task() -> int:
    """Count one more consumer task run by this worker process; return the count."""
    global _TASKS_RUN
    with _REGISTRY_LOCK:
        _check_fork()
        _TASKS_RUN += 1
        return _TASKS_RUN
