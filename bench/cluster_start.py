"""Measure ``PulsarCluster``: start time, memory of each JVM, and a broker failover.

Each run starts a fresh two-broker cluster (ZooKeeper, one bookie, two brokers) and records:

- the start time, in phases: ZooKeeper answering, cluster metadata initialized, bookie and
  both brokers ready (``PulsarCluster.startup_phases_s``), and the whole ``start()``;
- the RSS of each JVM when the cluster is ready, and again after the failover (psutil);
- a failover: a 4-partition topic spread over both brokers, 500 messages produced and
  received, then the owner of partition 0 killed with SIGKILL and 500 more messages sent
  (no send timeout). Measured from the kill: every partition looked up on the survivor,
  the first message sent after the kill to a partition of the killed broker received,
  and all 500 received; messages lost; then the killed broker's restart time.

The machine's load average is recorded beside each run: other work on this machine slows
the start. Results go to ``bench/results/cluster.json``; docs/brokers.md quotes them.

Run: ``python -m bench.cluster_start [--runs N]``
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from pulsar_nack.errors import BrokerError

from ._common import finish, parser, start_context, summarize

PARTITIONS = 4
MESSAGES = 500


def _rss_mib(cluster: Any) -> dict[str, float]:
    import psutil

    return {node.name: psutil.Process(node.pid).memory_info().rss / 2**20 for node in cluster.nodes}


def _wait(condition: Any, timeout_s: float) -> float | None:
    """Seconds until *condition* holds (polled every 50 ms), or None after *timeout_s*."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def _all_on(cluster: Any, topic: str, broker: int) -> bool:
    try:
        return all(cluster.owner_of(f"{topic}-partition-{p}") == broker for p in range(PARTITIONS))
    except (BrokerError, OSError):  # a lookup while ownership changes hands
        return False


def _failover(cluster: Any) -> dict[str, Any]:
    """Kill the owner of partition 0 of a spread topic; time lookups, the consumer, the restart."""
    import pulsar

    from pulsar_nack.testing import quiet_client

    topic = cluster.create_partitioned_topic(f"failover-{uuid.uuid4().hex[:8]}", PARTITIONS)
    owners = cluster.spread_partitions(topic, PARTITIONS)
    victim = owners[0]
    survivor = next(i for i in range(len(cluster.brokers)) if i != victim)
    moved_partitions = {f"{topic}-partition-{p}" for p, owner in owners.items() if owner == victim}
    client = quiet_client(cluster.url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "bench", receiver_queue_size=100)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=0)
        for i in range(MESSAGES):
            producer.send(f"before-{i}".encode())
        got: set[bytes] = set()
        while len(got) < MESSAGES:
            message = consumer.receive(30_000)
            got.add(message.data())
            consumer.acknowledge(message)
        lookups: dict[str, float | None] = {}
        watcher = threading.Thread(
            target=lambda: lookups.update(moved=_wait(lambda: _all_on(cluster, topic, survivor), 120.0)), daemon=True
        )
        killed = time.monotonic()
        cluster.kill_broker(victim)
        watcher.start()
        for i in range(MESSAGES):
            producer.send_async(f"after-{i}".encode(), None)
        first_moved: float | None = None
        after: set[bytes] = set()
        deadline = killed + 180.0
        while len(after) < MESSAGES and time.monotonic() < deadline:
            try:
                message = consumer.receive(1000)
            except pulsar.Timeout:
                continue
            after.add(message.data())
            consumer.acknowledge(message)
            if first_moved is None and message.topic_name() in moved_partitions:
                first_moved = time.monotonic() - killed
        all_received = time.monotonic() - killed
        watcher.join()
        rss_after = _rss_mib(cluster)
    finally:
        client.close()
    restart_began = time.monotonic()
    cluster.restart_broker(victim)
    return {
        "partition_owners_before": owners,
        "killed_broker": victim,
        "first_message_from_moved_partition_s": first_moved,
        "all_sent_after_kill_received_s": all_received,
        "lookups_on_survivor_s": lookups.get("moved"),
        "sent_after_kill": MESSAGES,
        "lost": MESSAGES - len(after),
        "restart_s": time.monotonic() - restart_began,
        "rss_mib_after_failover": rss_after,
    }


def one_run(index: int) -> dict[str, Any]:
    from pulsar_nack.testing import PulsarCluster

    load_before = os.getloadavg()
    cluster = PulsarCluster()
    began = time.monotonic()
    with cluster:
        start_s = time.monotonic() - began
        rss = _rss_mib(cluster)
        failover = _failover(cluster)
    return {
        "run": index,
        "load_average_1_5_15_before": [round(x, 2) for x in load_before],
        "load_average_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        "start_s": start_s,
        "phases_s": dict(cluster.startup_phases_s),
        "rss_mib_at_ready": rss,
        "rss_mib_total_at_ready": sum(rss.values()),
        "session_timeout_ms": cluster.session_timeout_ms,
        "failover": failover,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(runs[0]["rss_mib_at_ready"])
    fail = [r["failover"] for r in runs]
    return {
        "start_s": summarize([r["start_s"] for r in runs]),
        "rss_mib_at_ready": {n: summarize([r["rss_mib_at_ready"][n] for r in runs]) for n in names},
        "rss_mib_total_at_ready": summarize([r["rss_mib_total_at_ready"] for r in runs]),
        **{key: summarize([f[key] or float("nan") for f in fail])
           for key in ("lookups_on_survivor_s", "first_message_from_moved_partition_s", "all_sent_after_kill_received_s", "restart_s")},
        "lost": sum(f["lost"] for f in fail),
    }


def main(argv: list[str] | None = None) -> None:
    args_parser = parser(__doc__, "bench.cluster_start")
    args_parser.add_argument("--runs", type=int, default=3, help="fresh clusters to start (default 3)")
    args = args_parser.parse_args(argv)
    start = start_context()
    runs = [one_run(i) for i in range(args.runs)]
    payload = {"method": __doc__, "parameters": {"runs": args.runs, "partitions": PARTITIONS, "messages_each_side": MESSAGES},
               "summary": _summary(runs), "runs": runs}
    from .report import cluster_table

    finish(args, "cluster", payload, start, table=cluster_table)


if __name__ == "__main__":
    main()
