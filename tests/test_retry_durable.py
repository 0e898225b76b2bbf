"""Retries survive a SIGKILL of the consumer process, and a broker restart: the CI-sized scenario.

The scenario is ``bench/retry_durable.py``'s (which runs it with 1,000 retries and commits
``bench/results/retry_durable.json``, the nack path beside it): a scheduler process
reconsumes every message with a 2-8 s delay and is killed with SIGKILL; a new consumer
process must then receive every one, none before its due time - 50 ms. Own broker (stock
settings: 1 s delayed-delivery tick, not strict), because one scenario restarts it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.retry_durable import EARLY_SLACK_MS, run_scenario

pytestmark = pytest.mark.broker

RETRIES = 100


@pytest.fixture(scope="module")
def own_broker() -> Any:
    from pulsar_nack.testing import PulsarStandalone

    with PulsarStandalone() as broker:
        yield broker


@pytest.mark.parametrize("mode", ["reconsume", "reconsume-held"])
@pytest.mark.parametrize("scenario", ["kill", "kill+restart"])
def test_reconsumed_retries_survive_a_killed_consumer(own_broker, scenario, mode, tmp_path):
    """``reconsume-held``: the copies carry no delivery time; the receiver gets them all at once and holds them."""
    run = run_scenario(own_broker, mode, scenario, RETRIES, 2_000, 8_000, tmp_path, restart_offset_ms=10_000)
    assert run["acked_before_kill"], "the originals were not all acked on the broker before the kill"
    assert run["lost"] == 0, run
    assert run["early"] == 0, f"{run['early']} retries came more than {EARLY_SLACK_MS} ms early: {run}"
    assert run["received"] == RETRIES
