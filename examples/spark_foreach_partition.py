"""Consume a Pulsar topic in Spark with ``foreachPartition``, retrying failures on schedule.

Each Spark task runs one consumer task on its executor's Python worker: it receives
messages, calls ``process(message)``, acks on success and nacks with exponential
backoff when ``process`` raises ``ConnectionError`` (a flaky downstream). The worker
keeps its consumer -- and the pending retries -- for the next task.

Run it against the embedded pulsar-lite broker (started here, with test data)::

    python examples/spark_foreach_partition.py

or against your cluster, on a topic that already has data::

    python examples/spark_foreach_partition.py --service-url pulsar://broker:6650 \\
        --topic persistent://public/default/orders --messages 0

On a cluster, submit it with ``spark-submit`` instead (see docs/spark.md).
"""

from __future__ import annotations

import argparse
import sys
import uuid
import zlib

from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff
from pulsar_nack.spark import ConsumerConfig, TaskBudget, consumer_task, local_session, stop_session


def process(message) -> None:
    """The application's work. Here: 5 % of the events fail on their first delivery."""
    flaky = zlib.crc32(message.data()) % 100 < 5
    if flaky and message.redelivery_count() == 0:
        raise ConnectionError("downstream unavailable, try later")
    # ... write the event somewhere idempotent: it may be delivered more than once.


def make_task(config, budget, counters):
    """Wrap the consumer task to feed Spark accumulators (foreachPartition returns nothing)."""
    task = consumer_task(config, process, budget)

    def run(partition):
        for stats in task(partition):
            for name, accumulator in counters.items():
                accumulator.add(stats[name])

    return run


def produce(url: str, topic: str, n: int) -> None:
    from pulsar_nack.testing import quiet_client

    client = quiet_client(url)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True)
    for i in range(n):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    producer.close()
    client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="Pulsar service URL (default: start the embedded broker)")
    parser.add_argument("--topic", default=f"persistent://public/default/spark-example-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--subscription", default="spark-example")
    parser.add_argument("--messages", type=int, default=5_000, help="test events to produce first (0: none)")
    parser.add_argument("--tasks", type=int, default=4, help="Spark tasks per round")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    broker = None
    if args.service_url is None:
        from pulsar_nack.testing import PulsarLite

        broker = PulsarLite().start()
    url = args.service_url or broker.url
    from pulsar_nack.testing import client_factory_for

    spark = None
    try:
        if args.messages:
            produce(url, args.topic, args.messages)
        spark = local_session(args.master, "pulsar-nack foreachPartition example")
        sc = spark.sparkContext
        config = ConsumerConfig(
            url,
            args.topic,
            args.subscription,
            backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=30_000),
            retryable=(ConnectionError,),  # anything else goes to <topic>-<subscription>-DLQ
            client_factory=client_factory_for(url),  # None on a real cluster; pulsar-lite's shim here
        )
        budget = TaskBudget(max_time_ms=60_000, idle_timeout_ms=1_000)
        for round_number in range(1, 21):
            counters = {name: sc.accumulator(0) for name in ("received", "acked", "nacked", "dead_lettered")}
            sc.parallelize(range(args.tasks), args.tasks).foreachPartition(make_task(config, budget, counters))
            values = {name: acc.value for name, acc in counters.items()}
            print(f"round {round_number}: {values}")
            if values["received"] == 0:  # a round that found nothing: the subscription is drained
                break
    finally:
        if spark is not None:
            stop_session(spark)
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
