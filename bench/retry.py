"""Retry letter topics: when reconsumed messages come back, and what a pending retry costs.

Two parts, each on its own Apache Pulsar standalone:

``lateness``
    For each broker setting (stock: ``delayedDeliveryTickTimeMillis=1000``, not strict;
    a 100 ms tick; a 100 ms tick with ``isDelayedDeliveryDeliverAtTimeStrict=true``), a
    stream of one message every 10 ms; our consumer reconsumes each as it arrives
    (``--per-delay`` messages at each of several delays, interleaved) and records
    when each copy reaches the application, minus its due time (publish time +
    ``DELAY_TIME``). Beside it, an *observer*: a plain ``pulsar.Consumer`` on the retry
    topic under a second subscription, which sees when the broker delivers each copy,
    which is what a client without our hold (the Java client) hands over.
``cost``
    ``--pending`` messages retried with a 10 min delay, with ``negative_acknowledge``,
    ``reconsume_later`` (waits for the stored copy: a round trip per call) and
    ``reconsume_later_async`` (pipelined): the call's cost (µs), retries per second,
    the client memory held per pending retry (the tracker's own estimate, and the
    process RSS growth), and for reconsume the broker's side: the retry topic's storage
    and the subscription's delayed-delivery index per pending retry (admin stats).

``receive``
    The per-message cost of receive + acknowledge (process CPU and wall time, µs) of a
    consumer with ``retry_enable=True`` beside a plain one and beside one multi-topic
    consumer of the topic and a second topic: why the retry topic has a consumer of its
    own, as in the Java client, instead of joining the consumer's topics.

Run: ``python -m bench.retry [--quick] [--parts lateness,cost,receive]``; writes
``bench/results/retry.json`` (``retry-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import array
import concurrent.futures
import json
import threading
import time
import uuid
from typing import Any

from pulsar_nack.testing.waits import wait_until

from ._common import percentile, print_table, results_dir, rss_bytes, start_context, trim_heap, write_result

BROKERS: dict[str, dict[str, str]] = {
    "stock": {},
    "tick-100": {"delayedDeliveryTickTimeMillis": "100"},
    "tick-100-strict": {"delayedDeliveryTickTimeMillis": "100", "isDelayedDeliveryDeliverAtTimeStrict": "true"},
}
DELAYS_MS = (250, 500, 1000, 2000, 5000)
LONG_DELAY_MS = 600_000
IN_FLIGHT = 500
"""The pipelined modes keep at most this many reconsumes unconfirmed: a retry producer takes
1,000 pending sends (the client's default) and fails the next at once (``ProducerQueueIsFull``)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _lateness(values: list[int]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "early": sum(1 for v in ordered if v < 0),
        "min": ordered[0],
        "p50": percentile(ordered, 50),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
    }


# ---------------------------------------------------------------------- lateness

INTERVAL_MS = 10
"""The lateness stream: one original message every 10 ms."""


def _send_paced(client: Any, topic: str, n: int) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    start = time.monotonic()
    for i in range(n):
        wait = start + i * INTERVAL_MS / 1000 - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the stream's pace
        producer.send_async(str(i).encode(), None)
    producer.flush()
    producer.close()


