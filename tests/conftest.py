"""Fixtures: one Apache Pulsar standalone broker for the session's broker tests, a quiet client, topics.

The ``apache`` broker (fetched from Maven Central on first use) is the newest release an
installed JDK runs, with batch-index acknowledgement on; it starts on the first test that
asks for it and stops at the session's end. Tests marked ``all_brokers`` also run on each
Apache Pulsar version of ``--pulsar-versions`` (default ``4.0,3.0``) with that version's
own default settings (batch-index acknowledgement off on both), one shared broker per
version per session: ``session_broker`` is parametrized as ``apache``, ``apache-4.0.8``,
``apache-3.0.7``. A version no installed JDK runs is skipped, with the reason, unless
``--pulsar-versions`` named it.
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


DEFAULT_PULSAR_VERSIONS = "4.0,3.0"
VERSIONED = "apache-"  # session_broker params "apache-<version>": that version, its default settings


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pulsar-versions",
        default=None,
        help=(
            "comma-separated Apache Pulsar versions ('4.0.8', '4.0', '3.x') that tests marked all_brokers "
            f"also run on, each with its default settings; 'none' for none (default {DEFAULT_PULSAR_VERSIONS})"
        ),
    )


HEAVY_MODULES = frozenset(
    {"test_chaos", "test_cli", "test_cluster", "test_examples", "test_faults", "test_spark", "test_spark_cluster"}
)
"""The modules that start a Pulsar cluster or Spark: one xdist worker runs them all, one after another,
so that no two clusters or Spark jobs share the two cores (see ``pytest_collection_modifyitems``)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook, which copies each test's group into its node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, pyproject.toml): each module is a group of its own,
    so that its module-scoped runs stay on one worker, and the heavy modules are one group."""
    for item in items:
        module = Path(item.nodeid.split("::", 1)[0]).stem
        item.add_marker(pytest.mark.xdist_group("heavy" if module in HEAVY_MODULES else module))


def _version_params(config: pytest.Config) -> list[Any]:
    """One ``apache-<version>`` param per version asked for (deduplicated), or a skipped one
    for a default version that no installed JDK runs."""
    from pulsar_nack.errors import BrokerError
    from pulsar_nack.testing.distribution import choose_release

    asked = config.getoption("--pulsar-versions")
    specs = (asked or DEFAULT_PULSAR_VERSIONS).split(",")
    params: dict[str, Any] = {}
    for spec in (s.strip() for s in specs if s.strip() and s.strip() != "none"):
        try:
            release, _ = choose_release(version=spec)
        except BrokerError as exc:
            if asked:
                raise pytest.UsageError(f"--pulsar-versions {spec}: {exc}") from None
            marks = pytest.mark.skip(reason=f"Apache Pulsar {spec}: {exc}")
            params.setdefault(spec, pytest.param(f"{VERSIONED}{spec}", marks=marks, id=f"{VERSIONED}{spec}"))
            continue
        except ValueError as exc:
            raise pytest.UsageError(f"--pulsar-versions: {exc}") from None
        key = f"{VERSIONED}{release.version}"
        params.setdefault(key, pytest.param(key, id=key))
    return list(params.values())


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under ``--dist loadgroup``: stop unless every test a worker collected carries its group.

    pytest-xdist passes a test's group in its node id; where it cannot (pytest-xdist#1386,
    pytest 9.2), or a hook adds the group after xdist read it, the groups are silently
    ignored and two clusters share the two cores.
    """
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if ungrouped:
        raise pytest.UsageError(
            f"--dist loadgroup has no effect with pytest {pytest.__version__} (pytest-xdist#1386): "
            f"{len(ungrouped)} tests without a group, e.g. {ungrouped[0]}; install the test extra's pytest"
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "session_broker" in metafunc.fixturenames:
        kinds: list[Any] = ["apache"]
        if metafunc.definition.get_closest_marker("all_brokers") is not None:
            kinds += _version_params(metafunc.config)
        metafunc.parametrize("session_broker", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def broker_pool() -> Iterator[dict[str, Any]]:
    """One broker per version per session, started on first use, stopped at the session's end."""
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

    @property
    def version(self) -> str:
        """The Pulsar version the broker reports."""
        return self.admin.broker_version()

    @property
    def batch_index_ack(self) -> bool:
        """Whether the broker acknowledges at batch-index level, as its admin API reports it."""
        return self.admin.runtime_configuration().get("acknowledgmentAtBatchIndexLevelEnabled") == "true"

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        return str(self.admin.create_partitioned_topic(topic, partitions))

    def restart(self, timeout_s: float = 30.0) -> None:
        pytest.skip("the broker is shared (PULSAR_NACK_TEST_BROKER): not restarted")

    def stop(self) -> None:
        """Not ours to stop."""


def _shared_broker(pool: dict[str, Any], kind: str) -> Any:
    """``apache``: the newest release, batch-index acks on; ``apache-<version>``: that version, default settings.

    ``PULSAR_NACK_TEST_BROKER="pulsar://HOST:PORT http://HOST:PORT"`` makes ``apache`` a broker
    that is already running (see :class:`RunningBroker`).
    """
    running = os.environ.get("PULSAR_NACK_TEST_BROKER")
    if kind == "apache" and running:
        url, admin_url = running.split()
        return RunningBroker(url, admin_url)
    if kind not in pool:
        from pulsar_nack.testing import PulsarStandalone

        if kind.startswith(VERSIONED):
            pool[kind] = PulsarStandalone(version=kind[len(VERSIONED) :]).start()
        else:
            pool[kind] = PulsarStandalone(batch_index_ack=True).start()
    return pool[kind]


@pytest.fixture(scope="session")
def session_broker(request: pytest.FixtureRequest, broker_pool: dict[str, Any]) -> Any:
    """The ``apache`` broker, or for ``all_brokers`` tests also each Apache Pulsar version
    (parametrized by pytest_generate_tests)."""
    return _shared_broker(broker_pool, getattr(request, "param", "apache"))


@pytest.fixture(scope="session")
def apache_broker(broker_pool: dict[str, Any]) -> Any:
    """The ``apache`` broker, whatever ``session_broker`` is parametrized as."""
    return _shared_broker(broker_pool, "apache")


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
def cluster(pulsar_cluster: Any) -> Iterator[Any]:
    """The session's cluster; every broker a test stopped, killed or froze is brought back after it."""
    yield pulsar_cluster
    for broker in pulsar_cluster.brokers:
        if broker.frozen:
            pulsar_cluster.thaw_broker(broker.index)
        if not broker.is_running():
            pulsar_cluster.restart_broker(broker.index)


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
