"""Markdown tables for README.md and docs/benchmarks.md, generated from bench/results/*.json.

Every figure in those tables comes from here, so the docs cannot drift from the
committed JSON: ``python -m bench.report --write`` rewrites the blocks between
``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers, and ``tests/test_docs.py``
fails when a block differs from what the JSON gives.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = {
    "README.md": ["results-table", "consumer-summary"],
    "docs/benchmarks.md": ["goals", "memory", "profile", "core", "core-ab", "client", "e2e", "scaling", "meta", "consumer"],
    "docs/design.md": ["space"],
    "docs/spark.md": ["demo", "replay"],
    "docs/metrics.md": ["metrics-cost"],
    "docs/asyncio.md": ["asyncio-lateness"],
    "docs/brokers.md": ["cluster"],
}

DEMO_RESULTS = ("demo-apache",)
"""The demo's result files, written by one ``python -m bench.demo`` run (Apache Pulsar)."""

# Space model constants (bytes), from CPython 3.11, the roaring portable format and
# pulsar_nack/core/pages.py.
SLOT = 75  # per page in the SortedDict: key int (32) + list slot (8) + dict slot (~35)
BYTES_OBJ = 33  # header of a `bytes` object (one per page)
PAGE_BYTES = 4096  # a page grows up to this
STREAM_HEADER = 2  # uvarint(sid << 2 | codec) + uvarint(payload length), small sids and payloads
ROARING_HEADER = 8  # cookie + container count
CONTAINER = 4  # per container: key + cardinality
RUN = 4  # per run (start, length), plus 2 bytes run count per container


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _b(value: float) -> str:
    """Bytes per message with sensible precision."""
    return f"{value:.3g}" if value < 10 else f"{value:,.0f}"


def _span(low: float, high: float) -> str:
    """``low–high`` bytes, or one figure when they print the same."""
    a, b = _b(low), _b(high)
    return a if a == b else f"{a}–{b}"


def _case(memory: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in memory["cases"] if c["case"]["name"] == name)


def _e2e(e2e: dict[str, Any], system: str, delay: int, mode: str, subscription: str = "Shared") -> dict[str, Any]:
    return next(
        c
        for c in e2e["cases"]
        if (c["system"], c["delay_ms"], c["mode"], c.get("subscription", "Shared")) == (system, delay, mode, subscription)
    )


def _broker(result: dict[str, Any]) -> str:
    """Which broker a result came from, e.g. "Apache Pulsar 4.0.8 standalone".

    Raises
    ------
    KeyError
        For a result without the label: every table with broker numbers shows where they came from.
    """
    return str(result["broker"])


def _client(client: dict[str, Any], system: str) -> dict[str, Any]:
    return next(c for c in client["cases"] if c["system"] == system)


