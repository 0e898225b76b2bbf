"""``pulsar_nack.testing.PulsarStandalone``: Apache Pulsar's own broker, started and stopped by us."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pulsar
import pytest

from helpers import wait_for
from pulsar_nack.errors import BrokerError, PulsarNackError
from pulsar_nack.testing import PulsarStandalone, quiet_client
from pulsar_nack.testing import distribution as dist
from pulsar_nack.testing.standalone import DEFAULT_JVM_OPTIONS

pytestmark = pytest.mark.broker
REPO_ROOT = Path(__file__).resolve().parents[1]


def test_url_answers_a_client_and_admin_lists_the_default_namespace(apache_broker: Any) -> None:
    assert apache_broker.url.startswith("pulsar://127.0.0.1:")
    assert apache_broker.admin_url.startswith("http://127.0.0.1:")
    assert "public/default" in apache_broker.admin.namespaces("public")
    client = quiet_client(apache_broker.url)
    try:
        topic = "persistent://public/default/standalone-hello"
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"hello")
        assert consumer.receive(10_000).data() == b"hello"
    finally:
        client.close()


def test_listens_on_loopback_only(apache_broker: Any) -> None:
    listening = [c for c in psutil.Process(apache_broker.pid).net_connections() if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 3  # binary, admin HTTP, bookie
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}, listening


def test_creates_partitioned_topics_through_the_admin_api(apache_broker: Any) -> None:
    name = apache_broker.create_partitioned_topic("standalone-parts", 3)
    assert name == "persistent://public/default/standalone-parts"
    meta = apache_broker.admin.request("GET", "persistent/public/default/standalone-parts/partitions")
    assert meta["partitions"] == 3
    with pytest.raises(ValueError):
        apache_broker.create_partitioned_topic("standalone-none", 0)
    with pytest.raises(BrokerError):  # exists already
        apache_broker.create_partitioned_topic("standalone-parts", 3)


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    with pytest.raises(TypeError):
        PulsarStandalone(heap=512)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PulsarStandalone(heap="lots")
    with pytest.raises(ValueError):
        PulsarStandalone(startup_timeout_s=0)
    with pytest.raises(BrokerError):
        _ = PulsarStandalone().url  # never started: no port yet
    with pytest.raises(TypeError, match="jvm_options"):
        PulsarStandalone(jvm_options="-XX:TieredStopAtLevel=1")  # a str, not a sequence of them
    with pytest.raises(TypeError, match="jvm_options"):
        PulsarStandalone(jvm_options=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="jvm_options"):
        PulsarStandalone(jvm_options=["-Xss1m -Xint"])  # bin/pulsar would split it
    with pytest.raises(ValueError, match="jvm_options"):
        PulsarStandalone(jvm_options=[""])


def test_the_broker_jvm_runs_the_default_jvm_options(apache_broker: Any) -> None:
    """C1 only (``DEFAULT_JVM_OPTIONS``): about half the CPU to start (bench/results/startup.json)."""
    assert DEFAULT_JVM_OPTIONS == ("-XX:TieredStopAtLevel=1",)
    command = psutil.Process(apache_broker.pid).cmdline()
    assert command[0].endswith("java") and "org.apache.pulsar.PulsarStandaloneStarter" in command
    assert set(DEFAULT_JVM_OPTIONS) <= set(command), command


def test_missing_maven_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSAR_NACK_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("PULSAR_NACK_PULSAR_HOME", raising=False)
    monkeypatch.setattr(dist.shutil, "which", lambda name: None if name == "mvn" else "/usr/bin/" + name)
    with pytest.raises(BrokerError, match="needs Maven: `mvn` is not on PATH") as caught:
        dist.ensure_distribution(dist.RELEASES[0])
    assert isinstance(caught.value, PulsarNackError)


def test_missing_java_is_a_clear_error() -> None:
    with pytest.raises(BrokerError, match="needs a Java runtime"):
        dist.choose_release({})
    with pytest.raises(BrokerError, match="needs Java 17 or newer"):
        dist.choose_release({Path("/opt/old-jdk"): 11})


def test_release_choice_prefers_the_newest_lts_the_jdks_run() -> None:
    release, home = dist.choose_release({Path("/j17"): 17, Path("/j25"): 25, Path("/j21"): 21})
    assert (release.version.split(".")[0], home) == ("4", Path("/j25"))
    release, home = dist.choose_release({Path("/j17"): 17})
    assert (release.version.split(".")[0], home) == ("3", Path("/j17"))


def test_a_failed_download_says_what_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSAR_NACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PULSAR_NACK_PULSAR_HOME", raising=False)
    missing = dist.PulsarRelease("0.0.0-no-such-version", 17)
    with pytest.raises(BrokerError, match=r"could not fetch Apache Pulsar 0\.0\.0-no-such-version"):
        dist.ensure_distribution(missing)
    assert not list((tmp_path / "cache").glob("download-*")), "the failed download left files behind"


_STARTER = textwrap.dedent(
    """
    import sys, time
    from pulsar_nack.testing import PulsarStandalone
    broker = PulsarStandalone().start()
    print(broker.pid, broker.data_dir, flush=True)
    time.sleep(600)
    """
)


def test_nothing_is_left_behind_when_the_interpreter_is_killed() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    child = subprocess.Popen([sys.executable, "-c", _STARTER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line, "the child did not start a broker"
        pid = int(line.split()[0])
        assert psutil.pid_exists(pid)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_for(gone, 30), "the broker JVM outlived the interpreter that started it"


def test_stop_removes_the_process_and_the_temporary_directory(tmp_path: Path) -> None:
    broker = PulsarStandalone().start()
    pid, data_dir = broker.pid, broker.data_dir
    assert pid is not None and data_dir.exists() and broker.log_path.exists()
    broker.stop()
    assert broker.pid is None and not psutil.pid_exists(pid) and not data_dir.exists()
    broker.stop()  # idempotent
    with pytest.raises(BrokerError):
        broker.restart()


def test_restart_keeps_messages_and_clients_reconnect(apache_broker: Any) -> None:
    client = quiet_client(apache_broker.url, operation_timeout_seconds=60)
    try:
        topic = "persistent://public/default/standalone-restart"
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        old_pid = apache_broker.pid
        apache_broker.restart()
        assert apache_broker.pid != old_pid
        assert consumer.receive(60_000).data() == b"before"  # unacked: redelivered after the restart
        producer.send(b"after")
        assert wait_for(lambda: consumer.receive(60_000).data() == b"after", 60)
    finally:
        client.close()
