"""Consume a Pulsar topic in Spark with ``foreachPartition``, retrying failures on schedule.

Needs: ``pip install -e ".[spark]"`` (PySpark; Spark itself runs on the Java 17+ that
Apache Pulsar needs too) and either Maven, to start Apache Pulsar standalone here
(:class:`pulsar_nack.testing.PulsarStandalone`; the first start fetches about 245 MB
from Maven Central into ``~/.cache/pulsar-nack``), or a running cluster given with
``--service-url``.

Each Spark task runs one consumer task on its executor's Python worker: it receives
messages, calls ``process(message)``, acks on success and nacks with exponential
backoff when ``process`` raises ``ConnectionError`` (a flaky downstream). The worker
keeps its consumer -- and the pending retries -- for the next task.

Run it on Apache Pulsar standalone (started here, with test data)::

    python examples/spark_foreach_partition.py

or against your cluster, on a topic that already has data::

    python examples/spark_foreach_partition.py --service-url pulsar://broker:6650 \\
        --topic persistent://public/default/orders --messages 0

On a cluster, submit it with ``spark-submit`` instead (see docs/spark.md).

The output: one line per round of ``--tasks`` Spark tasks, with the counts of that
round summed over its tasks (``received``: handler calls; ``acked``: calls that
succeeded; ``nacked``: calls that raised ``ConnectionError``, retried later;
``dead_lettered``: other errors), until a round receives nothing; then a total. With
5,000 messages and 5 % failing once, expect about 250 nacked and 5,000 acked. Delivery
is at least once, so ``acked`` counts a message twice when it reached the handler twice:
after a worker died before its ack reached the broker, or, on a broker without
batch-index acknowledgement, when a batch with a nacked message went to another worker
with its already acked siblings (the test broker has batch-index acks on; a plain
Apache Pulsar broker has them off by default). ``acked`` above ``produced`` counts those
duplicates; the handler must be idempotent.
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


def consume(url: str, args: argparse.Namespace) -> dict[str, int]:
    """Rounds of ``--tasks`` Spark tasks until one receives nothing; the totals."""
    spark = local_session(args.master, "pulsar-nack foreachPartition example")
    try:
        sc = spark.sparkContext
        config = ConsumerConfig(
            url,
            args.topic,
            args.subscription,
            redelivery_backoff=MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=30_000),
            retryable=(ConnectionError,),  # anything else goes to <topic>-<subscription>-DLQ
        )
        budget = TaskBudget(max_time_ms=60_000, idle_timeout_ms=1_000)
        totals = dict.fromkeys(("received", "acked", "nacked", "dead_lettered"), 0)
        for round_number in range(1, 21):
            counters = {name: sc.accumulator(0) for name in totals}
            sc.parallelize(range(args.tasks), args.tasks).foreachPartition(make_task(config, budget, counters))
            values = {name: acc.value for name, acc in counters.items()}
            print(f"round {round_number}: {values}", flush=True)
            totals = {name: totals[name] + values[name] for name in totals}
            if values["received"] == 0:  # a round that found nothing: the subscription is drained
                break
        return totals
    finally:
        stop_session(spark)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="Pulsar service URL (default: start Apache Pulsar standalone)")
    parser.add_argument("--topic", default=f"persistent://public/default/spark-example-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--subscription", default="spark-example")
    parser.add_argument("--messages", type=int, default=5_000, help="test events to produce first (0: none)")
    parser.add_argument("--tasks", type=int, default=4, help="Spark tasks per round")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    broker = None
    if args.service_url is None:
        from pulsar_nack.testing import PulsarStandalone

        print("starting Apache Pulsar standalone (the first time fetches it, about 245 MB) ...", file=sys.stderr)
        broker = PulsarStandalone(batch_index_ack=True).start()
    url = args.service_url or broker.url
    try:
        if args.messages:
            produce(url, args.topic, args.messages)
        totals = consume(url, args)
    finally:
        if broker is not None:
            broker.stop()
    duplicates = max(0, totals["acked"] - args.messages) if args.messages else 0  # acked includes dead-lettered
    print(
        f"total: {totals['acked']:,} acked of {args.messages:,} produced ({duplicates:,} delivered twice), "
        f"{totals['nacked']:,} nacked and retried, {totals['dead_lettered']:,} dead-lettered"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