def _observe(client: Any, retry_topic: str, expected: int, out: list[int], stop: threading.Event) -> None:
    """A plain consumer on the retry topic: broker arrival minus due time of each copy."""
    import pulsar

    from pulsar_nack.consumer.retry import due_time_ms

    consumer = client.subscribe(
        retry_topic, "observer", consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    while len(out) < expected and not stop.is_set():
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        out.append(now_ms() - (due_time_ms(message) or 0))
        consumer.acknowledge(message)
    consumer.close()


def lateness_run(broker: Any, per_delay: int) -> dict[str, Any]:
    """Reconsume *per_delay* messages at each delay; application and broker lateness per delay."""
    import pulsar

    import pulsar_nack
    from pulsar_nack.consumer.retry import DELAY_TIME, RetryMessage, due_time_ms
    from pulsar_nack.testing import quiet_client

    client = quiet_client(broker.url)
    topic = f"persistent://public/default/retry-late-{uuid.uuid4().hex[:8]}"
    consumer = pulsar_nack.subscribe(
        client, topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest, retry_enable=True,
    )
    n = per_delay * len(DELAYS_MS)
    observed: list[int] = []
    stop = threading.Event()
    observer = threading.Thread(target=_observe, args=(client, f"{topic}-sub-RETRY", n, observed, stop), daemon=True)
    observer.start()
    retry_topic = f"{topic}-sub-RETRY"
    if not wait_until(lambda: "observer" in broker.admin.topic_stats(retry_topic).get("subscriptions", {}), 30, poll_s=0.05):
        raise RuntimeError("the observer did not subscribe")
    # A stream: one original every INTERVAL_MS; each is reconsumed as it arrives, without
    # waiting a round trip (reconsume_later_async), and its copy is timed when it is back.
    sender = threading.Thread(target=_send_paced, args=(client, topic, n), daemon=True)
    sender.start()
    futures: list[concurrent.futures.Future[str]] = []
    ours: dict[int, list[int]] = {d: [] for d in DELAYS_MS}
    end = time.monotonic() + n * INTERVAL_MS / 1000 + max(DELAYS_MS) / 1000 + 60
    seen = 0
    while seen < n and time.monotonic() < end:
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        if isinstance(message, RetryMessage):
            ours[int(message.properties()[DELAY_TIME])].append(now_ms() - (due_time_ms(message) or 0))
            consumer.acknowledge(message)
            seen += 1
        else:
            futures.append(consumer.reconsume_later_async(message, DELAYS_MS[int(message.data()) % len(DELAYS_MS)]))
    failed = sum(1 for f in futures if f.exception() is not None)
    observer.join(timeout=max(DELAYS_MS) / 1000 + 30)
    stop.set()
    held = consumer.stats()["held"]
    consumer.close()
    client.close()
    return {
        "received": seen,
        "expected": n,
        "failed_reconsumes": failed,
        "held": held,
        "application": _lateness([v for values in ours.values() for v in values]),
        "application_by_delay": {str(d): _lateness(v) for d, v in ours.items() if v},
        "broker": _lateness(observed) if observed else None,
    }


# ---------------------------------------------------------------------- cost


def _calls_us(times_ns: list[int]) -> dict[str, float]:
    ordered = sorted(t / 1000 for t in times_ns)
    return {
        "mean": sum(ordered) / len(ordered),
        "p50": percentile(ordered, 50),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
    }


def _retry_cost(broker: Any, mode: str, pending: int) -> dict[str, Any]:
    """Retry *pending* received messages with a 10 min delay; call cost and memory."""
    import pulsar

    import pulsar_nack
    from pulsar_nack.testing import quiet_client

    client = quiet_client(broker.url)
    topic = f"persistent://public/default/retry-cost-{mode}-{uuid.uuid4().hex[:8]}"
    held = mode == "reconsume_async_held"
    consumer = pulsar_nack.subscribe(
        client, topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest, retry_enable=mode != "nack",
        retry_hold_ms=LONG_DELAY_MS if held else 0, receiver_queue_size=1000,
    )
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=pending + 1)
    for i in range(pending):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    messages = [consumer.receive(30_000) for _ in range(pending)]
    call: Any = {
        "nack": consumer.negative_acknowledge,
        "reconsume": consumer.reconsume_later,
        "reconsume_async": consumer.reconsume_later_async,
        "reconsume_async_held": consumer.reconsume_later_async,
    }[mode]
    call(messages[0], LONG_DELAY_MS)  # warm up (the retry producer, the tracker's first bucket)
    times_ns = array.array("q", bytes(8 * (pending - 1)))  # preallocated: not in the RSS delta
    outcomes: list[Any] = [None] * (pending - 1)
    trim_heap()
    rss_before = rss_bytes()
    started = time.perf_counter_ns()
    for i, message in enumerate(messages[1:]):
        if i >= IN_FLIGHT and mode.startswith("reconsume_async"):
            outcomes[i - IN_FLIGHT].exception(timeout=60)  # keep at most IN_FLIGHT copies unconfirmed
        begin = time.perf_counter_ns()
        outcomes[i] = call(message, LONG_DELAY_MS)
        times_ns[i] = time.perf_counter_ns() - begin
    if mode.startswith("reconsume_async"):
        concurrent.futures.wait(outcomes, timeout=300)
    all_done_s = (time.perf_counter_ns() - started) / 1e9
    failed = sum(1 for outcome in outcomes if isinstance(outcome, concurrent.futures.Future) and outcome.exception() is not None)
    if held:  # the copies come straight back, to wait in this process's memory: count them in
        wait_until(lambda: consumer.stats()["held"] >= pending, 60, poll_s=0.05)
    del outcomes  # the futures of the calls: the benchmark's, not the retries'
    trim_heap()
    rss_after = rss_bytes()
    del messages
    tracker = consumer.tracker.stats()
    result: dict[str, Any] = {
        "mode": mode,
        "pending": pending,
        "call_us": _calls_us(list(times_ns)),
        "retries_per_s": (pending - 1) / all_done_s,
        "tracker_bytes_per_pending": tracker["memory_bytes"] / pending if mode == "nack" else None,
        "tracker_pending": tracker["pending_messages"],
        "rss_delta_bytes_per_pending": (rss_after - rss_before) / (pending - 1),
        "failed": failed,
    }
    if mode != "nack":
        result["held"] = consumer.stats()["held"]
        retry_topic = f"{topic}-sub-RETRY"
        counted = "msgBacklog" if held else "msgDelayed"  # held copies have no delivery time
        wait_until(lambda: broker.admin.topic_stats(retry_topic)["subscriptions"]["sub"][counted] >= pending, 30, poll_s=0.05)
        stats = broker.admin.topic_stats(retry_topic)
        sub = stats["subscriptions"]["sub"]
        result["broker"] = {
            "retry_topic_storage_bytes": stats["storageSize"],
            "msg_backlog": sub["msgBacklog"],
            "msg_delayed": sub["msgDelayed"],
            "delayed_index_bytes": sub.get("delayedMessageIndexSizeInBytes"),
            "storage_bytes_per_pending": stats["storageSize"] / pending,
            "delayed_index_bytes_per_pending": (sub.get("delayedMessageIndexSizeInBytes") or 0) / pending,
        }
    consumer.close(redeliver_pending=False)
    client.close()
    return result


