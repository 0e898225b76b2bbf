"""What reading a received message's id costs, through the bindings or libpulsar, beside the plain consumer's receive + ack.

A consumer that guards (nacks pending) must know each received message's entry to tell
a copy of a nacked entry from a new message, so it reads the id of every message:
``message_id()`` then ``serialize()`` on the client's bindings, inside
``EntryTable.admit_message`` (``pulsar_nack.consumer._msgid``), or, where pulsar-client
3.9+ allows it, through libpulsar's C++ accessors (``pulsar_nack.consumer.native_ids``).
This measures, per message, on messages received from Apache Pulsar standalone (batches
of 10): the plain consumer's ``acknowledge(receive())``, the two binding calls alone, and
``admit_message`` + ``ack_message`` (all a guarded receive and ack add in C), both ways.
``floor_ratio`` is (plain + admit + ack) / plain: the guarded receive + ack over the plain
one if every other line of ours cost nothing (``floor_ratio_bindings``: reading every id
through the bindings).

Run ``python -m bench.id_read [--quick]``; writes ``bench/results/id-read.json``. Thread
CPU time (as bench/consumer.py), minima over repetitions (the least disturbed), each repetition
over the same received messages.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from pulsar_nack.consumer import msgid, native_ids
from pulsar_nack.consumer._client import unwrap_message, wrap_message

from ._common import broker_label, finish, parser, standalone, start_context
from .consumer import _receive_ack, _side_by_side

MESSAGES = 10_000
REPETITIONS = 7
SETTLED_CAPACITY = 1 << 17


def _received(client: Any, n: int) -> list[Any]:
    """*n* ``_pulsar.Message`` objects received (not acked) from a fresh topic, batches of 10."""
    topic = f"persistent://public/default/id-read-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, "bench", receiver_queue_size=n)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      block_if_queue_full=True)  # fmt: skip
    for _ in range(n):
        producer.send_async(b"x" * 64, lambda result, message_id: None)
    producer.flush()
    producer.close()
    messages = [unwrap_message(consumer.receive(30_000)) for _ in range(n)]
    consumer.close()
    return messages


def _timed(loop: Callable[[], int]) -> float:
    """Thread-CPU µs per message of one run of ``loop()`` (which returns how many it did)."""
    cpu = time.thread_time()
    count = loop()
    return (time.thread_time() - cpu) / count * 1e6


def _per_message(loop: Callable[[], int], reps: int) -> float:
    """Least thread-CPU µs per message over *reps* runs of ``loop()``."""
    return min(_timed(loop) for _ in range(reps))


def _plain_receive_ack(client: Any, admin: Any, n: int, reps: int) -> float:
    """Least thread-CPU µs per ``acknowledge(receive())`` of the plain consumer (bench.consumer's loop)."""
    prepare = partial(_receive_ack, client, admin, n=n, batched=True)
    return min(_side_by_side(["plain"], prepare, n - 1)["plain"][1] for _ in range(reps))


def _wrapped(raw: list[Any]) -> list[Any]:
    """A ``pulsar.Message`` around each received ``_pulsar.Message``, as a receive builds it."""
    return [wrap_message(message, None) for message in raw]


def _binding(raw: list[Any], read: Callable[[Any], Any], reps: int) -> float:
    """Least thread-CPU µs per message of ``read(message)`` over the received messages."""

    def loop() -> int:
        for message in raw:
            read(message)
        return len(raw)

    return _per_message(loop, reps)


def _table_pass(raw: list[Any], with_ack: bool) -> float:
    """Thread-CPU µs per message of ``admit_message`` (and ``ack_message``) on a fresh guarding table."""
    pairs = list(zip(raw, _wrapped(raw)))
    entries = msgid.EntryTable(SETTLED_CAPACITY)
    entries.watch(0, 0)  # a watch elsewhere: every message is looked up, as while guarding
    entries.guard_left = len(pairs) + 1

    def loop() -> int:
        for message, wrapper in pairs:
            entries.admit_message(message, wrapper)
            if with_ack:
                entries.ack_message(wrapper)
        return len(pairs)

    return _timed(loop)


def run(n: int, reps: int) -> dict[str, Any]:
    import pulsar

    import pulsar_nack

    with standalone() as broker:
        client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        raw = _received(client, n)
        plain = _plain_receive_ack(client, broker.admin, n, reps)
        client.close()
        label = f"{broker_label(broker)}, batch-index acks on"
    empty = _binding(raw, lambda message: None, reps)
    serialized = _binding(raw, lambda message: message.message_id().serialize(), reps) - empty
    admit_ack = min(_table_pass(raw, True) for _ in range(reps)) - empty
    native = msgid.NATIVE_IDS
    native_ids.unbind(msgid._c)  # the same table reading every id through the bindings, as before 3.9
    try:
        admit_ack_bindings = min(_table_pass(raw, True) for _ in range(reps)) - empty
    finally:
        native_ids.bind(msgid._c)
    return {
        "broker": label,
        "messages": n,
        "repetitions": reps,
        "pulsar_nack": pulsar_nack.__version__,
        "us": {
            "plain_receive_ack": plain,
            "message_id": _binding(raw, lambda message: message.message_id(), reps) - empty,
            "message_id_serialize": serialized,
            "admit_message": min(_table_pass(raw, False) for _ in range(reps)) - empty,
            "admit_and_ack_message": admit_ack,
            "admit_and_ack_message_bindings": admit_ack_bindings,
        },
        "native_ids": native,
        "id_read_over_plain": serialized / plain,
        "floor_ratio": (plain + admit_ack) / plain,
        "floor_ratio_bindings": (plain + admit_ack_bindings) / plain,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser(__doc__, "bench.id_read", quick="2,000 messages, 3 repetitions").parse_args(
        sys.argv[1:] if argv is None else argv)  # fmt: skip
    start = start_context()
    payload = run(2_000 if args.quick else MESSAGES, 3 if args.quick else REPETITIONS)
    for name, value in payload["us"].items():
        print(f"{name:24} {value:6.3f} µs")
    print(f"id read / plain receive + ack: {payload['id_read_over_plain']:.3f}; floor of guarding: "
          f"{payload['floor_ratio']:.3f}x the plain consumer")  # fmt: skip
    finish(args, "id-read", payload, start)
    return payload


if __name__ == "__main__":
    main()
