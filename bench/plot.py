"""Draw the docs' plots from the committed JSON in bench/results/ (full runs).

* ``docs/img/bytes_per_message.png``: bytes per pending message by pattern, log scale:
  pulsar-nack vs hash-map baseline (bench/memory.py), with the built-in client's figure
  (bench/client.py, consecutive ids) as a reference line;
* ``docs/img/lateness_cdf.png``: CDFs of redelivery lateness, ours vs built-in, for each
  delay and mode of bench/e2e.py;
* ``docs/img/scaling.png``: log-log memory and add cost against pending messages
  (bench/scaling.py);
* ``docs/img/jitter.png``: arrivals of 10,000 simultaneous failures per 256 ms, with and
  without jitter, on the tracker and on Apache Pulsar (bench/jitter.py);
* ``docs/img/soak_rss.png``: RSS and tracker bytes of each consumer process over a soak
  (bench/chaos.py --soak).

Run: ``python -m bench.plot`` (or ``pulsar-nack bench --plot``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ._common import REPO, RESULTS, load

IMG = REPO / "docs" / "img"
COLORS = {"pulsar-nack": "#1f77b4", "tracker": "#1f77b4", "baseline": "#ff7f0e", "built-in": "#d62728"}
LABELS = {"tracker": "pulsar-nack", "baseline": "hash-map baseline", "built-in": "pulsar-client built-in"}


def _load(name: str) -> dict[str, Any] | None:
    return load(name) if (RESULTS / f"{name}.json").exists() else None


def bytes_per_message(memory: dict[str, Any], client: dict[str, Any] | None, out: Path) -> None:
    cases = memory["cases"]
    names = [c["case"]["name"] for c in cases]
    ours = [max(c["tracker"]["rss_bytes_per_msg"], 0.01) for c in cases]
    base = [c["baseline"]["rss_bytes_per_msg"] for c in cases]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    xs = range(len(names))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], base, width, label=LABELS["baseline"], color=COLORS["baseline"])
    ax.bar([x + width / 2 for x in xs], ours, width, label=LABELS["tracker"], color=COLORS["tracker"])
    if client:
        built_in = next(c for c in client["cases"] if c["system"] == "built-in")
        ax.axhline(
            built_in["bytes_per_id"],
            color=COLORS["built-in"],
            linestyle="--",
            label=f"{LABELS['built-in']} ({built_in['ids']:,} consecutive ids)",
        )
    for x, value in zip(xs, ours):
        ax.annotate(f"{value:.2g}", (x + width / 2, value), ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel("bytes per pending message (RSS delta, log)")
    n = memory["parameters"]["messages"]
    ax.set_title(f"Memory per pending retry, {n:,} nacks per case (lower is better)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def lateness_cdf(e2e: dict[str, Any], out: Path) -> None:
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for case in e2e["cases"]:
        groups.setdefault((case["delay_ms"], case["mode"]), []).append(case)
    delays = sorted({d for d, _ in groups})
    modes = sorted({m for _, m in groups}, reverse=True)  # stream first
    fig, axes = plt.subplots(len(modes), len(delays), figsize=(5.2 * len(delays), 3.6 * len(modes)), squeeze=False)
    for (row, mode), (col, delay) in [(r, c) for r in enumerate(modes) for c in enumerate(delays)]:
        ax, key = axes[row][col], (delay, mode)
        if key not in groups:
            ax.set_visible(False)
            continue
        for case in groups[key]:
            samples = sorted(case["lateness_ms"].get("samples", []))
            if not samples:
                continue
            ys = [(i + 1) / len(samples) for i in range(len(samples))]
            subscription = case.get("subscription", "Shared")
            label = f"{case['system']}, {subscription} (p99 {case['lateness_ms']['p99']:.0f} ms)"
            style = "-" if subscription == "Shared" else ":"
            ax.step(samples, ys, where="post", label=label, color=COLORS[case["system"]], linestyle=style)
        delay, mode = key
        ax.set_title(f"{delay / 1000:g} s delay, {mode}", fontsize=10)
        ax.set_xscale("symlog", linthresh=100)
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_xlabel("lateness: arrival − requested (ms, symlog)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for row in axes:
        row[0].set_ylabel("fraction of messages")
    broker = e2e["broker"]
    fig.suptitle(f"Redelivery lateness on {broker} (left of 0 = early)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def scaling(data: dict[str, Any], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in ("tracker", "baseline", "built-in"):
        rows = sorted((r for r in data["rows"] if r["system"] == system), key=lambda r: r["pending"])
        if not rows:
            continue
        xs = [r["pending"] for r in rows]
        left.plot(xs, [max(r["rss_delta_bytes"], 1024) for r in rows], "o-", label=LABELS[system], color=COLORS[system])
        right.plot(xs, [r["add_us"] for r in rows], "o-", label=LABELS[system], color=COLORS[system])
    left.set(xscale="log", yscale="log", xlabel="pending messages", ylabel="RSS delta (bytes, floor 1 KiB)")
    left.set_title("Memory (lower is better)")
    right.set(xscale="log", yscale="log", xlabel="pending messages", ylabel="µs per add / nack call")
    right.set_title("Add cost (lower is better)")
    for ax in (left, right):
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Scaling ({data['case']} for the trackers)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def jitter(data: dict[str, Any], out: Path) -> None:
    panels = [("tracker (injected clock), 3 deliveries", [(f"jitter {c['jitter']:g}", [
        (int(t), n) for d in c["deliveries"] for t, n in d["bins"].items()]) for c in data.get("tracker", [])])]
    if data.get("broker"):
        panels.append((f"{data['broker']['broker']}, FixedDelay(2000), 1 delivery", [
            (f"jitter {c['jitter']:g}", [(int(t), n) for t, n in c["arrivals"]["bins"].items()]) for c in data["broker"]["cases"]]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    width = data["parameters"]["bin_ms"] / 1000
    for ax, (title, series) in zip(axes[0], panels):
        for label, bins in series:
            xs = [t / 1000 for t, _ in bins]
            ax.bar(xs, [n for _, n in bins], width=width, align="edge", alpha=0.55, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("seconds after the failures")
        ax.set_ylabel(f"arrivals per {data['parameters']['bin_ms']} ms (log)")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.suptitle(f"{data['parameters']['messages']:,} messages failing together, with and without jitter")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def soak_rss(data: dict[str, Any], out: Path) -> None:
    """RSS, tracker bytes and (when sampled) the consumer's books of each consumer process over a soak, warm-up shaded."""
    memory = data["memory"]
    books = all(len(row) > 4 and row[4] is not None for p in memory["processes"].values() for row in p["series"])
    fig, axes = plt.subplots(3 if books else 2, 1, figsize=(10, 9.0 if books else 6.4), sharex=True)
    for name, proc in memory["processes"].items():
        minutes = [row[0] / 60 for row in proc["series"]]
        label = f"{name.rsplit('.', 1)[0]} (slope {proc['rss_slope_mib_per_h']:+.2f} MiB/h)"
        axes[0].plot(minutes, [row[1] / (1 << 20) for row in proc["series"]], label=label)
        axes[1].plot(minutes, [row[2] for row in proc["series"]], label=name.rsplit(".", 1)[0])
        if books:  # histories from before the books were sampled have no such column
            axes[2].plot(minutes, [row[4] / 1024 for row in proc["series"]], label=name.rsplit(".", 1)[0])
    for ax in axes:
        ax.axvspan(0, memory["warmup_s"] / 60, color="grey", alpha=0.15, label="warm-up (not fitted)" if ax is axes[0] else None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].set_ylabel("tracker bytes (its own estimate)")
    if books:
        axes[2].set_ylabel("consumer's books (KiB)")
    axes[-1].set_xlabel("minutes since the load started")
    axes[0].set_title(f"Soak: {data['minutes']:g} min of the chaos workload without faults, {data['cluster']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[Path]:
    argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n\n")[0]).parse_args(argv)
    IMG.mkdir(parents=True, exist_ok=True)
    written = []
    memory, client, e2e, scale, jit = _load("memory"), _load("client"), _load("e2e"), _load("scaling"), _load("jitter")
    if memory:
        bytes_per_message(memory, client, IMG / "bytes_per_message.png")
        written.append(IMG / "bytes_per_message.png")
    if e2e:
        lateness_cdf(e2e, IMG / "lateness_cdf.png")
        written.append(IMG / "lateness_cdf.png")
    if scale:
        scaling(scale, IMG / "scaling.png")
        written.append(IMG / "scaling.png")
    if jit:
        jitter(jit, IMG / "jitter.png")
        written.append(IMG / "jitter.png")
    soak = _load("soak")
    if soak:
        soak_rss(soak, IMG / "soak_rss.png")
        written.append(IMG / "soak_rss.png")
    for path in written:
        print(f"wrote {path.relative_to(REPO)}")
    return written


if __name__ == "__main__":
    main()
