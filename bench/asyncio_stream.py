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

import asyncio
import contextlib
import uuid
from typing import Any

import pulsar
import pulsar.asyncio

import pulsar_nack.asyncio
from pulsar_nack.testing import PulsarStandalone, quiet_client

from ._common import broker_label, finish, parser, start_context
from .e2e import Tally, producer_thread, run_case


async def _async_case(url: str, producer_client: pulsar.Client, delay_ms: int, n: int) -> dict[str, Any]:
    """bench.e2e's stream case, with the asyncio consumer on the event loop."""
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/aio-{uuid.uuid4().hex[:10]}"
    consumer = await pulsar_nack.asyncio.subscribe(client, topic, "bench", negative_ack_redelivery_delay_ms=delay_ms,
                                                   consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000)
    stream_s = max(5.0, 1.5 * delay_ms / 1000)
    producer, tally = producer_thread(producer_client, topic, n, stream_s / n), Tally(n, delay_ms)

    async def consume() -> None:
        while not tally.done:
            message = await consumer.receive()
            await (consumer.negative_acknowledge if tally.nack(message) else consumer.acknowledge)(message)

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(consume(), stream_s + delay_ms / 1000 + 60)
    producer.join(30)
    await consumer.close()
    await client.close()
    return tally.result(system="pulsar-nack asyncio", delay_ms=delay_ms, mode="stream",
                        nack_interval_ms=round(stream_s / n * 1000, 3), stream_s=stream_s)


def run(messages: int, delay_ms: int) -> dict[str, Any]:
    with PulsarStandalone(batch_index_ack=True) as broker:
        client = quiet_client(broker.url)
        try:
            cases = [asyncio.run(_async_case(broker.url, client, delay_ms, messages))]
            cases += [run_case(client, system, delay_ms, "stream", messages) for system in ("pulsar-nack", "built-in")]
        finally:
            client.close()
    return {"broker": broker_label(broker), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.asyncio_stream")
    args_parser.add_argument("--messages", type=int, default=1000)
    args_parser.add_argument("--delay-ms", type=int, default=1000)
    args = args_parser.parse_args(argv)
    context = start_context()
    payload = run(args.messages, args.delay_ms)
    from .report import asyncio_lateness_table

    finish(args, "asyncio", payload, context, table=asyncio_lateness_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
