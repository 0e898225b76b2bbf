"""The Spark demo's busy wave without Spark: where ours' and the built-in's messages/s part.

Two parts, each system in fresh processes, ours and pulsar-client's built-in nack alternating:

``wave``
    What the demo's two busiest tasks do on ``local[2]``, outside Spark: two worker processes
    run :func:`~pulsar_nack.spark.consume_partition` at once, with the demo's handler (10 % of
    the events fail on their first delivery), timings and ``collect``, on one Shared
    subscription over a batched backlog (the demo's batch size and size). The consumer
    configuration is the demo's for each tracker. Per worker: messages, the process's CPU
    time during the task, when its first pass ended (its last nack), when its last retry
    arrived, the task's wall time; and the broker's CPU time.
``stream``
    One consumer receiving a batched backlog the broker streams to it (the client's default
    receiver queue, so the broker keeps dispatching during the loop), 10 % nacked by payload
    hash (long delay, so nothing comes back in the loop), the rest acked: wall, process and
    main-thread CPU per message, ours (``pulsar_nack.subscribe``) beside ``client.subscribe``.

Run: ``python -m bench.demo_wave [--quick] [--repeats N]``; writes ``bench/results/demo-wave.json``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._common import broker_label, finish, parser, run_worker, standalone, start_context

SYSTEMS = ("ours", "builtin")
WAVE_WORKERS = 2
"""The demo's ``local[2]`` runs two tasks at once."""
STREAM_MESSAGES = 55_000
"""About what one of the two busy tasks receives in the demo at its default size."""
NACK_EVERY = 10
"""The demo's failure rate, 10 %."""
LONG_DELAY_MS = 3_600_000


def process_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stat_cpu_s(stat_path: str) -> float:
    """User + system CPU seconds in a Linux ``/proc/.../stat`` file (a process's or a thread's)."""
    with open(stat_path, encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process *pid*, None when unknown."""
    return None if pid is None else stat_cpu_s(f"/proc/{pid}/stat")


def produce(url: str, topic: str, subscription: str, n: int) -> None:
    """The demo's batched backlog of events 0..n-1 behind a Shared subscription."""
    import pulsar

    from pulsar_nack.cli.demo import BATCH_SIZE

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared).close()
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=BATCH_SIZE, batching_max_publish_delay_ms=5,
        block_if_queue_full=True,
    )
    for event in range(n):
        producer.send_async(str(event).encode(), None)
    producer.flush()
    client.close()


# ---------------------------------------------------------------------- wave


def demo_config(url: str, topic: str, tracker: str) -> Any:
    """The consumer configuration ``pulsar-nack demo --retries nack`` gives its executors for *tracker*."""
    from pulsar_nack.cli.demo import MAX_BACKOFF_MS, MIN_BACKOFF_MS, SUBSCRIPTION, TransientError
    from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff
    from pulsar_nack.spark import ConsumerConfig

    backoff = MultiplierRedeliveryBackoff(MIN_BACKOFF_MS, MAX_BACKOFF_MS)
    builtin = tracker == "builtin"
    return ConsumerConfig(
        url, topic, SUBSCRIPTION,
        negative_ack_redelivery_delay_ms=backoff.next_delay_ms(0) if builtin else 60_000,
        redelivery_backoff=None if builtin else backoff, retryable=(TransientError,), tracker=tracker,
    )  # fmt: skip


def demo_task(url: str, topic: str, tracker: str) -> Any:
    """Run one demo task (its handler, budget, timings and ``collect``) in this process; its TaskStats."""
    from pulsar_nack.cli.demo import DemoHandler, collect_event
    from pulsar_nack.spark import TaskBudget, consume_partition

    return consume_partition(
        demo_config(url, topic, tracker), DemoHandler(1 / NACK_EVERY), TaskBudget(max_time_ms=300_000, idle_timeout_ms=1_000),
        record_timings=True, collect=collect_event,
    )  # fmt: skip


def _wave_worker(url: str, topic: str, tracker: str) -> dict[str, Any]:
    """One demo task in this process; what it received and spent."""
    before = process_cpu_s()
    stats = demo_task(url, topic, tracker)
    cpu_s = process_cpu_s() - before
    started = stats["started_at_ms"]
    arrivals = [arrived - started for _key, arrived, _count in stats["arrivals"]]
    return {
        "received": stats["received"],
        "nacked": stats["nacked"],
        "cpu_s": round(cpu_s, 3),
        "cpu_us_per_message": round(cpu_s / max(stats["received"], 1) * 1e6, 2),
        "first_pass_end_ms": round(max(nacked - started for _key, nacked, _due in stats["nacks"])),
        "last_retry_arrival_ms": round(max(arrivals)) if arrivals else None,
        "task_wall_ms": round(stats["wall_ms"]),
    }


def _wave(broker: Any, tracker: str, n: int) -> dict[str, Any]:
    from pulsar_nack.cli.demo import SUBSCRIPTION

    topic = f"persistent://public/default/demo-wave-{tracker}-{uuid.uuid4().hex[:8]}"
    produce(broker.url, topic, SUBSCRIPTION, n)
    pid = getattr(broker, "pid", None)
    broker_before = broker_cpu_s(pid)
    start = time.monotonic()
    with ThreadPoolExecutor(WAVE_WORKERS) as pool:
        workers = list(pool.map(lambda _: run_worker("bench.demo_wave", "wave", broker.url, topic, tracker),
                                range(WAVE_WORKERS)))  # fmt: skip
    broker_after = broker_cpu_s(pid)
    return {
        "wall_s": round(time.monotonic() - start, 3),
        "broker_cpu_s": None if broker_before is None or broker_after is None else round(broker_after - broker_before, 3),
        "workers": workers,
        "received": sum(w["received"] for w in workers),
        "first_pass_end_ms": max(w["first_pass_end_ms"] for w in workers),
        "last_retry_arrival_ms": max((w["last_retry_arrival_ms"] or 0) for w in workers),
        "workers_cpu_s": round(sum(w["cpu_s"] for w in workers), 3),
    }


