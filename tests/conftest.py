"""Fixtures: one broker per kind for the session's broker tests, a quiet client, topics.

``--broker apache`` (the default) runs the broker tests on Apache Pulsar standalone
(fetched from Maven Central on first use), ``--broker lite`` on pulsar-lite, ``--broker
both`` on each. Tests that need a feature one broker lacks ask for ``apache_broker``.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for `import helpers`


BROKER_KINDS = ("apache", "lite")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broker",
        choices=(*BROKER_KINDS, "both"),
        default="apache",
        help="which broker the broker tests run on: Apache Pulsar standalone (default), pulsar-lite, or both",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "session_broker" in metafunc.fixturenames:
        choice = metafunc.config.getoption("--broker")
        kinds = list(BROKER_KINDS) if choice == "both" else [choice]
        metafunc.parametrize("session_broker", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def broker_pool() -> Iterator[dict[str, Any]]:
    """One broker of each kind per session, started on first use, stopped at the session's end."""
    pool: dict[str, Any] = {}
    try:
        yield pool
    finally:
        while pool:
            pool.popitem()[1].stop()


def _shared_broker(pool: dict[str, Any], kind: str) -> Any:
    if kind not in pool:
        from pulsar_nack.testing import BROKERS

        pool[kind] = BROKERS[kind]().start()
    return pool[kind]


@pytest.fixture(scope="session")
def session_broker(request: pytest.FixtureRequest, broker_pool: dict[str, Any]) -> Any:
    """The broker of the kind ``--broker`` chose (parametrized by pytest_generate_tests)."""
    return _shared_broker(broker_pool, getattr(request, "param", "apache"))


@pytest.fixture(scope="session")
def apache_broker(broker_pool: dict[str, Any]) -> Any:
    """Apache Pulsar standalone, whatever ``--broker`` says: for what pulsar-lite cannot do."""
    return _shared_broker(broker_pool, "apache")


@pytest.fixture(scope="session")
def lite_broker(broker_pool: dict[str, Any]) -> Any:
    """pulsar-lite: only for tests of the lite broker itself and of the demo's default."""
    return _shared_broker(broker_pool, "lite")


@pytest.fixture(scope="session")
def pulsar_cluster() -> Iterator[Any]:
    """A two-broker Apache Pulsar cluster (ZooKeeper, one bookie), started on first use."""
    from pulsar_nack.testing import PulsarCluster

    cluster = PulsarCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


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
        "pulsar-lite",
        "PulsarStandaloneStarter",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",  # PulsarCluster's JVMs
        "org.apache.bookkeeper.server.Main",
        "org.apache.pulsar.PulsarBrokerStarter",
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
