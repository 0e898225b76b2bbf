"""Where the demo's busy wave spends its CPU, call by call: ours beside the built-in.

The *wave* of :mod:`bench.demo_wave` (two worker processes run the demo's task at once on
one Shared subscription over its batched backlog, 10 % of the events failing once), with
each consumer call timed in the thread that makes it (``time.thread_time_ns`` before and
after, so the CPU of that thread only, waits excluded):

- ``receive``, ``acknowledge``, ``negative_acknowledge``: the consumer's calls the task
  makes (ours: :class:`~pulsar_nack.consumer.NackingConsumer`; the built-in: the task's
  wrapper around ``client.subscribe``'s consumer);
- ours only, inside those: ``screen_kept`` (a received copy the C table did not decide, so
  the ledger screens it under its lock) and ``before_ack`` (an ack the C table did not
  record, so the ledger records it);
- per thread: the task's (main) thread, ours' tracker timer thread (``pulsar-nack-tracker``,
  where due entries are handed to the client), and the rest of the process (the client's
  own threads).

Every call pays the same timer on both systems (two clock reads), so per-call figures are
above what the calls cost untimed; the differences are what matter. Run:
``python -m bench.wave_calls [--quick] [--repeats N]``; writes ``bench/results/wave-calls.json``.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._common import broker_label, finish, md_table, parser, run_worker, standalone, start_context
from .demo_wave import SYSTEMS, WAVE_WORKERS, demo_task, process_cpu_s, produce, stat_cpu_s

CONSUMER_CALLS = ("receive", "acknowledge", "negative_acknowledge")
"""The consumer calls the task makes, timed on both systems."""
LEDGER_CALLS = ("screen_kept", "before_ack")
"""Ours only: the calls into the ledger that the C table left to it."""
TIMER_THREAD = "pulsar-nack-tracker"
"""The name of ours' tracker timer thread (:class:`~pulsar_nack.core.tracker.NegativeAcksTracker`)."""


class CallTimer:
    """Thread CPU time and count per timed method (a stand-in wrapper per method, on its class)."""

    def __init__(self) -> None:
        self.totals: dict[str, list[int]] = {}

    def wrap(self, cls: type, name: str, label: str) -> None:
        """Time ``cls.name`` under *label* from now on, in every thread that calls it."""
        method: Callable[..., Any] = getattr(cls, name)
        total = self.totals.setdefault(label, [0, 0])
        clock = time.thread_time_ns

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                total[0] += clock() - start
                total[1] += 1

        setattr(cls, name, timed)

    def report(self) -> dict[str, dict[str, float]]:
        """``{label: {"calls": n, "cpu_ms": total}}`` for the methods called at least once."""
        return {label: {"calls": n, "cpu_ms": round(ns / 1e6, 2)} for label, (ns, n) in self.totals.items() if n}


def _timer_for(system: str) -> CallTimer:
    from pulsar_nack.consumer import NackingConsumer
    from pulsar_nack.consumer.nacking import NackingCore
    from pulsar_nack.spark.builtin import BuiltinNackConsumer

    timer = CallTimer()
    consumer_class: type = NackingConsumer if system == "ours" else BuiltinNackConsumer
    for name in CONSUMER_CALLS:
        timer.wrap(consumer_class, name, name)
    if system == "ours":
        for name in LEDGER_CALLS:
            timer.wrap(NackingCore, name, name)
    return timer


def _thread_cpu_s(native_id: int | None) -> float:
    """User + system CPU seconds of this process's thread *native_id* (Linux /proc); 0 if unknown."""
    if native_id is None:
        return 0.0
    try:
        return stat_cpu_s(f"/proc/self/task/{native_id}/stat")
    except OSError:  # the thread ended
        return 0.0


def _wave_worker(url: str, topic: str, system: str) -> dict[str, Any]:
    """One demo task in this process with its calls timed; the calls' and the threads' CPU."""
    timer = _timer_for(system)
    before, main_before = process_cpu_s(), time.thread_time()
    stats = demo_task(url, topic, system)
    main_s, process_s = time.thread_time() - main_before, process_cpu_s() - before
    tracker_thread = next((t for t in threading.enumerate() if t.name == TIMER_THREAD), None)
    timer_s = _thread_cpu_s(None if tracker_thread is None else tracker_thread.native_id)
    return {
        "received": stats["received"],
        "calls": timer.report(),
        "main_thread_cpu_s": round(main_s, 3),
        "timer_thread_cpu_s": round(timer_s, 3),
        "other_threads_cpu_s": round(process_s - main_s - timer_s, 3),
        "process_cpu_s": round(process_s, 3),
    }