# ---------------------------------------------------------------------- receive


RECEIVE_MODES = ("plain", "retry_enable", "two-topic multi-topic")


def _receive_cost(broker: Any, mode: str, n: int) -> dict[str, float]:
    """Receive and ack *n* batched messages; CPU and wall µs per message (after a first one)."""
    import resource

    import pulsar

    import pulsar_nack
    from pulsar_nack.testing import quiet_client

    client = quiet_client(broker.url)
    topic = f"persistent://public/default/retry-receive-{uuid.uuid4().hex[:8]}"
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True)
    for i in range(n):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    producer.close()
    kwargs: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared, "initial_position": pulsar.InitialPosition.Earliest}
    topics: Any = [topic, f"{topic}-other"] if mode == "two-topic multi-topic" else topic
    consumer = pulsar_nack.subscribe(client, topics, "sub", retry_enable=mode == "retry_enable", **kwargs)
    consumer.acknowledge(consumer.receive(30_000))
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(n - 1):
        consumer.acknowledge(consumer.receive(30_000))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    consumer.close()
    client.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_us": cpu / (n - 1) * 1e6, "wall_us": wall / (n - 1) * 1e6}


def receive_part(broker: Any, n: int, repetitions: int) -> dict[str, Any]:
    """Each mode *repetitions* times, the modes alternating; the medians and every sample."""
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in RECEIVE_MODES}
    for repetition in range(repetitions):
        order = RECEIVE_MODES if repetition % 2 == 0 else RECEIVE_MODES[::-1]
        for mode in order:
            samples[mode].append(_receive_cost(broker, mode, n))
    return {
        "messages": n,
        "repetitions": repetitions,
        "modes": {
            mode: {
                "cpu_us_median": percentile(sorted(x["cpu_us"] for x in runs), 50),
                "wall_us_median": percentile(sorted(x["wall_us"] for x in runs), 50),
                "samples": runs,
            }
            for mode, runs in samples.items()
        },
    }


