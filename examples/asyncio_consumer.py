"""An asyncio consumer whose handler fails sometimes, retried with pulsar-nack.

Needs: ``pip install -e .`` (pulsar-client comes with it) and either Java 17+ and Maven,
to start Apache Pulsar standalone here (:class:`pulsar_nack.testing.PulsarStandalone`;
the first start fetches about 245 MB from Maven Central into ``~/.cache/pulsar-nack``),
or a running cluster given with ``--service-url``::

    python examples/asyncio_consumer.py                       # Apache Pulsar standalone, started here
    python examples/asyncio_consumer.py --service-url pulsar://localhost:6650

Every third message fails on its first delivery and is negatively acknowledged with an
exponential backoff (500 ms, 1 s, ...); it comes back on time, by itself, while the
others flow. The handlers run as four concurrent tasks on one event loop. The output:
one line per failure, one per retry that succeeded (about 500 ms after its failure),
and the consumer's stats, where ``'pending_messages': 0`` means no retry is left
waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
import uuid

import pulsar
import pulsar.asyncio

import pulsar_nack.asyncio
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.testing import PulsarStandalone


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
    client = pulsar.asyncio.Client(url, logger=logging.getLogger("pulsar"))  # its warnings on stderr
    topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"
    async with await pulsar_nack.asyncio.subscribe(  # closed on leaving the block
        client,
        topic,
        "billing",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_precision_bit_cnt=6,  # 64 ms buckets
        redelivery_backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=10_000),
    ) as consumer:
        producer = await client.create_producer(topic)
        for i in range(messages):
            await producer.send(str(i).encode())

        start, succeeded, finished = time.monotonic(), set(), asyncio.Event()

        async def worker() -> None:
            async for message in consumer:  # until the consumer is closed
                if await process(consumer, message, start):
                    succeeded.add(message.data())
                    if len(succeeded) == messages:
                        finished.set()

        workers = [asyncio.create_task(worker()) for _ in range(4)]  # four handlers at once
        await asyncio.wait_for(finished.wait(), 60)
        print("stats:", consumer.stats())
    await asyncio.wait_for(asyncio.gather(*workers), 30)  # closing the consumer ended their loops
    await producer.close()
    await client.close()

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="pulsar:// URL of a cluster (default: start Apache Pulsar standalone)")
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.service_url is None:
            print("starting Apache Pulsar standalone (the first time fetches it, about 245 MB) ...", file=sys.stderr)
        url = args.service_url or stack.enter_context(PulsarStandalone(batch_index_ack=True)).url
        asyncio.run(run(url, args.messages))


if __name__ == "__main__":
    main()
