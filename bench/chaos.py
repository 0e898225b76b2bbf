"""Chaos and soak: a seeded nemesis against a recorded workload on two brokers, checked from the history.

``python -m bench.chaos --minutes M --seed S`` runs the workload of
:mod:`pulsar_nack.testing.chaos.workload` on a fresh two-broker
:class:`~pulsar_nack.testing.PulsarCluster` for M minutes while the nemesis throws faults
(topic and bundle unloads, broker SIGKILL and restart, broker SIGSTOP past the clients'
operation timeout, consumer SIGKILL and restart, close and resubscribe, producer bursts),
drains without faults, then checks the promises on the history
(:mod:`pulsar_nack.testing.chaos.checker`). ``--soak`` runs the same workload without the
nemesis and fits each consumer process's RSS and tracker bytes over time
(:mod:`pulsar_nack.testing.chaos.soak`). The seed is printed first; the same seed gives
the same fates and the same sequence of faults.

The run's directory (history, worker logs, the cluster's data) is kept; ``--analyze DIR``
checks it again. Results: ``bench/results/chaos.json`` or ``soak.json`` (``--out``), with
the seed; ``python -m bench.plot`` draws ``docs/img/soak_rss.png`` from ``soak.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._common import parser, start_context, write_result

WARMUP_FRACTION = 0.2
"""The soak's slope is fitted after this share of the load phase."""


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    made = parser(__doc__, "bench.chaos")
    made.add_argument("--minutes", type=float, default=30.0, help="length of the load phase (default 30)")
    made.add_argument("--seed", type=int, default=None, help="the run's seed (default: a random one, printed)")
    made.add_argument("--soak", action="store_true", help="no nemesis; sample memory")
    made.add_argument("--dir", type=Path, default=None, help="the run's directory (default: a new one under /tmp)")
    made.add_argument("--rate", type=float, default=8.0, help="batched messages per second per topic (default 8)")
    made.add_argument("--gap", type=float, nargs=2, default=(5.0, 30.0), metavar=("MIN", "MAX"),
                      help="seconds between faults (default 5 30)")  # fmt: skip
    made.add_argument("--faults", nargs="+", default=(), metavar="KIND",
                      help="only these fault kinds (topic-unload bundle-unload broker-kill broker-freeze consumer-kill "
                           "resubscribe producer-burst; default: all)")  # fmt: skip
    made.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples (default 10)")
    made.add_argument("--analyze", type=Path, default=None, metavar="DIR", help="only check the run kept in DIR")
    return made.parse_args(argv)


