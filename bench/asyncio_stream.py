"""Steady-stream redelivery lateness: the asyncio consumer beside the blocking one, in one run.

The ``stream`` case of :mod:`bench.e2e` (a fresh topic gets ``n`` messages, produced one
every ``stream_s / n`` ms; the consumer nacks each with the delay and acks its
redelivery; lateness is ``arrival - (nack time + delay)`` per message), on one Apache
Pulsar standalone, for three systems one after the other:

* ``pulsar-nack asyncio``: :func:`pulsar_nack.asyncio.subscribe` on a
  ``pulsar.asyncio.Client``, messages received with ``await consumer.receive()``;
* ``pulsar-nack``: the blocking :func:`pulsar_nack.subscribe` (bench.e2e's case);
* ``built-in``: the client's own tracker (bench.e2e's case).

Defaults as in the docs' e2e figures: 8 precision bits (up to 255 ms early by design).
Result: ``bench/results/asyncio.json``.

Run: ``python -m bench.asyncio_stream [--messages N] [--delay-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import pulsar
import pulsar.asyncio

import pulsar_nack.asyncio
from pulsar_nack.testing import PulsarStandalone, quiet_client

from ._common import broker_label, print_table, start_context, write_result
from .e2e import _producer_thread, lateness_summary, run_case


async def _async_case(url: str, producer_client: pulsar.Client, delay_ms: int, n: int) -> dict[str, Any]:
    """bench.e2e's stream case, with the asyncio consumer on the event loop."""
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/aio-{uuid.uuid4().hex[:10]}"
    consumer = await pulsar_nack.asyncio.subscribe(
        client,
        topic,
        "bench",
        negative_ack_redelivery_delay_ms=delay_ms,
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=1000,
    )
    stream_s = max(5.0, 1.5 * delay_ms / 1000)
    producer = _producer_thread(producer_client, topic, n, stream_s / n)
    requested: dict[bytes, float] = {}
    lateness: list[float] = []
    duplicates = 0

    async def consume() -> None:
        nonlocal duplicates
        while len(lateness) < n:
            message = await consumer.receive()
            now = time.monotonic()
            data = message.data()
            if message.redelivery_count() == 0 and data not in requested:
                requested[data] = now + delay_ms / 1000
                await consumer.negative_acknowledge(message)
            elif data in requested and requested[data] > 0:
                lateness.append((now - requested[data]) * 1000)
                requested[data] = -1.0
                await consumer.acknowledge(message)
            else:
                duplicates += 1
                await consumer.acknowledge(message)

    try:
        await asyncio.wait_for(consume(), stream_s + delay_ms / 1000 + 60)
    except asyncio.TimeoutError:
        pass
    producer.join(30)
    await consumer.close()
    await client.close()
    return {
        "system": "pulsar-nack asyncio",
        "delay_ms": delay_ms,
        "mode": "stream",
        "messages": n,
        "nack_interval_ms": round(stream_s / n * 1000, 3),
        "stream_s": stream_s,
        "redelivered": len(lateness),
        "lost_or_timed_out": n - len(lateness),
        "duplicates": duplicates,
        "lateness_ms": lateness_summary(lateness),
    }


def run(messages: int, delay_ms: int) -> dict[str, Any]:
    cases = []
    with PulsarStandalone(batch_index_ack=True) as broker:
        client = quiet_client(broker.url)
        try:
            cases.append(asyncio.run(_async_case(broker.url, client, delay_ms, messages)))
            for system in ("pulsar-nack", "built-in"):
                cases.append(run_case(client, system, delay_ms, "stream", messages))
        finally:
            client.close()
    return {"broker": broker_label(broker), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.asyncio_stream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--delay-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    context = start_context()
    payload = run(args.messages, args.delay_ms)
    rows = []
    for case in payload["cases"]:
        late = case["lateness_ms"]
        rows.append(
            [case["system"], f"{case['redelivered']}/{case['messages']}"]
            + [f"{late[k]:.0f}" if late["n"] else "-" for k in ("p50", "p99", "max", "min")]
        )
    table = print_table(
        ["system", "back", "p50 ms", "p99 ms", "max ms", "min ms"],
        rows,
        title=f"Steady stream, {args.delay_ms} ms delay: arrival - requested, {payload['broker']}",
    )
    path = write_result("asyncio", {**payload, "table": table}, start=context)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
