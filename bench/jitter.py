"""Jitter: when 10,000 messages that fail together come back, with and without it.

Two parts:

``tracker``
    10,000 messages nacked at the same instant on a :class:`~pulsar_nack.NegativeAcksTracker`
    with an injected clock (8-bit buckets, the default), each nacked again as it comes
    back, for three deliveries, with ``MultiplierRedeliveryBackoff(1000, 60000, 2)`` and
    jitter 0, 0.5 and 1 (seeded). The clock steps 1 ms at a time; every release is
    recorded: the arrival histogram (256 ms bins, a bucket) per delivery, the most
    arrivals in one bin, and the spread. No broker: these are the due times the tracker releases.
``broker``
    The same 10,000 messages on Apache Pulsar standalone with ``pulsar_nack.subscribe``:
    received, then all nacked together with ``FixedDelay(2000)`` and with
    ``FixedDelay(2000, jitter=1.0)``; each arrival at the application is recorded once
    (and acked). The plain client has no jitter: its arrivals are the ``jitter 0`` row's.

Run: ``python -m bench.jitter [--quick] [--parts tracker,broker]``; writes
``bench/results/jitter.json``; ``python -m bench.plot`` draws ``docs/img/jitter.png``.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from ._common import finish, parser, start_context

MESSAGES = 10_000
BIN_MS = 256
"""One bucket at the default 8 precision bits."""
JITTERS = (0.0, 0.5, 1.0)
DELIVERIES = 3
BROKER_DELAY_MS = 2_000
SEED = 2015  # the year of the AWS post on backoff and jitter


def histogram(times_ms: list[int]) -> dict[str, Any]:
    """Arrivals per ``BIN_MS`` bin from the first bin's start (0 ms), and a summary."""
    bins: dict[int, int] = {}
    for at in times_ms:
        bins[at // BIN_MS] = bins.get(at // BIN_MS, 0) + 1
    ordered = sorted(times_ms)
    return {
        "n": len(ordered),
        "first_ms": ordered[0],
        "p50_ms": ordered[len(ordered) // 2],
        "last_ms": ordered[-1],
        "peak_per_bin": max(bins.values()),
        "bins_used": len(bins),
        "bins": {str(k * BIN_MS): v for k, v in sorted(bins.items())},
    }


# ---------------------------------------------------------------------- tracker


def tracker_case(jitter: float, messages: int) -> dict[str, Any]:
    """Nack *messages* at t=0, each again as it comes back; the release times per delivery."""
    from pulsar_nack import MultiplierRedeliveryBackoff, NegativeAcksTracker

    clock = [0]
    backoff = MultiplierRedeliveryBackoff(1_000, 60_000, 2, jitter=jitter, rng=random.Random(SEED))
    tracker = NegativeAcksTracker(clock=lambda: clock[0], backoff=backoff)
    counts = dict.fromkeys(range(messages), 0)
    for entry in range(messages):
        tracker.add(("t", 1, entry, -1), redelivery_count=0)
    arrivals: list[list[int]] = [[] for _ in range(DELIVERIES)]
    while len(tracker):
        clock[0] += 1
        for keys in tracker.pop_due().values():
            for key in keys:
                entry = key[2]
                arrivals[counts[entry]].append(clock[0])
                counts[entry] += 1
                if counts[entry] < DELIVERIES:
                    tracker.add(key, redelivery_count=counts[entry])
    tracker.close(flush=False)
    return {
        "jitter": jitter,
        "backoff": repr(backoff),
        "precision_bits": 8,
        "deliveries": [histogram(times) for times in arrivals],
    }


# ---------------------------------------------------------------------- broker


def broker_case(client: Any, jitter: float, messages: int) -> dict[str, Any]:
    """Receive *messages*, nack them all at once, record when each comes back (ms after the last nack)."""
    import pulsar

    import pulsar_nack
    from pulsar_nack import FixedDelay

    topic = f"persistent://public/default/jitter-{uuid.uuid4().hex[:8]}"
    consumer = pulsar_nack.subscribe(
        client, topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000,
        redelivery_backoff=FixedDelay(BROKER_DELAY_MS, jitter=jitter, rng=random.Random(SEED)),
    )
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100, block_if_queue_full=True)
    for i in range(messages):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    received = [consumer.receive(30_000) for _ in range(messages)]
    started = time.monotonic()
    for message in received:
        consumer.negative_acknowledge(message)
    nack_ms = (time.monotonic() - started) * 1000
    back: dict[bytes, int] = {}
    end = time.monotonic() + BROKER_DELAY_MS * (1 + jitter) / 1000 + 30
    while len(back) < messages and time.monotonic() < end:
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:
            continue
        back.setdefault(message.data(), int((time.monotonic() - started) * 1000))
        consumer.acknowledge(message)
    consumer.close()
    producer.close()
    return {
        "jitter": jitter,
        "backoff": f"FixedDelay({BROKER_DELAY_MS}, jitter={jitter})",
        "nack_all_ms": round(nack_ms, 1),
        "lost": messages - len(back),
        "arrivals": histogram(list(back.values())),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    made = parser(__doc__ or "", "bench.jitter", quick="1,000 messages instead of 10,000")
    made.add_argument("--parts", default="tracker,broker", help="comma-separated: tracker, broker")
    args = made.parse_args(argv)
    start = start_context()
    messages = 1_000 if args.quick else MESSAGES
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    payload: dict[str, Any] = {"parameters": {"messages": messages, "bin_ms": BIN_MS, "seed": SEED}}
    if "tracker" in parts:
        payload["tracker"] = [tracker_case(j, messages) for j in JITTERS]
    if "broker" in parts:
        from pulsar_nack.testing import PulsarStandalone, quiet_client

        with PulsarStandalone() as broker:
            client = quiet_client(broker.url)
            try:
                payload["broker"] = {
                    "broker": f"Apache Pulsar {broker.version} standalone",
                    "cases": [broker_case(client, j, messages) for j in (0.0, 1.0)],
                }
            finally:
                client.close()
    from .report import jitter_table

    finish(args, "jitter", payload, start, table=jitter_table)
    return payload


if __name__ == "__main__":
    main()
