"""Markdown tables for README.md and docs/, generated from bench/results/*.json and the code.

Every figure in those tables comes from here, so the docs cannot drift from the committed
JSON: ``python -m bench.report --write`` rewrites the blocks between
``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers, and ``tests/test_docs.py``
fails when a block differs from what the JSON (or, for ``constants``, the code) gives.
The benchmarks print their results with the same functions.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Callable
from typing import Any

from pulsar_nack.core.buckets import DEFAULT_PRECISION_BITS

from . import chaos
from ._common import MISSED, REPO, RESULTS, load, md_table

DOCS = {
    "README.md": ["results-table", "consumer-summary"],
    "docs/benchmarks.md": ["goals", "memory", "tail-log", "profile", "core", "core-ab", "client", "e2e", "scaling", "meta", "consumer",
                           "consumer-profile", "nack-instructions", "id-read", "chaos", "soak", "chaos-breaks"],
    "docs/design.md": ["constants", "tail-log", "space"],
    "docs/spark.md": ["demo", "replay", "demo-retries", "demo-ab", "demo-wave", "wave-calls", "ledger-steps", "sharing-wait"],
    "docs/metrics.md": ["metrics-cost"],
    "docs/asyncio.md": ["asyncio-lateness"],
    "docs/brokers.md": ["cluster"],
    "docs/consumer.md": ["retry-lateness", "retry-durable", "retry-cost", "retry-receive", "faults", "client-matrix",
                         "demo-kill-duplicates", "jitter", "chunks",
                         "ack-timeout"],
}


SPACE_MODEL = (75, 33, 2, 8, 4, 4)
"""The space model's bytes (docs/design.md, Space analysis): a page's map slot, its ``bytes`` header,
a stream's tag and length, a Roaring header, a container, a run."""


def _b(value: float) -> str:
    """Bytes per message with sensible precision."""
    return f"{value:.3g}" if value < 10 else f"{value:,.0f}"


def _span(low: float, high: float) -> str:
    """``low–high`` bytes, or one figure when they print the same."""
    a, b = _b(low), _b(high)
    return a if a == b else f"{a}–{b}"


def _mmm(stats: dict[str, float], fmt: str = ".2f") -> str:
    return " / ".join(f"{stats[k]:{fmt}}" for k in ("min", "median", "max"))


def _pass(ok: bool, fail: str = "FAIL") -> str:
    return "pass" if ok else fail


def _case(memory: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in memory["cases"] if c["case"]["name"] == name)


def _e2e(e2e: dict[str, Any], system: str, delay: int = 1000, mode: str = "stream") -> dict[str, Any]:
    return next(c for c in e2e["cases"] if (c["system"], c["delay_ms"], c["mode"], c.get("subscription", "Shared")) == (system, delay, mode, "Shared"))


def _client(client: dict[str, Any], system: str) -> dict[str, Any]:
    return next(c for c in client["cases"] if c["system"] == system)


# ---------------------------------------------------------------------- README and goals


def results_table() -> str:
    memory, core, client, e2e = load("memory"), load("core_perf"), load("client"), load("e2e")
    grid = _case(memory, "consec-x8-y10")
    sparse = max((c for c in memory["cases"] if c["case"]["y"] >= 8), key=lambda c: c["tracker"]["rss_bytes_per_msg"])
    base_max = max(c["baseline"]["rss_bytes_per_msg"] for c in memory["cases"])
    built_in, ours = _client(client, "built-in"), _client(client, "pulsar-nack")
    late_built_in, late_ours = _e2e(e2e, "built-in")["lateness_ms"], _e2e(e2e, "pulsar-nack")["lateness_ms"]
    add = core["add"]
    table = md_table(
        ["", "memory per pending retry", "add / nack call", "p99 redelivery lateness, steady nack stream, 1 s delay"],
        [
            ["`pulsar-client` built-in tracker", f"{_b(built_in['bytes_per_id'])} B ¹", f"{built_in['call_us']['median']:.2f} µs ¹",
             f"{late_built_in['p99']:,.0f} ms ³"],
            ["hash-map baseline (pre-PIP-393)", f"{_span(grid['baseline']['rss_bytes_per_msg'], base_max)} B ²",
             f"{1e6 / add['baseline']['rate']['median']:.2f} µs ⁴", f"{core['lateness']['rows']['baseline']['per_message']['p99']:.0f} ms ⁵"],
            ["**pulsar-nack**", f"**{_span(grid['tracker']['rss_bytes_per_msg'], sparse['tracker']['rss_bytes_per_msg'])} B** ²",
             f"**{1e6 / add['tracker']['rate']['median']:.2f} µs** ⁴", f"**{late_ours['p99']:.0f} ms** ³"],
        ],
        "lrrr",
    )
    return table + (
        f"\n\n¹ `bench/client.py`: {built_in['ids']:,} `negative_acknowledge(MessageId)` calls on a real consumer of {client['broker']}, "
        f"RSS delta per id, median call cost. In the same run `NackingConsumer.negative_acknowledge` holds "
        f"{_b(ours['bytes_per_id'])} B per id and costs {ours['call_us']['median']:.2f} µs per id; on received "
        f"messages it costs {ours['call_message_us']['median']:.2f} µs against the built-in's "
        f"{built_in['call_message_us']['median']:.2f} µs; `tracker.add` alone costs {ours['tracker_add_us']['median']:.2f} µs with "
        f"the C hot path ({client['ratios']['call_built_in_over_tracker_add']:.1f}× faster than the built-in id call) and "
        f"{ours['tracker_add_pure_python_us']['median']:.2f} µs in pure Python. "
        f"² `bench/memory.py`, {memory['parameters']['messages']:,} pending per case, RSS delta per message: from the paper's x=8, "
        f"y=10 case (consecutive entries) to the sparsest pattern at y ≥ 8 (`{sparse['case']['name']}`: "
        f"{sparse['case']['description']}); every case in docs/benchmarks.md. "
        f"³ `bench/e2e.py` on {e2e['broker']}, Shared subscription: 1,000 messages, one nack every 5 ms; arrival − requested time "
        f"(ours: p50 {late_ours['p50']:.0f} ms, since 8 precision bits may release up to 255 ms early by design). "
        "⁴ `bench/core_perf.py`: public `add`, 1M keys, median of repetitions by CPU time, both in one run. "
        "⁵ `bench/core_perf.py`: timer only (no broker), one add per ms at 100 ms delay; the baseline's delay/3 scan; "
        f"pulsar-nack at precision 0 gives {core['lateness']['rows']['tracker p0']['per_message']['p99']:.1f} ms in the same run."
    )


def goals_table() -> str:
    memory, client, e2e, core = load("memory"), load("client"), load("e2e"), load("core_perf")
    built_in = _client(client, "built-in")
    grid = [c for c in memory["cases"] if c["case"]["pattern"] == "consec" and c["case"]["y"] >= 8]
    worst_base = min(c["ratio_baseline_over_tracker_rss"] for c in grid)
    worst_built = min(built_in["bytes_per_id"] / max(c["tracker"]["rss_bytes_per_msg"], 1e-9) for c in grid)
    ours_add = _client(client, "pulsar-nack")["tracker_add_us"]["median"]
    by_id, by_message = built_in["call_us"]["median"] / ours_add, built_in["call_message_us"]["median"] / ours_add
    ours, theirs = _e2e(e2e, "pulsar-nack")["lateness_ms"]["p99"], _e2e(e2e, "built-in")["lateness_ms"]["p99"]
    forms = core["add"]["forms_over_bare_add"]
    return md_table(["goal", "measured", "result"], [
        ["memory ≤ 1/20 of the baseline, paper grid y ≥ 8", f"worst case 1/{worst_base:,.0f}", _pass(worst_base >= 20)],
        ["memory ≤ 1/50 of the built-in client, paper grid y ≥ 8",
         f"worst case 1/{worst_built:,.0f} (built-in {_b(built_in['bytes_per_id'])} B/id)", _pass(worst_built >= 50)],
        ["add ≥ 10× faster than the built-in nack call",
         f"{by_id:.1f}× its `nack(MessageId)`, {by_message:.1f}× its `nack(message)` (C hot path; pure Python "
         f"{client['ratios']['call_built_in_over_tracker_add_pure_python']:.1f}×)", _pass(min(by_id, by_message) >= 10)],
        ["every documented `add` call form ≤ 1.3× a bare `add(key)`",
         f"worst `{max(forms, key=forms.get)}` {max(forms.values()):.2f}×", _pass(max(forms.values()) <= 1.3)],
        ["p99 lateness under a steady stream ≤ 50 ms (ours), built-in > delay",
         f"ours {ours:.0f} ms, built-in {theirs:,.0f} ms at 1 s delay", _pass(ours <= 50 and theirs > 1000)],
    ])


def meta_table() -> str:
    rows = []
    for name in ("memory", "core_perf", "client", "e2e", "scaling", "demo-apache"):
        meta = load(name)["meta"]
        git, machine, packages = meta["git"], meta["machine"], meta["packages"]
        commit = (git["commit"] or "?")[:10] + (" + uncommitted changes" if git.get("dirty") else "")
        rows.append([f"`bench/results/{name}.json`", f"`{commit}`", meta.get("utc", "?"),
                     f"{machine['cpu_model']}, {machine['cores']} cores, {machine['ram_bytes'] / 2**30:.0f} GiB",
                     meta["python"]["version"], packages.get("pulsar-client"), packages.get("pyroaring")])
    return md_table(["result file", "commit", "when (UTC)", "machine", "Python", "pulsar-client", "pyroaring"], rows)


# ---------------------------------------------------------------------- the core


def memory_table(memory: dict[str, Any] | None = None) -> str:
    memory = memory or load("memory")
    rows = [
        [f"`{c['case']['name']}`", c["case"]["description"], f"{t['buckets']:,}", _b(t["rss_bytes_per_msg"]),
         _b(t["estimate_bytes_per_msg"]), f"{t['rss_delta'] / 2**20:.2f} MiB", f"{b['rss_bytes_per_msg']:.0f}",
         f"{c['limit_bytes_per_msg']:.3g}", f"{c['ratio_tracker_over_limit']:,.1f}×", f"1/{c['ratio_baseline_over_tracker_rss']:,.0f}",
         f"{t['add_rate'] / 1e6:.2f} M", f"{b['add_rate'] / 1e6:.2f} M"]
        for c in memory["cases"] for t, b in [(c["tracker"], c["baseline"])]
    ]
    headers = ["case", "pattern", "buckets", "pulsar-nack B/msg (RSS)", "estimate B/msg", "total", "baseline B/msg",
               "limit B/msg", "ours / limit", "ours / baseline", "add/s ours", "add/s baseline"]
    missed = MISSED if memory["parameters"].get("quick") else "FAIL"
    targets = [[f"`{v['case']}` {v['target']}", v["value"], _pass(v["pass"], missed)] for v in memory["verdicts"]]
    return md_table(headers, rows, "llrrrrrrrrrr") + "\n\n" + md_table(["target", "value", "result"], targets)


