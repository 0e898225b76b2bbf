"""Core performance: NegativeAcksTracker vs the hash-map baseline, measured in one run.

Every timed figure is measured with the systems interleaved (the order alternates
between repetitions), after a warmup, over several repetitions, and is reported as
min / median / max. Targets are judged on the median.

1. **add rate**: 1M pre-built keys (consecutive entries, 50,000 per ledger; building
   them is not timed) through the public ``add`` in one thread, real default clock,
   default precision (8 bits), 60 s delay, manual mode (no timer thread); a fresh
   tracker per repetition. Extra rows: a tracker with a ``redeliver`` callback (timer
   thread running), one with ``speedups=False`` (pure Python, as the baseline is), and
   every call form the docs show, as users write it: ``add(key, 1000)``,
   ``add(key, delay_ms=1000)`` and, with ``MultiplierRedeliveryBackoff(1000, 60000)``,
   ``add(key, None, 3)`` and ``add(key, redelivery_count=3)``. Rates are by the process's
   CPU time (which other processes on a shared machine do not inflate; wall time is
   recorded beside it). Targets: tracker >= 1,000,000 adds/s and >= 0.8x baseline; every
   call form costs at most 1.3x a bare ``add(key)``.
2. **pop 1M due**: 1M keys added with an injected clock advancing 1 ms per 8 keys
   (so 489 buckets of 256 ms, all but 16 sealed), then one ``pop_due`` when all are due,
   timed by CPU time. Target: tracker <= 0.5 s.
3. **find 1,000 due among 1M pending**: 999,000 keys due in 60 s and 1,000 keys due
   now; CPU time of one ``pop_due(now)`` releasing exactly those 1,000 (re-added, untimed,
   before each repetition). The baseline scans its whole dict. Target: tracker <= 1/100
   of the baseline.
4. **timer idle**: 1M far-future keys pending with a ``redeliver`` callback, then 5 s
   of nothing; reports ``stats()["timer_wakeups"]`` over the window and the process CPU
   time spent in it. Baseline with delay 60 s (scan every 20 s) and with delay 1 s (scan
   every 333 ms; keys added with a per-call delay of 1 h so they stay pending).
   Target: tracker makes zero wakeups.
5. **timer lateness under steady adds**: a producer thread adds one key every 1 ms for
   5 s with delay 100 ms while the timer thread releases them; for each callback,
   lateness = callback time (``time.monotonic_ns``) - the earliest deadline it released
   (the deadline ``add`` returned, on the ms monotonic clock). Rows: tracker with
   precision 0 (a bucket per ms), tracker with the default precision 8 (buckets of
   256 ms floored: keys come back up to 255 ms *early* by design, Java semantics), and
   the baseline scanning every ``delay/3`` = 33 ms. Target: tracker (precision 0)
   p99 <= 5 ms. The GIL switch interval is recorded with the results.

Run ``python -m bench.core_perf`` (committed as ``bench/results/core_perf.json``) or
``--quick`` (smaller sizes, shorter windows; ``core_perf-quick.json``).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ._common import (
    MISSED,
    dist,
    finish,
    fmt_rate,
    interleave,
    parser,
    print_table,
    start_context,
    summarize,
    timed,
    timed_pop_all,
)

TOPIC = "persistent://public/default/core-perf"
ENTRIES_PER_LEDGER = 50_000
LEDGER0 = 10_000
DELAY_MS = 60_000
END_OF_TIME = 1 << 62
FORM_LIMIT = 1.3
"""Target: every documented call form of ``add`` costs at most this much a bare ``add(key)``."""


def keys(n: int, topic: str = TOPIC) -> list[tuple[str, int, int, int]]:
    """*n* keys of consecutive entries, 50,000 per ledger."""
    return [(topic, LEDGER0 + m // ENTRIES_PER_LEDGER, m % ENTRIES_PER_LEDGER, -1) for m in range(n)]


def fill(tracker: Any, cell: list[int], items: list[Any], start_ms: int, per_ms: int) -> None:
    """Add *items*, the injected clock (``cell[0]``) advancing 1 ms every *per_ms* keys."""
    add = tracker.add
    for i, key in enumerate(items):
        cell[0] = start_ms + i // per_ms
        add(key)


def _trackers() -> tuple[Any, Any, Any]:
    import importlib

    import pulsar_nack

    try:  # a core from before pulsar_nack/core/ (bench/core_ab.py measures one) has it at the top
        baseline = importlib.import_module("pulsar_nack.core").HashMapNegativeAcksTracker
    except ImportError:
        baseline = getattr(pulsar_nack, "HashMapNegativeAcksTracker")  # noqa: B009 (the older layout has it)
    return pulsar_nack.NegativeAcksTracker, baseline, pulsar_nack.MultiplierRedeliveryBackoff


# ---------------------------------------------------------------------- 1. add rate

def _bare(add: Callable[..., int], items: list[Any]) -> None:
    for key in items:
        add(key)


def _delay(add: Callable[..., int], items: list[Any]) -> None:
    for key in items:
        add(key, 1000)


def _delay_keyword(add: Callable[..., int], items: list[Any]) -> None:
    for key in items:
        add(key, delay_ms=1000)


def _count(add: Callable[..., int], items: list[Any]) -> None:
    for key in items:
        add(key, None, 3)


def _count_keyword(add: Callable[..., int], items: list[Any]) -> None:
    for key in items:
        add(key, redelivery_count=3)


# name -> (tracker keywords, the loop: the call as users write it); "baseline" is the hash-map tracker
ADD_ROWS: dict[str, tuple[dict[str, Any], Callable[[Callable[..., int], list[Any]], None]]] = {
    "tracker": ({}, _bare),
    "baseline": ({}, _bare),
    "tracker+timer": ({"redeliver": True}, _bare),
    "tracker (pure Python)": ({"speedups": False}, _bare),
    "add(key, 1000)": ({}, _delay),
    "add(key, delay_ms=1000)": ({}, _delay_keyword),
    "add(key, None, 3), backoff": ({"backoff": True}, _count),
    "add(key, redelivery_count=3), backoff": ({"backoff": True}, _count_keyword),
}
FORMS = [name for name in ADD_ROWS if name.startswith("add(")]


def bench_add(n: int, warmup: int, reps: int) -> dict[str, Any]:
    tracker_class, baseline_class, backoff_class = _trackers()
    items = keys(n)

    def measure(name: str) -> tuple[float, float]:
        options, loop = ADD_ROWS[name]
        kwargs: dict[str, Any] = {"delay_ms": DELAY_MS, "speedups": options.get("speedups", True)}
        if options.get("backoff"):
            kwargs["backoff"] = backoff_class(1000, 60_000, 2)
        redeliver = (lambda due: None) if options.get("redeliver") else None
        tracker = baseline_class(delay_ms=DELAY_MS) if name == "baseline" else tracker_class(redeliver, **kwargs)
        elapsed = timed(lambda: loop(tracker.add, items))
        if len(tracker) != n:
            raise AssertionError(f"{name}: {len(tracker)} pending of {n}")
        tracker.close(flush=False)
        return elapsed

    times = interleave(tuple(ADD_ROWS), reps, measure, warmup, progress="add")
    out: dict[str, Any] = {"messages": n, "warmup": warmup, "repetitions": reps, "rate": "by CPU time"}
    for name, samples in times.items():
        cpu = [c for _, c in samples]
        out[name] = {"seconds": summarize(cpu), "rate": summarize([n / s for s in cpu]), "wall_seconds": summarize(w for w, _ in samples)}
    bare = out["tracker"]["seconds"]["median"]
    out["forms_over_bare_add"] = {name: out[name]["seconds"]["median"] / bare for name in FORMS}
    return out


# ---------------------------------------------------------------------- 2. pop 1M due


def bench_pop_all(n: int, warmup: int, reps: int) -> dict[str, Any]:
    tracker_class, baseline_class, _ = _trackers()
    items, cell, buckets = keys(n), [0], []

    def measure(name: str) -> tuple[float, float]:
        tracker = (tracker_class if name == "tracker" else baseline_class)(delay_ms=DELAY_MS, clock=lambda: cell[0])
        fill(tracker, cell, items, 1_000_000, 8)
        if name == "tracker":
            buckets.append(tracker.stats()["buckets"])
        return timed(lambda: timed_pop_all(tracker, n, END_OF_TIME))

    times = interleave(("tracker", "baseline"), reps, measure, warmup, progress="pop")
    out: dict[str, Any] = {"messages": n, "tracker_buckets": buckets[-1], "warmup": warmup, "repetitions": reps, "rate": "by CPU time"}
    for name, samples in times.items():
        cpu = [c for _, c in samples]
        out[name] = {"seconds": summarize(cpu), "rate": summarize([n / s for s in cpu]), "wall_seconds": summarize(w for w, _ in samples)}
    return out


# ---------------------------------------------------------------------- 3. find due


def bench_find_due(n: int, due_n: int, warmup: int, reps: int) -> dict[str, Any]:
    tracker_class, baseline_class, _ = _trackers()
    cell, t_due = [0], 1 << 20  # aligned to the 256 ms buckets
    due_keys = keys(due_n, topic=TOPIC + "-due")
    trackers = {"tracker": tracker_class, "baseline": baseline_class}
    for name, made in trackers.items():
        trackers[name] = made(delay_ms=DELAY_MS, clock=lambda: cell[0])
        fill(trackers[name], cell, keys(n - due_n), t_due, 8)  # deadlines >= t_due + 60 s

    def measure(name: str) -> tuple[float, float]:
        tracker = trackers[name]
        cell[0] = t_due
        for key in due_keys:
            tracker.add(key, delay_ms=0)
        return timed(lambda: timed_pop_all(tracker, due_n, t_due + 255, n - due_n))  # the 1,000 are due, nothing else

    times = interleave(tuple(trackers), reps, measure, warmup)
    out: dict[str, Any] = {"pending": n, "due": due_n, "warmup": warmup, "repetitions": reps, "seconds": "CPU time"}
    out.update({name: {"seconds": summarize(c for _, c in samples), "wall_seconds": summarize(w for w, _ in samples)}
                for name, samples in times.items()})
    out["ratio_baseline_over_tracker_median"] = out["baseline"]["seconds"]["median"] / out["tracker"]["seconds"]["median"]
    return out


# ---------------------------------------------------------------------- 4. timer idle


def bench_idle(n: int, window_s: float) -> dict[str, Any]:
    tracker_class, baseline_class, _ = _trackers()
    items = keys(n)
    rows = [
        ("tracker", "delay 60 s", tracker_class, 60_000, None),
        ("tracker", "delay 1 s, keys 1 h", tracker_class, 1_000, 3_600_000),
        ("baseline", "delay 60 s (scan 20 s)", baseline_class, 60_000, None),
        ("baseline", "delay 1 s (scan 333 ms), keys 1 h", baseline_class, 1_000, 3_600_000),
    ]
    out = []
    for system, label, made, delay, per_call in rows:
        released = [0]
        tracker = made(lambda due, r=released: r.__setitem__(0, r[0] + sum(map(len, due.values()))), delay_ms=delay)
        for key in items:
            tracker.add(key, per_call)
        time.sleep(0.2)  # let the wake-up for the first key settle
        gc.collect()
        # stats() reads timer_wakeups first, then does O(n) work for the baseline: the
        # window runs from one read to the next, so the sleep makes up for that work.
        t0, s0, cpu0 = time.monotonic(), tracker.stats(), time.process_time()
        time.sleep(max(0.0, window_s - (time.monotonic() - t0)))
        cpu1, t1, s1 = time.process_time(), time.monotonic(), tracker.stats()
        out.append(
            {
                "system": system, "setting": label, "pending": s1["pending_messages"], "window_s": t1 - t0,
                "wakeups": s1["timer_wakeups"] - s0["timer_wakeups"], "cpu_s_in_window": cpu1 - cpu0,
                "released": released[0],
            }
        )
        tracker.close(flush=False)
    return {"pending": n, "window_s": window_s, "rows": out}


# ---------------------------------------------------------------------- 5. lateness


def lateness_run(system: str, precision: int | None, duration_s: float, delay_ms: int) -> dict[str, Any]:
    """One add per ms for *duration_s* on a producer thread; lateness of each timer release."""
    tracker_class, baseline_class, _ = _trackers()
    count = int(duration_s * 1000)
    firings: list[tuple[int, dict[str, list[Any]]]] = []

    def redeliver(due: dict[str, list[Any]]) -> None:
        firings.append((time.monotonic_ns(), due))

    if system == "tracker":
        tracker: Any = tracker_class(redeliver, delay_ms=delay_ms, precision_bits=precision or 0)
    else:
        tracker = baseline_class(redeliver, delay_ms=delay_ms)
    deadlines = [0] * count
    items = [(TOPIC + "-lateness", 1, i, -1) for i in range(count)]

    def producer() -> None:
        start = time.monotonic_ns()
        for i in range(count):
            while (now := time.monotonic_ns()) < start + i * 1_000_000:
                time.sleep((start + i * 1_000_000 - now) / 1e9)
            deadlines[i] = tracker.add(items[i])

    thread = threading.Thread(target=producer, name="bench-producer")
    t_start = time.monotonic()
    thread.start()
    thread.join()
    produce_s = time.monotonic() - t_start
    give_up = time.monotonic() + delay_ms / 1000 + 2.0
    while len(tracker) and time.monotonic() < give_up:
        time.sleep(0.01)
    left = tracker.close(flush=False)
    per_firing: list[float] = []
    per_message: list[float] = []
    released = 0
    for t_ns, due in firings:
        entries = [key[2] for keys_ in due.values() for key in keys_]
        released += len(entries)
        if entries:
            per_firing.append(t_ns / 1e6 - min(deadlines[e] for e in entries))
            per_message.extend(t_ns / 1e6 - deadlines[e] for e in entries)
    return {
        "adds": count, "produce_s": produce_s, "firings": len(firings), "released": released,
        "left_at_close": sum(map(len, left.values())), "timer_wakeups": tracker.stats()["timer_wakeups"],
        "per_firing": per_firing, "per_message": per_message,
    }


def bench_lateness(duration_s: float, warmup_s: float, reps: int, delay_ms: int = 100) -> dict[str, Any]:
    rows = {"tracker p0": ("tracker", 0), "tracker p8": ("tracker", 8), "baseline": ("baseline", None)}
    names = tuple(rows)
    pooled: dict[str, dict[str, list[float]]] = {n: {"per_firing": [], "per_message": []} for n in names}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for name in names:  # warmup: a short run of each
        lateness_run(*rows[name], warmup_s, delay_ms)
    for rep in range(reps):
        for name in names[rep % 3 :] + names[: rep % 3]:  # rotate the order
            run = lateness_run(*rows[name], duration_s, delay_ms)
            summary = {k: v for k, v in run.items() if k not in ("per_firing", "per_message")}
            for field in ("per_firing", "per_message"):
                pooled[name][field] += run[field]
                summary[field] = dist(run[field])
            runs[name].append(summary)
            print(f"  lateness {name:10} p99/firing {summary['per_firing'].get('p99', 0):7.2f} ms", file=sys.stderr)
    out: dict[str, Any] = {
        "delay_ms": delay_ms, "add_interval_ms": 1, "duration_s": duration_s, "repetitions": reps,
        "switch_interval_s": sys.getswitchinterval(), "rows": {},
    }
    for name in names:
        out["rows"][name] = {
            "system": rows[name][0], "precision_bits": rows[name][1],
            "per_firing": dist(pooled[name]["per_firing"]), "per_message": dist(pooled[name]["per_message"]),
            "per_run_p99_per_firing": summarize([r["per_firing"]["p99"] for r in runs[name]]), "runs": runs[name],
        }
    return out


# ---------------------------------------------------------------------- main


def _ms(s: float) -> str:
    return f"{s * 1000:.2f}"


def _parts(n: int, reps: int, idle_s: float, lateness: tuple[float, float, int]) -> dict[str, Callable[[], Any]]:
    """Each part: what it measures, then its tables and verdicts (see :func:`report`)."""
    return {
        "add": lambda: bench_add(n, 1, reps),
        "pop": lambda: bench_pop_all(n, 1, reps),
        "find": lambda: bench_find_due(1_000_000, 1000, 1, max(reps, 15)),  # the target is defined at 1M pending
        "idle": lambda: bench_idle(n, idle_s),
        "lateness": lambda: bench_lateness(*lateness),
    }


def report(results: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The tables and the verdicts of a run (for the console, the JSON and bench/report.py)."""
    tables: dict[str, str] = {}
    verdicts: list[dict[str, Any]] = []

    def verdict(name: str, target: str, value: str, ok: bool) -> None:
        verdicts.append({"benchmark": name, "target": target, "value": value, "pass": bool(ok)})

    if "add" in results:
        r = results["add"]
        rows = [[name, *(fmt_rate(r[name]["rate"][k]) for k in ("min", "median", "max")), f"{1e9 / r[name]['rate']['median']:.0f}"]
                for name in ADD_ROWS]
        tables["add"] = print_table(["system / call", "min", "median", "max", "median ns/add"], rows,
                                    title=f"add rate ({r['messages']:,} keys, {r['repetitions']} reps)")
        t_med, b_med = r["tracker"]["rate"]["median"], r["baseline"]["rate"]["median"]
        verdict("add rate", "tracker >= 1,000,000 adds/s", fmt_rate(t_med), t_med >= 1_000_000)
        verdict("add rate", "tracker >= 0.8x baseline", f"{t_med / b_med:.2f}x", t_med >= 0.8 * b_med)
        for name, ratio in r["forms_over_bare_add"].items():
            verdict("call forms", f"`{name}` <= {FORM_LIMIT}x `add(key)`", f"{ratio:.2f}x", ratio <= FORM_LIMIT)
    if "pop_all" in results:
        r = results["pop_all"]
        rows = [[name, *(_ms(r[name]["seconds"][k]) for k in ("min", "median", "max")), fmt_rate(r[name]["rate"]["median"])]
                for name in ("tracker", "baseline")]
        tables["pop"] = print_table(["system", "min ms", "median ms", "max ms", "median rate"], rows,
                                    title=f"pop_due of {r['messages']:,} due keys ({r['tracker_buckets']} tracker buckets)")
        limit = 0.5 * r["messages"] / 1_000_000
        median = r["tracker"]["seconds"]["median"]
        verdict("pop all", f"tracker <= {limit:g} s for {r['messages']:,}", f"{median:.3f} s", median <= limit)
    if "find_due" in results:
        r = results["find_due"]
        ratio = r["ratio_baseline_over_tracker_median"]  # by CPU time
        rows = [[name, *(_ms(r[name]["seconds"][k]) for k in ("min", "median", "max"))] for name in ("tracker", "baseline")]
        tables["find"] = print_table(["system", "min ms", "median ms", "max ms"], rows,
                                     title=f"pop_due(now) with {r['pending']:,} pending, 1,000 due; baseline/tracker = {ratio:.0f}x")
        verdict("find due", "tracker <= 1/100 of baseline", f"1/{ratio:.0f}", ratio >= 100)
    if "idle" in results:
        r = results["idle"]
        rows = [[x["system"], x["setting"], x["pending"], f"{x['window_s']:.2f}", x["wakeups"], f"{x['cpu_s_in_window']:.3f}"]
                for x in r["rows"]]
        tables["idle"] = print_table(["system", "setting", "pending", "window s", "wakeups", "CPU s"], rows,
                                     title=f"timer idle ({r['pending']:,} far-future keys)")
        for x in r["rows"]:
            if x["system"] == "tracker":
                verdict("timer idle", f"tracker 0 wakeups in {r['window_s']:g} s ({x['setting']})", str(x["wakeups"]), x["wakeups"] == 0)
    if "lateness" in results:
        r = results["lateness"]
        rows = [[name, f["n"], *(f"{f[k]:.2f}" for k in ("p50", "p99", "max")), *(f"{m[k]:.1f}" for k in ("min", "p50", "p99", "max"))]
                for name, row in r["rows"].items() for f, m in [(row["per_firing"], row["per_message"])]]
        tables["lateness"] = print_table(
            ["row", "firings", "fire p50 ms", "fire p99 ms", "fire max ms", "msg min", "msg p50", "msg p99", "msg max"], rows,
            title=f"timer lateness: 1 add/ms for {r['duration_s']:g} s, delay {r['delay_ms']} ms, {r['repetitions']} runs pooled "
            f"(switch interval {r['switch_interval_s'] * 1000:g} ms; negative = early)",
        )
        p99 = r["rows"]["tracker p0"]["per_firing"]["p99"]
        verdict("lateness", "tracker (precision 0) p99 <= 5 ms", f"{p99:.2f} ms", p99 <= 5.0)
    missed = MISSED if results["parameters"]["quick"] else "FAIL"
    tables["targets"] = print_table(
        ["benchmark", "target", "value", "result"],
        [[v["benchmark"], v["target"], v["value"], "pass" if v["pass"] else missed] for v in verdicts], title="Targets",
    )
    return tables, verdicts


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.core_perf", "smaller sizes, shorter windows; verdicts indicative, exit status 0")
    args_parser.add_argument("--reps", type=int, default=None, help="repetitions (default 7, quick 5)")
    args_parser.add_argument("--only", default="add,pop,find,idle,lateness", help="comma-separated parts")
    args = args_parser.parse_args(argv)
    n, reps = (200_000, args.reps or 5) if args.quick else (1_000_000, args.reps or 7)
    started, context = time.time(), start_context()
    parts = _parts(n, reps, 2.0 if args.quick else 5.0, (2.0, 0.5, 2) if args.quick else (5.0, 1.0, 5))
    names = {"pop": "pop_all", "find": "find_due"}
    results: dict[str, Any] = {
        "parameters": {"messages": n, "repetitions": reps, "warmup": 1, "quick": args.quick,
                       "switch_interval_s": sys.getswitchinterval(), "gc": "enabled; gc.collect() before each timed repetition"}
    }
    for part in args.only.split(","):
        print(f"{part} ...", file=sys.stderr, flush=True)
        results[names.get(part, part)] = parts[part]()
    results["tables"], results["verdicts"] = report(results)
    passed = sum(v["pass"] for v in results["verdicts"])
    print(f"{passed}/{len(results['verdicts'])} targets passed; {time.time() - started:.0f} s")
    if args.quick:
        results["quick_note"] = QUICK_NOTE
        print(QUICK_NOTE)
    results["method"] = __doc__
    results["elapsed_s"] = time.time() - started
    finish(args, "core_perf", results, context)
    return 0 if args.quick or passed == len(results["verdicts"]) else 1


QUICK_NOTE = (
    "quick mode: targets are defined for the full run (1M keys, 5 s windows); quick verdicts are "
    "indicative only and do not set the exit status."
)

if __name__ == "__main__":
    sys.exit(main())
