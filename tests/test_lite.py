"""Tests for ``pulsar_nack.testing.lite`` and its shim, against a real pulsar-lite broker and client.

Every test uses its own topic names. Waits are condition polls with generous
deadlines, never bare sleeps.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pulsar = pytest.importorskip("pulsar")
_pulsar = pytest.importorskip("_pulsar")

from pulsar_nack.errors import BrokerError  # noqa: E402
from pulsar_nack.testing import PulsarLite, quiet_client  # noqa: E402
from pulsar_nack.testing.lite import is_lite_broker_url  # noqa: E402
from pulsar_nack.testing.lite_shim import (  # noqa: E402
    apply_lite_consumer_id_shim,
    claim_lite_consumer_slot,
    reserve_consumer_ids_for_lite,
)

pytestmark = pytest.mark.broker

REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    """True if ``pid`` no longer exists or is a zombie (nobody reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def child_env() -> dict[str, str]:
    """Environment for Python children so they import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def reap(proc: subprocess.Popen[str], timeout_s: float = 15) -> None:
    """Wait for a child (killing it after ``timeout_s``) and close its pipes."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture
def broker() -> Iterator[PulsarLite]:
    b = PulsarLite()
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(broker: PulsarLite) -> Iterator[pulsar.Client]:
    c = quiet_client(broker.url, operation_timeout_seconds=10)
    try:
        yield c
    finally:
        c.close()


# --------------------------------------------------------------------------
# lifecycle
# --------------------------------------------------------------------------


def test_start_stop_process_gone_and_tempdir_removed() -> None:
    b = PulsarLite()
    assert not b.is_running()
    assert b.pid is None
    b.start()
    try:
        pid = b.pid
        assert pid is not None and b.is_running()
        assert b.url == f"pulsar://127.0.0.1:{b.port}"
        data_dir = b.data_dir
        assert (data_dir / "pulsar-lite.toml").read_text() == "[metrics]\nenabled = false\n"
        assert (data_dir / "broker.log").exists()
        with socket.create_connection(("127.0.0.1", b.port), timeout=5):
            pass
    finally:
        b.stop()
    assert not b.is_running()
    assert b.pid is None
    assert process_gone(pid)
    assert not data_dir.exists()
    b.stop()  # idempotent
    b.stop(timeout_s=0)


def test_listens_only_on_its_loopback_port(broker: PulsarLite) -> None:
    psutil = pytest.importorskip("psutil")
    listening = [
        c.laddr
        for c in psutil.Process(broker.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", broker.port)]


def test_context_manager_and_persistent_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    with PulsarLite(data_dir) as b:
        pid = b.pid
        assert pid is not None and b.is_running()
        assert b.data_dir == data_dir
    assert not b.is_running()
    assert process_gone(pid)
    assert (data_dir / "db.rocksdb").is_dir()  # a given directory is kept


def test_start_twice_raises(broker: PulsarLite) -> None:
    with pytest.raises(BrokerError, match="already running"):
        broker.start()


def test_start_after_stop_gets_fresh_broker() -> None:
    b = PulsarLite()
    try:
        b.start()
        first_dir = b.data_dir
        b.stop()
        b.start()
        assert b.is_running()
        assert b.data_dir != first_dir
    finally:
        b.stop()


def test_round_trip(client: pulsar.Client) -> None:
    topic = topic_name("round-trip")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(f"m{i}".encode())
    got = []
    for _ in range(5):
        msg = consumer.receive(timeout_millis=10_000)
        got.append(msg.data())
        consumer.acknowledge(msg)
    assert got == [f"m{i}".encode() for i in range(5)]


def test_restart_keeps_data_port_and_clients_reconnect(broker: PulsarLite) -> None:
    client = quiet_client(broker.url, operation_timeout_seconds=15)
    try:
        topic = topic_name("restart")
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"unacked")
        first = consumer.receive(timeout_millis=10_000)
        assert first.data() == b"unacked"  # delivered, deliberately not acked

        old_pid, old_port, old_dir = broker.pid, broker.port, broker.data_dir
        broker.restart()
        assert broker.is_running()
        assert broker.pid != old_pid and process_gone(old_pid)
        assert (broker.port, broker.data_dir) == (old_port, old_dir)

        # The open consumer reconnects by itself and gets the unacked message again.
        again = consumer.receive(timeout_millis=20_000)
        assert again.data() == b"unacked"
        consumer.acknowledge(again)

        # The open producer reconnects too.
        producer.send(b"after-restart")
        later = consumer.receive(timeout_millis=20_000)
        assert later.data() == b"after-restart"
        consumer.acknowledge(later)
    finally:
        client.close()


def test_early_exit_raises_with_log_tail(tmp_path: Path) -> None:
    (tmp_path / "db.rocksdb").write_text("not a directory")  # the broker cannot open its DB
    b = PulsarLite(tmp_path)
    with pytest.raises(BrokerError, match="exited with code") as info:
        b.start()
    assert "RocksDB" in str(info.value)
    assert not b.is_running()
    b.stop()


def test_port_taken_by_another_socket_raises() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: the broker's bind fails
        port = sock.getsockname()[1]
        b = PulsarLite(port=port)
        with pytest.raises(BrokerError, match=r"AddrInUse|in use"):
            b.start()
        assert not b.is_running()
        b.stop()


def test_port_of_running_broker_is_refused(broker: PulsarLite) -> None:
    other = PulsarLite(port=broker.port)
    with pytest.raises(BrokerError, match="in use"):
        other.start()
    assert broker.is_running()


def test_startup_timeout_raises_and_kills() -> None:
    b = PulsarLite(startup_timeout_s=1e-6)
    with pytest.raises(BrokerError, match="did not accept connections"):
        b.start()
    assert not b.is_running()
    b.stop()


def test_restart_before_start_raises() -> None:
    with pytest.raises(BrokerError):
        PulsarLite().restart()


def test_url_before_start_raises() -> None:
    with pytest.raises(BrokerError):
        PulsarLite().url  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"data_dir": 42}, TypeError),
        ({"data_dir": ""}, ValueError),
        ({"port": "6650"}, TypeError),
        ({"port": True}, TypeError),
        ({"port": 6650.0}, TypeError),
        ({"port": 0}, ValueError),
        ({"port": 65536}, ValueError),
        ({"port": -1}, ValueError),
        ({"log_level": 3}, TypeError),
        ({"log_level": "verbose"}, ValueError),
        ({"startup_timeout_s": "10"}, TypeError),
        ({"startup_timeout_s": 0}, ValueError),
        ({"startup_timeout_s": -1.0}, ValueError),
        ({"startup_timeout_s": float("nan")}, ValueError),
        ({"startup_timeout_s": float("inf")}, ValueError),
    ],
)
def test_constructor_rejects_bad_input(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        PulsarLite(**kwargs)  # type: ignore[arg-type]


def test_stop_rejects_bad_timeout() -> None:
    b = PulsarLite()
    with pytest.raises(TypeError):
        b.stop(timeout_s="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        b.stop(timeout_s=-1)


# --------------------------------------------------------------------------
# no broker left behind
# --------------------------------------------------------------------------

_START_AND_REPORT = textwrap.dedent(
    """
    import sys
    from pulsar_nack.testing.lite import PulsarLite
    broker = PulsarLite().start()
    print(broker.pid, broker.port, broker.data_dir, flush=True)
    if sys.argv[1] == "block":
        sys.stdin.read()
    """
)


def _spawn_reporter(mode: str) -> tuple[subprocess.Popen[str], int, int, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _START_AND_REPORT, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "child did not report a broker"
    pid_text, port_text, data_dir = line.split(maxsplit=2)
    return proc, int(pid_text), int(port_text), Path(data_dir.strip())


def test_interpreter_exit_stops_forgotten_broker() -> None:
    proc, pid, port, data_dir = _spawn_reporter("exit")
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)
    wait_for(lambda: process_gone(pid), 10, f"broker {pid} to stop at interpreter exit")
    assert not data_dir.exists()
    assert not is_lite_broker_url(f"pulsar://127.0.0.1:{port}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_broker_dies_when_parent_is_killed() -> None:
    proc, pid, port, data_dir = _spawn_reporter("block")
    try:
        assert not process_gone(pid)
        assert is_lite_broker_url(f"pulsar://127.0.0.1:{port}")
        os.kill(proc.pid, signal.SIGKILL)  # no atexit hook can run
        proc.wait(timeout=30)
        wait_for(lambda: process_gone(pid), 10, f"broker {pid} to die with its parent")
    finally:
        if proc.poll() is None:
            proc.kill()
        reap(proc)
    # Its marker is stale now: never trusted, and the next start removes it
    # together with the temporary data directory nobody was left to delete.
    assert not is_lite_broker_url(f"pulsar://127.0.0.1:{port}")
    assert data_dir.exists()
    with PulsarLite():
        assert not data_dir.exists()


# --------------------------------------------------------------------------
# consumer-id shim
# --------------------------------------------------------------------------


def test_is_embedded_broker_url(broker: PulsarLite) -> None:
    assert is_lite_broker_url(broker.url)
    assert is_lite_broker_url(f"pulsar://localhost:{broker.port}")
    assert is_lite_broker_url(broker.url + "/")
    assert not is_lite_broker_url("pulsar://pulsar.example.com:6650")
    assert not is_lite_broker_url(f"pulsar+ssl://127.0.0.1:{broker.port}")
    assert not is_lite_broker_url(f"http://127.0.0.1:{broker.port}")
    assert not is_lite_broker_url("pulsar://127.0.0.1:1")
    assert not is_lite_broker_url(f"pulsar://127.0.0.1:{broker.port},127.0.0.1:1")
    assert not is_lite_broker_url("not a url")
    with pytest.raises(TypeError):
        is_lite_broker_url(None)  # type: ignore[arg-type]


def test_url_is_no_longer_embedded_after_stop() -> None:
    b = PulsarLite().start()
    url = b.url
    assert is_lite_broker_url(url)
    b.stop()
    assert not is_lite_broker_url(url)


def test_shim_refuses_other_urls(broker: PulsarLite, client: pulsar.Client) -> None:
    real = "pulsar://pulsar.example.com:6650"
    with pytest.raises(ValueError, match="refusing"):
        reserve_consumer_ids_for_lite(client, 1, service_url=real)
    with pytest.raises(ValueError):
        claim_lite_consumer_slot(real)
    assert apply_lite_consumer_id_shim(client, real) is None


def test_shim_rejects_bad_input(broker: PulsarLite, client: pulsar.Client) -> None:
    with pytest.raises(TypeError):
        reserve_consumer_ids_for_lite(object(), 1, service_url=broker.url)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        reserve_consumer_ids_for_lite(client, "1", service_url=broker.url)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        reserve_consumer_ids_for_lite(client, -1, service_url=broker.url)
    with pytest.raises(ValueError):
        reserve_consumer_ids_for_lite(client, 1, service_url=broker.url, consumers_per_client=0)
    with pytest.raises(TypeError):
        apply_lite_consumer_id_shim(object(), broker.url)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        quiet_client(b"pulsar://127.0.0.1:1")  # type: ignore[arg-type]


def test_slots_are_distinct_within_a_process(broker: PulsarLite) -> None:
    slots = {claim_lite_consumer_slot(broker.url) for _ in range(5)}
    assert len(slots) == 5


def test_two_clients_in_one_process_share_subscription_with_shim(broker: PulsarLite) -> None:
    topic = topic_name("shim-one-process")
    clients = [quiet_client(broker.url, operation_timeout_seconds=10) for _ in range(2)]
    try:
        consumers = []
        for c in clients:
            assert apply_lite_consumer_id_shim(c, broker.url) is not None
            consumers.append(c.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared))
        producer = clients[0].create_producer(topic)
        producer.send(b"x")
        # Both consumers are attached; exactly one gets the message.
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            for consumer in consumers:
                try:
                    got.append(consumer.receive(timeout_millis=50))
                except pulsar.Timeout:
                    pass
        assert [m.data() for m in got] == [b"x"]
    finally:
        for c in clients:
            c.close()


_SHARED_WORKER = textwrap.dedent(
    """
    import os, sys
    import pulsar
    from pulsar_nack.testing import quiet_client
    from pulsar_nack.testing.lite_shim import apply_lite_consumer_id_shim

    url, topic, use_shim, stop_file = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    client = quiet_client(url, operation_timeout_seconds=3)
    try:
        if use_shim:
            apply_lite_consumer_id_shim(client, url)
        try:
            consumer = client.subscribe(
                topic, "shared-sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1
            )
        except Exception as exc:
            print("SUBSCRIBE-FAILED", type(exc).__name__, flush=True)
            sys.exit(3)
        print("READY", flush=True)
        while not os.path.exists(stop_file):
            try:
                msg = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            print("GOT", msg.data().decode(), flush=True)
            consumer.acknowledge(msg)
    finally:
        client.close()
    """
)


def _spawn_worker(url: str, topic: str, use_shim: bool, stop_file: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _SHARED_WORKER, url, topic, "1" if use_shim else "0", str(stop_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )


def test_without_shim_second_process_is_refused(broker: PulsarLite, tmp_path: Path) -> None:
    """Documents the pulsar-lite limitation the shim exists for.

    If this starts failing, pulsar-lite stopped keying consumers by the
    client-chosen id, and the shim may no longer be needed.
    """
    topic = topic_name("no-shim")
    stop_file = tmp_path / "stop"
    first = _spawn_worker(broker.url, topic, False, stop_file)
    second = None
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "READY"
        second = _spawn_worker(broker.url, topic, False, stop_file)
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 3
        assert "SUBSCRIBE-FAILED" in out
        assert "Consumer 0 already exists" in broker.log_path.read_text()
    finally:
        stop_file.touch()
        for proc in (first, second):
            if proc is not None:
                reap(proc)


class _LineReader:
    """Collects a child's stdout lines on a daemon thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.strip())

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def payloads(self) -> list[str]:
        return [line.split()[1] for line in list(self.lines) if line.startswith("GOT ")]


def test_shim_lets_two_processes_share_one_subscription(
    broker: PulsarLite, client: pulsar.Client, tmp_path: Path
) -> None:
    topic = topic_name("shim-two-processes")
    stop_file = tmp_path / "stop"
    workers = [_spawn_worker(broker.url, topic, True, stop_file) for _ in range(2)]
    readers = [_LineReader(w) for w in workers]
    expected = sorted(f"m{i:02d}" for i in range(40))
    try:
        wait_for(lambda: all("READY" in r.lines for r in readers), 30, "both workers to subscribe")

        producer = client.create_producer(topic, batching_enabled=False)
        for payload in expected:
            producer.send(payload.encode())

        wait_for(
            lambda: len(readers[0].payloads()) + len(readers[1].payloads()) >= len(expected),
            30,
            "the workers to consume every message",
        )
        stop_file.touch()
        for w in workers:
            assert w.wait(timeout=20) == 0
    finally:
        stop_file.touch()
        for w in workers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                w.kill()
        for r in readers:
            r.join(15)  # EOF follows the exit; join before the pipe is closed
        for w in workers:
            reap(w)

    # Every message reached exactly one process, and both processes consumed.
    received = [r.payloads() for r in readers]
    assert sorted(received[0] + received[1]) == expected
    assert received[0] and received[1]