def profile_table() -> str:
    """The py-spy summary of ``add`` on the cases where it has the least margin."""
    profile = load("profile_add")
    rows = [[f"`{name}`", f"`{re.sub(r' [(].*[)]$', '', row['function'])}`", f"{row['inclusive']:.0%}", f"{row['self']:.0%}"]
            for name, case in profile["cases"].items() for row in case["functions"][:10]]
    return md_table(["case", "function (inside `add`)", "inclusive", "self"], rows, "llrr")


def core_table() -> str:
    core = load("core_perf")
    verdicts = md_table(["benchmark", "target", "value", "result"],
                        [[v["benchmark"], v["target"], v["value"], _pass(v["pass"])] for v in core["verdicts"]])
    tables = [text for name, text in core["tables"].items() if name != "targets"]
    return "\n\n".join([verdicts, *tables])


def core_ab_table() -> str:
    """pop_due and timer lateness, the current core beside an earlier one (bench/core_ab.py)."""
    result = load("core_ab")
    labels = {
        "pop": "pop all, 1,000,000 due (ns per released message)",
        "lateness-p0": "timer lateness, precision 0 (p99 per firing, ms)",
        "lateness-p8": "timer lateness, 8 bits (p99 per firing, ms; negative = early)",
    }
    rows = []
    for part, label in labels.items():
        row = result["parts"][part]
        if "ratio_now_over_before" in row:
            change, goal = f"{row['ratio_now_over_before']:.2f}×", f"{row['goal']}: {_pass(row['pass'], 'MISSED')}"
        else:
            change, goal = f"{row['difference_now_minus_before']:+.2f} ms", "none (early by design; the difference is shown)"
        rows.append([label, f"{row['before']['median']:.2f}", f"{row['now']['median']:.2f}", change, goal])
    return md_table([ "measure", f"core at `{result['ref']}` (median)", "this core (median)", "now vs before", "goal"], rows, "lrrrl") + (
        f"\n\nOne `python -m bench.core_ab` run: {result['repetitions']} repetitions of each part after a warmup, "
        "each in a fresh process, the two cores alternating (`bench/results/core_ab.json`)."
    )


def tail_log_table() -> str:
    """``y0-x1`` with and without the C tail log (bench/memory.py, the log switched off for one run)."""
    rows = []
    for label, name in (("with the tail log", "memory"), ("without (one run at the commit that switched it off)",
                                                            "repeats/memory-y0-x1-without-tail-log")):
        result = load(name)
        c = _case(result, "y0-x1")
        t, b = c["tracker"], c["baseline"]
        rows.append([label, f"{t['add_rate'] / 1e6:.2f} M", f"{b['add_rate'] / 1e6:.2f} M", f"{t['add_rate'] / b['add_rate']:.2f}×",
                     _b(t["rss_bytes_per_msg"]), f"`bench/results/{name}.json` (`{result['meta']['git']['commit'][:7]}`)"])
    return md_table(["`y0-x1`: precision 0, one nack per ms", "add/s ours", "add/s baseline", "ours / baseline", "RSS B/msg", "result"],
                    rows, "lrrrrl")


