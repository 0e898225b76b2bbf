"""A consumer process of a chaos run: receive, record, then ack, nack or reconsume as the fate says.

Uses the public API only (:func:`pulsar_nack.subscribe`, :func:`pulsar_nack.asyncio.subscribe`,
``negative_acknowledge``, ``reconsume_later``, ``stats()``). Every delivery and every
settlement is recorded *before* the call that settles it, so a nack's recorded time is
never after the consumer's own (its due time is never overstated) and an ack recorded just
before a SIGKILL reads as an ack the kill may have lost.

Signals: SIGUSR1 closes the consumer and subscribes again (the nemesis's *resubscribe*);
SIGTERM closes it and ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from typing import Any

from ...core.backoff import MultiplierRedeliveryBackoff
from .fate import Mechanism, decode, fate_of
from .history import Ev, HistoryWriter
from .workload import DLQ_SUBSCRIPTION, PRECISION_BITS, TOKEN, ConsumerSpec, WorkloadSpec

__all__ = ["Action", "Request", "Settle", "decide", "run_consumer"]

_SUBSCRIBE_TIMEOUT_S = 180.0
_TRACE_AFTER_S = 120.0
"""With tracemalloc on, the Python allocations that grew since this moment are recorded at the end."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Request(enum.Enum):
    """What a signal asked the process to do next."""

    NONE = "none"
    RESUBSCRIBE = "resubscribe"
    STOP = "stop"


class Settle(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    RECONSUME = "reconsume"


@dataclass(frozen=True)
class Action:
    """How to settle one delivery: *delay_ms* None leaves a nack's delay to the backoff."""

    settle: Settle
    delay_ms: int | None = None
    token: str | None = None


class _Signals:
    """The latest request from a signal; the handlers only set it."""

    def __init__(self) -> None:
        self.request = Request.NONE
        signal.signal(signal.SIGUSR1, lambda *_: self._ask(Request.RESUBSCRIBE))
        signal.signal(signal.SIGTERM, lambda *_: self._ask(Request.STOP))

    def _ask(self, request: Request) -> None:
        if self.request is not Request.STOP:  # a stop is never overridden
            self.request = request

    def take(self) -> Request:
        request, self.request = self.request, (Request.STOP if self.request is Request.STOP else Request.NONE)
        return request


class _Context:
    """What one consumer process needs to record and decide."""

    def __init__(self, spec: WorkloadSpec, me: ConsumerSpec) -> None:
        self.spec = spec
        self.me = me
        self.sub = spec.subscription(me.subscription)
        self.backoff = MultiplierRedeliveryBackoff(*self.sub.backoff)
        self.writer = HistoryWriter(spec.history, me.name)
        self.gen = 0
        self.next_sample = 0.0
        self.started = time.monotonic()
        self.trace_base: tracemalloc.Snapshot | None = None

    def subscribe_kwargs(self) -> dict[str, Any]:
        import pulsar

        sub = self.sub
        kwargs: dict[str, Any] = {
            "consumer_type": getattr(pulsar.ConsumerType, sub.consumer_type),
            "consumer_name": self.me.name,  # Key_Shared hash ranges follow the name, kept across restarts
            "negative_ack_redelivery_delay_ms": 1_000,
            "negative_ack_precision_bit_cnt": PRECISION_BITS,
            "never_early": self.me.never_early,
            "redelivery_backoff": self.backoff,
            "receiver_queue_size": 100,
            "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(
                max_redeliver_count=sub.max_redeliver_count, dead_letter_topic=sub.dead_letter_topic(self.spec),
                initial_subscription_name=DLQ_SUBSCRIPTION),
        }  # fmt: skip
        if Mechanism.RECONSUME in sub.mechanisms:
            kwargs.update(retry_enable=True, retry_hold_ms=self.me.retry_hold_ms)
        return kwargs

    def delivered(self, message: Any) -> Action:
        """Record a delivery and decide how to settle it (recorded too)."""
        message_id, _ = decode(message.data())
        rc = message.redelivery_count()
        common = {"id": message_id, "sub": self.sub.name, "gen": self.gen, "rc": rc}
        self.writer.write(Ev.DELIVER, **common, mid=str(message.message_id()),
                          copy=message.properties().get(TOKEN))  # fmt: skip
        action = decide(self.spec.seed, message_id, rc, self.sub.mechanisms)
        if action.settle is Settle.ACK:
            self.writer.write(Ev.ACK, **common)
        elif action.settle is Settle.NACK:
            delay = self.backoff.next_delay_ms(rc) if action.delay_ms is None else action.delay_ms
            self.writer.write(Ev.NACK, **common, delay_ms=delay, floor_ms=self.me.floor_ms)
        else:
            self.writer.write(Ev.RECONSUME, **common, delay_ms=action.delay_ms, token=action.token)
        return action

    def sample(self, consumer: Any) -> None:
        """Record RSS, the tracker's own bytes and the consumer's books (``memory_bytes``) every ``sample_s``."""
        now = time.monotonic()
        if now < self.next_sample:
            return
        self.next_sample = now + self.spec.sample_s
        stats = consumer.stats()
        with open("/proc/self/statm", encoding="ascii") as f:
            rss = int(f.read().split()[1]) * _PAGE
        tracker = stats["tracker"]
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
        if traced is not None and self.trace_base is None and now - self.started >= _TRACE_AFTER_S:
            self.trace_base = tracemalloc.take_snapshot()
        self.writer.write(Ev.SAMPLE, rss=rss, tracker_bytes=tracker["memory_bytes"],
                          books_bytes=stats.get("memory_bytes"), pending=tracker["pending_messages"],
                          held=stats.get("held"), delivered=stats["delivered"], gen=self.gen, python_bytes=traced)  # fmt: skip

    def error(self, op: str, error: BaseException, message_id: str | None = None) -> None:
        """Record an error; a failed settlement names its message (its ack, nack or reconsume did not happen)."""
        self.writer.write(Ev.ERROR, op=op, error=repr(error)[:300], gen=self.gen, id=message_id, sub=self.sub.name)


