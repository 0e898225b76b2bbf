"""pulsar-client's subscribe keywords, typed on ``pulsar_nack.subscribe`` and ``pulsar_nack.asyncio.subscribe``:
``mypy --strict`` on a user's script refuses a misspelled keyword and a value of the wrong
type, and passes a correct script; the declared keys are the installed client's."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pulsar
import pulsar.asyncio

from pulsar_nack.consumer import async_consumer, blocking
from pulsar_nack.consumer.keywords import AsyncSubscribeKeywords, SubscribeKeywords

REPO_ROOT = Path(__file__).resolve().parents[1]

GOOD = '''
import pulsar
import pulsar.asyncio
import pulsar_nack
import pulsar_nack.asyncio


def blocking(client: pulsar.Client) -> pulsar_nack.NackingConsumer:
    return pulsar_nack.subscribe(client, "orders", "billing", consumer_type=pulsar.ConsumerType.Shared,
                                 receiver_queue_size=10, consumer_name=None, negative_ack_redelivery_delay_ms=500,
                                 properties={"a": "b"}, batch_index_ack_enabled=False)


async def asyncio_(client: pulsar.asyncio.Client) -> pulsar_nack.asyncio.AsyncNackingConsumer:
    return await pulsar_nack.asyncio.subscribe(client, "orders", "billing", is_pattern_topic=False,
                                               receiver_queue_size=10)
'''

BAD = '''
import pulsar
import pulsar.asyncio
import pulsar_nack
import pulsar_nack.asyncio


def blocking(client: pulsar.Client) -> None:
    pulsar_nack.subscribe(client, "orders", "billing", reciever_queue_size=10)  # line 9
    pulsar_nack.subscribe(client, "orders", "billing", receiver_queue_size="10")  # line 10


async def asyncio_(client: pulsar.asyncio.Client) -> None:
    await pulsar_nack.asyncio.subscribe(client, "orders", "billing", is_pattern_topc=True)  # line 14
    await pulsar_nack.asyncio.subscribe(client, "orders", "billing", pattern_auto_discovery_period=5)  # line 15
'''


def _mypy(tmp_path: Path, **scripts: str) -> dict[str, list[str]]:
    """``mypy --strict`` on each script (pulsar_nack from this checkout); its error lines per script."""
    for name, text in scripts.items():
        (tmp_path / f"{name}.py").write_text(text)
    env = {**os.environ, "MYPYPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / ".mypy_cache"), *(f"{name}.py" for name in scripts)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    errors: dict[str, list[str]] = {name: [] for name in scripts}
    for line in done.stdout.splitlines():
        match = re.match(r"(\w+)\.py:(\d+): error: (.*)", line)
        if match:
            errors[match.group(1)].append(f"{match.group(2)}: {match.group(3)}")
    assert done.returncode == (1 if any(errors.values()) else 0), done.stdout + done.stderr
    return errors


def test_mypy_strict_refuses_misspelled_and_mistyped_subscribe_keywords_and_passes_good_ones(tmp_path) -> None:
    errors = _mypy(tmp_path, good=GOOD, bad=BAD)
    assert errors["good"] == []
    bad = errors["bad"]
    assert any(e.startswith("9: Unexpected keyword argument \"reciever_queue_size\"") for e in bad), bad
    assert any(e.startswith("10: Argument \"receiver_queue_size\"") and "incompatible type" in e for e in bad), bad
    assert any(e.startswith("14: Unexpected keyword argument \"is_pattern_topc\"") for e in bad), bad
    assert any(e.startswith("15: Unexpected keyword argument \"pattern_auto_discovery_period\"") for e in bad), bad
    assert len(bad) == 4, bad


def _clients_keywords(subscribe: object, ours: set[str]) -> set[str]:
    return set(inspect.signature(subscribe).parameters) - {"self", "topic", "subscription_name"} - ours  # type: ignore[arg-type]


def test_the_declared_keywords_are_the_installed_clients() -> None:
    """Every keyword the installed pulsar-client takes is declared (or named by our function); on
    pulsar-client 3.13 and later, every declared one is the client's (older clients lack some)."""
    blocking_own = set(inspect.signature(blocking.subscribe).parameters) - {"subscribe_kwargs"}
    async_own = set(inspect.signature(async_consumer.subscribe).parameters) - {"subscribe_kwargs"}
    pairs = [
        (set(SubscribeKeywords.__annotations__), _clients_keywords(pulsar.Client.subscribe, blocking_own),
         blocking._SUBSCRIBE_KEYWORDS),
        (set(AsyncSubscribeKeywords.__annotations__), _clients_keywords(pulsar.asyncio.Client.subscribe, async_own),
         async_consumer._SUBSCRIBE_KEYWORDS),
    ]
    version = tuple(int(part) for part in pulsar.__version__.split(".")[:2])
    for declared, theirs, accepted in pairs:
        assert theirs == accepted  # what the run-time check lets through
        assert theirs <= declared, theirs - declared
        if version >= (3, 13):
            assert declared == theirs, declared ^ theirs
