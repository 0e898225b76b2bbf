"""Fixtures: one Apache Pulsar standalone broker for the session's broker tests, a quiet client, topics.

The broker (fetched from Maven Central on first use) starts on the first test that asks
for it and stops at the session's end.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import helpers`


@pytest.fixture(scope="session")
def broker_pool() -> Iterator[dict[str, Any]]:
    """Brokers shared by the session, started on first use, stopped at the session's end."""
    pool: dict[str, Any] = {}
    try:
        yield pool
    finally:
        while pool:
            pool.popitem()[1].stop()


class RunningBroker:
    """A broker this session did not start (``PULSAR_NACK_TEST_BROKER``): only its URLs.

    ``tools/client_matrix.py`` runs the consumer tests of several pulsar-client versions
    against one broker this way. A test that restarts the broker is skipped.
    """

    def __init__(self, url: str, admin_url: str) -> None:
        from pulsar_nack.testing.admin import PulsarAdmin

        self.url, self.admin_url = url, admin_url
        self.admin = PulsarAdmin(admin_url)
        self.pid = None

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        return str(self.admin.create_partitioned_topic(topic, partitions))

    def restart(self, timeout_s: float = 30.0) -> None:
        pytest.skip("the broker is shared (PULSAR_NACK_TEST_BROKER): not restarted")

    def stop(self) -> None:
        """Not ours to stop."""


@pytest.fixture(scope="session")
def session_broker(broker_pool: dict[str, Any]) -> Any:
    """Apache Pulsar standalone, shared by the session.

    ``PULSAR_NACK_TEST_BROKER="pulsar://HOST:PORT http://HOST:PORT"`` uses a broker that
    is already running instead (see :class:`RunningBroker`).
    """
    running = os.environ.get("PULSAR_NACK_TEST_BROKER")
    if running:
        url, admin_url = running.split()
        return RunningBroker(url, admin_url)
    if "apache" not in broker_pool:
        from pulsar_nack.testing import PulsarStandalone

        broker_pool["apache"] = PulsarStandalone().start()
    return broker_pool["apache"]


@pytest.fixture(scope="session")
def apache_broker(session_broker: Any) -> Any:
    """The session's Apache Pulsar standalone (the name older tests use)."""
    return session_broker


@pytest.fixture
def pulsar_client(session_broker) -> Iterator[object]:
    from pulsar_nack.testing import quiet_client

    client = quiet_client(session_broker.url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a test left a broker, a Spark JVM or a pyspark worker behind.

    Only processes started by this test session (descendants of this process) count.
    """
    import os
    import time

    try:
        import psutil
    except ImportError:  # psutil comes with the test extra
        return
    me = psutil.Process(os.getpid())
    patterns = (
        "PulsarStandaloneStarter",
        "org.apache.spark.deploy",
        "CoarseGrainedExecutorBackend",
        "pyspark.daemon",
    )

    def leftovers():
        found = []
        for child in me.children(recursive=True):
            try:
                cmdline = " ".join(child.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(p in cmdline for p in patterns):
                found.append(f"{child.pid} {cmdline[:120]}")
        return found

    end = time.monotonic() + 15  # processes being stopped get a moment to exit
    left = leftovers()
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = leftovers()
    if left:
        session.exitstatus = 1
        print("\nprocesses left running by the tests:\n" + "\n".join(left))
