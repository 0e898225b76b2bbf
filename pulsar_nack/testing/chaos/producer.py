"""A producer process of a chaos run: a steady stream of chaos messages, and bursts on demand.

Each message's id is ``<name>.<pid>.<seq>``, unique across restarts; its ``produce`` record
is written when the broker confirms it, with the stored message's id. Sends never time
out (``send_timeout_millis=0``): across a broker kill the client sends again, which may
store a message twice (the checker tells such copies by their two message ids).

Signals: SIGUSR1 sends a burst of ``ProducerSpec.burst`` messages at once; SIGTERM
flushes, waits for the confirmations and ends the process.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from .fate import encode
from .history import Ev, HistoryWriter
from .workload import ProducerSpec, WorkloadSpec

__all__ = ["run_producer"]

_CONFIRM_WAIT_S = 120.0


class _Stream:
    """Sends and records; counts what the broker has not confirmed yet."""

    def __init__(self, spec: WorkloadSpec, me: ProducerSpec, writer: HistoryWriter, producer: Any) -> None:
        self.me = me
        self.alias = me.topic
        self.writer = writer
        self.producer = producer
        self.seq = 0
        self.unconfirmed = 0
        self.lock = threading.Lock()

    def send(self) -> None:
        import pulsar

        message_id = f"{self.me.name}.{self.writer.pid}.{self.seq}"
        key = f"k{self.seq % self.me.keys}" if self.me.keys else None
        self.seq += 1

        def confirmed(result: Any, stored: Any) -> None:
            if result == pulsar.Result.Ok:
                self.writer.write(Ev.PRODUCE, id=message_id, topic=self.alias, mid=str(stored), batched=self.me.batched)
            else:
                self.writer.write(Ev.ERROR, op="send", id=message_id, error=str(result))
            with self.lock:
                self.unconfirmed -= 1

        with self.lock:
            self.unconfirmed += 1
        options = {"partition_key": key} if key else {}
        self.producer.send_async(encode(message_id, time.time()), confirmed, **options)


def run_producer(spec: WorkloadSpec, name: str) -> None:
    """Run producer *name* of *spec* until SIGTERM."""
    import pulsar

    from ..client import quiet_client

    me = spec.producer(name)
    writer = HistoryWriter(spec.history, name)
    bursts: list[int] = []
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: bursts.append(me.burst))
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    writer.write(Ev.START, role="producer", topic=me.topic)
    client = quiet_client(spec.url)
    producer = client.create_producer(
        spec.topics[me.topic], batching_enabled=me.batched, batching_max_messages=20,
        batching_max_publish_delay_ms=10, block_if_queue_full=True, send_timeout_millis=0,
        batching_type=pulsar.BatchingType.KeyBased if me.keys else pulsar.BatchingType.Default,
    )  # fmt: skip
    stream = _Stream(spec, me, writer, producer)
    period = 1.0 / me.rate_per_s
    next_send = time.monotonic()
    while not stop.is_set():
        while bursts:
            for _ in range(bursts.pop()):
                stream.send()
            writer.write(Ev.SAMPLE, burst=me.burst, seq=stream.seq)
        stream.send()
        next_send += period
        stop.wait(max(0.0, next_send - time.monotonic()))
    producer.flush()
    deadline = time.monotonic() + _CONFIRM_WAIT_S
    while stream.unconfirmed and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.write(Ev.STOP, sent=stream.seq, unconfirmed=stream.unconfirmed)
    producer.close()
    client.close()
    writer.close()
