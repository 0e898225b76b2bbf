"""Startup cost of ``pulsar-nack demo`` on Apache Pulsar standalone, warm and cold cache.

The committed ``bench/results/startup.json`` was recorded before the former embedded
test broker left the project (commit c8e2156; see CHANGELOG.md), with a third arm
(``lite``) running the demo on it; its ``over_lite`` ratios are issue 20's goal (at most
1.5x). That arm is gone with the broker.

What one ``python -m bench.startup`` run records in ``bench/results/startup.json``:

1. **demo runs**: ``pulsar-nack demo --json`` exactly as a user types it (the
   installed script, a fresh process each time), ``apache`` and ``apache-tiered`` alternating,
   ``--repeats`` pairs, on the warm distribution cache. Per run: the command's wall time
   (interpreter start to exit), and from the demo's own JSON the broker start, Spark
   start, and the first message handed to a handler (all from the start of the demo's
   ``run()``, after the interpreter's start and imports), and the lost/duplicate counts.
2. **a cold run** (``--cold``, on by default): the same apache command with
   ``PULSAR_NACK_CACHE`` and Maven's local repository in a fresh temporary directory, so
   the distribution (and Maven's plugin) come from Maven Central as on a new machine. A
   thread watches the cache directory to time the download and the unpack.
3. **broker phases** (``--phases N``): ``PulsarStandalone().start()`` timed N times per
   variant of settings, with the broker log's time stamps marking where the seconds go
   (JVM up and logging, bookie started, broker service, HTTP server, ``public/default``
   created, ready). Each variant is checked with a smoke test (partitioned topic through
   the admin API, a batched producer, batch-index ack and nack of single members, a
   delayed message) before its times count.

Run: ``python -m bench.startup [--repeats N] [--messages SIZE] [--no-cold] [--phases N]
[--variants a,b]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import REPO, print_table, start_context, summarize, write_result

BROKERS = ("apache", "apache-tiered")
"""What the demo runs on: Apache Pulsar standalone as shipped (C1 only, see
``DEFAULT_JVM_OPTIONS``); and the same with the JVM's default tiered compilation (the
settings before this benchmark), for the before/after."""
_TIERED = (
    "import sys; from pulsar_nack.testing import standalone; standalone.DEFAULT_JVM_OPTIONS = (); "
    "from pulsar_nack.cli import main; sys.exit(main(sys.argv[1:]))"
)
GOAL_RATIO = 1.5
"""Issue 20's goal: the warm-cache apache demo takes at most 1.5x the lite one."""
_SUMMARY_KEYS = (
    "broker_start_s", "spark_start_s", "first_message_s", "produce_s", "consume_s", "wall_s",
    "produced", "lost", "duplicates", "duplicates_pct", "messages_per_s", "ok",
)


# --------------------------------------------------------------------- demo runs


