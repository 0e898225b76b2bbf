"""Retries across a crash: ``reconsume_later`` (retry letter topic) beside the nack path.

One scenario: N messages; a consumer process (the *scheduler*) receives them all and
schedules a retry of each, due 2-20 s later (a fixed spread by message index), with
``reconsume_later(message, delay)`` or with ``negative_acknowledge(message, delay)``
(``never_early=True``, so that every early copy is the crash's doing); it writes each
retry's due time (wall clock at the call + delay) and says ``ready``. Then it is killed
with SIGKILL, the broker is restarted too in the ``kill+restart`` scenario (there every
delay is 60 s longer, so that retries fall due after the broker is back), and a new
consumer process (the *receiver*, same subscription, same mode) receives until every
message came back or the last due time is 10 s past (20 s after it subscribed at least).
Retries due before the receiver was up are late by the gap; ``due_after_receiver_up``
summarizes the others alone. Per message: its first arrival
minus its due time (negative: early), copies beyond the first (duplicates), and the
messages never seen (lost).

Reconsume modes: the scheduler's originals are all acked on the broker (its backlog is 0)
before the kill, so the retries live only in the retry topic: ``reconsume`` as the Java
client sends them (each with its delivery time), ``reconsume-held`` batched without one
and held by the consumers (``retry_hold_ms``), so the killed scheduler had them all and
the receiver gets them all at once, to hold until due. Nack mode: the originals are
unacked and their schedule is in the killed process's memory.

Run: ``python -m bench.retry_durable [--retries 1000] [--modes reconsume,reconsume-held,nack]
[--scenarios kill,kill+restart] [--tick-ms 1000]``; writes ``bench/results/retry_durable.json``
(``--out`` to change). ``tests/test_retry_durable.py`` runs the same scenario with fewer
messages. Workers: ``python -m bench.retry_durable --worker schedule|receive ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pulsar_nack.testing.waits import wait_until

from ._common import REPO, percentile, print_table, start_context, write_result

MODES = ("reconsume", "reconsume-held", "nack")
HELD_HOLD_MS = 120_000
"""``reconsume-held``: the consumers' ``retry_hold_ms``, above every delay of both scenarios, so
that each retry copy is batched and held by a consumer instead of by the broker."""
SCENARIOS = ("kill", "kill+restart")
EARLY_SLACK_MS = 50
"""A message is early when it arrives before its due time minus this."""
SUBSCRIPTION = "sub"
RECEIVE_WINDOW_MS = 20_000
"""The receiver waits at least this long after subscribing, whatever the due times."""
RESTART_OFFSET_MS = 60_000
"""Added to every delay in the ``kill+restart`` scenario: retries fall due after the broker is back."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def delay_of(index: int, min_ms: int, max_ms: int) -> int:
    """The retry delay of message *index*: spread evenly over [min_ms, max_ms) by a fixed stride."""
    span = max(max_ms - min_ms, 1)
    return min_ms + (index * 7919) % span


# ---------------------------------------------------------------------- workers


def _subscribe(url: str, topic: str, mode: str) -> tuple[Any, Any]:
    import pulsar

    import pulsar_nack
    from pulsar_nack.testing import quiet_client

    client = quiet_client(url)
    consumer = pulsar_nack.subscribe(
        client, topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest, retry_enable=mode != "nack",
        retry_hold_ms=HELD_HOLD_MS if mode == "reconsume-held" else 0, never_early=True, receiver_queue_size=2000,
    )
    return client, consumer


def worker_schedule(url: str, topic: str, mode: str, n: int, min_ms: int, max_ms: int, dues_path: str) -> None:
    """Receive *n* messages, schedule a retry of each, write their due times, say ready, wait to be killed."""
    _client, consumer = _subscribe(url, topic, mode)
    dues: dict[int, int] = {}
    while len(dues) < n:
        message = consumer.receive(60_000)
        index = int(message.data())
        if index in dues:  # a retry back already (due 2 s on): left unacked, for the receiver
            continue
        delay = delay_of(index, min_ms, max_ms)
        called = now_ms()
        if mode != "nack":
            consumer.reconsume_later(message, delay)
        else:
            consumer.negative_acknowledge(message, delay)
        dues[index] = called + delay
    tmp = f"{dues_path}.tmp"
    Path(tmp).write_text(json.dumps(dues))
    os.replace(tmp, dues_path)
    print("ready", flush=True)
    threading.Event().wait()  # until SIGKILL


