"""How long each Apache Pulsar version takes to start, and what it says about batch-index acks.

For every release in :data:`pulsar_nack.testing.distribution.RELEASES` that an installed
JDK runs: ``--reps`` cold starts of :class:`~pulsar_nack.testing.PulsarStandalone` with
the version's default settings (each a fresh data directory, timed from ``start()`` to
``public/default`` listed by the admin API, then stopped), the JDK it ran on, and
``acknowledgmentAtBatchIndexLevelEnabled`` as the broker reports it. With
``--fresh-cache``, also the time to fetch or assemble each release into an empty cache
(jars already in Maven's local repository are copied, not downloaded).

Result: ``bench/results/broker_start.json``.

Run: ``python -m bench.broker_start [--reps N] [--fresh-cache]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from pulsar_nack.errors import BrokerError
from pulsar_nack.testing import PulsarStandalone
from pulsar_nack.testing.distribution import RELEASES, choose_release, ensure_distribution, java_major

from ._common import print_table, start_context, summarize, write_result


def fetch_seconds(version: str) -> float:
    """Seconds to fetch (or assemble) *version* into an empty cache directory."""
    release, _ = choose_release(version=version)
    saved = os.environ.get("PULSAR_NACK_CACHE")
    with tempfile.TemporaryDirectory(prefix="pulsar-nack-fetch-") as cache:
        os.environ["PULSAR_NACK_CACHE"] = cache
        try:
            began = time.monotonic()
            ensure_distribution(release)
            return time.monotonic() - began
        finally:
            if saved is None:
                os.environ.pop("PULSAR_NACK_CACHE", None)
            else:
                os.environ["PULSAR_NACK_CACHE"] = saved


def one_version(version: str, reps: int, fresh_cache: bool) -> dict[str, Any]:
    """Start *version* ``reps`` times; its start seconds, JDK and batch-index ack default."""
    fetch = fetch_seconds(version) if fresh_cache else None
    ensure_distribution(choose_release(version=version)[0])  # not part of the timed starts
    starts, acks, java = [], set(), None
    for _ in range(reps):
        broker = PulsarStandalone(version=version)
        began = time.monotonic()
        broker.start()
        try:
            starts.append(time.monotonic() - began)
            acks.add(broker.batch_index_ack)
            java = java_major(broker.java_home) if broker.java_home else None
            kind = broker.release.kind if broker.release else None
        finally:
            broker.stop()
    return {
        "version": version,
        "kind": kind,
        "java": java,
        "start_s": summarize(round(s, 2) for s in starts),
        "fetch_s": None if fetch is None else round(fetch, 1),
        "default_batch_index_ack": sorted(acks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--fresh-cache", action="store_true", help="also time a fetch into an empty cache")
    args = parser.parse_args(argv)
    context = start_context()
    cases = []
    for release in RELEASES:
        try:
            choose_release(version=release.version)
        except BrokerError as exc:
            print(f"skipping {release.version}: {exc}")
            continue
        cases.append(one_version(release.version, args.reps, args.fresh_cache))
    rows = [
        [
            c["version"],
            c["kind"],
            c["java"],
            f"{c['start_s']['median']:.1f}",
            f"{c['start_s']['min']:.1f}",
            f"{c['start_s']['max']:.1f}",
            "-" if c["fetch_s"] is None else f"{c['fetch_s']:.0f}",
            ",".join(str(a).lower() for a in c["default_batch_index_ack"]),
        ]
        for c in cases
    ]
    table = print_table(
        ["version", "kind", "java", "start p50 s", "min s", "max s", "fetch s", "batch-index ack"],
        rows,
        title=f"PulsarStandalone(version=...).start() to ready, {args.reps} cold starts each",
    )
    path = write_result("broker_start", {"reps": args.reps, "cases": cases, "table": table}, start=context)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
