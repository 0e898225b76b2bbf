"""Faults on a two-broker Apache Pulsar cluster: our consumer beside the built-in nack, in the same run.

Each fault of :mod:`pulsar_nack.testing.faults` runs once on a fresh
:class:`~pulsar_nack.testing.PulsarCluster`, with two consumers on the same topic, each on
its own client and subscription: ours (``pulsar_nack.subscribe``) and the built-in nack
(``client.subscribe`` + ``negative_acknowledge``, its fixed delay). Both see the fault at
the same moment. Per consumer: messages lost, early copies (a delivery answering a nack more
than 265 ms before it was due), duplicates (deliveries beyond one plus one per nack),
deliveries after an ack, and the retry lateness (arrival minus due time) p50/p99.

Then ``pulsar-nack demo`` on a Spark standalone cluster (two workers) against the same
cluster, with the broker that owns its topic killed a third of the way through: once with
our tracker, once with ``--tracker builtin`` (two runs, one after the other).

Results go to ``bench/results/faults.json``; ``python -m bench.report --write`` puts the
table in docs/consumer.md. The machine's load average is recorded: this is a shared 2-core
machine, and the lateness figures move with its load.

Run: ``python -m bench.faults [--threads-runs N] [--demo-messages N] [--no-spark]``

``--demo-only N [--broker-config KEY=VALUE ...] [--receiver-queue-size N] [--subscription KeyShared] --out NAME``
runs only the demo with the broker kill, N times with our tracker (or ``--tracker builtin``), on a cluster whose brokers
get those settings (how much a broker persists of its acks before a SIGKILL is the broker's
setting: ``managedLedgerDefaultMarkDeleteRateLimit``, see docs/consumer.md), on a Shared or a
Key_Shared subscription (to which consumer the new owner hands the acks it lost).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from pulsar_nack.cli.demo import SUBSCRIPTION_TYPES

from ._common import finish, parser, print_table, start_context

ARMS = ("ours", "builtin")


def _scenarios(threads_runs: int) -> list[tuple[str, Callable[[Any], Any]]]:
    from pulsar_nack.testing import faults

    return [
        ("unload", lambda c: faults.topic_unload(c, ARMS, batched=False, move=False)),
        ("unload-batched", lambda c: faults.topic_unload(c, ARMS, batched=True, move=False)),
        ("bundle-move", lambda c: faults.topic_unload(c, ARMS, batched=False, move=True)),
        ("bundle-move-batched", lambda c: faults.topic_unload(c, ARMS, batched=True, move=True)),
        ("restart", lambda c: faults.broker_restart(c, ARMS)),
        ("freeze", lambda c: faults.broker_freeze(c, ARMS)),
        ("kill", lambda c: faults.broker_kill(c, ARMS)),
        ("kill-while-acking", lambda c: faults.broker_kill_while_acking(c, ARMS)),
        ("eight-threads", lambda c: faults.eight_threads(c, ARMS, runs=threads_runs)),
    ]


def _row(key: str, run: dict[str, Any], arm: str) -> list[Any]:
    found = run["arms"][arm]
    late = found["lateness_ms"]
    return [key, arm, found["lost"], found["early"], found["duplicates"], found["after_ack"],
            late["p50"], late["p99"]]  # fmt: skip


def _spark_demos(
    cluster: Any,
    messages: int,
    trackers: tuple[str, ...] = ARMS,
    receiver_queue_size: int | None = None,
    subscription: str = "Shared",
) -> list[dict[str, Any]]:
    """The demo with a broker kill, once per tracker in turn, on a fresh Spark standalone cluster."""
    from pulsar_nack.testing import faults
    from pulsar_nack.testing.spark_cluster import SparkStandaloneCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    demos = []
    with SparkStandaloneCluster(workers=2, cores_per_worker=1, worker_memory="1g") as spark:
        for tracker in trackers:
            result = faults.spark_demo_with_kill(
                cluster,
                spark.master_url,
                tracker=tracker,
                messages=messages,
                receiver_queue_size=receiver_queue_size,
                subscription=subscription,
            )
            demos.append({k: v for k, v in result.items() if k != "log_tail"})
            summary = result["summary"] or {}
            print(f"demo {tracker}: lost {summary.get('lost')}, left {summary.get('left_in_subscription')}, "
                  f"duplicates {summary.get('duplicates')} ({summary.get('duplicates_pct')} %)", flush=True)  # fmt: skip
    return demos


def main(argv: list[str] | None = None) -> None:
    args_parser = parser(__doc__, "bench.faults")
    args_parser.add_argument("--threads-runs", type=int, default=3, help="runs of the eight-thread scenario (default 3)")
    args_parser.add_argument("--demo-messages", type=int, default=20_000, help="events of each demo run (default 20,000)")
    args_parser.add_argument("--no-spark", action="store_true", help="skip the Spark demo runs")
    args_parser.add_argument("--demo-only", type=int, metavar="N", help="only the demo with a broker kill, N runs, ours")
    args_parser.add_argument("--broker-config", nargs="*", default=[], metavar="KEY=VALUE", help="brokers' settings")
    args_parser.add_argument("--receiver-queue-size", type=int, help="the demo consumers' receive queue (--demo-only)")
    args_parser.add_argument(
        "--subscription", choices=SUBSCRIPTION_TYPES, default="Shared", help="the demo's subscription type (--demo-only)"
    )
    args_parser.add_argument(
        "--tracker", choices=ARMS, default="ours", help="the demo's tracker (--demo-only; default ours)"
    )
    args = args_parser.parse_args(argv)
    if any("=" not in item for item in args.broker_config):
        args_parser.error(f"--broker-config takes KEY=VALUE items, not {args.broker_config}")
    broker_config = dict(item.split("=", 1) for item in args.broker_config)
    if args.demo_only is not None:
        _demo_only(args, args.demo_only, broker_config)
        return

    from pulsar_nack.testing import PulsarCluster
    from pulsar_nack.testing.faults import EARLY_MS, LATE_S, PRECISION_BITS, QUIET_S

    start = start_context()
    load_before = list(os.getloadavg())
    began = time.monotonic()
    runs: list[dict[str, Any]] = []
    demos: list[dict[str, Any]] = []
    with PulsarCluster() as cluster:
        started_s = time.monotonic() - began
        version = cluster.version
        for key, scenario in _scenarios(args.threads_runs):
            run_began = time.monotonic()
            summary = scenario(cluster).summary()
            summary.update(key=key, seconds=round(time.monotonic() - run_began, 1), load_average_after=list(os.getloadavg()))
            runs.append(summary)
            print_table(["fault", "consumer", "lost", "early", "dups", "after ack", "late p50 ms", "late p99 ms"],
                        [_row(key, summary, arm) for arm in ARMS])  # fmt: skip
        if not args.no_spark:
            demos = _spark_demos(cluster, args.demo_messages)
    payload = {
        "method": __doc__,
        "broker": f"Apache Pulsar {version}, PulsarCluster (ZooKeeper, one bookie, two brokers)",
        "precision_bits": PRECISION_BITS,
        "early_ms": EARLY_MS,
        "late_s": LATE_S,
        "quiet_s": QUIET_S,
        "cluster_start_s": round(started_s, 1),
        "load_average_1_5_15_before": load_before,
        "wall_s": round(time.monotonic() - began, 1),
        "faults": runs,
        "spark_demo": demos,
    }
    from .report import faults_table

    finish(args, "faults", payload, start, table=faults_table)


def _demo_only(args: Any, runs: int, broker_config: dict[str, str]) -> None:
    """``--demo-only``: the demo with a broker kill, *runs* times with one tracker (ours by default), one cluster."""
    from pulsar_nack.testing import PulsarCluster

    start = start_context()
    began = time.monotonic()
    with PulsarCluster(broker_config=broker_config) as cluster:
        version = cluster.version
        demos = _spark_demos(
            cluster,
            args.demo_messages,
            trackers=(args.tracker,) * runs,
            receiver_queue_size=args.receiver_queue_size,
            subscription=args.subscription,
        )
    shares = [d["summary"]["duplicates"] / d["summary"]["produced"] for d in demos if d.get("summary")]
    payload = {
        "method": __doc__,
        "broker": f"Apache Pulsar {version}, PulsarCluster (ZooKeeper, one bookie, two brokers)",
        "broker_config": broker_config,
        "receiver_queue_size": args.receiver_queue_size,
        "subscription": args.subscription,
        "tracker": args.tracker,
        "wall_s": round(time.monotonic() - began, 1),
        "duplicates_pct": [round(100 * share, 2) for share in shares],
        "spark_demo": demos,
    }
    finish(args, "faults-demo", payload, start)


if __name__ == "__main__":
    main()