def worker_receive(url: str, topic: str, mode: str, n: int, until_ms: int, out_path: str) -> None:
    """Receive until all *n* messages came back or *until_ms*; ack each; write ``[index, arrival, RECONSUMETIMES]``."""
    import pulsar

    client, consumer = _subscribe(url, topic, mode)
    subscribed_at = now_ms()
    until_ms = max(until_ms, subscribed_at + RECEIVE_WINDOW_MS)  # a broker just restarted loads topics slowly
    events: list[list[int]] = []
    seen: set[int] = set()
    while len(seen) < n and now_ms() < until_ms:
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        arrival = now_ms()
        index = int(message.data())
        events.append([index, arrival, int(message.properties().get("RECONSUMETIMES", 0))])
        seen.add(index)
        consumer.acknowledge(message)
    Path(out_path).write_text(json.dumps({"subscribed_at": subscribed_at, "events": events, "stats": {k: v for k, v in consumer.stats().items() if k != "tracker"}}))
    consumer.close()
    client.close()


# ---------------------------------------------------------------------- one scenario


def _produce(url: str, topic: str, n: int) -> None:
    from pulsar_nack.testing import quiet_client

    client = quiet_client(url)
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=n + 1)
    for index in range(n):
        producer.send_async(str(index).encode(), None)
    producer.flush()
    producer.close()
    client.close()


def _worker_argv(*args: Any) -> list[str]:
    return [sys.executable, "-m", "bench.retry_durable", "--worker", *map(str, args)]


def _await_ready(process: subprocess.Popen[str], timeout_s: float) -> None:
    """Wait for the scheduler's ``ready`` line (a reader thread; the deadline holds)."""
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip() == "ready":
                ready.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s):
        process.kill()
        raise RuntimeError(f"the scheduler was not ready within {timeout_s} s (exit code {process.poll()})")