def decide(seed: int, message_id: str, rc: int, mechanisms: tuple[Mechanism, ...]) -> Action:
    """The action for the delivery of *message_id* with ``redelivery_count() == rc``."""
    fate = fate_of(seed, message_id, mechanisms)
    if not fate.fails(rc):
        return Action(Settle.ACK)
    if fate.mechanism is Mechanism.RECONSUME:
        return Action(Settle.RECONSUME, fate.delay_ms(rc), uuid.uuid4().hex[:16])
    return Action(Settle.NACK, None if fate.by_backoff else fate.delay_ms(rc))


# --------------------------------------------------------------------------- blocking


def _subscribe_blocking(ctx: _Context, client: Any) -> Any:
    import pulsar_nack

    deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT_S
    while True:
        try:
            consumer = pulsar_nack.subscribe(client, ctx.spec.topics[ctx.sub.topic], ctx.sub.name, **ctx.subscribe_kwargs())
        except Exception as error:  # the broker may be down or frozen: the nemesis is at work
            ctx.error("subscribe", error)
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
            continue
        ctx.gen += 1
        ctx.writer.write(Ev.SUBSCRIBE, sub=ctx.sub.name, gen=ctx.gen)
        return consumer


def _settle_blocking(consumer: Any, message: Any, action: Action) -> None:
    if action.settle is Settle.ACK:
        consumer.acknowledge(message)
    elif action.settle is Settle.NACK:
        consumer.negative_acknowledge(message, action.delay_ms)
    else:
        consumer.reconsume_later(message, action.delay_ms, {TOKEN: str(action.token)})


def _close(ctx: _Context, consumer: Any) -> None:
    ctx.writer.write(Ev.CLOSE, sub=ctx.sub.name, gen=ctx.gen)
    try:
        consumer.close()
    except Exception as error:
        ctx.error("close", error)