# ---------------------------------------------------------------------- stream


def _stream_worker(url: str, topic: str, system: str, n: int) -> dict[str, Any]:
    """Receive *n* messages as the broker streams them; nack 10 % by payload hash, ack the rest."""
    import pulsar

    from pulsar_nack import subscribe

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    options = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "batch_index_ack_enabled": True,
        "negative_ack_redelivery_delay_ms": LONG_DELAY_MS,
    }
    consumer = subscribe(client, topic, "stream", **options) if system == "ours" else client.subscribe(topic, "stream", **options)
    message = consumer.receive(30_000)  # the first waits for the broker: outside the timing
    cpu, main, wall = process_cpu_s(), time.thread_time(), time.perf_counter()
    for i in range(n):
        if zlib.crc32(message.data()) % NACK_EVERY == 0:
            consumer.negative_acknowledge(message)
        else:
            consumer.acknowledge(message)
        if i + 1 < n:
            message = consumer.receive(30_000)
    result = {
        "wall_us": round((time.perf_counter() - wall) / n * 1e6, 3),
        "process_cpu_us": round((process_cpu_s() - cpu) / n * 1e6, 3),
        "main_thread_cpu_us": round((time.thread_time() - main) / n * 1e6, 3),
    }
    consumer.close()
    client.close()
    return result


def _stream(broker: Any, system: str, n: int) -> dict[str, Any]:
    topic = f"persistent://public/default/demo-stream-{system}-{uuid.uuid4().hex[:8]}"
    produce(broker.url, topic, "stream", n)
    return run_worker("bench.demo_wave", "stream", broker.url, topic, system, str(n))


# ---------------------------------------------------------------------- the run


def _medians(runs: list[dict[str, Any]], part: str, keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    return {
        system: {key: round(statistics.median(r[key] for r in runs if r["part"] == part and r["system"] == system), 3) for key in keys}
        for system in SYSTEMS
    }


WAVE_ROWS = (
    ("workers_cpu_s", "wave: CPU time of the two workers", "s"),
    ("broker_cpu_s", "wave: CPU time of the broker", "s"),
    ("first_pass_end_ms", "wave: first pass done (the last nack), after", "ms"),
    ("last_retry_arrival_ms", "wave: last retry arrived, after", "ms"),
    ("wall_s", "wave: wall time", "s"),
)
STREAM_ROWS = (
    ("wall_us", "stream: wall time per message", "µs"),
    ("process_cpu_us", "stream: CPU time of the process per message", "µs"),
    ("main_thread_cpu_us", "stream: CPU time of the application's thread per message", "µs"),
)


def table(payload: dict[str, Any]) -> str:
    """The medians, ours beside the built-in, as a markdown table."""
    from ._common import md_table

    rows = [
        [label, f"{medians['ours'][key]:,.{0 if unit == 'ms' else 2}f} {unit}",
         f"{medians['builtin'][key]:,.{0 if unit == 'ms' else 2}f} {unit}",
         f"{medians['ours'][key] / medians['builtin'][key]:.2f}x"]
        for medians, spec in ((payload["wave_medians"], WAVE_ROWS), (payload["stream_medians"], STREAM_ROWS))
        for key, label, unit in spec
    ]  # fmt: skip
    return md_table(["median of the repetitions", "ours", "built-in", "ours / built-in"], rows, "lrrr")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.demo_wave", "a tenth of the messages, two repetitions")
    args_parser.add_argument("--repeats", type=int, default=5, help="pairs per part, order alternating")
    args = args_parser.parse_args(argv)
    wave_n, stream_n, repeats = (10_000, 5_500, 2) if args.quick else (100_000, STREAM_MESSAGES, args.repeats)
    start = start_context()
    runs: list[dict[str, Any]] = []
    with standalone() as broker:
        label = broker_label(broker)
        for repeat in range(repeats):
            order = SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]
            for system in order:
                runs.append({"part": "wave", "system": system, "repeat": repeat, **_wave(broker, system, wave_n)})
                print(f"wave {repeat} {system}: {runs[-1]['wall_s']} s, workers {runs[-1]['workers_cpu_s']} CPU s", flush=True)
            for system in order:
                runs.append({"part": "stream", "system": system, "repeat": repeat, **_stream(broker, system, stream_n)})
                print(f"stream {repeat} {system}: {runs[-1]['wall_us']} µs", flush=True)
    payload: dict[str, Any] = {
        "broker": label,
        "wave_messages": wave_n,
        "stream_messages": stream_n,
        "repeats": repeats,
        "runs": runs,
        "wave_medians": _medians(runs, "wave", tuple(key for key, _label, _unit in WAVE_ROWS)),
        "stream_medians": _medians(runs, "stream", tuple(key for key, _label, _unit in STREAM_ROWS)),
    }
    finish(args, "demo-wave", payload, start, table)
    return payload


def _worker(argv: list[str]) -> None:
    part, url, topic, system, *rest = argv
    result = _wave_worker(url, topic, system) if part == "wave" else _stream_worker(url, topic, system, int(rest[0]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2:])
    else:
        main()