def execute(args: argparse.Namespace) -> Path:
    """Run the workload as *args* say; return the run's directory (with ``run.json``)."""
    from pulsar_nack.testing.chaos.run import RunConfig, run

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed}", flush=True)
    directory = args.dir or Path(tempfile.mkdtemp(prefix=f"pulsar-nack-{'soak' if args.soak else 'chaos'}-{seed}-"))
    print(f"run directory {directory}", flush=True)
    start = start_context()
    config = RunConfig(directory, args.minutes, seed, soak=args.soak, rate_per_s=args.rate, gap_s=tuple(args.gap),
                       sample_s=args.sample_s, faults=tuple(args.faults))  # fmt: skip
    result = run(config, progress=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True))
    summary = {"start": start, "config": {**asdict(config), "directory": str(directory)},
               "result": {k: v for k, v in asdict(result).items() if k != "spec"}}  # fmt: skip
    (directory / "run.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    return directory


def analyze(directory: Path) -> dict[str, Any]:
    """The result of the run kept in *directory*: the checker's report, and memory for a soak."""
    from pulsar_nack.testing.chaos.checker import check
    from pulsar_nack.testing.chaos.history import read_history
    from pulsar_nack.testing.chaos.soak import memory_summary
    from pulsar_nack.testing.chaos.workload import WorkloadSpec

    summary = json.loads((directory / "run.json").read_text(encoding="utf-8"))
    spec = WorkloadSpec.load(directory / "workload.json")
    history = read_history(directory / "history")
    report = check(history, spec)
    config, result = summary["config"], summary["result"]
    payload: dict[str, Any] = {
        "seed": config["seed"], "soak": config["soak"], "minutes": config["minutes"],
        "parameters": {k: config.get(k) for k in ("rate_per_s", "gap_s", "drain_timeout_s", "quiet_s", "sample_s",
                                                   "broker_config", "faults")},
        "workload": {"topics": spec.topics, "partitions": spec.partitions,
                     "subscriptions": [asdict(s) for s in spec.subscriptions],
                     "consumers": [asdict(c) for c in spec.consumers], "producers": [asdict(p) for p in spec.producers],
                     "operation_timeout_s": spec.operation_timeout_s},
        "cluster": f"Apache Pulsar {result['version']}, PulsarCluster (ZooKeeper, one bookie, two brokers)",
        "run": result,
        "check": report.summary(),
        "violations": report.lines(),
    }  # fmt: skip
    if config["soak"]:
        load_s = result["load_ended"] - result["started"]
        payload["memory"] = memory_summary(history, result["started"], result["load_ended"], load_s * WARMUP_FRACTION)
    payload["_start"] = summary["start"]
    return payload


def chaos_table(result: dict[str, Any] | None = None) -> str:
    """docs/benchmarks.md: what the checker found in the committed chaos run (``bench/results/chaos.json``)."""
    from ._common import load, md_table

    data = result or load("chaos")
    check, totals = data["check"], data["check"]["totals"]
    faults = totals["faults"]
    rows = [
        ["faults", f"{sum(faults.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))],
        ["messages produced / deliveries", f"{totals['produced']:,} / {totals['deliveries']:,}"],
        ["lost (never acked nor dead-lettered)", f"{totals['lost']}"],
        ["left unacknowledged after the drain", f"{totals['left_unacked']}"],
        ["early (a violation)", f"{totals['early']}"],
        ["early, by a documented cause", _causes(check["early_documented_by_cause"])],
        ["delivered after an ack (a violation)", f"{totals['after_ack']}"],
        ["dead letters", _causes(check["dead_letters"])],
        ["dead letter before the count / past it unexplained", f"{totals['dead_letter_early']} / {totals['past_count']}"],
        ["duplicates without a documented cause", f"{totals['unexplained_duplicate']}"],
        [f"duplicates with a documented cause ({totals['duplicate_rate'] * 100:.2f} % of messages x subscriptions)",
         _causes(check["duplicates_by_cause"])],
    ]  # fmt: skip
    run = data["run"]
    note = (f"\n\n{data['minutes']:g} minutes of faults, seed {data['seed']} (`python -m bench.chaos --minutes "
            f"{data['minutes']:g} --seed {data['seed']}`, `bench/results/chaos.json`), on {data['cluster']}; the drain "
            f"without faults took {run['drain_s']:.0f} s. {_code(data['meta'])}")  # fmt: skip
    return md_table(["what the checker counts", "chaos run"], rows) + note


def _code(meta: dict[str, Any]) -> str:
    """The commit of the code that ran, and of the checker when ``--analyze`` checked the run again later."""
    ran, checked = meta.get("at_start", {}).get("git_commit") or meta["git"]["commit"], meta["git"]["commit"]
    return f"Code: `{ran[:7]}`." + (f" Checked again by the checker of `{checked[:7]}`." if checked != ran else "")


def soak_table(result: dict[str, Any] | None = None) -> str:
    """docs/benchmarks.md: each consumer process's memory over the committed soak (``bench/results/soak.json``)."""
    from ._common import load, md_table

    data = result or load("soak")
    memory = data["memory"]
    rows = [[name.rsplit(".", 1)[0], f"{p['rss_mib_after_warmup']:.1f}", f"{p['rss_mib_last']:.1f}",
             f"{p['rss_slope_mib_per_h']:+.3f}", f"{p['tracker_bytes_min']:,.0f}–{p['tracker_bytes_max']:,.0f}",
             f"{p['tracker_slope_bytes_per_h']:+,.0f}", *_books(p)] for name, p in memory["processes"].items()]  # fmt: skip
    totals = data["check"]["totals"]
    note = (f"\n\n{data['minutes']:g} minutes of the chaos workload without faults (`python -m bench.chaos --soak "
            f"--minutes {data['minutes']:g} --seed {data['seed']}`, `bench/results/soak.json`), a sample every "
            f"{data['parameters']['sample_s']:g} s; slopes fitted by least squares after the first "
            f"{memory['warmup_s'] / 60:.0f} minutes (warm-up). {totals['produced']:,} messages, {totals['deliveries']:,} "
            f"deliveries; the checker: {totals['lost']} lost, {totals['early']} early, {totals['after_ack']} after an "
            f"ack, {totals['past_count']} dead letters past the count. {_code(data['meta'])}")  # fmt: skip
    headers = ["consumer process", "RSS after warm-up (MiB)", "RSS at the end (MiB)", "RSS slope (MiB/h)",
               "tracker bytes (min–max)", "tracker slope (bytes/h)"]  # fmt: skip
    if all(row[6:] for row in rows):  # runs before the consumer's books were sampled have no such columns
        headers += ["consumer books bytes (min–max)", "books slope (bytes/h)"]
    return md_table(headers, rows) + note


def _books(process: dict[str, Any]) -> list[str]:
    """The consumer's books (``stats()["memory_bytes"]``) of one soak process: range and slope, if sampled."""
    if process.get("books_slope_bytes_per_h") is None:
        return []
    return [f"{process['books_bytes_min']:,.0f}–{process['books_bytes_max']:,.0f}",
            f"{process['books_slope_bytes_per_h']:+,.0f}"]


BREAKS = {
    "chaos-break-copyfilter": ("the copy filter disabled: a copy of an acked message is delivered",
                               "`NackingCore.admit`: the `ACKED` verdict turned into `DELIVER`"),
    "chaos-break-neverearly": ("the never-early rule disabled: a copy of a pending nack is delivered",
                               "`NackingCore.admit`: the `NACKED` verdict turned into `DELIVER`"),
    "chaos-break-ackdrop": ("an ack dropped: one in 25 recorded but never sent",
                            "`NackingConsumer._acknowledge_guarded`, `AsyncNackingConsumer.acknowledge`"),
}
"""The short runs with a promise broken on purpose in a copy of the code (never committed): result name ->
(what was broken, where)."""


def breaks_table() -> str:
    """docs/benchmarks.md: what the checker reported on each run with a promise broken on purpose."""
    from ._common import load, md_table

    rows = []
    for name, (broken, where) in BREAKS.items():
        data = load(name)
        check = data["check"]
        faults = ", ".join(f"{k} {v}" for k, v in sorted(check["totals"]["faults"].items()))
        rows.append([broken, where, f"{data['minutes']:g} min, seed {data['seed']}: {faults}",
                     _promises(check["by_promise_one_consumer"]), _promises(check["by_promise_two_consumers"])])  # fmt: skip
    note = ("\n\nEach a short run (`python -m bench.chaos --minutes 2 --seed S --faults ...`) on a copy of the code with "
            "the change in *where*, restored afterwards; `bench/results/<name>.json` (its `meta` lists the changed "
            "files; its `violations`, the lines the checker printed). The last column is the known findings above "
            "(two consumers of one subscription involved), which appear without any break too.")  # fmt: skip
    headers = ["broken on purpose", "where", "run and faults", "caught (one consumer involved)",
               "also reported (two consumers involved)"]  # fmt: skip
    return md_table(headers, rows) + note


def _promises(counts: dict[str, int]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {n:,}" for name, n in sorted(counts.items())) or "none"


def _causes(counts: dict[str, int]) -> str:
    return "; ".join(f"{cause}: {n:,}" for cause, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    directory = args.analyze or execute(args)
    payload = analyze(directory)
    start = payload.pop("_start")
    for line in payload["violations"]:
        print(line)
    print(json.dumps(payload["check"]["totals"], indent=1))
    path = write_result(args.out or ("soak" if payload["soak"] else "chaos"), payload, start)
    print(f"wrote {path}", flush=True)
    if payload["violations"]:
        print(f"{len(payload['violations'])} violations; seed {payload['seed']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
