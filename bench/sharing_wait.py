"""What the sharing rule costs a nacked batch member: its lateness under each rule, beside the plain client.

On a Shared or Key_Shared subscription (``Sharing.SHARED``, what ``subscribe`` sets) the
nacked members of one batch entry come back together, when the last of them is due: the
broker may dispatch the redelivered entry to another consumer, which knows nothing of this
consumer's pending nacks. With one active consumer (``Sharing.ONE_ACTIVE``) each comes back at
its own time. The Spark demo's workload nacks members of one entry a few milliseconds apart
(one in ten events fails once, each taking some work), so under the rule the earlier ones
wait for the last one.

This runs that workload on one consumer of a Shared subscription on Apache Pulsar
standalone, four ways, alternating, ``--repeats`` times: the plain ``client.subscribe``
with its built-in nack (``plain``), ours with the rule (``shared``, as ``subscribe`` makes
it), and ours without it (``one-active``, ``NackingConsumer.wrap`` with
``Sharing.ONE_ACTIVE``, its consumer subscribed as ``subscribe`` subscribes it, batch-index acks
on: correct here, since no other consumer reads the subscription), and ours with the rule and
batch-index acks off (``shared-unindexed``, ``batch_index_ack_enabled=False``). A
backlog of ``--messages`` events in batches of up to ``BATCH`` is read with ``WORK_US`` of
busy work per event; every tenth event is nacked once with a ``DELAY_MS`` delay, the rest
and every retry acked. Lateness is a retry's first arrival less its nack time and delay.
For ``shared``, ``rule_wait_ms`` is what the rule alone adds to each nacked member: the
last nack of its entry less its own. ``--precision-bits`` sets our consumers'
``negative_ack_precision_bit_cnt`` (default: the library's). Result:
``bench/results/sharing-wait.json``.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from pulsar_nack.core.buckets import DEFAULT_PRECISION_BITS

from ._common import broker_label, finish, parser, percentile, standalone, start_context

MESSAGES = 20_000
REPEATS = 3
BATCH = 100
DELAY_MS = 500
WORK_US = 100
NACK_EVERY = 10
RECEIVER_QUEUE = 1_000
MODES = ("plain", "shared", "one-active", "shared-unindexed")
TIMEOUT_S = 60.0


def _produce(client: Any, topic: str, n: int) -> None:
    """A backlog of *n* events numbered in their payloads, in batches of up to :data:`BATCH`."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=BATCH,
                                      batching_max_publish_delay_ms=10, block_if_queue_full=True)  # fmt: skip
    for number in range(n):
        producer.send_async(str(number).encode(), lambda result, message_id: None)
    producer.flush()
    producer.close()


def _subscribe(client: Any, topic: str, mode: str, bits: int) -> Any:
    """The consumer of *mode* on a fresh Shared subscription (ours with *bits* of precision)."""
    import pulsar

    import pulsar_nack
    from pulsar_nack import NackingConsumer
    from pulsar_nack.consumer import ConsumerSettings, Sharing

    shared = pulsar.ConsumerType.Shared
    queue = RECEIVER_QUEUE
    if mode == "plain":
        return client.subscribe(topic, "wait", consumer_type=shared, negative_ack_redelivery_delay_ms=DELAY_MS,
                                receiver_queue_size=queue)  # fmt: skip
    if mode in ("shared", "shared-unindexed"):
        return pulsar_nack.subscribe(client, topic, "wait", consumer_type=shared, negative_ack_redelivery_delay_ms=DELAY_MS,
                                     negative_ack_precision_bit_cnt=bits, batch_index_ack_enabled=mode == "shared",
                                     receiver_queue_size=queue)  # fmt: skip
    # subscribe's own configuration of the consumer (batch-index acks on), so that only the sharing differs
    raw = client.subscribe(topic, "wait", consumer_type=shared, negative_ack_redelivery_delay_ms=100,
                           batch_index_ack_enabled=True, receiver_queue_size=queue)  # fmt: skip
    settings = ConsumerSettings(negative_ack_redelivery_delay_ms=DELAY_MS, sharing=Sharing.ONE_ACTIVE,
                                negative_ack_precision_bit_cnt=bits)  # fmt: skip
    return NackingConsumer.wrap(raw, topic, settings, handoff_delay_ms=100, client=client)


def _work() -> None:
    """:data:`WORK_US` of busy work: an event's processing."""
    until = time.perf_counter_ns() + WORK_US * 1000
    while time.perf_counter_ns() < until:
        pass