def run_scenario(
    broker: Any, mode: str, scenario: str, n: int, min_ms: int, max_ms: int, workdir: Path,
    restart_offset_ms: int = RESTART_OFFSET_MS,
) -> dict[str, Any]:
    """One mode in one scenario on *broker*; the per-message outcome and its summary."""
    if scenario == "kill+restart":
        min_ms, max_ms = min_ms + restart_offset_ms, max_ms + restart_offset_ms
    topic = f"persistent://public/default/durable-{mode}-{uuid.uuid4().hex[:8]}"
    _produce(broker.url, topic, n)
    dues_path, out_path = workdir / f"{topic.rsplit('/', 1)[1]}-dues.json", workdir / f"{topic.rsplit('/', 1)[1]}-out.json"
    scheduler = subprocess.Popen(
        _worker_argv("schedule", broker.url, topic, mode, n, min_ms, max_ms, dues_path),
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    _await_ready(scheduler, 300)
    acked_before_kill = None
    if mode != "nack":  # the originals' acks are on the broker: only the retry topic holds the retries
        acked_before_kill = wait_until(lambda: broker.admin.backlog(topic, SUBSCRIPTION) == 0, 10, poll_s=0.05)
    killed_at = now_ms()
    os.kill(scheduler.pid, signal.SIGKILL)
    scheduler.wait()
    restart_s = None
    if scenario == "kill+restart":
        begin = time.monotonic()
        broker.restart()
        restart_s = round(time.monotonic() - begin, 1)
    dues = {int(k): v for k, v in json.loads(dues_path.read_text()).items()}
    until = max(dues.values()) + 10_000
    subprocess.run(
        _worker_argv("receive", broker.url, topic, mode, n, until, out_path), cwd=REPO, check=True,
        timeout=max(until - now_ms(), RECEIVE_WINDOW_MS) / 1000 + 120,
    )
    received = json.loads(out_path.read_text())
    return {
        "mode": mode,
        "scenario": scenario,
        "retries": n,
        "delay_ms": [min_ms, max_ms],
        "acked_before_kill": acked_before_kill,
        "broker_restart_s": restart_s,
        "receiver_up_after_kill_ms": received["subscribed_at"] - killed_at,
        **summarize_arrivals(dues, received["events"], killed_at),
        "due_after_receiver_up": summarize_arrivals(
            {i: d for i, d in dues.items() if d >= received["subscribed_at"]}, received["events"], killed_at
        ),
        "receiver_stats": received["stats"],
    }


def summarize_arrivals(dues: dict[int, int], events: list[list[int]], killed_at: int) -> dict[str, Any]:
    """Lateness of each message's first arrival (arrival - due), early/lost/duplicate counts."""
    first: dict[int, int] = {}
    for index, arrival, _count in events:
        if index in dues:
            first.setdefault(index, arrival)
    lateness = sorted(first[i] - dues[i] for i in first)
    early = [x for x in lateness if x < -EARLY_SLACK_MS]
    return {
        "retries": len(dues),
        "received": len(first),
        "lost": len(dues) - len(first),
        "duplicates": sum(1 for index, _, _ in events if index in dues) - len(first),
        "early": len(early),
        "earliest_ms": lateness[0] if lateness else None,
        "lateness_ms": {
            "min": lateness[0] if lateness else None,
            "p50": percentile(lateness, 50) if lateness else None,
            "p99": percentile(lateness, 99) if lateness else None,
            "max": lateness[-1] if lateness else None,
        },
        "early_by_ms_p50": percentile(sorted(-x for x in early), 50) if early else 0,
        "first_arrival_after_kill_ms": min(first.values()) - killed_at if first else None,
    }


# ---------------------------------------------------------------------- the command


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _row(r: dict[str, Any]) -> list[Any]:
    late = r["lateness_ms"]
    return [
        r["mode"], r["scenario"], r["retries"], r["received"], r["lost"], r["duplicates"],
        f"{r['early']} ({100 * r['early'] / r['retries']:.0f} %)",
        " / ".join(_ms(late[k]) for k in ("min", "p50", "p99", "max")),
        " / ".join(_ms(r["due_after_receiver_up"]["lateness_ms"][k]) for k in ("min", "p50", "p99", "max")),
        r["broker_restart_s"] if r["broker_restart_s"] is not None else "-",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        kind, *rest = argv[1:]
        if kind == "schedule":
            worker_schedule(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), int(rest[5]), rest[6])
        else:
            worker_receive(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), rest[5])
        return {}
    parser = argparse.ArgumentParser(prog="python -m bench.retry_durable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--retries", type=int, default=1000)
    parser.add_argument("--min-delay-ms", type=int, default=2_000)
    parser.add_argument("--max-delay-ms", type=int, default=20_000)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--tick-ms", type=int, default=1000, help="the broker's delayedDeliveryTickTimeMillis")
    parser.add_argument("--out", default="retry_durable")
    args = parser.parse_args(argv)
    import tempfile

    from pulsar_nack.testing import PulsarStandalone

    start = start_context()
    runs = []
    config = {"delayedDeliveryTickTimeMillis": str(args.tick_ms)}
    with tempfile.TemporaryDirectory(prefix="retry-durable-") as tmp, PulsarStandalone(config=config) as broker:
        for scenario in args.scenarios.split(","):
            for mode in args.modes.split(","):
                run = run_scenario(broker, mode, scenario, args.retries, args.min_delay_ms, args.max_delay_ms, Path(tmp))
                runs.append(run)
                print(json.dumps({k: run[k] for k in ("mode", "scenario", "received", "lost", "duplicates", "early")}), flush=True)
    print_table(
        ["mode", "scenario", "retries", "received", "lost", "duplicates", "early (< due - 50 ms)",
         "lateness min/p50/p99/max ms", "due after receiver up: min/p50/p99/max", "broker restart s"],
        [_row(r) for r in runs],
        title="retries across a SIGKILL of the consumer",
    )
    payload = {"tick_ms": args.tick_ms, "early_slack_ms": EARLY_SLACK_MS, "runs": runs}
    path = write_result(args.out, payload, start)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