def _wave(broker: Any, system: str, n: int) -> dict[str, Any]:
    from pulsar_nack.cli.demo import SUBSCRIPTION

    topic = f"persistent://public/default/wave-calls-{system}-{uuid.uuid4().hex[:8]}"
    produce(broker.url, topic, SUBSCRIPTION, n)
    with ThreadPoolExecutor(WAVE_WORKERS) as pool:
        workers = list(pool.map(lambda _: run_worker("bench.wave_calls", broker.url, topic, system), range(WAVE_WORKERS)))
    return {"workers": workers}


# ---------------------------------------------------------------------- the summary

THREAD_ROWS = (
    ("main_thread_cpu_s", "the task's thread"),
    ("rest_of_task_cpu_s", "the task's thread outside the consumer calls"),
    ("timer_thread_cpu_s", "ours' tracker timer thread"),
    ("other_threads_cpu_s", "the client's threads"),
    ("process_cpu_s", "the process"),
)


def _thread_value(worker: dict[str, Any], key: str) -> float:
    """A worker's thread figure; the rest of the task is its thread's CPU less the consumer calls' (seconds)."""
    if key != "rest_of_task_cpu_s":
        return float(worker[key])
    in_calls = sum(worker["calls"].get(name, {}).get("cpu_ms", 0.0) for name in CONSUMER_CALLS)
    return float(worker["main_thread_cpu_s"]) - in_calls / 1000


def per_worker(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Medians over every worker of every run, per system: calls, CPU per call (µs), CPU per worker (ms); thread CPU (s)."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for system in SYSTEMS:
        workers = [w for run in runs if run["system"] == system for w in run["workers"]]
        labels = CONSUMER_CALLS + (LEDGER_CALLS if system == "ours" else ())
        calls = {
            label: {
                "calls": statistics.median(w["calls"].get(label, {}).get("calls", 0) for w in workers),
                "us_per_call": round(statistics.median(
                    w["calls"][label]["cpu_ms"] * 1000 / w["calls"][label]["calls"] for w in workers if label in w["calls"]), 2),
                "ms_per_worker": round(statistics.median(w["calls"].get(label, {}).get("cpu_ms", 0.0) for w in workers), 1),
            }
            for label in labels
            if any(label in w["calls"] for w in workers)
        }  # fmt: skip
        threads = {key: {"s": round(statistics.median(_thread_value(w, key) for w in workers), 3)} for key, _label in THREAD_ROWS}
        summary[system] = {**calls, **threads}
    return summary


def table(payload: dict[str, Any]) -> str:
    """Per worker, medians: each call's count, CPU per call and CPU in all; each thread's CPU; ours beside the built-in."""
    medians = payload["medians"]
    ours, builtin = medians["ours"], medians["builtin"]
    rows: list[list[Any]] = []
    for label in CONSUMER_CALLS + LEDGER_CALLS:
        if label not in ours:
            continue
        theirs = builtin.get(label)
        rows.append([
            f"`{label}`" + ("" if label in CONSUMER_CALLS else " (ours only, inside the calls above)"),
            f"{ours[label]['calls']:,.0f}", f"{ours[label]['us_per_call']:.2f} µs", f"{ours[label]['ms_per_worker']:,.0f} ms",
            "-" if theirs is None else f"{theirs['calls']:,.0f}",
            "-" if theirs is None else f"{theirs['us_per_call']:.2f} µs",
            "-" if theirs is None else f"{theirs['ms_per_worker']:,.0f} ms",
        ])  # fmt: skip
    for key, label in THREAD_ROWS:
        rows.append([f"CPU of {label}", "", "", f"{ours[key]['s'] * 1000:,.0f} ms", "", "", f"{builtin[key]['s'] * 1000:,.0f} ms"])
    headers = ["per worker (median)", "ours: calls", "ours: CPU per call", "ours: CPU", "built-in: calls",
               "built-in: CPU per call", "built-in: CPU"]  # fmt: skip
    return md_table(headers, rows, "lrrrrrr")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.wave_calls", "a tenth of the messages, two repetitions")
    args_parser.add_argument("--repeats", type=int, default=3, help="pairs, order alternating")
    args = args_parser.parse_args(argv)
    n, repeats = (10_000, 2) if args.quick else (100_000, args.repeats)
    start = start_context()
    runs: list[dict[str, Any]] = []
    with standalone() as broker:
        label = broker_label(broker)
        for repeat in range(repeats):
            for system in SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]:
                runs.append({"system": system, "repeat": repeat, **_wave(broker, system, n)})
                cpu = sum(w["process_cpu_s"] for w in runs[-1]["workers"])
                print(f"wave {repeat} {system}: workers {cpu:.2f} CPU s", flush=True)
    payload: dict[str, Any] = {"broker": label, "messages": n, "repeats": repeats, "runs": runs, "medians": per_worker(runs)}
    finish(args, "wave-calls", payload, start, table)
    return payload


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(_wave_worker(*sys.argv[2:5])), flush=True)
    else:
        main()