def _consume(consumer: Any, n: int) -> dict[str, Any]:
    """Read the backlog and every retry; the nack time, entry and first retry arrival of each nacked event, and
    how many messages the application read between each nack and its retry."""
    import pulsar

    nacked: dict[int, tuple[float, tuple[int, int]]] = {}
    arrived: dict[int, float] = {}
    read_at_nack: dict[int, int] = {}
    read_between: list[int] = []
    first: set[int] = set()
    duplicates = read = 0
    deadline = time.monotonic() + TIMEOUT_S
    want = len(range(0, n, NACK_EVERY))
    while len(arrived) < want and time.monotonic() < deadline:
        try:
            message = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        number, now = int(message.data()), time.monotonic()
        read += 1
        if number not in first:  # its first delivery: one in NACK_EVERY fails once
            first.add(number)
            _work()
            if number % NACK_EVERY == 0:
                mid = message.message_id()
                nacked[number] = (time.monotonic(), (mid.ledger_id(), mid.entry_id()))
                read_at_nack[number] = read
                consumer.negative_acknowledge(message)
                continue
        elif number in nacked and number not in arrived:  # its retry
            arrived[number] = now
            read_between.append(read - read_at_nack[number])
        else:  # a copy the workload did not ask for
            duplicates += 1
        consumer.acknowledge(message)
    return {"nacked": nacked, "arrived": arrived, "duplicates": duplicates, "read_between": read_between}


def _summary(mode: str, seen: dict[str, Any]) -> dict[str, Any]:
    """Lateness percentiles (and, under the rule, the wait for each entry's last nack)."""
    nacked, arrived = seen["nacked"], seen["arrived"]
    late = [(arrived[k] - t) * 1000 - DELAY_MS for k, (t, _) in nacked.items() if k in arrived]
    out: dict[str, Any] = {"nacked": len(nacked), "lost": len(nacked) - len(late), "duplicates": seen["duplicates"],
                           "lateness_ms": {q: round(percentile(late, p), 1) for q, p in (("p50", 50), ("p99", 99))},
                           "read_between_p50": percentile(seen["read_between"], 50)}  # fmt: skip
    if mode.startswith("shared"):
        last: dict[tuple[int, int], float] = {}
        for t, entry in nacked.values():
            last[entry] = max(t, last.get(entry, t))
        waits = [(last[entry] - t) * 1000 for t, entry in nacked.values()]
        out["rule_wait_ms"] = {q: round(percentile(waits, p), 1) for q, p in (("p50", 50), ("p99", 99))}
    return out


def run(n: int, repeats: int, bits: int) -> dict[str, Any]:
    import pulsar

    import pulsar_nack

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with standalone() as broker:
        client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        for repeat in range(repeats):
            order = MODES if repeat % 2 == 0 else MODES[::-1]  # alternating: no mode always runs first
            for mode in order:
                topic = f"persistent://public/default/wait-{uuid.uuid4().hex[:8]}"
                consumer = _subscribe(client, topic, mode, bits)
                _produce(client, topic, n)
                runs[mode].append(_summary(mode, _consume(consumer, n)))
                consumer.close()
                print(mode, repeat, runs[mode][-1], flush=True)
        client.close()
        label = broker_label(broker)
    medians = {mode: {q: percentile([r["lateness_ms"][q] for r in rs], 50) for q in ("p50", "p99")}
               for mode, rs in runs.items()}  # fmt: skip
    rule = [r["rule_wait_ms"]["p50"] for r in runs["shared"]]
    return {"broker": label, "messages": n, "repeats": repeats, "batch": BATCH, "delay_ms": DELAY_MS,
            "work_us": WORK_US, "nack_every": NACK_EVERY, "receiver_queue_size": RECEIVER_QUEUE, "precision_bits": bits, "pulsar_nack": pulsar_nack.__version__,
            "runs": runs, "median_lateness_ms": medians, "median_rule_wait_p50_ms": percentile(rule, 50)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    made = parser(__doc__, "bench.sharing_wait", quick="2,000 events, one repeat")
    made.add_argument("--messages", type=int, default=MESSAGES, help=f"events per run (default {MESSAGES:,})")
    made.add_argument("--repeats", type=int, default=REPEATS, help=f"alternating repeats (default {REPEATS})")
    made.add_argument("--precision-bits", type=int, default=DEFAULT_PRECISION_BITS,
                      help=f"our consumers' negative_ack_precision_bit_cnt (default {DEFAULT_PRECISION_BITS})")  # fmt: skip
    args = made.parse_args(sys.argv[1:] if argv is None else argv)
    start = start_context()
    payload = run(2_000 if args.quick else args.messages, 1 if args.quick else args.repeats, args.precision_bits)
    for mode, late in payload["median_lateness_ms"].items():
        print(f"{mode:10} lateness p50 {late['p50']:6.1f} ms, p99 {late['p99']:6.1f} ms")
    print(f"the rule's own wait (shared), median p50: {payload['median_rule_wait_p50_ms']:.1f} ms")
    finish(args, "sharing-wait", payload, start)
    return payload


if __name__ == "__main__":
    main()
