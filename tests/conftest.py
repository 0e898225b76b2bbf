"""Fixtures: one embedded broker for the session's consumer tests, a quiet client, topics."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import helpers`


@pytest.fixture(scope="session")
def session_broker() -> Iterator[object]:
    from pulsar_nack.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture
def pulsar_client(session_broker) -> Iterator[object]:
    from pulsar_nack.embedded import quiet_client

    client = quiet_client(session_broker.url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"