# ---------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.retry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="lateness,cost,receive")
    parser.add_argument("--per-delay", type=int, default=100, help="messages per delay (lateness)")
    parser.add_argument("--pending", type=int, default=5000, help="pending retries (cost)")
    parser.add_argument("--brokers", default=",".join(BROKERS))
    args = parser.parse_args(argv)
    if args.quick:
        args.per_delay, args.pending = 10, 500
    from pulsar_nack.testing import PulsarStandalone

    start = start_context()
    payload: dict[str, Any] = {"delays_ms": list(DELAYS_MS), "lateness": {}, "cost": [], "receive": {}}
    parts = args.parts.split(",")
    previous = results_dir("retry") / "retry.json"
    if not args.quick and set(parts) != {"lateness", "cost", "receive"} and previous.exists():
        kept = json.loads(previous.read_text())  # the parts not run now keep their committed results
        payload.update({p: kept[p] for p in ("lateness", "cost", "receive") if p not in parts and p in kept})
    if "lateness" in parts:
        for name in args.brokers.split(","):
            with PulsarStandalone(config=BROKERS[name]) as broker:
                run = lateness_run(broker, args.per_delay)
            payload["lateness"][name] = {"config": BROKERS[name], **run}
            print(name, run["application"], run["broker"], flush=True)
        rows = []
        for name, run in payload["lateness"].items():
            for who in ("application", "broker"):
                late = run[who]
                if late:
                    rows.append([name, who, late["n"], late["early"], f"{late['min']:.0f}",
                                 f"{late['p50']:.0f}", f"{late['p99']:.0f}", f"{late['max']:.0f}"])
        print_table(["broker", "seen by", "copies", "early", "min", "p50", "p99", "max ms"], rows,
                    title="reconsume lateness (arrival - due)")
    if "cost" in parts:
        with PulsarStandalone() as broker:
            for mode in ("nack", "reconsume", "reconsume_async", "reconsume_async_held"):
                payload["cost"].append(_retry_cost(broker, mode, args.pending))
        print_table(
            ["mode", "pending", "call µs p50", "call µs p99", "retries/s", "tracker B/pending", "RSS B/pending"],
            [[c["mode"], c["pending"], f"{c['call_us']['p50']:.1f}", f"{c['call_us']['p99']:.1f}", f"{c['retries_per_s']:.0f}",
              "-" if c["tracker_bytes_per_pending"] is None else f"{c['tracker_bytes_per_pending']:.1f}",
              f"{c['rss_delta_bytes_per_pending']:.0f}"] for c in payload["cost"]],
            title="cost per pending retry",
        )
    if "receive" in parts:
        with PulsarStandalone() as broker:
            payload["receive"] = receive_part(broker, 5_000 if args.quick else 40_000, 2 if args.quick else 3)
        print_table(
            ["consumer", "CPU µs / message (median)", "wall µs / message (median)"],
            [[m, f"{r['cpu_us_median']:.1f}", f"{r['wall_us_median']:.1f}"] for m, r in payload["receive"]["modes"].items()],
            title="receive + acknowledge",
        )
    path = write_result("retry-quick" if args.quick else "retry", payload, start)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
