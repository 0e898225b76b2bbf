"""Shared test helpers: waiting on conditions with a deadline (never bare sleeps), pure-Python trackers."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from bench._common import varint as _varint
from pulsar_nack import NegativeAcksTracker
from pulsar_nack.core import accel as _accel
from pulsar_nack.testing.waits import wait_until


def pid_gone(pid: int) -> bool:
    """True if process *pid* no longer runs (gone, or a zombie awaiting its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True
    return False


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll *condition* until it is truthy; return its final truthiness after *timeout_s*."""
    return wait_until(condition, timeout_s, poll_s)


class FakeClock:
    """A settable clock (``.now``) that counts how often it is read (``.calls``)."""

    def __init__(self, now: Any = 10_000) -> None:
        self.now = now
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.now


class PurePythonTracker(NegativeAcksTracker):
    """A NegativeAcksTracker with ``speedups=False``: the code a build without a compiler runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, speedups=False, **kwargs)
        assert type(self._buckets.hot_slot) is _accel.PyHotSlot and "add" not in vars(self)


def _batch_size(serialized: bytes) -> int:
    """Field 6 (batch_size) of a serialized MessageIdData (varint fields only)."""
    pos, size = 0, 0
    while pos < len(serialized):
        values = []
        for _ in range(2):  # tag, then value
            shift = value = 0
            while True:
                byte = serialized[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            values.append(value)
        if values[0] >> 3 == 6:
            size = values[1]
    return size


def out_of_batch_id(message_id: Any, batch_index: int) -> Any:
    """*message_id* with another batch index, keeping its batch size (as ``deserialize`` gives it)."""
    import _pulsar

    size = _batch_size(message_id.serialize())
    assert size > 0, "not a batch message id"
    fields = [(1, message_id.ledger_id()), (2, message_id.entry_id()), (3, message_id.partition()),
              (4, batch_index), (6, size)]
    return _pulsar.MessageId.deserialize(b"".join(_varint(n << 3) + _varint(v) for n, v in fields))


def produce(client: Any, topic: str, payloads: list[bytes], *, batch_size: int = 0) -> None:
    """Send *payloads* to *topic*; with *batch_size* > 0 they go out in batches of that many."""
    if batch_size:
        failed: list[Any] = []
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=batch_size,
            batching_max_publish_delay_ms=1_000,
            block_if_queue_full=True,  # else send_async drops what exceeds the 1,000 pending messages
        )
        for payload in payloads:
            producer.send_async(payload, lambda result, _id: failed.append(result) if str(result) != "Result.Ok" else None)
        producer.flush()
        assert not failed, f"{len(failed)} messages were not sent: {failed[:3]}"
    else:
        producer = client.create_producer(topic, batching_enabled=False)
        for payload in payloads:
            producer.send(payload)
    producer.close()


FIGURES_ENV = "PULSAR_NACK_TEST_FIGURES"
"""Where :func:`record_figure` appends (a JSON-lines file); ``tools/client_matrix.py`` sets it."""


def record_figure(name: str, **values: Any) -> None:
    """Append a test's measured *values* under *name* to ``$PULSAR_NACK_TEST_FIGURES``, if set.

    The client matrix keeps them in its JSON (``bench/results/client_matrix.json``), so the
    docs can quote what a test measured on each broker and client.
    """
    path = os.environ.get(FIGURES_ENV)
    if path:
        import json

        with open(path, "a") as out:
            out.write(json.dumps({"name": name, **values}) + "\n")


def read_all(client: Any, topic: str, subscription: str = "check", wait_ms: int = 1_000) -> list[Any]:
    """Every message of *topic* from the start (a new subscription, or an existing one), acked."""
    import pulsar

    reader = client.subscribe(topic, subscription, initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        while True:
            message = reader.receive(wait_ms)
            got.append(message)
            reader.acknowledge(message)
    except pulsar.Timeout:
        pass
    reader.close()
    return got


def dead_letters_allowed(kind: str, batched: bool) -> int:
    """How many dead letters of one message a run of *kind* ("plain" or ours) may send.

    The plain client may send a batch member's dead letter twice: the C++ client keys its
    dead-letter candidates by entry, and a second redelivery request for the entry before the
    first dead letter is stored sends the batch again (seen in about one run in ten of the
    reconnect scenario, the second copy sometimes without keys or properties). Ours sends one.
    """
    return 2 if kind == "plain" and batched else 1