def _run_blocking(ctx: _Context, signals: _Signals) -> None:
    import pulsar

    from ..client import quiet_client

    client = quiet_client(ctx.spec.url, operation_timeout_seconds=ctx.spec.operation_timeout_s)
    consumer = _subscribe_blocking(ctx, client)
    while True:
        request = signals.take()
        if request is not Request.NONE:
            _close(ctx, consumer)
            if request is Request.STOP:
                break
            consumer = _subscribe_blocking(ctx, client)
        ctx.sample(consumer)
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        except Exception as error:
            ctx.error("receive", error)
            time.sleep(0.1)
            continue
        action = ctx.delivered(message)
        try:
            _settle_blocking(consumer, message, action)
        except Exception as error:
            ctx.error("settle", error, decode(message.data())[0])
    client.close()


# --------------------------------------------------------------------------- asyncio


async def _subscribe_async(ctx: _Context, client: Any) -> Any:
    import pulsar_nack.asyncio

    deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT_S
    while True:
        try:
            consumer = await pulsar_nack.asyncio.subscribe(
                client, ctx.spec.topics[ctx.sub.topic], ctx.sub.name, **ctx.subscribe_kwargs())
        except Exception as error:
            ctx.error("subscribe", error)
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        ctx.gen += 1
        ctx.writer.write(Ev.SUBSCRIBE, sub=ctx.sub.name, gen=ctx.gen)
        return consumer


async def _settle_async(consumer: Any, message: Any, action: Action) -> None:
    if action.settle is Settle.ACK:
        await consumer.acknowledge(message)
    elif action.settle is Settle.NACK:
        await consumer.negative_acknowledge(message, action.delay_ms)
    else:
        await consumer.reconsume_later(message, action.delay_ms, {TOKEN: str(action.token)})


async def _close_async(ctx: _Context, consumer: Any, pending: asyncio.Future[Any] | None) -> None:
    ctx.writer.write(Ev.CLOSE, sub=ctx.sub.name, gen=ctx.gen)
    try:
        await consumer.close()
    except Exception as error:
        ctx.error("close", error)
    if pending is not None:  # its message, if any, is unacked and comes back
        pending.cancel()
        with contextlib.suppress(BaseException):
            await pending


async def _run_async(ctx: _Context, signals: _Signals) -> None:
    import pulsar.asyncio

    from ...consumer.client_log import stderr_logger

    client = pulsar.asyncio.Client(ctx.spec.url, operation_timeout_seconds=ctx.spec.operation_timeout_s,
                                   logger=stderr_logger("warn"))  # fmt: skip
    consumer = await _subscribe_async(ctx, client)
    receiving: asyncio.Future[Any] | None = None  # kept across turns: a cancelled receive may lose its message
    while True:
        request = signals.take()
        if request is not Request.NONE:
            await _close_async(ctx, consumer, receiving)
            receiving = None
            if request is Request.STOP:
                break
            consumer = await _subscribe_async(ctx, client)
        ctx.sample(consumer)
        if receiving is None:
            receiving = asyncio.ensure_future(consumer.receive())
        done, _ = await asyncio.wait({receiving}, timeout=0.2)
        if not done:
            continue
        future, receiving = receiving, None
        try:
            message = future.result()
        except Exception as error:
            ctx.error("receive", error)
            await asyncio.sleep(0.1)
            continue
        action = ctx.delivered(message)
        try:
            await _settle_async(consumer, message, action)
        except Exception as error:
            ctx.error("settle", error, decode(message.data())[0])
    await client.close()


def run_consumer(spec: WorkloadSpec, name: str) -> None:
    """Run consumer *name* of *spec* until SIGTERM.

    With ``PYTHONTRACEMALLOC`` set, each sample also records the bytes Python itself holds
    (``python_bytes``), which tells growth of Python objects from native growth.
    """
    ctx = _Context(spec, spec.consumer(name))
    signals = _Signals()
    ctx.writer.write(Ev.START, role="consumer", mode=ctx.me.mode, sub=ctx.sub.name)
    if ctx.me.mode == "asyncio":
        asyncio.run(_run_async(ctx, signals))
    else:
        _run_blocking(ctx, signals)
    if ctx.trace_base is not None:
        grown = tracemalloc.take_snapshot().compare_to(ctx.trace_base, "lineno")[:15]
        ctx.writer.write(Ev.SAMPLE, python_growth=[[str(stat.traceback), stat.size_diff, stat.count_diff] for stat in grown])
    ctx.writer.write(Ev.STOP)
    ctx.writer.close()