def demo_command(broker: str, messages: str) -> list[str]:
    """The command a user types: the ``pulsar-nack`` script beside this interpreter.

    ``apache-tiered`` is the same with ``DEFAULT_JVM_OPTIONS`` emptied first.
    """
    script = Path(sys.executable).parent / "pulsar-nack"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "pulsar_nack.cli"]
    if broker == "apache-tiered":
        head = [sys.executable, "-c", _TIERED]
    tail = [] if messages == "default" else ["--messages", messages]
    return [*head, "demo", "--json", *tail]


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for descendants so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_demo(broker: str, messages: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One demo process: wall time around it, exit code, and the timing fields of its JSON."""
    command = demo_command(broker, messages)
    load = os.getloadavg()[0]  # the machine is shared: how busy it was when the run began
    cpu_before = _children_cpu_s()
    start = time.monotonic()
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - start
    record: dict[str, Any] = {
        "broker": broker, "exit_code": out.returncode, "process_wall_s": round(wall, 2), "loadavg_1m": load,
        # CPU of the demo and the descendants it waited for (broker and Spark JVMs, Python
        # workers): unlike wall time, about the same on a busy machine as on a quiet one.
        "cpu_s": round(_children_cpu_s() - cpu_before, 2),
    }
    try:
        summary = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        record["stderr_tail"] = out.stderr.strip().splitlines()[-20:]
        return record
    record.update({key: summary.get(key) for key in _SUMMARY_KEYS})
    # Interpreter start, imports and exit: the part of the command the demo cannot time.
    record["outside_run_s"] = round(wall - summary["wall_s"], 2)
    return record


class CacheWatcher:
    """Polls a fresh cache directory: when the download starts, the archive lands, the tree is unpacked."""

    def __init__(self, root: Path, start: float) -> None:
        self.root, self.start = root, start
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-watcher", daemon=True)
        self._thread.start()

    def _mark(self, name: str, seen: bool) -> None:
        if seen and name not in self.marks:
            self.marks[name] = round(time.monotonic() - self.start, 2)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            if not self.root.is_dir():
                continue
            names = [p.name for p in self.root.iterdir()]
            self._mark("download_started_s", any(n.startswith("download-") for n in names))
            self._mark("archive_ready_s", any(n.endswith(".tar.gz") for n in names))
            self._mark("unpacked_s", any(n.startswith("apache-pulsar-") for n in names))

    def close(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(1)
        return self.marks


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def cold_run(messages: str) -> dict[str, Any]:
    """The apache demo on an empty distribution cache and an empty Maven local repository."""
    scratch = Path(tempfile.mkdtemp(prefix="pulsar-nack-cold-"))
    try:
        cache, m2 = scratch / "cache", scratch / "m2"
        env = dict(os.environ, PULSAR_NACK_CACHE=str(cache), MAVEN_OPTS=f"-Dmaven.repo.local={m2}")
        watcher = CacheWatcher(cache, time.monotonic())
        try:
            record = run_demo("apache", messages, env)
        finally:
            marks = watcher.close()
        record.update(marks)
        if "archive_ready_s" in marks and "download_started_s" in marks:
            record["fetch_s"] = round(marks["archive_ready_s"] - marks["download_started_s"], 2)
        if "unpacked_s" in marks and "archive_ready_s" in marks:
            record["unpack_s"] = round(marks["unpacked_s"] - marks["archive_ready_s"], 2)
        homes = list(cache.glob("apache-pulsar-*"))
        record["distribution_bytes"] = _tree_bytes(homes[0]) if homes else None
        record["maven_repo_bytes"] = _tree_bytes(m2) if m2.is_dir() else None
        return record
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------ broker phases

_PHASE_MARKS = (
    ("first_log_s", "Starting BK with"),
    ("bookie_started_s", "Started component bookie-server"),
    ("broker_service_s", "Started Pulsar Broker service on"),
    ("http_started_s", "HTTP Service started at"),
    ("namespace_created_s", "Created namespace public/default"),
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d),(\d{3})([+-]\d{4}) ")


def _log_marks(log: Path, launched: float) -> dict[str, float | None]:
    """Seconds from *launched* (a ``time.time()``) to the first log line holding each mark."""
    marks: dict[str, float | None] = dict.fromkeys(name for name, _ in _PHASE_MARKS)
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = _STAMP.match(line)
            if match is None:
                continue
            for name, needle in _PHASE_MARKS:
                if marks[name] is None and needle in line:
                    stamp = dt.datetime.strptime(f"{match[1]}.{match[2]}{match[3]}", "%Y-%m-%dT%H:%M:%S.%f%z")
                    marks[name] = round(stamp.timestamp() - launched, 2)
    return marks


def _smoke(broker: Any) -> None:
    """What the tests need from a broker: partitioned topics, batch-index ack, nack, delayed delivery."""
    import pulsar

    from pulsar_nack.testing import quiet_client

    topic = broker.create_partitioned_topic("persistent://public/default/startup-smoke", 2)
    client = quiet_client(broker.url)
    try:
        consumer = client.subscribe(
            topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True,
            negative_ack_redelivery_delay_ms=200,
        )
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
        for i in range(10):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        producer.send(b"delayed", deliver_after=dt.timedelta(milliseconds=500))
        seen: dict[bytes, int] = {}
        deadline = time.monotonic() + 30
        while sum(seen.values()) < 13 and time.monotonic() < deadline:  # 11 + the 2 nacked back
            message = consumer.receive(30_000)
            data = message.data()
            seen[data] = seen.get(data, 0) + 1
            if data in (b"3", b"7") and seen[data] == 1:
                consumer.negative_acknowledge(message)
            else:
                consumer.acknowledge(message)
        expected = {str(i).encode(): 2 if i in (3, 7) else 1 for i in range(10)} | {b"delayed": 1}
        if seen != expected:
            raise AssertionError(f"smoke test: got {seen}, expected {expected}")
    finally:
        client.close()


def _variants() -> dict[str, dict[str, Any]]:
    """Settings to try: standalone.conf overrides and JVM options, each on its own and together.

    Not here because they cannot work: AppCDS (``-XX:+AutoCreateSharedArchive``) refuses
    to archive, since ``bin/pulsar`` puts ``conf/``, a non-empty directory, on the class
    path; another garbage collector needs ``PULSAR_GC``, which the broker sets.
    """
    c1 = ["-XX:TieredStopAtLevel=1"]
    light = {"webSocketServiceEnabled": "false"}
    return {
        "tiered": {"config": {}, "jvm_options": []},  # the settings before this benchmark
        "tiered+no-websocket": {"config": light, "jvm_options": []},
        "c1-only": {"config": {}, "jvm_options": c1},  # DEFAULT_JVM_OPTIONS now
        "c1-only+no-websocket": {"config": light, "jvm_options": c1},
    }


def time_broker(config: dict[str, str], jvm_options: Sequence[str], smoke: bool) -> dict[str, Any]:
    """Start (and smoke-test, and stop) one standalone broker; the phases of its start."""
    import psutil

    from pulsar_nack.testing import PulsarStandalone

    load = os.getloadavg()[0]
    launched, start = time.time(), time.monotonic()
    broker = PulsarStandalone(config=config, jvm_options=jvm_options, batch_index_ack=True)
    try:
        broker.start()
        ready = time.monotonic() - start
        cpu = psutil.Process(broker.pid).cpu_times()
        record: dict[str, Any] = {
            "start_s": round(ready, 2),
            # CPU the JVM (and the `java -version` that bin/pulsar runs first) spent until ready.
            "cpu_s": round(cpu.user + cpu.system + cpu.children_user + cpu.children_system, 2),
            "loadavg_1m": load,
            **_log_marks(broker.log_path, launched),
        }
        if smoke:
            smoke_start = time.monotonic()
            _smoke(broker)
            record["smoke_s"] = round(time.monotonic() - smoke_start, 2)
    finally:
        stop_start = time.monotonic()
        broker.stop()
    record["stop_s"] = round(time.monotonic() - stop_start, 2)
    return record


def broker_phases(repeats: int, names: Sequence[str]) -> dict[str, Any]:
    """Each variant *repeats* times, round robin (the first start of each is its warm-up of the page cache)."""
    variants = {k: v for k, v in _variants().items() if k in names}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name, variant in variants.items():
            record = time_broker(variant["config"], variant["jvm_options"], smoke=True)
            runs[name].append({**record, "repeat": repeat})
            print(f"  {name:<22} start {record['start_s']:5.2f} s cpu {record['cpu_s']:5.2f} s  {record}", flush=True)
    return {
        name: {
            **variants[name], "runs": rs,
            "start_s": summarize([r["start_s"] for r in rs]), "cpu_s": summarize([r["cpu_s"] for r in rs]),
        }
        for name, rs in runs.items()
    }


# --------------------------------------------------------------------------- main


def _stats(runs: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return summarize(values) if values else None


_COLUMNS = ("process_wall_s", "first_message_s", "broker_start_s", "cpu_s")


def _row(label: str, runs: list[dict[str, Any]]) -> tuple[list[Any], dict[str, float]]:
    """A table row (wall min / median / max, then medians) and the medians by column."""
    stats = {key: _stats(runs, key) for key in _COLUMNS}
    medians = {key: round(value["median"], 2) for key, value in stats.items() if value is not None}
    wall = stats["process_wall_s"]
    assert wall is not None
    span = f"{wall['min']:.1f} / {wall['median']:.1f} / {wall['max']:.1f}" if len(runs) > 1 else f"{wall['min']:.1f}"
    return [label, len(runs), span, *(medians.get(key) for key in _COLUMNS[1:])], medians


def _table(demo: list[dict[str, Any]], cold: dict[str, Any] | None) -> dict[str, Any]:
    """Print the demo table; return the medians per broker and the apache / lite ratios."""
    rows, medians = [], {}
    for broker in BROKERS:
        runs = [r for r in demo if r["broker"] == broker and r["exit_code"] == 0]
        if runs:
            row, medians[broker] = _row(f"{broker} (warm)", runs)
            rows.append(row)
    if cold is not None and cold.get("exit_code") == 0:
        rows.append(_row("apache (cold)", [cold])[0])
    print_table(
        ["broker", "runs", "wall s min / median / max", "first message s", "broker start s", "CPU s"],
        rows, title="pulsar-nack demo --json, default size (medians)",
    )
    ratios: dict[str, dict[str, float]] = {}
    lite = medians.get("lite", {})
    for broker in BROKERS if lite else ():
        mine = medians.get(broker, {})
        ratios[broker] = {k: round(mine[k] / lite[k], 3) for k in ("process_wall_s", "first_message_s", "cpu_s")
                          if k in mine and lite.get(k)}
        wall = ratios[broker].get("process_wall_s")
        if wall is not None:
            verdict = "meets" if wall <= GOAL_RATIO else "misses"
            print(f"{broker} / lite, median wall: {wall:.2f}x ({verdict} the goal of <= {GOAL_RATIO}x); "
                  f"first message {ratios[broker].get('first_message_s')}x, CPU {ratios[broker].get('cpu_s')}x")
    return {"medians": medians, "over_lite": ratios}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one run per broker, order rotating (default 3)")
    parser.add_argument("--messages", default="default", help="the demo's --messages (default: its default)")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold-cache apache run")
    parser.add_argument("--phases", type=int, default=0, metavar="N", help="time N broker starts per variant")
    parser.add_argument("--variants", default="", help="comma-separated variants for --phases (default: all)")
    parser.add_argument("--out", default="startup", help="result name under bench/results (default startup)")
    args = parser.parse_args(argv)
    start = start_context()
    demo: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for broker in BROKERS[repeat % len(BROKERS):] + BROKERS[: repeat % len(BROKERS)]:
            record = {**run_demo(broker, args.messages), "repeat": repeat}
            demo.append(record)
            print(f"  {broker:<13} repeat {repeat}: {record}", flush=True)
    cold = cold_run(args.messages) if args.cold else None
    if cold is not None:
        print(f"  cold apache: {cold}", flush=True)
    summary = _table(demo, cold)
    names = args.variants.split(",") if args.variants else list(_variants())
    phases = broker_phases(args.phases, names) if args.phases else None
    payload = {
        "messages": args.messages, "goal_apache_over_lite": GOAL_RATIO, **summary,
        "demo_runs": demo, "cold_apache": cold, "broker_phases": phases,
    }
    path = write_result(args.out, payload, start)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
