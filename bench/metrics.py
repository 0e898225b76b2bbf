"""``add`` cost with and without :func:`pulsar_nack.metrics.instrument`, in one run.

Method: 1M pre-built keys (consecutive entries) through the public ``add`` of a
``NegativeAcksTracker`` with a timer (``redeliver`` callback, 60 s delay, so nothing is
released while timing). Three systems, in alternating order per repetition, after a
warmup repetition:

* ``off``: no instruments;
* ``on``: ``instrument(tracker, meter)`` on an OpenTelemetry SDK meter with an in-memory
  reader, collected once after the timed loop (the values are checked);
* ``on+collecting``: the same, with a thread collecting every 10 ms during the loop (a
  hundred times more often than a usual export interval), to show what a collection
  costs the adds running beside it (``stats()`` takes the tracker's lock).

Result: ``bench/results/metrics.json`` (``metrics-quick.json`` with ``--quick``);
per system the seconds per 1M adds and ns per add (wall time), min/median/max.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ._common import finish, interleave, parser, print_table, start_context, summarize, timed
from .core_perf import DELAY_MS, keys

SYSTEMS = ("off", "on", "on+collecting")


def _one(system: str, items: list[Any]) -> float:
    """Seconds of one pass of ``add`` over *items* under *system*."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from pulsar_nack import NegativeAcksTracker
    from pulsar_nack.metrics import NACK_COUNTER, instrument

    tracker = NegativeAcksTracker(lambda due: None, delay_ms=DELAY_MS)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    stop = threading.Event()

    def collect() -> None:
        while not stop.wait(0.01):
            reader.get_metrics_data()

    def loop(add: Any = tracker.add) -> None:
        for key in items:
            add(key)

    collector = threading.Thread(target=collect, daemon=True)
    if system != "off":
        instrument(tracker, provider.get_meter("bench"))
    if system == "on+collecting":
        collector.start()
    elapsed = timed(loop)[0]
    stop.set()
    if collector.is_alive():
        collector.join()
    if system != "off":
        data: Any = reader.get_metrics_data()
        nacks = [m.data.data_points[0].value for rm in data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == NACK_COUNTER]
        if nacks != [len(items)]:
            raise AssertionError(f"{system}: nack counter {nacks} != {len(items)}")
    tracker.close(flush=False)
    provider.shutdown()
    return elapsed


def bench_add(n: int, warmup: int, reps: int) -> dict[str, Any]:
    items = keys(n)
    times = interleave(SYSTEMS, reps, lambda name: _one(name, items), warmup)
    out: dict[str, Any] = {"messages": n, "warmup": warmup, "repetitions": reps}
    for name, samples in times.items():
        out[name] = {"seconds": summarize(samples), "ns_per_add": summarize([s / n * 1e9 for s in samples])}
    off = out["off"]["ns_per_add"]["median"]
    out["ratio_on_to_off"] = out["on"]["ns_per_add"]["median"] / off
    out["ratio_collecting_to_off"] = out["on+collecting"]["ns_per_add"]["median"] / off
    return out


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.metrics", "200k keys, 3 repetitions")
    args_parser.add_argument("--reps", type=int, default=None, help="repetitions (default 9, quick 3)")
    args = args_parser.parse_args(argv)
    n, reps = (200_000, args.reps or 3) if args.quick else (1_000_000, args.reps or 9)
    context = start_context()
    result = bench_add(n, 1, reps)
    rows = [[name, *(f"{result[name]['ns_per_add'][k]:.1f} ns" for k in ("min", "median", "max"))] for name in SYSTEMS]
    table = print_table(["add, metrics", "min", "median", "max"], rows, title=f"add cost ({n:,} keys, {reps} reps)")
    print(f"median on/off: {result['ratio_on_to_off']:.3f}, collecting/off: {result['ratio_collecting_to_off']:.3f}")
    finish(args, "metrics", {"add": result, "tables": {"add": table}}, context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
