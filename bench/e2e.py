"""End-to-end redelivery lateness on a real broker: NackingConsumer vs built-in.

For each case a fresh topic gets ``n`` messages. The consumer receives each one and
negatively acknowledges it with the case's delay, then acknowledges its redelivery.
Lateness is ``arrival - (nack time + delay)`` per message, in ms.

* ``stream``: messages are produced one every ``interval`` ms, so the consumer nacks
  at that pace: a steady failure stream lasting ``max(5 s, 1.5 x delay)``.
* ``burst``: all ``n`` messages are nacked at once, then nothing else happens.

Systems, measured in the same run on the same broker:

* ``pulsar-nack``: :func:`pulsar_nack.subscribe` (defaults: 8 precision bits, so up to
  255 ms early by design, never later than the bucket plus the client's handoff);
* ``built-in``: ``client.subscribe(negative_ack_redelivery_delay_ms=delay)`` and the
  client's own ``negative_acknowledge``.

The broker is Apache Pulsar standalone; the result records its version.

Run: ``python -m bench.e2e [--quick] [--messages N] [--delays 1000,10000] [--modes stream,burst]``.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Any

import pulsar
from tqdm import tqdm

import pulsar_nack
from pulsar_nack.testing import PulsarStandalone, quiet_client

from ._common import broker_label, percentile, print_table, write_result

SYSTEMS = ("pulsar-nack", "built-in")


def _producer_thread(client: pulsar.Client, topic: str, n: int, interval_s: float) -> threading.Thread:
    def run() -> None:
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        next_send = time.monotonic()
        for i in range(n):
            pause = next_send - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            producer.send_async(str(i).encode(), None)
            next_send += interval_s
        producer.flush()
        producer.close()

    thread = threading.Thread(target=run, name="bench-producer", daemon=True)
    thread.start()
    return thread


def lateness_summary(values: list[float]) -> dict[str, Any]:
    """n, min, p50, p99, max (ms) and every sample."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
        "samples": [round(v, 2) for v in values],
    }


def run_case(
    client: pulsar.Client, system: str, delay_ms: int, mode: str, n: int, subscription: str = "Shared"
) -> dict[str, Any]:
    """One (system, delay, mode, subscription type) case; returns lateness stats and counts.

    On Failover and Exclusive the client redelivers every unacked message on a nack, so
    ``duplicates`` counts the extra deliveries that causes (for either system).
    """
    topic = f"persistent://public/default/e2e-{uuid.uuid4().hex[:10]}"
    kwargs = {"consumer_type": getattr(pulsar.ConsumerType, subscription), "receiver_queue_size": 1000}
    if system == "pulsar-nack":
        consumer: Any = pulsar_nack.subscribe(client, topic, "bench", negative_ack_redelivery_delay_ms=delay_ms, **kwargs)
    else:
        consumer = client.subscribe(topic, "bench", negative_ack_redelivery_delay_ms=delay_ms, **kwargs)
    stream_s = max(5.0, 1.5 * delay_ms / 1000)
    interval_s = stream_s / n if mode == "stream" else 0.0
    producer = _producer_thread(client, topic, n, interval_s)
    requested: dict[bytes, float] = {}
    lateness: list[float] = []
    duplicates = 0
    start = time.monotonic()
    give_up = start + stream_s + delay_ms / 1000 + 60
    with tqdm(total=2 * n, desc=f"{system} {mode} {delay_ms} ms", leave=False, disable=None, mininterval=1) as bar:
        while len(lateness) < n and time.monotonic() < give_up:
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            now = time.monotonic()
            data = message.data()
            if message.redelivery_count() == 0 and data not in requested:
                requested[data] = now + delay_ms / 1000
                consumer.negative_acknowledge(message)
            elif data in requested and requested[data] > 0:
                lateness.append((now - requested[data]) * 1000)
                requested[data] = -1.0  # seen back
                consumer.acknowledge(message)
            else:
                duplicates += 1
                consumer.acknowledge(message)
            bar.update()
    producer.join(30)
    stats: dict[str, Any] = {
        "system": system,
        "subscription": subscription,
        "delay_ms": delay_ms,
        "mode": mode,
        "messages": n,
        "nack_interval_ms": round(interval_s * 1000, 3),
        "stream_s": stream_s if mode == "stream" else 0.0,
        "redelivered": len(lateness),
        "lost_or_timed_out": n - len(lateness),
        "duplicates": duplicates,
        "lateness_ms": lateness_summary(lateness),
    }
    consumer.close()
    return stats


def run(
    messages: int, delays: list[int], modes: list[str], subscriptions: tuple[str, ...] = ("Shared",)
) -> dict[str, Any]:
    results = []
    with PulsarStandalone(batch_index_ack=True) as broker:
        client = quiet_client(broker.url)
        try:
            for delay_ms in delays:
                for mode in modes:
                    for subscription in subscriptions:
                        for system in SYSTEMS:
                            results.append(run_case(client, system, delay_ms, mode, messages, subscription))
        finally:
            client.close()
    return {"broker": broker_label(broker), "cases": results}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 messages, 1 s delay only")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--delays", default=None, help="comma-separated ms (default 1000,10000)")
    parser.add_argument("--modes", default="stream,burst")
    parser.add_argument(
        "--subscriptions", default=None, help="comma-separated consumer types (default Shared; full run adds Failover)"
    )
    parser.add_argument("--out", default=None, help="result name (default e2e or e2e-quick)")
    args = parser.parse_args(argv)
    messages = args.messages or (200 if args.quick else 1000)
    delays = [int(d) for d in (args.delays or ("1000" if args.quick else "1000,10000")).split(",")]
    modes = args.modes.split(",")
    subscriptions = tuple((args.subscriptions or ("Shared" if args.quick else "Shared,Failover")).split(","))
    payload = run(messages, delays, modes, subscriptions)
    rows = []
    for case in payload["cases"]:
        late = case["lateness_ms"]
        rows.append(
            [
                case["system"],
                case.get("subscription", "Shared"),
                case["delay_ms"],
                case["mode"],
                f"{case['redelivered']}/{case['messages']}",
                case["duplicates"],
                f"{late['p50']:.0f}" if late["n"] else "-",
                f"{late['p99']:.0f}" if late["n"] else "-",
                f"{late['max']:.0f}" if late["n"] else "-",
                f"{late['min']:.0f}" if late["n"] else "-",
            ]
        )
    print_table(
        ["system", "subscription", "delay ms", "mode", "back", "dups", "p50 ms", "p99 ms", "max ms", "min ms"],
        rows,
        title=f"Redelivery lateness (arrival - requested), {payload['broker']}",
    )
    path = write_result(args.out or ("e2e-quick" if args.quick else "e2e"), payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