def space_table() -> str:
    """The sealed-page model of docs/design.md beside the measurements (constants from pages.py)."""
    from pulsar_nack.core.pages import PAGE_BYTES

    slot, bytes_obj, stream_header, roaring_header, container, run = SPACE_MODEL

    def ulen(value: float) -> int:
        return max(1, -(-int(value).bit_length() // 7))

    def paged(body: float, y: int) -> float:  # a record in a page, plus its share of the page's own cost
        per_page = max(1, int(PAGE_BYTES // (body + 4)))
        return ulen(per_page * 2**y / 2) + ulen(body) + body + (slot + bytes_obj) / per_page

    memory = load("memory")
    per_ledger = memory["parameters"]["entries_per_ledger"]
    rows = []
    for c in memory["cases"]:
        x, y, p, pattern = (c["case"][k] for k in ("x", "y", "fraction", "pattern"))
        messages, ledgers = x * 2**y, 1 + x * 2**y / per_ledger  # messages and streams per bucket
        if pattern == "consec" and messages == 1:  # one GAPS value: the entry id, averaged over a ledger's ids
            model = paged(1 + stream_header + statistics.mean(ulen(e) for e in range(0, per_ledger, 97)), y)
        elif pattern == "consec":  # one Roaring run per ledger
            model = paged(1 + ledgers * (stream_header + roaring_header + container + 2 + run), y) / messages
        elif pattern == "random":  # GAPS: one byte per gap below 128, two below 16,384
            values = messages * p
            model = paged(1 + ledgers * (stream_header + 3) + values * (1 + (1 - p) ** 127 + (1 - p) ** 16383), y) / values
        else:
            continue
        rows.append([f"`{c['case']['name']}`", f"{messages:,}", _b(model), _b(c["tracker"]["rss_bytes_per_msg"]),
                     _b(c["tracker"]["estimate_bytes_per_msg"])])
    return md_table(["case", "messages per bucket M = x·2^y", "model B/msg", "measured RSS B/msg", "`memory_bytes()` B/msg"], rows, "lrrrr")


def constants_table() -> str:
    """The constants docs/design.md names, read from the code."""
    from pulsar_nack.core import accel, buckets, keys, pages
    from pulsar_nack.timing import (
        COALESCE_MS,
        HANDOFF_DELAY_MS,
        HANDOFF_MARGIN_MS,
        client_handoff_latency_ms,
        handoff_lead_ms,
    )

    return md_table(["constant", "value", "where"], [
        ["default precision", f"{buckets.DEFAULT_PRECISION_BITS} bits: buckets of {buckets.bucket_ms(buckets.DEFAULT_PRECISION_BITS)} ms",
         "`core/buckets.py` `DEFAULT_PRECISION_BITS`"],
        ["open buckets kept mutable", "16 (`max_open_buckets`)", "`core/buckets.py` `TimeBuckets`"],
        ["page size", f"{pages.PAGE_BYTES:,} bytes (a larger bucket is a page alone)", "`core/pages.py` `PAGE_BYTES`"],
        ["hot slots", f"{accel.MAX_SLOTS} bitmaps", "`core/accel.py` `MAX_SLOTS`"],
        ["tail log", f"{accel.LOG_CAPACITY:,} records, at most {accel.LOG_GROUP} per bucket", "`core/accel.py` `LOG_CAPACITY`, `LOG_GROUP`"],
        ["batched value", f"`entry_id << {keys.BATCH_BITS} | batch_index`", "`core/keys.py` `BATCH_BITS`"],
        ["client nack delay", f"{HANDOFF_DELAY_MS} ms", "`timing.py` `HANDOFF_DELAY_MS`"],
        ["handoff lead (buckets fire this early)",
         f"{handoff_lead_ms(HANDOFF_DELAY_MS)} ms: the client's delay less a {HANDOFF_MARGIN_MS} ms margin, in every mode",
         "`timing.py` `handoff_lead_ms`"],
        ["client handoff latency", f"{client_handoff_latency_ms(HANDOFF_DELAY_MS)} ms", "`timing.py` `client_handoff_latency_ms`"],
        ["burst spacing", f"{COALESCE_MS} ms", "`timing.py` `COALESCE_MS`"],
    ])


# ---------------------------------------------------------------------- brokers and clients


def client_table(result: dict[str, Any] | None = None) -> str:
    rows = [[c["system"], f"{c['ids']:,}", f"{c['rss_delta_bytes'] / 2**20:.1f} MiB", _b(c["bytes_per_id"]), _mmm(c["call_us"]),
             f"{c['call_message_us']['median']:.2f}", *(f"{c[k]['median']:.2f}" if k in c else "–" for k in ("tracker_add_us", "tracker_add_pure_python_us"))]
            for c in (result or load("client"))["cases"]]
    return md_table(["system", "pending ids", "RSS delta", "bytes/id", "nack(MessageId) µs (min / median / max)",
                     "nack(received message) µs (median)", "tracker.add µs (median)", "tracker.add, pure Python µs (median)"], rows, "lrrrrrrr")


def e2e_table(result: dict[str, Any] | None = None) -> str:
    e2e = result or load("e2e")
    rows = [[c["system"], c.get("subscription", "Shared"), f"{c['delay_ms'] / 1000:g} s", c["mode"], f"{c['redelivered']}/{c['messages']}",
             c.get("duplicates", 0), *(f"{c['lateness_ms'][k]:.0f}" for k in ("min", "p50", "p99", "max"))] for c in e2e["cases"]]
    return f"Broker: {e2e['broker']}.\n\n" + md_table(
        ["system", "subscription", "delay", "mode", "back", "duplicates", "min ms", "p50 ms", "p99 ms", "max ms"], rows, "llrlrrrrrr")


def scaling_table(result: dict[str, Any] | None = None) -> str:
    rows = [[r["system"], f"{r['pending']:,}", f"{r['rss_delta_bytes'] / 2**20:.2f} MiB", _b(r["bytes_per_msg"]), f"{r['add_us']:.2f}"]
            for r in (result or load("scaling"))["rows"]]
    return md_table(["system", "pending", "RSS delta", "bytes/msg", "µs per add"], rows, "lrrrr")


def metrics_cost_table() -> str:
    """``add`` with and without ``instrument()`` (bench/metrics.py)."""
    result = load("metrics")
    add, machine = result["add"], result["meta"]["machine"]
    off = add["off"]["ns_per_add"]["median"]
    rows = [[name, *(f"{add[name]['ns_per_add'][k]:.1f} ns" for k in ("min", "median", "max")), f"{add[name]['ns_per_add']['median'] / off:.3f}×"]
            for name in ("off", "on", "on+collecting")]
    return md_table(["`add`, 1M keys, tracker with timer", "min", "median", "max", "median vs off"], rows, "lrrrr") + (
        f"\n\n{add['repetitions']} repetitions after {add['warmup']} warmup, systems in alternating order; "
        f"{machine['cpu_model']}, {machine['cores']} cores, Python {result['meta']['python']['version']}."
    )


def asyncio_lateness_table(result: dict[str, Any] | None = None) -> str:
    """Steady-stream lateness, asyncio vs blocking vs built-in (bench/asyncio_stream.py)."""
    result = result or load("asyncio")
    rows = [[c["system"], f"{c['redelivered']:,}/{c['messages']:,}",
             *([f"{c['lateness_ms'][k]:,.0f} ms" for k in ("p50", "p99", "max", "min")] if c["lateness_ms"]["n"] else ["-"] * 4)]
            for c in result["cases"]]
    case = result["cases"][0]
    return md_table(["system", "redelivered", "p50", "p99", "max", "min"], rows, "lrrrrr") + (
        f"\n\n{result['broker']}; {case['messages']:,} messages, one nack every {case['nack_interval_ms']:g} ms for "
        f"{case['stream_s']:g} s, {case['delay_ms']:,} ms delay, 8 precision bits (up to 255 ms early by design)."
    )


def cluster_table(result: dict[str, Any] | None = None) -> str:
    """PulsarCluster start time, RSS per JVM and a broker failover (bench/cluster_start.py)."""
    result = result or load("cluster")

    def sec(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    rows = []
    for run in result["runs"]:
        phases, rss, fail = run["phases_s"], run["rss_mib_at_ready"], run["failover"]
        brokers = ", ".join(f"{v:.0f}" for k, v in rss.items() if k.startswith("broker"))
        rows.append([
            run["run"], f"{run['start_s']:.1f} s", f"{phases['zookeeper']:.1f} / {phases['metadata']:.1f} / {phases['brokers']:.1f} s",
            f"{rss['zookeeper']:.0f}, {rss['bookie']:.0f}, {brokers} MiB", f"{run['rss_mib_total_at_ready']:,.0f} MiB",
            sec(fail["lookups_on_survivor_s"]), sec(fail["first_message_from_moved_partition_s"]),
            sec(fail["all_sent_after_kill_received_s"]), fail["lost"], sec(fail["restart_s"]), f"{run['load_average_1_5_15_before'][0]:.1f}",
        ])
    summary = result["summary"]
    return md_table(
        ["run", "start", "ready at: ZooKeeper / metadata / all", "RSS at ready: ZooKeeper, bookie, brokers", "total RSS",
         "lookups moved", "first message back", "all 500 back", "lost", "restart", "load avg"], rows, "rrllrrrrrrr",
    ) + (
        f"\n\nMedian of {len(result['runs'])} fresh clusters: started in {summary['start_s']['median']:.1f} s "
        f"({summary['start_s']['min']:.1f}–{summary['start_s']['max']:.1f} s), "
        f"{summary['rss_mib_total_at_ready']['median']:,.0f} MiB RSS in all when ready; after SIGKILL of a broker "
        f"(metadata session timeout {result['runs'][0]['session_timeout_ms']:,} ms), lookups moved in "
        f"{summary['lookups_on_survivor_s']['median']:.1f} s and the consumer had every message sent after the "
        f"kill in {summary['all_sent_after_kill_received_s']['median']:.1f} s, {summary['lost']} lost. Times are "
        "from the kill; load avg is the machine's 1-minute load when the run began (2 cores, shared)."
    )


def _plain_way_rows(plain_way: dict[str, Any]) -> list[str]:
    """Rows of the plain-way memory measurement (issue 24, point 5)."""
    plain, ours = plain_way["cases"]
    ratio, net = plain_way["ratio_ours_over_plain"], plain_way["net_ratio_ours_over_plain"]
    trim = ours["after_trim_bytes_per_pending_nack"] / plain["after_trim_bytes_per_pending_nack"]
    return [
        f"| bytes per pending nack the plain way: {plain['messages']:,} messages in batches of 10, every tenth nacked "
        f"for 10 min, RSS delta after `gc.collect()` (median of {plain_way['runs_per_case']}) | "
        f"{plain['bytes_per_pending_nack']:.0f} | {ours['bytes_per_pending_nack']:.1f} | {ratio:.3f}× | "
        f"≤ 0.1×: {'pass' if ratio <= 0.1 else 'MISSED'} | - |",
        f"| the same, net of a control run that acks everything | {plain['net_bytes_per_pending_nack']:.0f} | "
        f"{ours['net_bytes_per_pending_nack']:.1f} | {net:.3f}× | - | - |",
        f"| the same, RSS read again after `malloc_trim(0)` | {plain['after_trim_bytes_per_pending_nack']:.0f} | "
        f"{ours['after_trim_bytes_per_pending_nack']:.1f} | {trim:.3f}× | - | - |",
    ]


def _plain_way_note(plain_way: dict[str, Any]) -> str:
    """Where the bytes of the plain-way measurement go, from its runs."""
    plain, ours = plain_way["cases"]

    def runs(case: dict[str, Any], key: str) -> str:
        return ", ".join(f"{v / case['pending_nacks']:.0f}" for v in case[key])

    return (
        f"The plain way, run by run (B per pending nack): plain {runs(plain, 'rss_delta_bytes_runs')}, ours "
        f"{runs(ours, 'rss_delta_bytes_runs')}; the control runs, which nack nothing, grew by "
        f"{runs(plain, 'control_rss_delta_bytes_runs')} (plain) and {runs(ours, 'control_rss_delta_bytes_runs')} "
        f"(ours) per would-be nack. After `malloc_trim(0)` ours is {runs(ours, 'rss_delta_after_trim_bytes_runs')}: "
        f"what the plain way counts beyond our structures ({ours['structures_bytes_per_pending_nack']:.1f} B per "
        "pending nack by their own estimate) is heap the allocator freed but kept, and it moves by tens of bytes "
        "per nack from run to run with or without nacks (see the text below)."
    )


CONSUMER_GOALS = {"quiet": 1.15, "guarding": 1.3, "nack": 1.0, "working": 1.2, "ack_timeout": 1.15, "unacked_memory": 0.1}
"""Issue 36's goals, ours / plain: receive + ack quiet and guarding, the nack call, the working case (10 % nacked);
issue 33's: receive + ack with an ack timeout, and bytes per unacked message."""
ACK_TIMEOUT_SYSTEMS = ("plain-ack-timeout", "pulsar-nack-ack-timeout")
"""The ack-timeout case's systems in bench/consumer.py and bench/ack_timeout.py: the plain consumer's, ours."""


def _cpu(case: dict[str, Any], key: str) -> str:
    """`` (CPU 1.10×)``: the ratio of the calling thread's CPU time, when the run recorded it."""
    return f" (CPU {case[key]:.2f}×)" if key in case else ""


def _goal(ratio: float, goal: float | None) -> str:
    return "-" if goal is None else f"≤ {goal}×: {'pass' if ratio <= goal else 'MISSED'}"


def consumer_table() -> str:
    """Issue 13 goals A, B, D, issue 24 points 4-5 and issue 36: NackingConsumer beside the plain consumer (bench/consumer.py)."""
    data = load("consumer")
    memory = data["pending_nack_memory_batched"]
    plain_mem, ours_mem = memory["cases"]
    without = data.get("no_batch_index_acks")
    lines = [
        f"{data['broker']}, with batch-index acks (`acknowledgmentAtBatchIndexLevelEnabled=true`) and, in the same run, "
        f"a second standalone without them (the broker's own default); {data['repetitions']} repetitions after a "
        "warmup (median), both consumers subscribed with the same keywords (Shared, `batch_index_ack_enabled=True`). "
        "Lower is better. The last column is a `NackingConsumer` that reads every id and records every ack all the "
        "time (`always_guard=True`), as every consumer does while nacks are pending (goal "
        f"≤ {CONSUMER_GOALS['guarding']}×). The *working* rows time receive + acknowledge + nack together, every "
        "100th or 10th message nacked for an hour, against the plain consumer with its built-in nack (goal "
        f"≤ {CONSUMER_GOALS['working']}× at 10 %)."
        + (" The rows *with an ack timeout* subscribe both consumers with `unacked_messages_timeout_ms` of ten "
           "minutes (ours keeps it itself), against the plain consumer with its own ack timeout (goal "
           f"≤ {CONSUMER_GOALS['ack_timeout']}×), and give the bytes each keeps per unacked message (goal "
           f"≤ {CONSUMER_GOALS['unacked_memory']}×)." if "ack_timeout_receive_ack_unbatched" in data else ""),
        "",
        "| measure | plain `pulsar.Consumer` | `NackingConsumer` | ours / plain | goal | guarding all the time |",
        "|---|---:|---:|---:|---|---:|",
    ]
    settings = [("", data)] + ([(" (no batch-index acks)", without)] if without else [])
    for setting, calls in settings:
        for case, label, goal in (
            ("receive_ack_batched", "receive + acknowledge, batches of 10 (µs/msg)", CONSUMER_GOALS["quiet"]),
            ("receive_ack_unbatched", "receive + acknowledge, not batched (µs/msg)", CONSUMER_GOALS["quiet"]),
            ("nack_message", "`negative_acknowledge(message)` (µs/call)", CONSUMER_GOALS["nack"]),
        ):
            c = calls[case]
            ratio = c["ratio_ours_over_plain"]
            guarding = c["us"].get("pulsar-nack-guarding")
            extra = "-"
            if guarding:
                extra = (f"{guarding['median']:.2f} ({c['ratio_guarding_over_plain']:.2f}×"
                         f"{_cpu(c, 'cpu_ratio_guarding_over_plain')}, "
                         f"{_goal(c['ratio_guarding_over_plain'], CONSUMER_GOALS['guarding'])})")
            lines.append(
                f"| {label}{setting}, {c['messages']:,} messages | {c['us']['plain']['median']:.2f} | "
                f"{c['us']['pulsar-nack']['median']:.2f} | {ratio:.2f}×{_cpu(c, 'cpu_ratio_ours_over_plain')} | "
                f"{_goal(ratio, goal)} | {extra} |"
            )
        lines += _ack_timeout_cost_rows(calls, setting, "| - |")
        for case, c in calls.items():
            if not case.startswith("working_"):
                continue
            share = f"{c['nacked_share'] * 100:.0f} %"
            kind = "batches of 10" if case.endswith("_batched") else "not batched"
            working_goal = CONSUMER_GOALS["working"] if case.startswith("working_10pct") else None
            lines.append(
                f"| working: receive + acknowledge + nack, {share} nacked, {kind} (µs/msg){setting}, "
                f"{c['messages']:,} messages | {c['us']['plain']['median']:.2f} (built-in nack) | "
                f"{c['us']['pulsar-nack']['median']:.2f} | {c['ratio_ours_over_plain']:.2f}×"
                f"{_cpu(c, 'cpu_ratio_ours_over_plain')} | "
                f"{_goal(c['ratio_ours_over_plain'], working_goal)} | - |"
            )
    ratio = memory["ratio_ours_over_plain"]
    lines.append(
        f"| bytes per pending nack, {plain_mem['messages']:,} messages in batches of 10, one of each nacked "
        f"(RSS delta, queue settled) | {plain_mem['bytes_per_pending_nack']:.0f} | "
        f"{ours_mem['bytes_per_pending_nack']:.1f} | {ratio:.3f}× | ≤ 0.1×: {'pass' if ratio <= 0.1 else 'MISSED'} | - |"
    )
    net = memory["net_ratio_ours_over_plain"]
    lines.append(
        f"| the same, net of a control run that acks everything (B) | {plain_mem['net_bytes_per_pending_nack']:.0f} | "
        f"{ours_mem['net_bytes_per_pending_nack']:.1f} | {net:.3f}× | ≤ 0.1×: {'pass' if net <= 0.1 else 'MISSED'} | - |"
    )
    plain_way = data.get("pending_nack_memory_plain_way")
    if plain_way:
        lines += _plain_way_rows(plain_way)
    if "ack_timeout_memory" in data:
        lines.append(_unacked_memory_row(data["ack_timeout_memory"], " - |"))
    lines.append("")
    lines.append(
        f"Our structures' own estimate for that workload: {ours_mem['structures_bytes_per_pending_nack']:.1f} B "
        f"per pending nack (tracker {ours_mem['tracker_memory_bytes']:,} B, admission structures "
        f"{ours_mem['pending_set_bytes']:,} B for {int(ours_mem['pending_nacks']):,} nacks)."
    )
    if plain_way:
        lines += ["", _plain_way_note(plain_way)]
    other_runs = _consumer_other_runs(data)
    if other_runs:
        lines += ["", other_runs]
    lines += ["", _nack_cost_profile()]
    return "\n".join(lines)


def _consumer_other_runs(data: dict[str, Any]) -> str | None:
    """The ratios of the other committed runs of ``bench/consumer.py`` (bench/results/repeats/)."""
    paths = sorted((RESULTS / "repeats").glob("consumer-run*.json"))
    if not paths:
        return None
    rows, ratios = [], [data["receive_ack_batched"]["ratio_ours_over_plain"]]
    for path in paths:
        run = load(f"repeats/{path.stem}")
        ratios.append(run["receive_ack_batched"]["ratio_ours_over_plain"])
        memory = run["pending_nack_memory_batched"]
        rows.append(
            f"`{path.relative_to(REPO).as_posix()}` (commit {run['meta']['git']['commit'][:7]}): receive + acknowledge "
            f"{run['receive_ack_batched']['ratio_ours_over_plain']:.2f}× batched, "
            f"{run['receive_ack_unbatched']['ratio_ours_over_plain']:.2f}× not batched; "
            f"`negative_acknowledge(message)` {run['nack_message']['ratio_ours_over_plain']:.2f}×; bytes per pending "
            f"nack {memory['ratio_ours_over_plain']:.3f}× (net {memory['net_ratio_ours_over_plain']:.3f}×)"
        )
    return (
        "Other committed runs of the same benchmark (the commit each measured), ours / plain: " + "; ".join(rows)
        + f". Over the {len(ratios)} runs, the batched receive + acknowledge ratio ranged from {min(ratios):.2f}× "
        f"to {max(ratios):.2f}× (median {statistics.median(ratios):.2f}×) on this shared 2-core machine."
    )


def _nack_cost_profile() -> str:
    """Where the time of ``negative_acknowledge(message)`` goes (bench/client.py's profile)."""
    client = load("client")
    built_in, ours = _client(client, "built-in"), _client(client, "pulsar-nack")
    steps, theirs, whole = ours["call_message_us"]["id_read_steps_us"], built_in["call_message_us"], ours["call_message_us"]["median"]

    def step(name: str) -> str:
        return f"{steps[name]['median']:.2f} µs"

    return (
        f"Where a nack of a received message goes (`bench/client.py`, {client['broker']}, medians): ours costs "
        f"{whole:.2f} µs, of which reading the message's id costs {step('id read, one serialize() parsed in C (used)')} "
        f"(`message_id()` {step('message_id()')}, `message_id()` + `serialize()` {step('message_id() + serialize()')}, "
        f"`topic_name()` {step('topic_name()')}; the four getters in Python took "
        f"{step('id read, four getters (pure Python)')}), and `tracker.add` {ours['tracker_add_us']['median']:.2f} µs. "
        f"The built-in's call on the same kind of messages, with {built_in['ids']:,} ids already in its map, "
        f"took {_mmm(theirs)} µs (min / median / max): "
        f"{whole / theirs['median']:.2f}× of its median, {whole / theirs['min']:.2f}× of its best (that run "
        "measured the code before issue 36; the table above has today's call against a fresh built-in consumer)."
    )


PROFILE_CASES = {
    "guarding_batched": "receive + acknowledge while guarding, batches of 10",
    "guarding_unbatched": "receive + acknowledge while guarding, not batched",
    "nack_message": "`negative_acknowledge(message)`",
    "working_10pct_batched": "working, 10 % nacked, batches of 10",
    "working_10pct_unbatched": "working, 10 % nacked, not batched",
    "plain_receive_ack_unbatched": "plain `pulsar.Consumer`: receive + acknowledge",
    "plain_nack_message": "plain `pulsar.Consumer`: `negative_acknowledge(message)`",
}


def consumer_profile_table() -> str:
    """Calls per message before and after issue 36 (bench/profile_consumer.py's two committed runs)."""
    before, after = load("consumer-profile-before"), load("consumer-profile-after")
    rows = []
    for case, label in PROFILE_CASES.items():
        b, a = before["cases"][case], after["cases"][case]
        rows.append([
            label,
            f"{b['python_calls_per_message']:.1f} → {a['python_calls_per_message']:.1f}",
            f"{b['binding_calls_per_message']:.1f} → {a['binding_calls_per_message']:.1f}",
            f"{b['builtin_calls_per_message']:.1f} → {a['builtin_calls_per_message']:.1f}",
        ])
    table = md_table(["path (per message)", "Python-level calls", "calls into the client's bindings",
                      "C-level calls seen by cProfile"], rows, "lrrr")
    return (
        f"`bench/profile_consumer.py` on {after['broker']}, {after['messages']:,} messages per case, before "
        f"(commit {before['meta']['git']['commit'][:7]}, `bench/results/consumer-profile-before.json`) → after "
        f"(commit {after['meta']['git']['commit'][:7]}, `consumer-profile-after.json`). Binding calls include "
        "those our C extension makes itself (`message_id()`, `serialize()`, `topic_name()`: an upper bound for "
        "the nack, which reads the id only when the message kept none)"
        + (", where it reads ids through the bindings; after, it read them through libpulsar's accessors "
           "(`pulsar_nack.consumer.native_ids`), which are no binding calls" if after.get("native_ids") else "")
        + ("; and the client's `receive` and `acknowledge` that the gate (`_msgid.Gate`) calls"
           if "receive" in after.get("c_calls", {}) else "")
        + ".\n\n" + table
    )


def nack_instructions_table(result: dict[str, Any] | None = None) -> str:
    """Instructions per ``negative_acknowledge(message)`` (bench/nack_instructions.py): medians per code and system."""
    result = result or load("nack-instructions")
    by_side: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in result["rows"]:
        by_side.setdefault((row["code"], row["system"]), []).append(row)
    steps = list(next((r["steps_per_nack"] for r in result["rows"] if r["steps_per_nack"]), {}))
    rows = []
    for (code, system), runs in by_side.items():
        counts = [r["instructions_per_nack"] for r in runs]
        rows.append([
            "the plain client's built-in nack" if system == "plain" else f"ours, {code}",
            f"{statistics.median(counts):,.0f} ({min(counts):,.0f}–{max(counts):,.0f})",
            *(f"{statistics.median(r['steps_per_nack'][s] for r in runs):,.0f}" if system != "plain" else None
              for s in steps),
        ])  # fmt: skip
    table = md_table(["code", "instructions per nack, median (range)", *(f"of which {s}" for s in steps)], rows,
                     "l" + "r" * (1 + len(steps)))
    return (
        f"`bench/nack_instructions.py` on {result['broker']}: {result['messages']:,} non-batched messages nacked "
        f"one after another on a fresh consumer, Callgrind's count, {len({r['repetition'] for r in result['rows']})} "
        "run(s) of each; instructions, "
        "not time.\n\n" + table
    )


def consumer_summary() -> str:
    """One README line per consumer-level goal, from bench/results/consumer.json."""
    data = load("consumer")
    plain_mem, ours_mem = data["pending_nack_memory_batched"]["cases"]
    a, b, d = data["receive_ack_batched"], data["receive_ack_unbatched"], data["nack_message"]
    w, w1 = data["working_10pct_batched"], data["working_10pct_unbatched"]

    def us(case: dict[str, Any], system: str) -> str:
        return f"{case['us'][system]['median']:.2f} µs"

    def ratio(case: dict[str, Any], who: str = "ours") -> str:
        return f"{case[f'ratio_{who}_over_plain']:.2f}×{_cpu(case, f'cpu_ratio_{who}_over_plain')}"

    return (
        f"At the consumer level (`bench/consumer.py`, {data['broker']}, medians; the thread's CPU time beside the "
        f"wall clock), at work (every tenth message nacked, the rest acked, receive + acknowledge + nack timed "
        f"together) ours costs {us(w, 'pulsar-nack')} per batched message against the plain consumer's "
        f"{us(w, 'plain')} with its built-in nack ({ratio(w)}), {us(w1, 'pulsar-nack')} against {us(w1, 'plain')} "
        f"not batched ({ratio(w1)}). Receive + acknowledge while nacks are pending (guarding) costs "
        f"{us(a, 'pulsar-nack-guarding')} batched against {us(a, 'plain')} ({ratio(a, 'guarding')}), "
        f"{us(b, 'pulsar-nack-guarding')} against {us(b, 'plain')} not batched ({ratio(b, 'guarding')}), and with "
        f"nothing pending {us(a, 'pulsar-nack')} and {us(b, 'pulsar-nack')} ({ratio(a)}, {ratio(b)}); a pending "
        f"nack of a batched workload holds {ours_mem['bytes_per_pending_nack']:.0f} B against the built-in's "
        f"{plain_mem['bytes_per_pending_nack']:.0f} B; `negative_acknowledge(message)` costs {us(d, 'pulsar-nack')} "
        f"against {us(d, 'plain')} ({ratio(d)})."
    )


# ---------------------------------------------------------------------- Spark


def _throughput_ratio(run: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """ours / builtin messages/s, for an ``ours`` run with a builtin peer of the same broker, size and repeat."""
    peer = next((r for r in runs if r.get("tracker") == "builtin" and (r["broker"], r["size"], r.get("repeat", 0))
                 == (run["broker"], run["size"], run.get("repeat", 0))), None)
    if run.get("tracker", "ours") != "ours" or peer is None:
        return "–"
    return f"{run['summary']['messages_per_s'] / peer['summary']['messages_per_s']:.2f}×"


def demo_table(result: dict[str, Any] | None = None) -> str:
    """The demo runs of one ``python -m bench.demo``: ours beside pulsar-client's built-in nack."""
    runs = (result or load("demo-apache"))["runs"]

    def known(value: int | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:,}{unit}"

    rows = []
    for run in runs:
        s, late = run["summary"], run["summary"]["redelivery_lateness_ms"]
        rows.append([
            f"{run['broker']}, {run.get('tracker', 'ours')}, {run['size']} (`bench/results/demo-apache.json`)", f"{s['produced']:,}",
            s["lost"], s["left_in_subscription"], f"{s['acked']:,}", f"{s['nacked']:,}", f"{s['duplicates']:,} ({s['duplicates_pct']:.2f} %)",
            f"{late['p50']:,.0f} / {late['p99']:,.0f} / {late['max']:,.0f} ms",
            f"{known(s['peak_pending_nacks'])} / {known(s['peak_tracker_memory_bytes'], ' B')}",
            f"{s['spark_start_s']:.1f} / {s['consume_s']:.1f} / {s['wall_s']:.1f} s", f"{run['process_wall_s']:.1f} s",
            f"{s['messages_per_s']:,.0f}", _throughput_ratio(run, runs), run["stderr_lines"],
        ])
    table = md_table(
        ["broker, tracker, size (JSON)", "events", "lost", "left in subscription", "acked (with duplicates)", "nacked", "duplicates",
         "retry lateness p50 / p99 / max", "peak pending nacks / tracker memory (one worker)", "Spark start / consume / demo total",
         "process wall time", "messages/s", "ours / builtin messages/s", "stderr lines"], rows, "lrrrrrrlllrrrr")
    summary = _demo_repeats_summary(runs)
    return table if summary is None else f"{table}\n\n{summary}"


def _demo_repeats_summary(runs: list[dict[str, Any]]) -> str | None:
    """Medians over the repetitions of ``bench.demo --repeats N`` (None for a single run)."""
    repeats = sorted({r.get("repeat", 0) for r in runs})
    if len(repeats) < 2:
        return None
    parts = []
    for size in dict.fromkeys(r["size"] for r in runs):
        ours = [r for r in runs if r["size"] == size and r["tracker"] == "ours"]
        ratios = [float(_throughput_ratio(r, runs).rstrip("×")) for r in ours]
        p99s = [r["summary"]["redelivery_lateness_ms"]["p99"] for r in ours]
        parts.append(
            f"`{size}`: ours / builtin messages/s {statistics.median(ratios):.2f}× (runs: " + ", ".join(f"{x:.2f}×" for x in ratios)
            + f"), ours' p99 lateness {statistics.median(p99s):,.0f} ms (runs: " + ", ".join(f"{x:,.0f}" for x in p99s) + " ms)"
        )
    return f"Medians of the {len(repeats)} repetitions on Apache Pulsar: " + "; ".join(parts) + "."


def replay_table(result: dict[str, Any] | None = None) -> str:
    """Retry lateness by stage while a consumer drains a backlog (bench/replay.py)."""
    result = result or load("replay")
    rows = []
    for case in result["cases"]:
        late, handoff, wait = (case[k] for k in ("lateness_ms", "handoff_minus_requested_ms", "arrival_minus_handoff_ms"))
        rows.append([
            f"`{case['case']}`", f"{case['messages']:,}", f"{case['messages_per_s']:,}",
            f"{late['p50']:,.0f} / {late['p99']:,.0f} / {late['max']:,.0f} ms", f"{handoff['p50']:,.0f} / {handoff['p99']:,.0f} ms",
            f"{wait['p50']:,.0f} / {wait['p99']:,.0f} / {wait['max']:,.0f} ms", f"{case['duplicates']:,}",
            f"{case['peak_available_permits']:,} ({case['receiver_queue_size']:,})",
        ])
    headers = ["case", "backlog", "msg/s", "lateness p50 / p99 / max", "handoff − requested p50 / p99",
               "arrival − handoff p50 / p99 / max", "acked messages received again", "peak `availablePermits` (receiver queue)"]
    return md_table(headers, rows, "lrrlllrr") + (
        f"\n\n{', '.join(sorted(set(result['brokers'].values())))}; one `NackingConsumer`, {result['spin_us']:g} µs of handler "
        f"time per message, backoff from {result['backoff_ms'][0]} ms (`bench/results/replay.json`). `availablePermits` is the "
        "broker's count of messages it may still push to the consumer, sampled from the topic's stats every 250 ms."
    )


def _ms_pair(late: dict[str, Any]) -> str:
    """``p50 / p99`` lateness in ms, or ``-`` without answers."""
    if late["p50"] is None:
        return "-"
    return f"{late['p50']:,.0f} / {late['p99']:,.0f}"


_ARM_NAMES = {"ours": "ours", "builtin": "built-in"}


def _faults_demo_table(demos: list[dict[str, Any]]) -> str:
    rows = []
    for demo in demos:
        summary = demo["summary"]
        rows.append([_ARM_NAMES[demo["tracker"]], f"{summary['produced']:,}", f"{100 * demo['killed_at_done']:.0f} %",
                     f"{summary['lost']:,}", f"{summary['left_in_subscription']:,}",
                     f"{summary['duplicates']:,} ({summary['duplicates_pct']:.1f} %)"])  # fmt: skip
    headers = ["`pulsar-nack demo`, broker killed", "events", "killed at", "lost", "left in the subscription", "duplicates"]
    return md_table(headers, rows, "lrrrrr") + (
        "\n\nTwo runs one after the other on a Spark standalone cluster (two workers, one consumer each, receiver "
        "queue 1,000), the broker owning the demo's topic killed with SIGKILL once the given share of its backlog "
        "was acked."
    )


def faults_table(result: dict[str, Any] | None = None) -> str:
    """Issue 23: each fault on the two-broker cluster, ours beside the built-in nack (bench/faults.py)."""
    result = result or load("faults")
    rows = []
    for run in result["faults"]:
        for arm, found in run["arms"].items():
            rows.append([run["fault"] if arm == "ours" else "", _ARM_NAMES[arm], f"{found['lost']:,}", f"{found['early']:,}",
                         f"{found['duplicates']:,}", f"{found['after_ack']:,}", _ms_pair(found["lateness_ms"])])  # fmt: skip
    headers = ["fault", "consumer", "lost", "early", "duplicates", "after an ack", "lateness p50 / p99 (ms)"]
    kill = next(run for run in result["faults"] if run["key"] == "kill")["timings_s"]
    text = md_table(headers, rows, "llrrrrr") + (
        f"\n\n{result['broker']}, one run of each fault (`python -m bench.faults`, `bench/results/faults.json`), "
        "both consumers on the same topic at the same time, each on its own client and subscription. "
        f"*Early*: a retry more than {result['early_ms']} ms before it was due (the floor of a "
        f"{result['precision_bits']}-bit bucket plus 10 ms); *duplicates*: deliveries beyond one plus one per nack; "
        "lateness: arrival minus due time of every retry (the built-in's due time is its fixed delay). "
        f"Load average {result['load_average_1_5_15_before'][0]:.1f} on 2 cores when the run began. After the SIGKILL, "
        f"lookups named the other broker {kill['lookups_moved_s']:.1f} s later and our consumer was connected again "
        f"after {kill['ours_reconnected_s']:.1f} s (the client's reconnect backoff)."
    )
    demos = result.get("spark_demo") or []
    return text + ("\n\n" + _faults_demo_table(demos) if demos else "")


# ---------------------------------------------------------------------- retry letter topics (issue 25)

_BROKER_LABELS = {
    "stock": "stock (1 s tick, not strict)",
    "tick-100": "`delayedDeliveryTickTimeMillis=100`",
    "tick-100-strict": "100 ms tick + `isDelayedDeliveryDeliverAtTimeStrict=true`",
}


def retry_lateness_table() -> str:
    """Reconsume lateness per broker setting: the application (held early copies) and the broker (bench/retry.py)."""
    data = load("retry")
    lines = [
        "| broker setting | seen by | copies | early | min | p50 | p99 | max | holds (a copy may be held twice) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in data["lateness"].items():
        for who, label in (("application", "our consumer"), ("broker", "the broker (no hold: the Java client)")):
            late = run[who]
            held = f"{run['held']:,}" if who == "application" else "–"
            lines.append(
                f"| {_BROKER_LABELS.get(name, name)} | {label} | {late['n']:,} | {late['early']:,} | "
                + " | ".join(f"{late[k]:,.0f} ms" for k in ("min", "p50", "p99", "max"))
                + f" | {held} |"
            )
    lines += [
        "",
        "Arrival minus due time (publish time + `DELAY_TIME`) of each reconsumed copy; negative is early. "
        f"A stream of one message every 10 ms, reconsumed with delays of {', '.join(f'{d:,}' for d in data['delays_ms'])} ms "
        "(interleaved); `python -m bench.retry` (`bench/results/retry.json`), on the machine in its `meta`.",
    ]
    return "\n".join(lines)


_DURABLE_MODE_NAMES = {
    "reconsume": "reconsume_later",
    "reconsume-held": "reconsume_later, held by the consumers (`retry_hold_ms`)",
    "nack": "negative_acknowledge",
}
"""The rows of ``bench/results/retry_durable.json`` by mode (``bench.retry_durable.MODES``)."""


def retry_durable_table() -> str:
    """Retries across a SIGKILL of the consumer and a broker restart: reconsume vs nack (bench/retry_durable.py)."""
    data = load("retry_durable")
    lines = [
        "| retries by | scenario | retries | received | lost | duplicates | early (before due - 50 ms) "
        "| lateness min / p50 / p99 / max | the same, for retries due after the new consumer was up |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]

    def span(late: dict[str, Any]) -> str:
        return " / ".join("–" if late[k] is None else f"{late[k]:,.0f}" for k in ("min", "p50", "p99", "max")) + " ms"

    for run in data["runs"]:
        after = run["due_after_receiver_up"]
        lines.append(
            f"| {_DURABLE_MODE_NAMES[run['mode']]} | {run['scenario']} | "
            f"{run['retries']:,} | {run['received']:,} | {run['lost']} | {run['duplicates']} | "
            f"{run['early']:,} ({100 * run['early'] / run['retries']:.0f} %) | {span(run['lateness_ms'])} | "
            f"{span(after['lateness_ms'])} ({after['retries']:,} retries) |"
        )
    restart = [r["broker_restart_s"] for r in data["runs"] if r["broker_restart_s"] is not None]
    lines += [
        "",
        f"Delays {data['runs'][0]['delay_ms'][0]:,}-{data['runs'][0]['delay_ms'][1]:,} ms (60 s more in the restart scenario, "
        f"so that they fall due after the broker is back; it took {', '.join(f'{x:.0f}' for x in restart)} s to restart); "
        f"broker tick {data['tick_ms']} ms; `python -m bench.retry_durable` (`bench/results/retry_durable.json`).",
    ]
    return "\n".join(lines)


def retry_cost_table() -> str:
    """What a pending retry costs: nack vs reconsume, client and broker (bench/retry.py)."""
    data = load("retry")
    lines = [
        "| retry with | pending | call p50 / p99 | retries/s (one thread) | client memory per pending retry | broker per pending retry |",
        "|---|---:|---|---:|---|---|",
    ]
    for cost in data["cost"]:
        call = cost["call_us"]
        if cost["mode"] == "nack":
            memory = f"{cost['tracker_bytes_per_pending']:.1f} B (tracker estimate)"
            broker = "nothing (the entry stays unacked)"
        elif cost["mode"].endswith("_held"):
            memory = f"the copy, held in memory ({cost['held']:,} held)"
            b = cost["broker"]
            broker = f"{b['storage_bytes_per_pending']:.0f} B stored (retry topic), no delayed-delivery index"
        else:
            memory = f"nothing tracked ({cost['tracker_pending']} in the tracker, {cost['held']} held)"
            b = cost["broker"]
            broker = (f"{b['storage_bytes_per_pending']:.0f} B stored (retry topic), "
                      f"{b['delayed_index_bytes_per_pending']:.0f} B delayed-delivery index")
        name = {"nack": "`negative_acknowledge`", "reconsume": "`reconsume_later` (waits for the stored copy)",
                "reconsume_async": "`reconsume_later_async` (pipelined)",
                "reconsume_async_held": "`reconsume_later_async`, held by the consumer (`retry_hold_ms`)"}[cost["mode"]]
        if cost.get("failed"):
            name += f" ({cost['failed']:,} calls failed)"
        lines.append(
            f"| {name} | {cost['pending']:,} | {call['p50']:,.1f} / {call['p99']:,.1f} µs | {cost['retries_per_s']:,.0f} | "
            f"{memory}; process RSS {cost['rss_delta_bytes_per_pending']:+,.0f} B | {broker} |"
        )
    lines += [
        "",
        "10-byte payloads, 10 min delays; RSS is the process's growth over the calls divided by the retries, after "
        "`malloc_trim` (with the pipelined calls it includes the client's buffers for the copies in flight, at most "
        f"{_retry_in_flight()} unconfirmed: a retry producer fails a send at once beyond the client's 1,000 pending); "
        "`python -m bench.retry` (`bench/results/retry.json`).",
    ]
    return "\n".join(lines)


def _retry_in_flight() -> int:
    from .retry import IN_FLIGHT

    return IN_FLIGHT


def retry_receive_table() -> str:
    """receive + acknowledge per message: retry_enable beside a plain and a multi-topic consumer (bench/retry.py)."""
    data = load("retry")["receive"]
    lines = ["| consumer | CPU per message (median) | wall time per message (median) |", "|---|---:|---:|"]
    for mode, row in data["modes"].items():
        lines.append(f"| {mode} | {row['cpu_us_median']:.1f} µs | {row['wall_us_median']:.1f} µs |")
    lines += [
        "",
        f"{data['messages']:,} batched messages received and acknowledged one by one, {data['repetitions']} runs of each, "
        "alternating; process CPU (all its threads) over the loop; `python -m bench.retry` (`bench/results/retry.json`).",
    ]
    return "\n".join(lines)


def _stages(summary: dict[str, Any]) -> str:
    """A durable run's p99 split: the broker's delivery after the due time, then the consumer's part."""
    stages = summary.get("retry_stages_ms") or {}
    if not stages:
        return "–"
    return f"{stages['broker']['p99']:,.0f} / {stages['consumer']['p99']:,.0f} ms"


def demo_retries_table(result: dict[str, Any] | None = None) -> str:
    """``pulsar-nack demo`` per retry mode, side by side (``python -m bench.demo --retries``)."""
    runs = (result or load("demo-retries"))["runs"]
    repeated = len({r.get("repeat", 0) for r in runs}) > 1
    rows = []
    for run in runs:
        s = run["summary"]
        late = s["redelivery_lateness_ms"]
        tick = (s.get("broker_config") or {}).get("delayedDeliveryTickTimeMillis", "1000")
        peer = next((r for r in runs if r["mode"] == "nack" and r["size"] == run["size"]
                     and r.get("repeat", 0) == run.get("repeat", 0)), None)
        ratio = "–" if peer is None else f"{s['messages_per_s'] / peer['summary']['messages_per_s']:.2f}×"
        rows.append([
            run["mode"], _held_by(s), f"{tick} ms", run["size"] + (f", run {run.get('repeat', 0) + 1}" if repeated else ""),
            f"{s['produced']:,}", s["lost"], f"{s['duplicates']:,} ({s['duplicates_pct']:.2f} %)", f"{s['nacked']:,}",
            " / ".join(f"{late[k]:,.0f}" for k in ("min", "p50", "p99", "max")) + " ms", _stages(s),
            f"{s['messages_per_s']:,.0f}", ratio,
        ])
    table = md_table(
        ["mode", "retries held by", "broker tick", "size", "events", "lost", "duplicates", "retries",
         "retry lateness min / p50 / p99 / max", "p99 after due: broker / consumer", "messages/s", "vs nack, same size"],
        rows, "llllrrrrllrr")
    lines = [table, "", "`python -m bench.demo --retries` (`bench/results/demo-retries.json`); each run starts its own broker, "
             "the modes one after the other, their order rotating between repetitions. *p99 after due* (durable runs): "
             "the copy's arrival at the retry topic's consumer minus its due time (publish time + `DELAY_TIME`; the "
             "broker's delivery), and its handover to the handler minus the later of its arrival and its due time (the "
             "consumer's part); the lateness also counts the produce, from the reconsume call to the stored copy. "
             "*Retries held by* the consumers: `retry_hold_ms` (batched copies without a delivery time, held unacked "
             "by the workers' consumers until due; their due time is `DELIVER_AT_TIME`); by the broker: each copy "
             "sent with its delivery time, as the Java client sends it."]
    summary = _demo_retries_summary(runs)
    return "\n".join(lines + ([] if summary is None else ["", summary]))


def _held_by(summary: dict[str, Any]) -> str:
    """Who holds a demo run's pending retries (its summary's ``retries`` and ``retry_hold_ms``)."""
    if summary.get("retries", "nack") != "durable":
        return "the workers' memory"
    hold = summary.get("retry_hold_ms") or 0
    return f"the consumers (≤ {hold:,} ms)" if hold else "the broker"


def _demo_retries_summary(runs: list[dict[str, Any]]) -> str | None:
    """Medians over the repetitions: each durable mode beside nack (throughput ratio, p99 lateness), per size."""
    repeats = sorted({r.get("repeat", 0) for r in runs})
    if len(repeats) < 2:
        return None
    parts = []
    for size in dict.fromkeys(r["size"] for r in runs):
        for mode in dict.fromkeys(r["mode"] for r in runs if r["mode"].startswith("durable")):
            pairs = []
            for repeat in repeats:
                by_mode = {r["mode"]: r["summary"] for r in runs if r["size"] == size and r.get("repeat", 0) == repeat}
                if mode in by_mode and "nack" in by_mode:
                    pairs.append((by_mode[mode]["messages_per_s"] / by_mode["nack"]["messages_per_s"],
                                  by_mode[mode]["redelivery_lateness_ms"]["p99"]))
            if pairs:
                parts.append(
                    f"`{size}`, {mode} / nack messages/s {statistics.median(p[0] for p in pairs):.2f}× (runs: "
                    + ", ".join(f"{p[0]:.2f}×" for p in pairs)
                    + f"), {mode} p99 lateness {statistics.median(p[1] for p in pairs):,.0f} ms (runs: "
                    + ", ".join(f"{p[1]:,.0f}" for p in pairs) + " ms)"
                )
    return f"Medians of the {len(repeats)} repetitions: " + "; ".join(parts) + "."

PROMISE_TESTS: dict[str, tuple[str, ...]] = {
    "on time": (
        "tests/test_apache_pulsar.py::test_shared_and_key_shared_each_nack_returns_once_on_time",
        "tests/test_consumer.py",
    ),
    "independent batch retries": (
        "tests/test_apache_pulsar.py::test_batch_index_acks_each_member_returns_at_its_own_time",
    ),
    "acked siblings out": (
        "tests/test_admission.py::test_acked_siblings_stay_out_without_batch_index_acks",
        "tests/test_consumer_fidelity.py::test_redeliver_unacknowledged_messages_never_returns_acked_siblings",
        "tests/test_apache_pulsar.py::test_batch_index_acks_hold_across_two_processes_on_one_subscription",
    ),
    "dead-letter count": (
        "tests/test_apache_pulsar.py::test_dead_letter_policy_after_n_redeliveries",
        "tests/test_dead_letters.py",
    ),
    "asyncio": ("tests/test_asyncio.py",),
}
"""Issue 24: each promise of docs/consumer.md's matrix and the tests that show it (a failure of one marks its cell)."""


def _sibling_figures(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for run in runs for f in run.get("figures", []) if f["name"].startswith("acked_siblings_")]


def _int_span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _promise_cell(promise: str, runs: list[dict[str, Any]]) -> str:
    tests = PROMISE_TESTS[promise]
    failed = [f"`{t}` on {run['pulsar_client']}" for run in runs for t in run.get("failed", []) if t.startswith(tests)]
    crashed = [run for run in runs if "died_in" in run or (run["result"] != "ok" and not run.get("failed"))]
    if failed:
        return "**no**: " + ", ".join(failed)
    if crashed:
        return "not known: the test process died before the end"
    if promise == "acked siblings out":
        figures = _sibling_figures(runs)
        if figures:
            acked = figures[0]["acked"]
            return f"yes: {_int_span([f['acked_back'] for f in figures])} of {acked} back, {_int_span([f['filtered'] for f in figures])} filtered"
    return "yes"


def _setting(run: dict[str, Any]) -> str:
    return {True: "on", False: "off"}.get(run["batch_index_ack"], "?")


def _on_off(run: dict[str, Any]) -> str:
    return {True: "(batch-index acks on)", False: "(batch-index acks off)"}.get(run["batch_index_ack"], "")


def client_matrix_table(result: dict[str, Any] | None = None) -> str:
    """Issue 24: broker version and setting x pulsar-client -> each promise (tools/client_matrix.py)."""
    result = result or load("client_matrix")
    rows = [[f"{run['broker']}, batch-index acks {_setting(run)}", run["pulsar_client"], *(_promise_cell(p, [run]) for p in PROMISE_TESTS)]
            for run in result["runs"]]  # fmt: skip
    headers = ["broker", "pulsar-client", *PROMISE_TESTS]
    runs_rows = [[f"{run['broker']}, {'on' if run['batch_index_ack'] else 'off'}", run["pulsar_client"], run["result"],
                  run["pytest"], f"{run['wall_s']:.0f} s"] for run in result["runs"]]  # fmt: skip
    tests = "; ".join(f"{name}: " + ", ".join(f"`{t}`" for t in found) for name, found in PROMISE_TESTS.items())
    text = md_table(headers, rows) + (
        f"\n\nThe tests of each promise: {tests}. *yes*: none of them failed. "
        f"Each broker is an Apache Pulsar standalone started by `{result['command']}` "
        f"(`bench/results/client_matrix.json`, commit {result['commit'][:10]}), one at a time, "
        "with `acknowledgmentAtBatchIndexLevelEnabled` as the row says; each client ran the consumer tests in its own venv:\n\n"
    )
    text += md_table(["broker, batch-index acks", "pulsar-client", "result", "pytest", "wall"], runs_rows)
    named = tuple(t for found in PROMISE_TESTS.values() for t in found)
    others = sorted({t for run in result["runs"] for t in run.get("failed", []) if not t.startswith(named)})
    if others:
        where = {t: [f"{r['broker']} {_on_off(r)}, {r['pulsar_client']}" for r in result["runs"] if t in r.get("failed", [])]
                 for t in others}  # fmt: skip
        text += "\n\nFailed, and not among the tests of a promise above: "
        text += ", ".join(f"`{t}` ({'; '.join(where[t])})" for t in others) + "."
    crashed = [run for run in result["runs"] if "died_in" in run or (run["result"] != "ok" and not run.get("failed"))]
    if crashed:
        text += "\n\nThe test process died (*not known* above: the tests after that point did not run): " + "; ".join(
            f"{run['broker']} {_on_off(run)}, pulsar-client {run['pulsar_client']} ({run['pytest']}"
            + (f", in `{run['died_in']}` after {run['passed_before_dying']} passed tests" if run.get("died_in") else "")
            + ")"
            for run in crashed
        ) + "."
    off = [run for run in result["runs"] if run["batch_index_ack"] is False]
    figures = _sibling_figures(off)
    if figures:
        text += (
            f"\n\nOn the brokers with batch-index acks off, a redelivered entry carries every member, acked or not. "
            f"`tests/test_admission.py::test_acked_siblings_stay_out_without_batch_index_acks` "
            f"({figures[0]['messages']} messages in batches of 10, one member of each entry nacked, the rest acked) "
            f"measured in each of its {len(figures)} runs there (two cases, the first or the last member nacked, per client run): {_int_span([f['acked_back'] for f in figures])} of "
            f"{figures[0]['acked']} acked siblings back to the application, {_int_span([f['filtered'] for f in figures])} "
            f"copies filtered (and acked again, so the entries settle), {_int_span([f['lost'] for f in figures])} lost."
        )
    return text


def demo_kill_duplicates() -> str:
    """The demo with a broker killed, per subscription type, tracker, broker setting and receive queue (``bench.faults --demo-only``)."""
    lines = []
    for (subscription, tracker), names in DEMO_KILL_RUNS.items():
        parts = []
        for name in names:
            result = load(name)
            assert (result.get("subscription", "Shared"), result.get("tracker", "ours")) == (subscription, tracker), name
            config = result["broker_config"]
            setting = "with the defaults" if not config else "with " + ", ".join(f"`{k}={v}`" for k, v in config.items())
            if result.get("receiver_queue_size"):
                setting += f" and a receive queue of {result['receiver_queue_size']} (the test's)"
            shares = ", ".join(f"{pct:.2f} %" for pct in result["duplicates_pct"])
            lost = sum(run["summary"]["lost"] + run["summary"]["left_in_subscription"] for run in result["spark_demo"])
            parts.append(f"{shares} {setting}, {lost} lost (`bench/results/{name}.json`)")
        who = "our tracker" if tracker == "ours" else "the built-in nack"
        lines.append(f"- {subscription}, {who}: duplicates " + "; ".join(parts) + ".")
    return "\n".join(lines)


DEMO_KILL_RUNS = {
    ("Shared", "ours"): ("faults-demo-default", "faults-demo-rate1000", "faults-demo-rate1000-q100", "faults-demo-persist-q100"),
    ("KeyShared", "ours"): ("faults-demo-keyshared-default", "faults-demo-keyshared-persist-q100"),
    ("KeyShared", "builtin"): ("faults-demo-keyshared-persist-q100-builtin",),
}
"""The committed runs of the demo with a broker killed, per subscription type and tracker."""


def jitter_table(result: dict[str, Any] | None = None) -> str:
    """10,000 simultaneous failures: arrivals with and without jitter (bench/jitter.py)."""
    data = result or load("jitter")
    rows = [
        ["tracker (injected clock)", case["jitter"], n + 1, f"{d['n']:,}", f"{d['first_ms']:,}", f"{d['p50_ms']:,}",
         f"{d['last_ms']:,}", f"{d['peak_per_bin']:,}"]
        for case in data.get("tracker", []) for n, d in enumerate(case["deliveries"])
    ]
    broker: dict[str, Any] | None = data.get("broker")
    where = broker["broker"] if broker is not None else ""
    for case in broker["cases"] if broker is not None else []:
        a = case["arrivals"]
        rows.append([where, case["jitter"], 1, f"{a['n']:,} ({case['lost']} lost)", f"{a['first_ms']:,}",
                     f"{a['p50_ms']:,}", f"{a['last_ms']:,}", f"{a['peak_per_bin']:,}"])
    most = f"most in one {data['parameters']['bin_ms']} ms"
    table = md_table(["where", "jitter", "delivery", "messages", "first ms", "p50 ms", "last ms", most], rows, "lrrrrrrr")
    if not data.get("tracker") or broker is None:
        return table
    peaks = {case["jitter"]: case["deliveries"][0]["peak_per_bin"] for case in data["tracker"]}
    on_broker = {case["jitter"]: case["arrivals"]["peak_per_bin"] for case in broker["cases"]}
    return (f"{table}\n\nThe first delivery's busiest {data['parameters']['bin_ms']} ms: {peaks[0.0]:,} messages without "
            f"jitter, {peaks[1.0]:,} with `jitter=1.0` on the tracker; {on_broker[0.0]:,} and {on_broker[1.0]:,} on the broker.")

def chunks_table(result: dict[str, Any] | None = None) -> str:
    """Nacked chunked messages, the plain client beside ours, per broker (bench/chunks.py)."""
    data = result or load("chunks")
    names = {"plain": "pulsar-client (plain)", "ours": "pulsar-nack"}

    def back(part: dict[str, Any]) -> str:
        ms = part["ms_to_return"]
        return f"{part['back']} of {part['sent']}" + (f" ({ms[0]:,}-{ms[-1]:,} ms)" if ms else "")

    rows = [[r["broker"], names[r["consumer"]], back(r["chunked"]), back(r["small"]),
             r["chunked"]["back_more_than_once"] + r["small"]["back_more_than_once"], "yes" if r["whole"] else "NO",
             r["backlog_left"]] for r in data["runs"]]
    return md_table(["broker", "consumer", "300 KB chunked back (ms after the nack)", "small back", "back twice",
                     "whole", "backlog left"], rows, "llllrlr")

def _ack_timeout_cost_rows(calls: dict[str, Any], setting: str, tail: str = "|") -> list[str]:
    """Table rows of the ack-timeout case's receive + ack cost (bench/consumer.py's ``run_ack_timeout_calls``), if run."""
    plain, ours = ACK_TIMEOUT_SYSTEMS
    rows = []
    for kind, label in (("batched", "batches of 10"), ("unbatched", "not batched")):
        c = calls.get(f"ack_timeout_receive_ack_{kind}")
        if c is None:
            continue
        ratio = c["ratio_ours_over_plain"]
        rows.append(
            f"| receive + acknowledge with an ack timeout, {label} (µs/msg){setting}, {c['messages']:,} messages | "
            f"{c['us'][plain]['median']:.2f} (its ack timeout) | {c['us'][ours]['median']:.2f} | "
            f"{ratio:.2f}×{_cpu(c, 'cpu_ratio_ours_over_plain')} | {_goal(ratio, CONSUMER_GOALS['ack_timeout'])} {tail}"
        )
    return rows


def _unacked_memory_row(memory: dict[str, Any], tail: str = "") -> str:
    """The table row of bytes per unacked message under an ack timeout (bench/ack_timeout.py's ``run_memory``)."""
    plain, ours = memory["plain"]["bytes_per_unacked"], memory["pulsar-nack"]["bytes_per_unacked"]
    ratio = ours / plain
    goal = CONSUMER_GOALS["unacked_memory"]
    return (f"| bytes per unacked message with an ack timeout, {memory['messages']:,} unacked (RSS with the timeout "
            f"minus without) | {plain:.1f} | {ours:.1f} | {ratio:.3f}× | ≤ {goal}×: {_pass(ratio <= goal, 'MISSED')} |{tail}")

def demo_ab_table(result: dict[str, Any] | None = None) -> str:
    """``python -m bench.demo --ab COMMIT``: medians per master and side, then the issue-36 goals checked from them."""
    result = result or load("demo-ab")
    runs = result["runs"]
    rows, medians = [], {}
    for master in dict.fromkeys(r["master"] for r in runs):
        for side in ("a", "b", "builtin"):
            mine = [r["summary"] for r in runs if r["master"] == master and r["code"] == side]
            if not mine:
                continue
            m = {k: statistics.median(s["redelivery_lateness_ms"][k] for s in mine) for k in ("p50", "p99")}
            m["rate"] = statistics.median(s["messages_per_s"] for s in mine)
            medians[master, side] = m
            rows.append([master, {"a": f"ours at {result['a']}", "b": "ours, current", "builtin": "built-in, current"}[side],
                         len(mine), f"{m['p50']:,.0f} ms", f"{m['p99']:,.0f} ms", f"{m['rate']:,.0f}",
                         sum(s["lost"] for s in mine), f"{max(s['duplicates_pct'] for s in mine):.2f} %"])
    table = md_table(["master", "code", "runs", "p50 lateness (median)", "p99 lateness (median)", "messages/s (median)",
                      "lost (all runs)", "duplicates (worst run)"], rows, "llrrrrrr")
    notes = []
    for master in dict.fromkeys(r["master"] for r in runs):
        a, b, c = (medians.get((master, side)) for side in ("a", "b", "builtin"))
        if a and b and c:
            notes.append(f"{master}: current / {result['a']} p50 {b['p50'] - a['p50']:+,.0f} ms, p99 {b['p99'] - a['p99']:+,.0f} ms; "
                         f"messages/s current / built-in {b['rate'] / c['rate']:.2f}×")
    return "\n".join([table, "", *notes])



def ack_timeout_table(result: dict[str, Any] | None = None) -> str:
    """The consumer's own ack timeout beside the plain client's (bench/ack_timeout.py)."""
    data = result or load("ack_timeout")
    cost, memory = data["cost"], data["memory"]
    lines = ["| measure | plain `pulsar.Consumer` | `NackingConsumer` | ours / plain | goal |", "|---|---:|---:|---:|---|"]
    lines += _ack_timeout_cost_rows(cost, "")
    lines.append(_unacked_memory_row(memory))
    ours = memory["pulsar-nack"].get("structures_bytes_per_unacked")
    some = next(iter(cost.values()))
    note = (f"{data['broker']}; {some['messages']:,} messages per repetition, medians of "
            f"{len(some['us'][ACK_TIMEOUT_SYSTEMS[0]]['samples'])} repetitions after a warmup (wall clock; the calling "
            "thread's CPU time in brackets)"
            + (f"; our structures' own estimate {ours:.1f} bytes per unacked message." if ours is not None else "."))
    return "\n".join(lines) + f"\n\n{note}"

def id_read_table(result: dict[str, Any] | None = None) -> str:
    """What a guarded receive must add to the plain one: the id read through the bindings (bench/id_read.py)."""
    data = result or load("id-read")
    us = data["us"]
    rows = [("the plain consumer's receive + acknowledge", us["plain_receive_ack"]),
            ("`message_id()`", us["message_id"]),
            ("`message_id().serialize()`", us["message_id_serialize"]),
            ("`EntryTable.admit_message` + `ack_message` (the id read, the verdict, the ack's record), ids read "
             + ("through libpulsar" if data.get("native_ids") else "through the bindings"), us["admit_and_ack_message"])]
    floors = f"{data['floor_ratio']:.2f}×"
    if "admit_and_ack_message_bindings" in us:
        rows.append(("the same, every id read through the bindings (`message_id()` + `serialize()`)",
                     us["admit_and_ack_message_bindings"]))
        floors += f" ({data['floor_ratio_bindings']:.2f}× with every id read through the bindings)"
    lines = ["| per received message | µs (CPU) |", "|---|---:|"] + [f"| {name} | {value:.2f} |" for name, value in rows]
    return "\n".join(lines) + (
        f"\n\n{data['broker']}: {data['messages']:,} messages (batches of 10), "
        f"the least of {data['repetitions']} repetitions. With nothing else of ours on the path, a guarded receive + "
        f"acknowledge would cost {floors} the plain one.")


def demo_wave_table(result: dict[str, Any] | None = None) -> str:
    """The demo's busy wave and a streamed working consumer, ours beside the built-in (bench/demo_wave.py)."""
    from . import demo_wave

    data = result or load("demo-wave")
    wave, stream = data["wave_medians"], data["stream_medians"]
    return demo_wave.table(data) + (
        f"\n\n{data['broker']}; the wave: {data['wave_messages']:,} events, two worker processes; the stream: "
        f"{data['stream_messages']:,} messages, one consumer; {data['repeats']} alternating repetitions. "
        f"In the wave ours' workers spent {wave['ours']['workers_cpu_s'] / wave['builtin']['workers_cpu_s']:.2f}x the "
        f"built-in's CPU time and ended their first pass "
        f"{wave['ours']['first_pass_end_ms'] - wave['builtin']['first_pass_end_ms']:+,.0f} ms from the built-in's; "
        f"their last retry came {wave['ours']['last_retry_arrival_ms'] - wave['builtin']['last_retry_arrival_ms']:+,.0f} ms "
        f"from the built-in's last. In the stream the application's thread spent "
        f"{stream['ours']['main_thread_cpu_us'] - stream['builtin']['main_thread_cpu_us']:+.2f} µs of CPU per message "
        f"against the plain client's.")


def wave_calls_table(result: dict[str, Any] | None = None) -> str:
    """Where the wave's CPU goes, call by call and thread by thread, ours beside the built-in (bench/wave_calls.py)."""
    from . import wave_calls

    data = result or load("wave-calls")
    ours, builtin = data["medians"]["ours"], data["medians"]["builtin"]
    main = (ours["main_thread_cpu_s"]["s"] - builtin["main_thread_cpu_s"]["s"]) * 1000
    calls = {name: ours[name]["ms_per_worker"] - builtin[name]["ms_per_worker"] for name in wave_calls.CONSUMER_CALLS}
    ledger = sum(ours[name]["ms_per_worker"] for name in wave_calls.LEDGER_CALLS if name in ours)
    rest = (ours["rest_of_task_cpu_s"]["s"] - builtin["rest_of_task_cpu_s"]["s"]) * 1000
    parts = ", ".join(f"`{name}` {delta:+,.0f} ms" for name, delta in calls.items())
    return wave_calls.table(data) + (
        f"\n\n{data['broker']}; {data['messages']:,} events, two worker processes; {data['repeats']} alternating "
        f"repetitions, every worker of each system counted. Per worker, ours' task thread spent {main:+,.0f} ms of CPU "
        f"against the built-in's: {parts} in the consumer calls ({ledger:,.0f} ms of them in the ledger's "
        f"`screen_kept` and `before_ack`), {rest:+,.0f} ms in the rest of the task (medians each, so they need not add "
        f"up); ours' "
        f"timer thread spent {ours['timer_thread_cpu_s']['s'] * 1000:,.0f} ms.")


def ledger_steps_table(result: dict[str, Any] | None = None) -> str:
    """The ledger's steps per retry, compiled beside pure Python (bench/ledger_steps.py)."""
    from . import ledger_steps

    return ledger_steps.table(result or load("ledger-steps"))


def sharing_wait_table(result: dict[str, Any] | None = None) -> str:
    """The sharing rule's cost to a nacked batch member, beside the plain client (bench/sharing_wait.py)."""
    data = result or load("sharing-wait")
    names = {"plain": "plain `client.subscribe`, built-in nack", "shared": "ours, `Sharing.SHARED` (what `subscribe` sets)",
             "one-active": "ours, `Sharing.ONE_ACTIVE`",
             "shared-unindexed": "ours, `Sharing.SHARED`, `batch_index_ack_enabled=False`"}  # fmt: skip
    lines = ["| consumer | p50 lateness (median) | p99 lateness (median) | lost (all runs) | unasked copies (all runs) |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for mode, late in data["median_lateness_ms"].items():
        runs = data["runs"][mode]
        lines.append(f"| {names[mode]} | {late['p50']:.0f} ms | {late['p99']:.0f} ms | {sum(r['lost'] for r in runs)} "
                     f"| {sum(r['duplicates'] for r in runs):,} |")  # fmt: skip
    medians = data["median_lateness_ms"]
    return "\n".join(lines) + (
        f"\n\n{data['broker']}; one consumer of a Shared subscription, a backlog of {data['messages']:,} events in "
        f"batches of up to {data['batch']}, {data['work_us']} µs of work each, one in {data['nack_every']} nacked once "
        f"({data['delay_ms']} ms), our consumers at {data.get('precision_bits', DEFAULT_PRECISION_BITS)} precision bits; "
        f"{data['repeats']} alternating repeats. The rule adds "
        f"{medians['shared']['p50'] - medians['one-active']['p50']:+.0f} ms at p50 against `ONE_ACTIVE`; the wait for "
        f"the last nack of each member's entry alone is {data['median_rule_wait_p50_ms']:.0f} ms at p50."
        + ("" if "shared-unindexed" not in medians else
           f" Batch-index acks add {medians['shared']['p50'] - medians['shared-unindexed']['p50']:+.0f} ms at p50."))


BLOCKS: dict[str, Callable[[], str]] = {
    "replay": replay_table, "asyncio-lateness": asyncio_lateness_table, "metrics-cost": metrics_cost_table,
    "demo": demo_table, "space": space_table, "constants": constants_table, "tail-log": tail_log_table, "results-table": results_table,
    "goals": goals_table, "memory": memory_table, "profile": profile_table, "core": core_table, "core-ab": core_ab_table,
    "client": client_table, "e2e": e2e_table, "scaling": scaling_table, "meta": meta_table, "consumer": consumer_table,
    "consumer-summary": consumer_summary, "consumer-profile": consumer_profile_table, "cluster": cluster_table, "faults": faults_table,
    "retry-lateness": retry_lateness_table, "retry-durable": retry_durable_table, "retry-cost": retry_cost_table,
    "retry-receive": retry_receive_table, "demo-retries": demo_retries_table,
    "client-matrix": client_matrix_table, "demo-kill-duplicates": demo_kill_duplicates, "jitter": jitter_table,
    "chunks": chunks_table,
    "chaos": chaos.chaos_table, "soak": chaos.soak_table, "chaos-breaks": chaos.breaks_table,
    "ack-timeout": ack_timeout_table, "demo-ab": demo_ab_table, "id-read": id_read_table,
    "sharing-wait": sharing_wait_table, "demo-wave": demo_wave_table, "wave-calls": wave_calls_table,
    "ledger-steps": ledger_steps_table, "nack-instructions": nack_instructions_table,
}


def render(text: str, names: list[str]) -> str:
    for name in names:
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"marker {name} not found")
        block = BLOCKS[name]()
        text = pattern.sub(lambda m: f"{m.group(1)}{block}\n{m.group(2)}", text)  # noqa: B023 (used at once)
    return text


def stale_blocks() -> list[str]:
    """Doc files whose generated blocks differ from the committed JSON."""
    return [rel for rel, names in DOCS.items() if (REPO / rel).read_text() != render((REPO / rel).read_text(), names)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in README.md and docs/")
    if parser.parse_args(argv).write:
        for rel, names in DOCS.items():
            (REPO / rel).write_text(render((REPO / rel).read_text(), names))
            print(f"updated {rel}")
        return 0
    for name, block in BLOCKS.items():
        print(f"## {name}\n\n{block()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

