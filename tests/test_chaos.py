"""A short chaos run on the session's two-broker cluster, checked from its history (the CI version of bench.chaos).

Two runs of :data:`MINUTES` minutes each of the chaos workload under the nemesis: one with a
fixed seed (reproducible: the same fates and the same sequence of faults), one with a random
seed, printed on failure so that it can be run again (``python -m bench.chaos --seed S``).
Every promise of :mod:`pulsar_nack.testing.chaos.checker` must hold, but for one shape left open
(``docs/benchmarks.md``, the item marked "Left"): a retry copy that its consumer acked shortly
before a broker was killed, sent again after the restart (the kill lost the ack) and delivered
again by the same consumer, and what that delivery starts (its retries). Any other finding fails
the test.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from pulsar_nack.testing.chaos.checker import Promise, check
from pulsar_nack.testing.chaos.history import read_history
from pulsar_nack.testing.chaos.run import RunConfig, run

FIXED_SEED = 20261128
MINUTES = 1.0
GAP_S = (3.0, 8.0)
"""Seconds between faults here: denser than a long run's (``RunConfig.gap_s``), to see several in a minute."""
DUPLICATE_BOUND = 0.01 * sum(RunConfig.gap_s) / sum(GAP_S)
"""The goal's 1 % of duplicates is for a long run's fault rate; here faults come that much more often,
and the documented causes of duplicates (an ack a killed broker did not persist, ...) come with faults."""
SEEDS = [FIXED_SEED, random.SystemRandom().randrange(1 << 31)]


def _known(finding: Any) -> bool:
    """The shape left open in the module's docstring: a retry copy, one consumer process involved, a broker kill
    the fault just before."""
    return (finding.copy and finding.promise in (Promise.AFTER_ACK, Promise.UNEXPLAINED_DUPLICATE)
            and len(set(finding.processes)) == 1 and "broker-kill" in finding.detail.rsplit(";", 1)[-1])  # fmt: skip


@pytest.mark.broker
@pytest.mark.parametrize("seed", SEEDS, ids=["fixed-seed", "random-seed"])
def test_a_short_chaos_run_keeps_every_promise(cluster: Any, tmp_path: Path, seed: int) -> None:
    config = RunConfig(tmp_path, MINUTES, seed, gap_s=GAP_S, drain_timeout_s=150.0, sample_s=30.0)
    result = run(config, progress=lambda line: None, cluster=cluster)
    report = check(read_history(tmp_path / "history"), result.spec)
    totals = report.summary()["totals"]
    context = f"seed {seed} (python -m bench.chaos --minutes {MINUTES} --seed {seed}); faults {result.faults}"
    assert result.drained, f"{result.outstanding} messages unsettled after the drain; {context}"
    assert sum(result.faults.values()) >= 4, context
    unexpected = [f for f in report.findings if not _known(f)]
    assert not unexpected, "\n".join([context, *report.lines()])
    assert totals["produced"] > 0 and totals["duplicate_rate"] <= DUPLICATE_BOUND, f"{totals}; {context}"
