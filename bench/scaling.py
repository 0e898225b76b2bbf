"""Scaling: memory and add cost from 10^4 to 10^7 pending nacks, three systems.

For each N, in a fresh process per (system, N):

* ``tracker`` and ``baseline``: the ``consec-x8-y10`` case of :mod:`bench.memory`
  (every entry nacked, 8 messages per ms, 10 precision bits): RSS delta and add rate;
* ``built-in``: the pulsar-client consumer of :mod:`bench.client` on Apache Pulsar
  standalone (N ``negative_acknowledge(MessageId)`` calls, one-hour delay): RSS delta and
  call cost. Up to 10^6 ids in the full run (10^7 would hold ~4.5 GB for the same curve).

Run: ``python -m bench.scaling [--quick]``; plots come from ``bench/plot.py``.
"""

from __future__ import annotations

from typing import Any

from ._common import broker_label, finish, fmt_bytes, parser, print_table, run_worker

CASE = "consec-x8-y10"


def run(sizes: list[int], built_in_max: int) -> dict[str, Any]:
    from pulsar_nack.testing import PulsarStandalone

    rows: list[dict[str, Any]] = []
    with PulsarStandalone(batch_index_ack=True) as broker:
        for n in sizes:
            for system in ("tracker", "baseline"):
                r = run_worker("bench.memory", CASE, system, str(n), timeout_s=3600)
                rows.append({"system": system, "pending": n, "rss_delta_bytes": r["rss_delta"], "bytes_per_msg": r["rss_bytes_per_msg"],
                             "estimate_bytes": r["estimate_bytes"], "add_us": 1e6 / r["add_rate"],
                             "add_us_note": "public add(), generator time subtracted"})
        for n in (n for n in sizes if n <= built_in_max):
            r = run_worker("bench.client", broker.url, "built-in", str(n), "1", timeout_s=3600)
            rows.append({"system": "built-in", "pending": n, "rss_delta_bytes": r["rss_delta_bytes"], "bytes_per_msg": r["bytes_per_id"],
                         "add_us": r["fill_us_per_call_with_id_creation"],
                         "add_us_note": "negative_acknowledge call incl. MessageId creation"})
    return {"case": CASE, "sizes": sizes, "built_in_max": built_in_max, "broker": broker_label(broker), "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser(__doc__, "bench.scaling", "10^4 and 10^5 only").parse_args(argv)
    sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6, 10**7]
    payload = run(sizes, 10**5 if args.quick else 10**6)
    print_table(["system", "pending", "RSS delta", "bytes/msg", "add µs"],
                [[r["system"], f"{r['pending']:,}", fmt_bytes(r["rss_delta_bytes"]), f"{r['bytes_per_msg']:.2f}", f"{r['add_us']:.2f}"]
                 for r in payload["rows"]], title=f"Scaling ({CASE} for the trackers; consecutive ids for the built-in client)")
    finish(args, "scaling", payload)
    return payload


if __name__ == "__main__":
    main()
