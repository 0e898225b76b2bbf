"""Memory over a soak: each consumer process's RSS and its tracker's own bytes, and their slopes.

Consumers record a ``sample`` every ``sample_s`` (:mod:`.consumer`): RSS from
``/proc/self/statm`` and ``stats()["tracker"]["memory_bytes"]``. :func:`memory_summary`
fits a least-squares line to each process's samples taken after the warm-up and before
the load ended (the drain is left out: the load stops there); a leak is a slope.

>>> slope_per_hour([(0.0, 10.0), (1800.0, 10.5), (3600.0, 11.0)])
1.0
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .history import Ev

__all__ = ["MIB", "memory_summary", "slope_per_hour"]

MIB = 1 << 20


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, value)`` points, in value per hour (None under 2 distinct times)."""
    n = len(points)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def memory_summary(history: Sequence[dict[str, Any]], started: float, load_ended: float,
                   warmup_s: float) -> dict[str, Any]:  # fmt: skip
    """Per consumer process (name and PID): the samples and the fitted slopes after *warmup_s*.

    *started* and *load_ended* are the load phase's bounds (``time.time()``).
    """
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in history:
        if record["ev"] == Ev.SAMPLE.value and "rss" in record and record["t"] <= load_ended:
            series[f"{record['proc']}.{record['pid']}"].append(record)
    processes = {}
    for key, samples in sorted(series.items()):
        fitted = [s for s in samples if s["t"] - started >= warmup_s]
        rss = [(s["t"] - started, s["rss"] / MIB) for s in fitted]
        tracker = [(s["t"] - started, float(s["tracker_bytes"])) for s in fitted]
        books = [(s["t"] - started, float(s["books_bytes"])) for s in fitted if s.get("books_bytes") is not None]
        processes[key] = {
            "samples": len(samples),
            "fitted_samples": len(fitted),
            "rss_mib_first": round(samples[0]["rss"] / MIB, 2),
            "rss_mib_after_warmup": round(rss[0][1], 2) if rss else None,
            "rss_mib_last": round(samples[-1]["rss"] / MIB, 2),
            "rss_slope_mib_per_h": _round(slope_per_hour(rss), 3),
            "tracker_bytes_min": min((v for _, v in tracker), default=None),
            "tracker_bytes_max": max((v for _, v in tracker), default=None),
            "tracker_slope_bytes_per_h": _round(slope_per_hour(tracker), 1),
            # histories before the consumer's books were sampled have none
            "books_bytes_min": min((v for _, v in books), default=None),
            "books_bytes_max": max((v for _, v in books), default=None),
            "books_slope_bytes_per_h": _round(slope_per_hour(books), 1) if len(books) > 1 else None,
            "series": [[round(s["t"] - started, 1), s["rss"], s["tracker_bytes"], s["pending"], s.get("books_bytes")]
                       for s in samples],
        }
    return {"warmup_s": warmup_s, "series_columns": ["s since start", "rss bytes", "tracker bytes", "pending nacks",
                                                    "consumer books bytes"],
            "processes": processes}  # fmt: skip


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
