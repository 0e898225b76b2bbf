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
    for release in dist.RELEASES:  # the tarball and the classpath kind alike
        with pytest.raises(BrokerError, match="needs Maven: `mvn` is not on PATH") as caught:
            dist.ensure_distribution(release)
        assert isinstance(caught.value, PulsarNackError)
    assert not [p for p in (tmp_path / "empty-cache").iterdir() if p.name != ".lock"], "left files behind"


def test_missing_java_is_a_clear_error() -> None:
    with pytest.raises(BrokerError, match="needs a Java runtime"):
        dist.choose_release({})
    with pytest.raises(BrokerError, match=r"no installed JDK runs Apache Pulsar \(4\.0\.8 needs Java 21 or newer; "):
        dist.choose_release({Path("/opt/old-jdk"): 11})
    # 3.0 supports Java 17 only: a Java 25 machine is told so, naming the JDK it found.
    with pytest.raises(BrokerError, match=r"Apache Pulsar '3\.x' \(3\.0\.7 needs Java 17\); found only /j25 \(Java 25\)"):
        dist.choose_release({Path("/j25"): 25}, version="3.x")
    with pytest.raises(BrokerError, match=r"4\.0\.8 needs Java 21 or newer\); found only /j17"):
        dist.choose_release({Path("/j17"): 17}, version="4.0.8")


def test_release_choice_prefers_the_newest_lts_the_jdks_run() -> None:
    release, home = dist.choose_release({Path("/j17"): 17, Path("/j25"): 25, Path("/j21"): 21})
    assert (release.version, release.kind, home) == ("4.0.8", "distribution", Path("/j25"))
    release, home = dist.choose_release({Path("/j17"): 17})
    assert (release.version, release.kind, home) == ("3.0.7", "classpath", Path("/j17"))


@pytest.mark.parametrize("spec", ["3", "3.x", "3.0", "3.0.x", "3.0.7", " 3.0 "])
def test_a_version_can_be_asked_for_and_gets_a_jdk_that_runs_it(spec: str) -> None:
    release, home = dist.choose_release({Path("/j17"): 17, Path("/j25"): 25}, version=spec)
    assert (release.version, home) == ("3.0.7", Path("/j17"))
    release, home = dist.choose_release({Path("/j17"): 17, Path("/j25"): 25}, version="4.0")
    assert (release.version, home) == ("4.0.8", Path("/j25"))


def test_a_version_we_cannot_run_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"version '3\.3' names no Apache Pulsar release we can run; known: 4\.0\.8, 3\.0\.7"):
        PulsarStandalone(version="3.3")
    for bad in ("", "x", "4.0.8-SNAPSHOT", "latest"):
        with pytest.raises(ValueError, match="version must look like"):
            PulsarStandalone(version=bad)
    with pytest.raises(TypeError, match="version must be a str"):
        PulsarStandalone(version=4.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch_index_ack must be a bool or None"):
        PulsarStandalone(batch_index_ack="true")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must map str to str"):
        PulsarStandalone(config={"acknowledgmentAtBatchIndexLevelEnabled": True})  # type: ignore[dict-item]


def test_the_pulsar_home_variable_serves_only_the_version_it_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "apache-pulsar-4.0.8"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "pulsar").write_text("#!/bin/sh\n")
    (home / "lib").mkdir()
    (home / "lib" / "org.apache.pulsar-pulsar-broker-common-4.0.8.jar").touch()
    (home / "lib" / "org.apache.pulsar-pulsar-broker-4.0.8.jar").touch()
    monkeypatch.setenv("PULSAR_NACK_PULSAR_HOME", str(home))
    monkeypatch.setenv("PULSAR_NACK_CACHE", str(tmp_path / "cache"))
    assert dist.home_version(home) == "4.0.8"
    assert dist.ensure_distribution(dist.RELEASES[0]) == home
    # 3.0.7 is not in it: it comes from the cache, here with no mvn, so a clear error.
    monkeypatch.setattr(dist.shutil, "which", lambda name: None)
    with pytest.raises(BrokerError, match="needs Maven"):
        dist.ensure_distribution(dist.matching_releases("3.0")[0])


