"""pulsar-client's built-in tracker vs pulsar-nack, on a real consumer (Apache Pulsar by default).

Two measurements, each system in a fresh worker process:

* **memory**: process RSS delta after ``n`` ``negative_acknowledge(MessageId)`` calls
  with a one-hour delay (nothing is redelivered during the run), per pending id. The
  built-in client holds them in the C++ tracker; ``NackingConsumer`` in its buckets
  (consecutive entry ids, one ledger per 50,000, as a consumer would see them).
* **call cost**: time per ``negative_acknowledge`` call (median of repetitions) for the
  built-in consumer and for ``NackingConsumer.negative_acknowledge``, on hand-built
  ``MessageId`` objects and on received messages (the application's path), and for
  ``NegativeAcksTracker.add`` alone (what a nack costs in the tracker itself), with the
  C hot path (``pulsar_nack.core._speedups``) and in pure Python (``speedups=False``).

Run: ``python -m bench.client [--quick] [--ids N]``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from ._common import broker_label, finish, parser, run_worker, settled_rss, standalone, summarize

ENTRIES_PER_LEDGER = 50_000
HOUR_MS = 3_600_000


def _ids(n: int, first_ledger: int = 1000):
    """(ledger, entry) pairs as a consumer sees them: consecutive, 50,000 per ledger."""
    for i in range(n):
        yield first_ledger + i // ENTRIES_PER_LEDGER, i % ENTRIES_PER_LEDGER


def _us_per_call(call: Any, items: list[Any]) -> float:
    """Microseconds per ``call(item)`` over *items* (the loop is timed, not the list)."""
    start = time.perf_counter()
    for item in items:
        call(item)
    return (time.perf_counter() - start) / len(items) * 1e6


def _id_read_steps() -> dict[str, Any]:
    """The client calls a nack of a received message needs, each timed on its own (a profile)."""
    from pulsar_nack.consumer import msgid as _msgid

    steps: dict[str, Any] = {
        "message_id()": lambda m: m.message_id(),
        "topic_name()": lambda m: m.topic_name(),
        "message_id() + serialize()": lambda m: m.message_id().serialize(),
        "id read, four getters (pure Python)": _msgid.py_message_key,
    }
    if _msgid.MSGID:
        steps["id read, one serialize() parsed in C (used)"] = _msgid.message_key
    return steps


def _nack_received_messages(client: Any, consumer: Any, topic: str, reps: int, profile: bool) -> dict[str, Any]:
    """Median µs per ``negative_acknowledge(message)`` on received messages (the app's path).

    With *profile*, also the median µs of each client call the nack makes to read the
    message's id, timed on the same messages just before they are nacked.
    """
    from pulsar_nack.consumer import _client as seam

    batch = 5_000
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    samples = []
    steps = _id_read_steps() if profile else {}
    step_samples: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(reps + 1):
        for _i in range(batch):
            producer.send_async(b"x", None)
        producer.flush()
        messages = [consumer.receive(30_000) for _ in range(batch)]
        inner = [seam.unwrap_message(message) for message in messages]
        step_costs = {name: _us_per_call(step, inner) for name, step in steps.items()}
        cost = _us_per_call(consumer.negative_acknowledge, messages)
        if rep:  # the first repetition is the warmup
            samples.append(cost)
            for name, step_cost in step_costs.items():
                step_samples[name].append(step_cost)
    producer.close()
    result: dict[str, Any] = {**summarize(samples), "batch": batch}
    if profile:
        result["id_read_steps_us"] = {name: summarize(values) for name, values in step_samples.items()}
    return result


def _tracker_add_us(topic: str, reps: int, batch: int, speedups: bool) -> dict[str, float]:
    """Median µs per ``NegativeAcksTracker.add(key)`` (consecutive entries of one ledger)."""
    import pulsar_nack

    tracker = pulsar_nack.NegativeAcksTracker(delay_ms=HOUR_MS, speedups=speedups)
    samples = []
    for rep in range(reps + 1):
        cost = _us_per_call(tracker.add, [(topic, 10**6 + rep, entry, -1) for entry in range(batch)])
        if rep:  # the first repetition is the warmup
            samples.append(cost)
    if len(tracker) != (reps + 1) * batch:
        raise AssertionError(f"tracker holds {len(tracker)} keys")
    tracker.close(flush=False)
    return summarize(samples)


def _worker(url: str, system: str, n: int, call_reps: int) -> dict[str, Any]:
    """Runs in a fresh process: memory for *n* pending ids, then call cost."""
    import pulsar

    import pulsar_nack
    from pulsar_nack.consumer import _client as seam

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    topic = f"persistent://public/default/bench-client-{uuid.uuid4().hex[:8]}"
    shared = pulsar.ConsumerType.Shared
    if system == "built-in":
        consumer: Any = client.subscribe(topic, "bench", consumer_type=shared, negative_ack_redelivery_delay_ms=HOUR_MS)
        nack = consumer.negative_acknowledge
    else:
        consumer = pulsar_nack.subscribe(client, topic, "bench", consumer_type=shared, negative_ack_redelivery_delay_ms=HOUR_MS)
        nack = consumer.negative_acknowledge
    # Ids are made one at a time and dropped: only what the tracker keeps stays in RSS.
    make_id = seam.raw_message_id
    before = settled_rss()
    start = time.perf_counter()
    for ledger, entry in _ids(n):
        nack(make_id(-1, ledger, entry, -1))
    elapsed = time.perf_counter() - start
    after = settled_rss()
    result: dict[str, Any] = {
        "system": system,
        "ids": n,
        "rss_delta_bytes": after - before,
        "bytes_per_id": (after - before) / n,
        "fill_s": elapsed,
        "fill_us_per_call_with_id_creation": elapsed / n * 1e6,
    }
    if system == "pulsar-nack":
        result["memory_bytes_estimate"] = consumer.tracker.stats()["memory_bytes"]
    # Call cost on a small, fresh id range (the tracker's state stays small and comparable).
    samples = []
    batch = 20_000
    for rep in range(call_reps + 1):
        cost = _us_per_call(nack, [seam.raw_message_id(-1, 10**6 + rep, entry, -1) for entry in range(batch)])
        if rep:  # the first repetition is the warmup
            samples.append(cost)
    result["call_us"] = summarize(samples)
    result["call_message_us"] = _nack_received_messages(client, consumer, topic, call_reps, system == "pulsar-nack")
    if system == "pulsar-nack":
        from pulsar_nack.consumer import msgid as _msgid
        from pulsar_nack.core import accel as _accel

        result["speedups_built"] = _accel.SPEEDUPS
        result["msgid_built"] = _msgid.MSGID
        result["tracker_add_us"] = _tracker_add_us(topic, call_reps, batch, speedups=True)
        result["tracker_add_pure_python_us"] = _tracker_add_us(topic, call_reps, batch, speedups=False)
        consumer.close(redeliver_pending=False)
    else:
        consumer.close()
    client.close()
    return result


def run(n: int, call_reps: int) -> dict[str, Any]:
    results = []
    with standalone() as broker:
        for system in ("built-in", "pulsar-nack"):
            results.append(run_worker("bench.client", broker.url, system, str(n), str(call_reps)))
    built_in, ours = results
    return {
        "broker": broker_label(broker),
        "cases": results,
        "ratios": {
            "memory_built_in_over_pulsar_nack": built_in["bytes_per_id"] / max(ours["bytes_per_id"], 1e-9),
            "call_built_in_over_tracker_add": built_in["call_us"]["median"] / ours["tracker_add_us"]["median"],
            "call_built_in_over_tracker_add_pure_python": built_in["call_us"]["median"]
            / ours["tracker_add_pure_python_us"]["median"],
            "call_built_in_over_nacking_consumer": built_in["call_us"]["median"] / ours["call_us"]["median"],
            "message_call_built_in_over_tracker_add": built_in["call_message_us"]["median"]
            / ours["tracker_add_us"]["median"],
            "message_call_built_in_over_nacking_consumer": built_in["call_message_us"]["median"]
            / ours["call_message_us"]["median"],
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        print(json.dumps(_worker(argv[1], argv[2], int(argv[3]), int(argv[4]))))
        return None
    args_parser = parser(__doc__, "bench.client", "200,000 ids, 3 repetitions")
    args_parser.add_argument("--ids", type=int, default=None, help="pending ids for the memory figure (default 1,000,000)")
    args = args_parser.parse_args(argv)
    payload = run(args.ids or (200_000 if args.quick else 1_000_000), 3 if args.quick else 7)
    from .report import client_table

    print(client_table(payload))
    for name, value in payload["ratios"].items():
        print(f"{name}: {value:.1f}x")
    finish(args, "client", payload)
    return payload


if __name__ == "__main__":
    main()