def results_table() -> str:
    memory, core, client, e2e = _load("memory"), _load("core_perf"), _load("client"), _load("e2e")
    grid = _case(memory, "consec-x8-y10")
    sparse = max(
        (c for c in memory["cases"] if c["case"]["y"] >= 8), key=lambda c: c["tracker"]["rss_bytes_per_msg"]
    )
    base_max = max(c["baseline"]["rss_bytes_per_msg"] for c in memory["cases"])
    built_in, ours = _client(client, "built-in"), _client(client, "pulsar-nack")
    late_built_in = _e2e(e2e, "built-in", 1000, "stream")["lateness_ms"]
    late_ours = _e2e(e2e, "pulsar-nack", 1000, "stream")["lateness_ms"]
    base_late = core["lateness"]["rows"]["baseline"]["per_message"]
    add = core["add"]
    n_mem = memory["parameters"]["messages"]
    rows = [
        "| | memory per pending retry | add / nack call | p99 redelivery lateness, steady nack stream, 1 s delay |",
        "|---|---:|---:|---:|",
        f"| `pulsar-client` built-in tracker | {_b(built_in['bytes_per_id'])} B ¹ | "
        f"{built_in['call_us']['median']:.2f} µs ¹ | {late_built_in['p99']:,.0f} ms ³ |",
        f"| hash-map baseline (pre-PIP-393) | {_span(grid['baseline']['rss_bytes_per_msg'], base_max)} B ² | "
        f"{1e6 / add['baseline']['rate']['median']:.2f} µs ⁴ | {base_late['p99']:.0f} ms ⁵ |",
        f"| **pulsar-nack** | **{_span(grid['tracker']['rss_bytes_per_msg'], sparse['tracker']['rss_bytes_per_msg'])} B** ² | "
        f"**{1e6 / add['tracker']['rate']['median']:.2f} µs** ⁴ | **{late_ours['p99']:.0f} ms** ³ |",
        "",
        f"¹ `bench/client.py`: {built_in['ids']:,} `negative_acknowledge(MessageId)` calls on a real consumer of {_broker(client)}, "
        f"RSS delta per id, median call cost. In the same run `NackingConsumer.negative_acknowledge` holds "
        f"{_b(ours['bytes_per_id'])} B per id and costs {ours['call_us']['median']:.2f} µs per id; on received "
        f"messages it costs {ours['call_message_us']['median']:.2f} µs against the built-in's "
        f"{built_in['call_message_us']['median']:.2f} µs; "
        f"`tracker.add` alone costs {ours['tracker_add_us']['median']:.2f} µs with the C hot path "
        f"({client['ratios']['call_built_in_over_tracker_add']:.1f}× faster than the built-in id call) and "
        f"{ours['tracker_add_pure_python_us']['median']:.2f} µs in pure Python. "
        f"² `bench/memory.py`, {n_mem:,} pending per case, RSS delta per message: from the paper's x=8, y=10 case "
        f"(consecutive entries) to the sparsest pattern at y ≥ 8 (`{sparse['case']['name']}`: "
        f"{sparse['case']['description']}); every case in docs/benchmarks.md. "
        f"³ `bench/e2e.py` on {_broker(e2e)}, Shared subscription: 1,000 messages, one nack every 5 ms; arrival − requested time "
        f"(ours: p50 {late_ours['p50']:.0f} ms, since 8 precision bits may release up to 255 ms early by design). "
        "⁴ `bench/core_perf.py`: public `add`, 1M keys, median of repetitions, both in one run. "
        "⁵ `bench/core_perf.py`: timer only (no broker), one add per ms at 100 ms delay; the baseline's "
        "delay/3 scan; pulsar-nack at precision 0 gives "
        f"{core['lateness']['rows']['tracker p0']['per_message']['p99']:.1f} ms in the same run.",
    ]
    return "\n".join(rows)


def goals_table() -> str:
    memory, client, e2e = _load("memory"), _load("client"), _load("e2e")
    built_in = _client(client, "built-in")
    lines = ["| goal | measured | result |", "|---|---|---|"]
    grid = [c for c in memory["cases"] if c["case"]["pattern"] == "consec" and c["case"]["y"] >= 8]
    worst_base = min(c["ratio_baseline_over_tracker_rss"] for c in grid)
    worst_built = min(built_in["bytes_per_id"] / max(c["tracker"]["rss_bytes_per_msg"], 1e-9) for c in grid)
    lines.append(
        f"| memory ≤ 1/20 of the baseline, paper grid y ≥ 8 | worst case 1/{worst_base:,.0f} | "
        f"{'pass' if worst_base >= 20 else 'FAIL'} |"
    )
    lines.append(
        f"| memory ≤ 1/50 of the built-in client, paper grid y ≥ 8 | worst case 1/{worst_built:,.0f} "
        f"(built-in {_b(built_in['bytes_per_id'])} B/id) | {'pass' if worst_built >= 50 else 'FAIL'} |"
    )
    ours_add = _client(client, "pulsar-nack")["tracker_add_us"]["median"]
    by_id = built_in["call_us"]["median"] / ours_add
    by_message = built_in["call_message_us"]["median"] / ours_add
    lines.append(
        f"| add ≥ 10× faster than the built-in nack call | {by_id:.1f}× its `nack(MessageId)`, {by_message:.1f}× "
        f"its `nack(message)` (C hot path; pure Python "
        f"{client['ratios']['call_built_in_over_tracker_add_pure_python']:.1f}×) | "
        f"{'pass' if min(by_id, by_message) >= 10 else 'FAIL'} |"
    )
    ours = _e2e(e2e, "pulsar-nack", 1000, "stream")["lateness_ms"]["p99"]
    theirs = _e2e(e2e, "built-in", 1000, "stream")["lateness_ms"]["p99"]
    ok = ours <= 50 and theirs > 1000
    lines.append(
        f"| p99 lateness under a steady stream ≤ 50 ms (ours), built-in > delay | ours {ours:.0f} ms, "
        f"built-in {theirs:,.0f} ms at 1 s delay | {'pass' if ok else 'FAIL'} |"
    )
    return "\n".join(lines)


