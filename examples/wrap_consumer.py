"""A consumer whose handler fails sometimes, retried with pulsar-nack.

Needs: ``pip install -e .`` (pulsar-client comes with it) and either Java 17+ and Maven,
to start Apache Pulsar standalone here (:class:`pulsar_nack.testing.PulsarStandalone`;
the first start fetches about 245 MB from Maven Central into ``~/.cache/pulsar-nack``),
or a running cluster given with ``--service-url``::

    python examples/wrap_consumer.py                       # Apache Pulsar standalone, started here
    python examples/wrap_consumer.py --service-url pulsar://localhost:6650

Every third message fails on its first delivery and is negatively acknowledged with an
exponential backoff (500 ms, 1 s, ...); it comes back on time, by itself, while the
others flow. The output: one line per failure (``0.05s  message   3 failed ...``), one
per retry that succeeded (``0.61s  message   3 succeeded on retry``: about 500 ms
later), and the consumer's stats, where ``'pending_messages': 0`` means no retry is
left waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid

import pulsar

import pulsar_nack
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.testing import PulsarStandalone, quiet_client


def handle(message: pulsar.Message) -> None:
    """The application's work: fails on the first try for every third message."""
    if int(message.data()) % 3 == 0 and message.redelivery_count() == 0:
        raise RuntimeError("downstream service unavailable")


def _start_broker(stack: contextlib.ExitStack) -> str:
    """Start Apache Pulsar standalone for this run (stopped when *stack* closes); its URL."""
    print("starting Apache Pulsar standalone (the first time fetches it, about 245 MB) ...", file=sys.stderr)
    return stack.enter_context(PulsarStandalone(batch_index_ack=True)).url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="pulsar:// URL of a cluster (default: start Apache Pulsar standalone)")
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.service_url or _start_broker(stack)
        client = quiet_client(url)
        stack.callback(client.close)
        topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"

        with pulsar_nack.subscribe(  # closed on leaving the block: pending retries are handed back
            client,
            topic,
            "billing",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_precision_bit_cnt=6,  # 64 ms buckets
            redelivery_backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=10_000),
        ) as consumer:
            producer = client.create_producer(topic)
            for i in range(args.messages):
                producer.send(str(i).encode())

            start, done = time.monotonic(), set()
            for message in consumer:  # receive() until the consumer is closed (or the loop breaks)
                try:
                    handle(message)
                except RuntimeError as error:
                    print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} failed ({error}); retry later")
                    consumer.negative_acknowledge(message)
                    continue
                consumer.acknowledge(message)
                done.add(message.data())
                if message.redelivery_count():
                    print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} succeeded on retry")
                if len(done) == args.messages:
                    break
            print("stats:", consumer.stats())

if __name__ == "__main__":
    main()
