"""A consumer whose handler fails sometimes, retried with pulsar-nack.

Runs against an embedded pulsar-lite broker by default, or a real cluster:

    python examples/wrap_consumer.py                       # embedded broker
    python examples/wrap_consumer.py --service-url pulsar://localhost:6650

Every third message fails on its first delivery and is negatively acknowledged with an
exponential backoff; it comes back on time, by itself, while the others flow.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid

import pulsar

import pulsar_nack
from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.testing import PulsarLite, quiet_client


def handle(message: pulsar.Message) -> None:
    """The application's work: fails on the first try for every third message."""
    if int(message.data()) % 3 == 0 and message.redelivery_count() == 0:
        raise RuntimeError("downstream service unavailable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="pulsar:// URL of a cluster (default: start an embedded broker)")
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.service_url or stack.enter_context(PulsarLite()).url
        client = quiet_client(url)
        stack.callback(client.close)
        topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"

        consumer = pulsar_nack.subscribe(
            client,
            topic,
            "billing",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_precision_bit_cnt=6,  # 64 ms buckets
            redelivery_backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=10_000),
        )
        producer = client.create_producer(topic)
        for i in range(args.messages):
            producer.send(str(i).encode())

        start, done = time.monotonic(), set()
        while len(done) < args.messages:
            message = consumer.receive(timeout_millis=10_000)
            try:
                handle(message)
            except RuntimeError as error:
                print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} failed ({error}); retry later")
                consumer.negative_acknowledge(message)
            else:
                consumer.acknowledge(message)
                done.add(message.data())
                if message.redelivery_count():
                    print(f"{time.monotonic() - start:5.2f}s  message {message.data().decode():>3} succeeded on retry")
        print("stats:", consumer.stats())
        consumer.close()


if __name__ == "__main__":
    main()