def memory_table() -> str:
    memory = _load("memory")
    lines = [
        "| case | pattern | buckets | pulsar-nack B/msg (RSS) | estimate B/msg | total | baseline B/msg | limit B/msg | ours / limit | ours / baseline | add/s ours | add/s baseline |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in memory["cases"]:
        t, b = c["tracker"], c["baseline"]
        lines.append(
            f"| `{c['case']['name']}` | {c['case']['description']} | {t['buckets']:,} | {_b(t['rss_bytes_per_msg'])} | "
            f"{_b(t['estimate_bytes_per_msg'])} | {t['rss_delta'] / 2**20:.2f} MiB | {b['rss_bytes_per_msg']:.0f} | "
            f"{c['limit_bytes_per_msg']:.3g} | {c['ratio_tracker_over_limit']:,.1f}× | "
            f"1/{c['ratio_baseline_over_tracker_rss']:,.0f} | {t['add_rate'] / 1e6:.2f} M | {b['add_rate'] / 1e6:.2f} M |"
        )
    lines.append("")
    lines.append("| target | value | result |")
    lines.append("|---|---|---|")
    for v in memory["verdicts"]:
        lines.append(f"| `{v['case']}` {v['target']} | {v['value']} | {'pass' if v['pass'] else 'FAIL'} |")
    return "\n".join(lines)


def profile_table() -> str:
    """The py-spy summary of ``add`` on the cases where it misses its target."""
    profile = _load("profile_add")
    lines = ["| case | function (inside `add`) | inclusive | self |", "|---|---|---:|---:|"]
    for name, case in profile["cases"].items():
        for row in case["functions"][:10]:
            function = re.sub(r" \(.*\)$", "", row["function"])
            lines.append(f"| `{name}` | `{function}` | {row['inclusive']:.0%} | {row['self']:.0%} |")
    return "\n".join(lines)


def core_table() -> str:
    core = _load("core_perf")
    lines = ["| benchmark | target | value | result |", "|---|---|---|---|"]
    for v in core["verdicts"]:
        lines.append(f"| {v['benchmark']} | {v['target']} | {v['value']} | {'pass' if v['pass'] else 'FAIL'} |")
    lines.append("")
    lines.append("```")
    lines.extend(table.strip("\n") + "\n" for table in core["tables"].values())
    lines.append("```")
    return "\n".join(lines)


def client_table() -> str:
    client = _load("client")
    lines = [
        "| system | pending ids | RSS delta | bytes/id | nack(MessageId) µs (min / median / max) "
        "| nack(received message) µs (median) | tracker.add µs (median) | tracker.add, pure Python µs (median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in client["cases"]:
        call = c["call_us"]
        add = f"{c['tracker_add_us']['median']:.2f}" if "tracker_add_us" in c else "–"
        pure = f"{c['tracker_add_pure_python_us']['median']:.2f}" if "tracker_add_pure_python_us" in c else "–"
        lines.append(
            f"| {c['system']} | {c['ids']:,} | {c['rss_delta_bytes'] / 2**20:.1f} MiB | {_b(c['bytes_per_id'])} | "
            f"{call['min']:.2f} / {call['median']:.2f} / {call['max']:.2f} | {c['call_message_us']['median']:.2f} | "
            f"{add} | {pure} |"
        )
    return "\n".join(lines)


def e2e_table() -> str:
    e2e = _load("e2e")
    lines = [
        f"Broker: {_broker(e2e)}.",
        "",
        "| system | subscription | delay | mode | back | duplicates | min ms | p50 ms | p99 ms | max ms |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in e2e["cases"]:
        late = c["lateness_ms"]
        lines.append(
            f"| {c['system']} | {c.get('subscription', 'Shared')} | {c['delay_ms'] / 1000:g} s | {c['mode']} | "
            f"{c['redelivered']}/{c['messages']} | {c.get('duplicates', 0)} | "
            f"{late['min']:.0f} | {late['p50']:.0f} | {late['p99']:.0f} | {late['max']:.0f} |"
        )
    return "\n".join(lines)


def scaling_table() -> str:
    scaling = _load("scaling")
    lines = ["| system | pending | RSS delta | bytes/msg | µs per add |", "|---|---:|---:|---:|---:|"]
    for r in scaling["rows"]:
        lines.append(
            f"| {r['system']} | {r['pending']:,} | {r['rss_delta_bytes'] / 2**20:.2f} MiB | {_b(r['bytes_per_msg'])} | "
            f"{r['add_us']:.2f} |"
        )
    return "\n".join(lines)


def meta_table() -> str:
    lines = ["| result file | commit | when (UTC) | machine | Python | pulsar-client | pyroaring |", "|---|---|---|---|---|---|---|"]
    for name in ("memory", "core_perf", "client", "e2e", "scaling", *DEMO_RESULTS):
        meta = _load(name)["meta"]
        git, machine, packages = meta["git"], meta["machine"], meta["packages"]
        commit = (git["commit"] or "?")[:10] + (" + uncommitted changes" if git.get("dirty") else "")
        lines.append(
            f"| `bench/results/{name}.json` | `{commit}` | {meta.get('utc', '?')} | {machine['cpu_model']}, "
            f"{machine['cores']} cores, {machine['ram_bytes'] / 2**30:.0f} GiB | {meta['python']['version']} | "
            f"{packages.get('pulsar-client')} | {packages.get('pyroaring')} |"
        )
    return "\n".join(lines)


def _uvarint_len(value: float) -> int:
    return max(1, -(-int(value).bit_length() // 7))


def _paged(body: float, y: int) -> float:
    """Bytes per sealed bucket in a page: its record (deadline delta, length, body) plus its
    share of the page's own cost (map slot and bytes header)."""
    per_page = max(1, int(PAGE_BYTES // (body + 4)))
    record = _uvarint_len(per_page * 2**y / 2) + _uvarint_len(body) + body
    return record + (SLOT + BYTES_OBJ) / per_page


def _model_bytes_per_msg(case: dict[str, Any], entries_per_ledger: int) -> float:
    """Predicted bytes per message of a sealed layout (see the table's notes)."""
    x, y, p, pattern = case["x"], case["y"], case["fraction"], case["pattern"]
    messages = x * 2**y  # messages per bucket
    ledgers = 1 + messages / entries_per_ledger  # streams per bucket (ledger switches)
    if pattern == "consec" and messages == 1:
        # One GAPS value: the entry id as a uvarint, averaged over a ledger's ids.
        value = sum(_uvarint_len(e) for e in range(0, entries_per_ledger, 97)) / len(range(0, entries_per_ledger, 97))
        return _paged(1 + STREAM_HEADER + value, y)
    if pattern == "consec":
        body = 1 + ledgers * (STREAM_HEADER + ROARING_HEADER + CONTAINER + 2 + RUN)  # one run per ledger
        return _paged(body, y) / messages
    if pattern == "random":
        values = messages * p
        # GAPS: one byte per gap below 128, two below 16,384 (gaps are geometric with parameter p).
        per_value = 1 + (1 - p) ** 127 + (1 - p) ** 16383
        body = 1 + ledgers * (STREAM_HEADER + 3) + values * per_value
        return _paged(body, y) / values
    raise ValueError(pattern)


def space_table() -> str:
    memory = _load("memory")
    per_ledger = memory["parameters"]["entries_per_ledger"]
    lines = [
        "| case | messages per bucket M = x·2^y | model B/msg | measured RSS B/msg | `memory_bytes()` B/msg |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in memory["cases"]:
        case = c["case"]
        if case["pattern"] not in ("consec", "random"):
            continue
        model = _model_bytes_per_msg(case, per_ledger)
        lines.append(
            f"| `{case['name']}` | {case['x'] * 2 ** case['y']:,} | {_b(model)} | "
            f"{_b(c['tracker']['rss_bytes_per_msg'])} | {_b(c['tracker']['estimate_bytes_per_msg'])} |"
        )
    return "\n".join(lines)


def _known(value: int | None, unit: str = "") -> str:
    """A count, or "n/a" where the run could not see it (the built-in tracker)."""
    return "n/a" if value is None else f"{value:,}{unit}"


def _throughput_ratio(run: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """ours / builtin messages/s, for an ``ours`` run with a builtin peer of the same broker and size."""
    if run.get("tracker", "ours") != "ours":
        return "–"
    peer = next(
        (
            r
            for r in runs
            if r.get("tracker") == "builtin"
            and (r["broker"], r["size"], r.get("repeat", 0)) == (run["broker"], run["size"], run.get("repeat", 0))
        ),
        None,
    )
    if peer is None:
        return "–"
    return f"{run['summary']['messages_per_s'] / peer['summary']['messages_per_s']:.2f}×"


def demo_table() -> str:
    """The demo runs of one ``python -m bench.demo``: ours beside pulsar-client's built-in nack."""
    lines = [
        "| broker, tracker, size (JSON) | events | lost | left in subscription | acked (with duplicates) | nacked | duplicates "
        "| retry lateness p50 / p99 / max | peak pending nacks / tracker memory (one worker) "
        "| Spark start / consume / demo total | process wall time | messages/s | ours / builtin messages/s | stderr lines |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for name in DEMO_RESULTS:
        runs = _load(name)["runs"]
        for run in runs:
            s = run["summary"]
            late = s["redelivery_lateness_ms"]
            lines.append(
                f"| {run['broker']}, {run.get('tracker', 'ours')}, {run['size']} (`bench/results/{name}.json`) | {s['produced']:,} | "
                f"{s['lost']} | {s['left_in_subscription']} | {s['acked']:,} | {s['nacked']:,} | "
                f"{s['duplicates']:,} ({s['duplicates_pct']:.2f} %) | "
                f"{late['p50']:,.0f} / {late['p99']:,.0f} / {late['max']:,.0f} ms | "
                f"{_known(s['peak_pending_nacks'])} / {_known(s['peak_tracker_memory_bytes'], ' B')} | "
                f"{s['spark_start_s']:.1f} / {s['consume_s']:.1f} / {s['wall_s']:.1f} s | {run['process_wall_s']:.1f} s | "
                f"{s['messages_per_s']:,.0f} | {_throughput_ratio(run, runs)} | {run['stderr_lines']} |"
            )
    summary = _demo_repeats_summary(_load("demo-apache")["runs"])
    return "\n".join(lines + ([] if summary is None else ["", summary]))


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
            f"`{size}`: ours / builtin messages/s {statistics.median(ratios):.2f}× (runs: "
            + ", ".join(f"{x:.2f}×" for x in ratios)
            + f"), ours' p99 lateness {statistics.median(p99s):,.0f} ms (runs: "
            + ", ".join(f"{x:,.0f}" for x in p99s)
            + " ms)"
        )
    return f"Medians of the {len(repeats)} repetitions on Apache Pulsar: " + "; ".join(parts) + "."


def metrics_cost_table() -> str:
    """``add`` with and without ``instrument()`` (bench/metrics.py)."""
    result = _load("metrics")
    add = result["add"]
    meta = result["meta"]
    lines = [
        "| `add`, 1M keys, tracker with timer | min | median | max | median vs off |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("off", "on", "on+collecting"):
        ns = add[name]["ns_per_add"]
        ratio = ns["median"] / add["off"]["ns_per_add"]["median"]
        lines.append(f"| {name} | {ns['min']:.1f} ns | {ns['median']:.1f} ns | {ns['max']:.1f} ns | {ratio:.3f}× |")
    lines.append("")
    lines.append(
        f"{add['repetitions']} repetitions after {add['warmup']} warmup, systems in alternating order; "
        f"{meta['machine']['cpu_model']}, {meta['machine']['cores']} cores, Python {meta['python']['version']}."
    )
    return "\n".join(lines)


def core_ab_table() -> str:
    """pop_due and timer lateness, the current core beside an earlier one (bench/core_ab.py)."""
    result = _load("core_ab")
    labels = {
        "pop": "pop all, 1,000,000 due (ns per released message)",
        "lateness-p0": "timer lateness, precision 0 (p99 per firing, ms)",
        "lateness-p8": "timer lateness, 8 bits (p99 per firing, ms; negative = early)",
    }
    lines = [
        f"| measure | core at `{result['ref']}` (median) | this core (median) | now vs before | goal |",
        "|---|---:|---:|---:|---|",
    ]
    for part, label in labels.items():
        row = result["parts"][part]
        if "ratio_now_over_before" in row:
            change = f"{row['ratio_now_over_before']:.2f}×"
            goal = f"{row['goal']}: {'pass' if row['pass'] else 'MISSED'}"
        else:
            change = f"{row['difference_now_minus_before']:+.2f} ms"
            goal = "none (early by design; the difference is shown)"
        lines.append(f"| {label} | {row['before']['median']:.2f} | {row['now']['median']:.2f} | {change} | {goal} |")
    lines += [
        "",
        f"One `python -m bench.core_ab` run: {result['repetitions']} repetitions of each part after a warmup, "
        "each in a fresh process, the two cores alternating (`bench/results/core_ab.json`).",
    ]
    return "\n".join(lines)


def asyncio_lateness_table() -> str:
    """Steady-stream lateness, asyncio vs blocking vs built-in (bench/asyncio_stream.py)."""
    result = _load("asyncio")
    lines = [
        "| system | redelivered | p50 | p99 | max | min |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in result["cases"]:
        late = case["lateness_ms"]
        cells = [f"{late[k]:,.0f} ms" for k in ("p50", "p99", "max", "min")] if late["n"] else ["-"] * 4
        lines.append(f"| {case['system']} | {case['redelivered']:,}/{case['messages']:,} | " + " | ".join(cells) + " |")
    case = result["cases"][0]
    lines.append("")
    lines.append(
        f"{result['broker']}; {case['messages']:,} messages, one nack every {case['nack_interval_ms']:g} ms for "
        f"{case['stream_s']:g} s, {case['delay_ms']:,} ms delay, 8 precision bits (up to 255 ms early by design)."
    )
    return "\n".join(lines)


def cluster_table() -> str:
    """PulsarCluster start time, RSS per JVM and a broker failover (bench/cluster_start.py)."""
    result = _load("cluster")
    lines = [
        "| run | start | ready at: ZooKeeper / metadata / all | RSS at ready: ZooKeeper, bookie, brokers | total RSS "
        "| lookups moved | first message back | all 500 back | lost | restart | load avg |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        phases, rss, fail = run["phases_s"], run["rss_mib_at_ready"], run["failover"]
        brokers = ", ".join(f"{v:.0f}" for k, v in rss.items() if k.startswith("broker"))

        def sec(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f} s"

        lines.append(
            f"| {run['run']} | {run['start_s']:.1f} s "
            f"| {phases['zookeeper']:.1f} / {phases['metadata']:.1f} / {phases['brokers']:.1f} s "
            f"| {rss['zookeeper']:.0f}, {rss['bookie']:.0f}, {brokers} MiB | {run['rss_mib_total_at_ready']:,.0f} MiB "
            f"| {sec(fail['lookups_on_survivor_s'])} | {sec(fail['first_message_from_moved_partition_s'])} "
            f"| {sec(fail['all_sent_after_kill_received_s'])} | {fail['lost']} | {sec(fail['restart_s'])} "
            f"| {run['load_average_1_5_15_before'][0]:.1f} |"
        )
    summary = result["summary"]
    lines.append("")
    lines.append(
        f"Median of {len(result['runs'])} fresh clusters: started in {summary['start_s']['median']:.1f} s "
        f"({summary['start_s']['min']:.1f}–{summary['start_s']['max']:.1f} s), "
        f"{summary['rss_mib_total_at_ready']['median']:,.0f} MiB RSS in all when ready; after SIGKILL of a broker "
        f"(metadata session timeout {result['runs'][0]['session_timeout_ms']:,} ms), lookups moved in "
        f"{summary['lookups_on_survivor_s']['median']:.1f} s and the consumer had every message sent after the "
        f"kill in {summary['all_sent_after_kill_received_s']['median']:.1f} s, {summary['lost']} lost. Times are "
        "from the kill; load avg is the machine's 1-minute load when the run began (2 cores, shared)."
    )
    return "\n".join(lines)


def consumer_table() -> str:
    """Issue 13 goals A, B, D: NackingConsumer beside the plain consumer (bench/consumer.py)."""
    data = _load("consumer")
    memory = data["pending_nack_memory_batched"]
    plain_mem, ours_mem = memory["cases"]
    lines = [
        f"{data['broker']}, one run, {data['repetitions']} repetitions after a warmup (median), both "
        "consumers subscribed with the same keywords (Shared, `batch_index_ack_enabled=True`). Lower is better.",
        "",
        "| measure | plain `pulsar.Consumer` | `NackingConsumer` | ours / plain | goal |",
        "|---|---:|---:|---:|---|",
    ]
    for case, label, goal in (
        ("receive_ack_batched", "receive + acknowledge, batches of 10 (µs/msg)", 1.15),
        ("receive_ack_unbatched", "receive + acknowledge, not batched (µs/msg)", 1.15),
        ("nack_message", "`negative_acknowledge(message)` (µs/call)", 0.6),
    ):
        c = data[case]
        ratio = c["ratio_ours_over_plain"]
        lines.append(
            f"| {label}, {c['messages']:,} messages | {c['us']['plain']['median']:.2f} | "
            f"{c['us']['pulsar-nack']['median']:.2f} | {ratio:.2f}× | ≤ {goal}×: {'pass' if ratio <= goal else 'MISSED'} |"
        )
    ratio = memory["ratio_ours_over_plain"]
    lines.append(
        f"| bytes per pending nack, {plain_mem['messages']:,} messages in batches of 10, one of each nacked "
        f"(RSS delta) | {plain_mem['bytes_per_pending_nack']:.0f} | {ours_mem['bytes_per_pending_nack']:.1f} | "
        f"{ratio:.3f}× | ≤ 0.1×: {'pass' if ratio <= 0.1 else 'MISSED'} |"
    )
    net = memory["net_ratio_ours_over_plain"]
    lines.append(
        f"| the same, net of a control run that acks everything (B) | {plain_mem['net_bytes_per_pending_nack']:.0f} | "
        f"{ours_mem['net_bytes_per_pending_nack']:.1f} | {net:.3f}× | ≤ 0.1×: {'pass' if net <= 0.1 else 'MISSED'} |"
    )
    lines.append("")
    lines.append(
        f"Our structures' own estimate for that workload: {ours_mem['structures_bytes_per_pending_nack']:.1f} B "
        f"per pending nack (tracker {ours_mem['tracker_memory_bytes']:,} B, pending set "
        f"{ours_mem['pending_set_bytes']:,} B for {int(ours_mem['pending_nacks']):,} nacks)."
    )
    other_runs = _consumer_other_runs()
    if other_runs:
        lines += ["", other_runs]
    lines += ["", _nack_cost_profile()]
    return "\n".join(lines)


def _consumer_other_runs() -> str | None:
    """The ratios of the other committed runs of ``bench/consumer.py`` (bench/results/repeats/)."""
    paths = sorted((RESULTS / "repeats").glob("consumer-run*.json"))
    if not paths:
        return None
    rows = []
    ratios = [_load("consumer")["receive_ack_batched"]["ratio_ours_over_plain"]]
    for path in paths:
        run = _load(f"repeats/{path.stem}")
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
        "Other committed runs of the same benchmark (the commit each measured), ours / plain: "
        + "; ".join(rows)
        + f". Over the {len(ratios)} runs, the batched receive + acknowledge ratio ranged from {min(ratios):.2f}× "
        f"to {max(ratios):.2f}× (median {statistics.median(ratios):.2f}×) on this shared 2-core machine."
    )


def _nack_cost_profile() -> str:
    """Where the time of ``negative_acknowledge(message)`` goes (bench/client.py's profile)."""
    client = _load("client")
    built_in, ours = (next(c for c in client["cases"] if c["system"] == s) for s in ("built-in", "pulsar-nack"))
    steps = ours["call_message_us"]["id_read_steps_us"]
    theirs = built_in["call_message_us"]
    whole = ours["call_message_us"]["median"]

    def step(name: str) -> str:
        return f"{steps[name]['median']:.2f} µs"

    return (
        f"Where a nack of a received message goes (`bench/client.py`, {client['broker']}, medians): ours costs "
        f"{whole:.2f} µs, of which reading the message's id costs {step('id read, one serialize() parsed in C (used)')} "
        f"(`message_id()` {step('message_id()')}, `message_id()` + `serialize()` {step('message_id() + serialize()')}, "
        f"`topic_name()` {step('topic_name()')}; the four getters in Python took "
        f"{step('id read, four getters (pure Python)')}), and `tracker.add` {ours['tracker_add_us']['median']:.2f} µs. "
        f"The built-in's call on the same kind of messages, with {built_in['ids']:,} ids already in its map, "
        f"took {theirs['min']:.2f} / {theirs['median']:.2f} / {theirs['max']:.2f} µs (min / median / max): "
        f"{whole / theirs['median']:.2f}× of its median, {whole / theirs['min']:.2f}× of its best. Against a "
        "fresh built-in consumer (the table above) ours is slower: the client's own calls to read the id through "
        "its bindings are most of a 0.6× budget, so that goal is out of reach for a wrapper that must read the id."
    )


def consumer_summary() -> str:
    """One README line per consumer-level goal, from bench/results/consumer.json."""
    data = _load("consumer")
    memory = data["pending_nack_memory_batched"]
    plain_mem, ours_mem = memory["cases"]
    a, b = data["receive_ack_batched"], data["receive_ack_unbatched"]
    d = data["nack_message"]
    return (
        f"At the consumer level (`bench/consumer.py`, {data['broker']}): receive + acknowledge costs "
        f"{a['us']['pulsar-nack']['median']:.2f} µs per batched message against the plain consumer's "
        f"{a['us']['plain']['median']:.2f} µs ({a['ratio_ours_over_plain']:.2f}×), "
        f"{b['us']['pulsar-nack']['median']:.2f} µs against {b['us']['plain']['median']:.2f} µs not batched "
        f"({b['ratio_ours_over_plain']:.2f}×); a pending nack of a batched workload holds "
        f"{ours_mem['bytes_per_pending_nack']:.0f} B against the built-in's {plain_mem['bytes_per_pending_nack']:.0f} B; "
        f"`negative_acknowledge(message)` costs {d['us']['pulsar-nack']['median']:.2f} µs against "
        f"{d['us']['plain']['median']:.2f} µs."
    )


def replay_table() -> str:
    """Retry lateness by stage while a consumer drains a backlog (bench/replay.py)."""
    result = _load("replay")
    lines = [
        "| case | backlog | msg/s | lateness p50 / p99 / max | handoff − requested p50 / p99 "
        "| arrival − handoff p50 / p99 / max | acked messages received again | peak `availablePermits` (receiver queue) |",
        "|---|---:|---:|---|---|---|---:|---:|",
    ]
    for case in result["cases"]:
        late, handoff, wait = (case[k] for k in ("lateness_ms", "handoff_minus_requested_ms", "arrival_minus_handoff_ms"))
        lines.append(
            f"| `{case['case']}` | {case['messages']:,} | {case['messages_per_s']:,} | "
            f"{late['p50']:,.0f} / {late['p99']:,.0f} / {late['max']:,.0f} ms | {handoff['p50']:,.0f} / {handoff['p99']:,.0f} ms | "
            f"{wait['p50']:,.0f} / {wait['p99']:,.0f} / {wait['max']:,.0f} ms | {case['duplicates']:,} | "
            f"{case['peak_available_permits']:,} ({case['receiver_queue_size']:,}) |"
        )
    brokers = sorted(set(result["brokers"].values()))
    lines += [
        "",
        f"{', '.join(brokers)}; one `NackingConsumer`, {result['spin_us']:g} µs of handler time per message, "
        f"backoff from {result['backoff_ms'][0]} ms (`bench/results/replay.json`). `availablePermits` is the "
        "broker's count of messages it may still push to the consumer, sampled from the topic's stats every 250 ms.",
    ]
    return "\n".join(lines)


BLOCKS = {
    "replay": replay_table,
    "asyncio-lateness": asyncio_lateness_table,
    "metrics-cost": metrics_cost_table,
    "demo": demo_table,
    "space": space_table,
    "results-table": results_table,
    "goals": goals_table,
    "memory": memory_table,
    "profile": profile_table,
    "core": core_table,
    "core-ab": core_ab_table,
    "client": client_table,
    "e2e": e2e_table,
    "scaling": scaling_table,
    "meta": meta_table,
    "consumer": consumer_table,
    "consumer-summary": consumer_summary,
    "cluster": cluster_table,
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
    stale = []
    for rel, names in DOCS.items():
        path = REPO / rel
        if path.read_text() != render(path.read_text(), names):
            stale.append(rel)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in README.md and docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.write:
        for rel, names in DOCS.items():
            path = REPO / rel
            path.write_text(render(path.read_text(), names))
            print(f"updated {rel}")
        return 0
    for name, block in BLOCKS.items():
        print(f"## {name}\n\n{block()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
