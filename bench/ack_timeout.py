"""The ack timeout kept by the consumer beside the plain client's: memory per unacked message, receive + ack cost.

Both on one Apache Pulsar standalone (batch-index acks on), one run, ``unacked_messages_timeout_ms``
of ten minutes (nothing times out during the measurement):

* **receive + acknowledge**: :func:`bench.consumer.run_ack_timeout_calls`, the ack-timeout
  case of ``bench/consumer.py`` (which runs it on both broker settings into
  ``bench/results/consumer.json``): µs per message over ``--messages`` messages already in
  the receive queue, batches of 10 and not, for the plain ``client.subscribe`` with its
  ack timeout and ``pulsar_nack.subscribe`` with the same; repetitions alternate the two,
  the first is a warmup; min / median / max, wall clock and the calling thread's CPU time.
* **bytes per unacked message**: a fresh worker process per run receives
  ``--unacked`` messages and keeps them unacked (the message objects dropped: only what
  each consumer keeps per id remains; ours converts its logs of received messages first,
  as its next tick would); the process RSS delta (after ``gc.collect`` and
  ``malloc_trim``) of the system with the ack timeout minus that of the same system
  without it, per message. Ours also reports its structures' own estimate
  (``AckTimeout.memory_bytes``). Three runs of each, medians. ``bench/consumer.py`` runs
  this part too (:func:`run_memory`).

Run: ``python -m bench.ack_timeout [--quick]``; writes ``bench/results/ack_timeout.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import uuid
from typing import Any

from ._common import finish, parser, rss_bytes, run_worker, start_context, trim_heap

TIMEOUT_MS = 600_000
SYSTEMS = ("plain", "pulsar-nack")
UNACKED = 40_000
"""Unacked messages per memory run: below the broker's ``maxUnackedMessagesPerConsumer`` (50,000 by
default), past which it stops dispatching to the consumer."""


def _subscribe(client: Any, system: str, topic: str, queue: int, timeout: bool) -> Any:
    import pulsar

    import pulsar_nack

    options: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": queue,
                               "initial_position": pulsar.InitialPosition.Earliest}
    if timeout:
        options["unacked_messages_timeout_ms"] = TIMEOUT_MS
    if system == "plain":
        return client.subscribe(topic, f"sub-{system}", **options)
    return pulsar_nack.subscribe(client, topic, f"sub-{system}", **options)


def _produce(client: Any, topic: str, n: int) -> None:
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for i in range(n):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    producer.close()


def _memory_worker(url: str, system: str, topic: str, n: int, timeout: bool) -> dict[str, Any]:
    """Fresh process: receive *n* messages, keep them unacked, drop the objects; the RSS delta."""
    import gc

    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = _subscribe(client, system, topic, 1000, timeout)
    consumer.acknowledge(consumer.receive(30_000))  # one-off structures before the first read
    gc.collect()
    trim_heap()
    before = rss_bytes()
    for _ in range(n):
        consumer.receive(30_000)
    if system == "pulsar-nack" and timeout:  # its logs converted (as a tick does): only what it keeps per id remains
        stats = consumer.stats()
    gc.collect()
    trim_heap()
    after = rss_bytes()
    result: dict[str, Any] = {"system": system, "timeout": timeout, "messages": n, "rss_delta_bytes": after - before}
    if system == "pulsar-nack" and timeout:  # its structures' own estimate
        result["structures_bytes"] = stats["ack_timeout_memory_bytes"]
        result["in_flight"] = stats["ack_timeout_in_flight"]
    consumer.close()
    client.close()
    return result


def run_memory(url: str, n: int, reps: int) -> dict[str, Any]:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    runs: list[dict[str, Any]] = []
    for _ in range(reps):
        for system in SYSTEMS:
            for timeout in (True, False):
                topic = f"persistent://public/default/bench-ackt-mem-{uuid.uuid4().hex[:8]}"
                _produce(client, topic, n + 1)
                runs.append(run_worker("bench.ack_timeout", url, system, topic, str(n), str(int(timeout))))
    client.close()
    out: dict[str, Any] = {"messages": n, "runs": runs}
    for system in SYSTEMS:
        with_t = statistics.median(r["rss_delta_bytes"] for r in runs if r["system"] == system and r["timeout"])
        without = statistics.median(r["rss_delta_bytes"] for r in runs if r["system"] == system and not r["timeout"])
        out[system] = {"rss_delta_with_timeout": with_t, "rss_delta_without": without,
                       "bytes_per_unacked": (with_t - without) / n}
    ours = [r["structures_bytes"] / r["in_flight"] for r in runs if "structures_bytes" in r and r["in_flight"]]
    out["pulsar-nack"]["structures_bytes_per_unacked"] = statistics.median(ours) if ours else None
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        url, system, topic, count, timeout = argv[1:6]
        print(json.dumps(_memory_worker(url, system, topic, int(count), bool(int(timeout)))))
        return None
    made = parser(__doc__ or "", "bench.ack_timeout", quick="5,000 messages, 2 repetitions")
    made.add_argument("--messages", type=int, default=None, help="receive + ack messages per repetition (20,000)")
    made.add_argument("--unacked", type=int, default=None, help=f"unacked messages per memory run ({UNACKED:,})")
    args = made.parse_args(argv)
    from pulsar_nack.testing import PulsarStandalone

    start = start_context()
    n = args.messages or (5_000 if args.quick else 20_000)
    unacked = args.unacked or (5_000 if args.quick else UNACKED)
    reps = 2 if args.quick else 3
    from .consumer import run_ack_timeout_calls

    with PulsarStandalone(batch_index_ack=True) as broker:
        payload = {"broker": f"Apache Pulsar {broker.version} standalone", "timeout_ms": TIMEOUT_MS,
                   "cost": run_ack_timeout_calls(broker.url, broker.admin, n, reps),
                   "memory": run_memory(broker.url, unacked, reps)}
    from .report import ack_timeout_table

    finish(args, "ack_timeout", payload, start, table=ack_timeout_table)
    return payload


if __name__ == "__main__":
    main()
