"""An asyncio consumer whose handler fails sometimes, retried with pulsar-nack.

Runs against an embedded pulsar-lite broker by default, or a real cluster:

    python examples/asyncio_consumer.py                       # embedded broker
    python examples/asyncio_consumer.py --service-url pulsar://localhost:6650

Every third message fails on its first delivery and is negatively acknowledged with an
exponential backoff; it comes back on time, by itself, while the others flow. The
handlers run as concurrent tasks on one event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

import pulsar
import pulsar.asyncio

import pulsar_nack.asyncio
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.testing import PulsarLite


async def handle(message: pulsar.Message) -> None:
    """The application's work: fails on the first try for every third message."""
    await asyncio.sleep(0.01)  # an awaited call to some service
    if int(message.data()) % 3 == 0 and message.redelivery_count() == 0:
        raise RuntimeError("downstream service unavailable")


async def process(consumer: pulsar_nack.asyncio.AsyncNackingConsumer, message: pulsar.Message, start: float) -> bool:
    """Handle one message; ack it on success, nack it (backoff) on failure."""
    try:
        await handle(message)
    except RuntimeError as error:
        print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} failed ({error}); retry later")
        await consumer.negative_acknowledge(message)
        return False
    await consumer.acknowledge(message)
    if message.redelivery_count():
        print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} succeeded on retry")
    return True


async def run(url: str, messages: int) -> None:
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"
    consumer = await pulsar_nack.asyncio.subscribe(
        client,
        topic,
        "billing",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_precision_bit_cnt=6,  # 64 ms buckets
        redelivery_backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=10_000),
    )
    producer = await client.create_producer(topic)
    for i in range(messages):
        await producer.send(str(i).encode())

    start, succeeded, finished = time.monotonic(), set(), asyncio.Event()

    async def worker() -> None:
        while True:
            message = await consumer.receive()
            if await process(consumer, message, start):
                succeeded.add(message.data())
                if len(succeeded) == messages:
                    finished.set()

    workers = [asyncio.create_task(worker()) for _ in range(4)]  # four handlers at once
    await asyncio.wait_for(finished.wait(), 60)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    print("stats:", consumer.stats())
    await consumer.close()
    await producer.close()
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="pulsar:// URL of a cluster (default: start an embedded broker)")
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.service_url or stack.enter_context(PulsarLite()).url
        asyncio.run(run(url, args.messages))


if __name__ == "__main__":
    main()