def test_a_failed_download_says_what_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSAR_NACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PULSAR_NACK_PULSAR_HOME", raising=False)
    for kind in ("distribution", "classpath"):
        missing = dist.PulsarRelease("0.0.0-no-such-version", 17, kind=kind)  # type: ignore[arg-type]
        with pytest.raises(BrokerError, match=r"could not fetch Apache Pulsar 0\.0\.0-no-such-version"):
            dist.ensure_distribution(missing)
        assert not [p for p in (tmp_path / "cache").iterdir() if p.name != ".lock"], f"{kind}: left files behind"


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


def _first_index_back_after_acking_index_0(broker: Any) -> int:
    """Publish one entry of 3 messages, ack index 0 (client batch-index acks on), close,
    subscribe again: the batch index of the first message back. 1 when the broker keeps
    batch-index acks, 0 when it redelivers the whole entry."""
    client = quiet_client(broker.url)
    try:
        topic = f"persistent://public/default/batch-index-ack-{broker.pid}"
        options = {"consumer_type": pulsar.ConsumerType.Shared, "batch_index_ack_enabled": True}
        consumer = client.subscribe(topic, "s", **options)
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=3, batching_max_publish_delay_ms=10_000
        )
        for i in range(3):
            producer.send_async(b"%d" % i, None)
        producer.flush()
        messages = [consumer.receive(10_000) for _ in range(3)]
        ids = [m.message_id() for m in messages]
        assert [i.batch_index() for i in ids] == [0, 1, 2] and len({i.entry_id() for i in ids}) == 1
        consumer.acknowledge(messages[0])
        consumer.close()  # flushes the grouped ack; 1 and 2 stay unacked
        again = client.subscribe(topic, "s", **options)
        return int(again.receive(10_000).message_id().batch_index())
    finally:
        client.close()


@pytest.mark.all_brokers
def test_each_version_starts_with_its_own_batch_index_ack_default(session_broker: Any, request: Any) -> None:
    """``apache`` turns batch-index acks on; ``apache-<version>`` keeps the version's default,
    as its admin API reports it and as it behaves."""
    param = request.node.callspec.params["session_broker"]
    release = session_broker.release
    assert session_broker.admin.broker_version() == session_broker.version == release.version
    assert release.runs_on(dist.java_major(session_broker.java_home) or 0)
    if param == "apache":
        expected = True
    else:
        assert param == f"apache-{release.version}"
        expected = release.default_batch_index_ack
    assert session_broker.batch_index_ack is expected
    assert _first_index_back_after_acking_index_0(session_broker) == (1 if expected else 0)


def test_an_unload_the_broker_answers_with_http_500_is_asked_again_and_other_errors_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in for the broker's answers (no broker fails an unload on demand): an HTTP 500
    is asked again, twice at most; any other error at once."""
    from pulsar_nack.errors import BrokerError
    from pulsar_nack.testing.admin import PulsarAdmin

    admin = PulsarAdmin("http://127.0.0.1:1")
    answers: list[BrokerError | None] = []
    calls: list[str] = []

    def request(method: str, path: str, body: object = None) -> None:
        calls.append(f"{method} {path}")
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(admin, "request", request)
    busy = BrokerError("PUT x/unload: HTTP 500 Consumer already closed")
    answers[:] = [busy, None]
    admin.unload_topic("persistent://public/default/t")
    assert calls == ["PUT persistent/public/default/t/unload"] * 2
    calls.clear()
    answers[:] = [busy, busy, busy]
    with pytest.raises(BrokerError, match="HTTP 500"):
        admin.unload_namespace("public/default")
    assert len(calls) == 3
    calls.clear()
    answers[:] = [BrokerError("PUT x/unload: HTTP 404 not found")]
    with pytest.raises(BrokerError, match="HTTP 404"):
        admin.unload_bundle("public/default", "0x00000000_0x10000000")
    assert len(calls) == 1
