"""A small Apache Pulsar cluster on loopback: ZooKeeper, one bookie and N brokers, each its own JVM.

:class:`PulsarCluster` runs the same distribution as
:class:`~pulsar_nack.testing.PulsarStandalone` (fetched once by
:mod:`~pulsar_nack.testing.distribution`), as separate processes, so that a test can
kill, freeze or restart one broker while the others serve::

    data_dir/
        zookeeper.conf  zookeeper.log  zookeeper/          metadata (ZooKeeper)
        initialize-cluster-metadata.log                     the one-off setup JVM
        bookie.conf     bookie.log     bookie/              journal and ledgers
        broker-0.conf   broker-0.log                        brokers keep no data
        broker-1.conf   broker-1.log
        logs/<name>/                                        log4j's own files

    127.0.0.1:ZK                   ZooKeeper (metadata and configuration store)
    127.0.0.1:BK, 127.0.0.1:BKS    the bookie and its stats
    127.0.0.1:P_i, 127.0.0.1:W_i   broker i: binary protocol and admin REST API

The order is ZooKeeper, then ``bin/pulsar initialize-cluster-metadata`` (which also
formats BookKeeper's ``/ledgers``), then the bookie and all brokers together. Every
socket is bound to 127.0.0.1; each JVM gets a bounded heap (ZooKeeper 128 MB; the bookie
and each broker 256 MB plus as much direct memory). Brokers use
``metadataStoreSessionTimeoutMillis=6000`` (the default is 30 s) so that the topics of a
killed broker move within seconds, batch-index acknowledgement like
:class:`~pulsar_nack.testing.PulsarStandalone`, and no load shedding or automatic bundle
splits, so that topics only move when a test moves them.

>>> PulsarCluster(brokers=0)
Traceback (most recent call last):
...
ValueError: brokers must be >= 1, got 0
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from .._validate import check_int, check_seconds
from ..errors import BrokerError
from ._process import (
    LOOPBACK,
    accepts_connections,
    free_loopback_port,
    parent_death_signal_preexec,
    read_tail,
    terminate_process,
)
from .admin import PulsarAdmin, topic_path
from .distribution import PulsarRelease, choose_release, ensure_distribution

__all__ = ["BOOKIE_MAIN_CLASS", "BROKER_MAIN_CLASS", "ZOOKEEPER_MAIN_CLASS", "ClusterBroker", "ClusterNode",
           "PulsarCluster"]

ZOOKEEPER_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
BOOKIE_MAIN_CLASS = "org.apache.bookkeeper.server.Main"
BROKER_MAIN_CLASS = "org.apache.pulsar.PulsarBrokerStarter"
"""The main classes in the JVMs' command lines (the test suite's leftover check looks for them)."""

CLUSTER_NAME = "pulsar-nack"
_TEMP_PREFIX = "pulsar-nack-cluster-"
_POLL_INTERVAL_S = 0.2
_SETUP_TIMEOUT_S = 120.0
_ZOOKEEPER_MEM = "-Xms32m -Xmx128m"
_GC = "-XX:+UseG1GC -XX:+PerfDisableSharedMem"
_INHERITED_PREFIXES = ("PULSAR_", "BOOKIE_", "BK_")


def _java_mem(heap: str) -> str:
    return f"-Xms64m -Xmx{heap} -XX:MaxDirectMemorySize={heap}"


def _check_heap(name: str, heap: object) -> str:
    if not isinstance(heap, str):
        raise TypeError(f"{name} must be a str such as '256m', got {type(heap).__name__}")
    if not heap[:-1].isdigit() or heap[-1:].lower() not in ("m", "g"):
        raise ValueError(f"{name} must look like '256m' or '1g', got {heap!r}")
    return heap


def _check_config(name: str, config: object) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in config.items()):
        raise TypeError(f"{name} must map str to str")
    return dict(config)


def override_properties(text: str, overrides: Mapping[str, str]) -> str:
    """*text* (a ``key=value`` file) with each key of *overrides* set in place, the rest appended.

    In place because ``bookkeeper.conf`` keeps the *first* of two equal keys.

    >>> print(override_properties("a=1\\n# b=2\\nc = 3\\n", {"c": "4", "b": "5"}))
    a=1
    # b=2
    c=4
    b=5
    <BLANKLINE>
    """
    pending = dict(overrides)
    lines = []
    for line in text.splitlines():
        match = re.match(r"\s*([^#!=\s][^=\s]*)\s*=", line)
        key = match.group(1) if match else None
        if key in pending:
            lines.append(f"{key}={pending.pop(key)}")
        elif key is None or key not in overrides:
            lines.append(line)
    lines.extend(f"{key}={value}" for key, value in pending.items())
    return "\n".join(lines) + "\n"


def _zookeeper_ok(port: int) -> bool:
    """ZooKeeper answers ``ruok`` with ``imok``."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0) as sock:
            sock.sendall(b"ruok")
            return sock.recv(16) == b"imok"
    except OSError:
        return False


class ClusterNode:
    """One JVM of a :class:`PulsarCluster`, started with ``bin/pulsar <command>``, stopped by its PID.

    Parameters
    ----------
    name : str
        ``"zookeeper"``, ``"bookie"`` or ``"broker-<i>"``: names its config and log files.
    command : str
        The ``bin/pulsar`` command.
    conf_variable : str
        The environment variable ``bin/pulsar`` reads the config path from.
    """

    def __init__(self, name: str, command: str, conf_variable: str) -> None:
        self.name = name
        self.command = command
        self.conf_variable = conf_variable
        self.frozen = False
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._log_offset = 0
        self._dir: Path | None = None

    @property
    def pid(self) -> int | None:
        """PID of the JVM while it runs (frozen or not), else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def log_path(self) -> Path:
        """The JVM's stdout and stderr."""
        if self._dir is None:
            raise BrokerError(f"{self.name} was never started")
        return self._dir / f"{self.name}.log"

    @property
    def conf_path(self) -> Path:
        if self._dir is None:
            raise BrokerError(f"{self.name} was never started")
        return self._dir / f"{self.name}.conf"

    def is_running(self) -> bool:
        """True while the JVM lives (also while it is frozen)."""
        return self.pid is not None

    def exit_code(self) -> int | None:
        """The JVM's exit status once it has exited after a launch, else None."""
        process = self._process
        return None if process is None else process.poll()

    def log_tail(self) -> str:
        """The last few KB this JVM logged since its latest launch."""
        return read_tail(self.log_path, self._log_offset)

    def launch(self, home: Path, directory: Path, env: dict[str, str], arguments: Iterable[str] = ()) -> None:
        """Start the JVM (its config must already be in *directory*); return at once."""
        if self.is_running():
            raise BrokerError(f"{self.name} is already running (pid {self.pid})")
        self._dir = directory
        env = {**env, self.conf_variable: str(self.conf_path), "PULSAR_LOG_DIR": str(directory / "logs" / self.name)}
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed by terminate_process
        self._log_offset = log_file.tell()
        try:
            process = subprocess.Popen(
                [str(home / "bin" / "pulsar"), self.command, *arguments],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(directory),
                env=env,
                close_fds=True,
                preexec_fn=parent_death_signal_preexec(),  # noqa: PLW1509 - see its docstring
            )
        except BaseException:
            log_file.close()
            raise
        self._process, self._log_file, self.frozen = process, log_file, False
        self._finalizer = weakref.finalize(self, terminate_process, process, log_file, 20.0)

    def send_signal(self, sig: signal.Signals) -> None:
        """Send *sig* to the JVM by the PID we started; BrokerError if it does not run."""
        process = self._process
        if process is None or process.poll() is not None:
            raise BrokerError(f"{self.name} is not running")
        process.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    def kill(self) -> None:
        """SIGKILL the JVM (a crash) and reap it. No-op if it does not run."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._release(0.0)

    def terminate(self, timeout_s: float) -> None:
        """SIGCONT if frozen, SIGTERM, SIGKILL after *timeout_s*; close the log. Idempotent."""
        process = self._process
        if process is not None and process.poll() is None and self.frozen:
            process.send_signal(signal.SIGCONT)
        self._release(timeout_s)

    def begin_terminate(self) -> None:
        """Thaw and SIGTERM without waiting, so that several JVMs shut down together."""
        process = self._process
        if process is not None and process.poll() is None:
            if self.frozen:
                process.send_signal(signal.SIGCONT)
            self.frozen = False
            process.terminate()

    def _release(self, timeout_s: float) -> None:
        process, log_file, finalizer = self._process, self._log_file, self._finalizer
        self._log_file = self._finalizer = None
        self.frozen = False
        if finalizer is not None:
            finalizer.detach()
        if process is not None:
            terminate_process(process, log_file, timeout_s)

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else "running" if self.is_running() else "stopped"
        return f"{type(self).__name__}({self.name}, pid={self.pid}, {state})"


class ClusterBroker(ClusterNode):
    """One broker of a :class:`PulsarCluster`: its ports, URLs and JVM.

    Attributes
    ----------
    index : int
        Its position in :attr:`PulsarCluster.brokers`.
    port, web_port : int
        The binary protocol's and the admin REST API's ports on 127.0.0.1.
    """

    def __init__(self, index: int, port: int, web_port: int) -> None:
        super().__init__(f"broker-{index}", "broker", "PULSAR_BROKER_CONF")
        self.index = index
        self.port = port
        self.web_port = web_port

    @property
    def url(self) -> str:
        """This broker's own service URL, ``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def admin_url(self) -> str:
        """This broker's admin REST API, ``http://127.0.0.1:WEB_PORT``."""
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def broker_id(self) -> str:
        """How the cluster names it (``/admin/v2/brokers``, ``destinationBroker``): ``127.0.0.1:WEB_PORT``."""
        return f"{LOOPBACK}:{self.web_port}"

    @property
    def admin(self) -> PulsarAdmin:
        return PulsarAdmin(self.admin_url)

    def is_ready(self, cluster_name: str) -> bool:
        """The binary port accepts and the cluster's broker list names this broker."""
        if not accepts_connections(self.port):
            return False
        try:
            return self.broker_id in self.admin.brokers(cluster_name)
        except (urllib.error.URLError, OSError, ValueError, BrokerError):
            return False


class PulsarCluster:
    """ZooKeeper, one bookie and *brokers* Apache Pulsar brokers on ``127.0.0.1``; a context manager.

    Parameters
    ----------
    brokers : int
        How many brokers (default 2).
    data_dir : path, optional
        Where configs, logs and data go; it must be empty or absent (it is kept after
        :meth:`stop`, for its logs). None: a fresh temporary directory, removed by
        :meth:`stop`.
    heap : str
        Each broker's and the bookie's ``-Xmx`` and direct memory bound (default ``"256m"``).
        ZooKeeper gets 128 MB.
    session_timeout_ms : int
        The brokers' ``metadataStoreSessionTimeoutMillis`` (default 6000): how long a killed
        broker keeps owning its topics. 4,000 to 40,000: ZooKeeper grants no session
        outside 2 to 20 ticks of 2 s.
    broker_config : mapping, optional
        Extra ``broker.conf`` settings for every broker, set over ours.
    startup_timeout_s : float
        How long each start phase (ZooKeeper; bookie and brokers) and each broker restart
        may take (default 180 s).

    Raises
    ------
    BrokerError
        From :meth:`start`: no JDK, a failed download, or a JVM that exits or is not
        ready in time (with the tail of its log).

    Notes
    -----
    Cleanup works as for :class:`~pulsar_nack.testing.PulsarStandalone`: :meth:`stop` and
    the context manager stop every JVM by PID (brokers first, then the bookie, then
    ZooKeeper; SIGTERM, then SIGKILL), finalizers stop them at interpreter exit, and on
    Linux each JVM gets ``PR_SET_PDEATHSIG``.
    """

    cluster_name = CLUSTER_NAME

    def __init__(
        self,
        brokers: int = 2,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        heap: str = "256m",
        session_timeout_ms: int = 6000,
        broker_config: Mapping[str, str] | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(f"data_dir must be a str, os.PathLike or None, got {type(data_dir).__name__}")
        self._broker_count = check_int("brokers", brokers, 1, 16)
        self._data_dir_arg = None if data_dir is None else Path(os.fspath(data_dir)).absolute()
        self._heap = _check_heap("heap", heap)
        # ZooKeeper grants sessions of 2 to 20 ticks (4-40 s with tickTime=2000)
        self._session_timeout_ms = check_int("session_timeout_ms", session_timeout_ms, 4000, 40_000)
        self._broker_config = _check_config("broker_config", broker_config)
        self._startup_timeout_s = check_seconds("startup_timeout_s", startup_timeout_s, allow_zero=False)
        self._data_dir: Path | None = None
        self._dir_finalizer: weakref.finalize | None = None
        self._home: Path | None = None
        self.release: PulsarRelease | None = None
        self.java_home: Path | None = None
        self.zookeeper = ClusterNode("zookeeper", "zookeeper", "PULSAR_ZK_CONF")
        self.bookie = ClusterNode("bookie", "bookie", "PULSAR_BOOKKEEPER_CONF")
        self.brokers: list[ClusterBroker] = []
        self._zk_port = 0
        self._bookie_ports = (0, 0)
        self.startup_phases_s: dict[str, float] = {}
        """Seconds each phase of the latest :meth:`start` took (``zookeeper``, ``metadata``, ``brokers``)."""

    # ------------------------------------------------------------------ info

    @property
    def url(self) -> str:
        """The multi-host service URL, ``pulsar://127.0.0.1:P0,127.0.0.1:P1``."""
        self._check_started()
        return "pulsar://" + ",".join(f"{LOOPBACK}:{broker.port}" for broker in self.brokers)

    @property
    def admin_url(self) -> str:
        """The admin REST API of the first broker that runs and is not frozen (else broker 0's)."""
        self._check_started()
        for broker in self.brokers:
            if broker.is_running() and not broker.frozen:
                return broker.admin_url
        return self.brokers[0].admin_url

    @property
    def admin(self) -> PulsarAdmin:
        """A small client of :attr:`admin_url`."""
        return PulsarAdmin(self.admin_url)

    @property
    def session_timeout_ms(self) -> int:
        """The brokers' ``metadataStoreSessionTimeoutMillis``."""
        return self._session_timeout_ms

    @property
    def version(self) -> str:
        if self.release is None:
            raise BrokerError("the cluster is not started")
        return self.release.version

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise BrokerError("no data directory: the cluster is not started")
        return self._data_dir

    @property
    def nodes(self) -> list[ClusterNode]:
        """Every JVM: ZooKeeper, the bookie, then the brokers."""
        return [self.zookeeper, self.bookie, *self.brokers]

    def is_running(self) -> bool:
        """True while every JVM of the cluster runs."""
        return bool(self.brokers) and all(node.is_running() for node in self.nodes)

    def __repr__(self) -> str:
        state = ", ".join(repr(node) for node in self.nodes) if self.brokers else "stopped"
        return f"PulsarCluster({state})"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> PulsarCluster:
        """Start ZooKeeper, set up the cluster's metadata, then the bookie and the brokers together.

        Returns when ZooKeeper answers, the bookie accepts connections and every broker is
        listed by the cluster. Idempotent while everything runs.
        """
        if self.is_running():
            return self
        if self.brokers:
            raise BrokerError(f"partly running; stop() it first: {self!r}")
        self.release, self.java_home = choose_release()
        self._home = ensure_distribution(self.release)
        self._ensure_data_dir()
        try:
            self._start_all()
        except BaseException:
            self.stop(timeout_s=5.0)
            raise
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every JVM by PID: the brokers together, then the bookie, then ZooKeeper. Idempotent.

        Frozen JVMs are resumed first so that SIGTERM reaches them. Removes the data
        directory if it was a temporary one.
        """
        timeout = check_seconds("timeout_s", timeout_s, allow_zero=True)
        for broker in self.brokers:
            broker.begin_terminate()
        for node in [*self.brokers, self.bookie, self.zookeeper]:
            node.terminate(timeout)
        self.brokers = []
        if self._dir_finalizer is not None:
            self._dir_finalizer()
            self._dir_finalizer = None
            self._data_dir = None

    def __enter__(self) -> PulsarCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------- broker faults

    def broker(self, index: int) -> ClusterBroker:
        """Broker *index* (IndexError outside ``range(len(brokers))``)."""
        self._check_started()
        check_int("index", index, 0)
        if index >= len(self.brokers):
            raise IndexError(f"index {index} out of range: the cluster has {len(self.brokers)} brokers")
        return self.brokers[index]

    def kill_broker(self, index: int) -> None:
        """SIGKILL broker *index*: a crash. Its topics move once its metadata session expires."""
        self.broker(index).kill()

    def stop_broker(self, index: int, timeout_s: float = 30.0) -> None:
        """Stop broker *index* gracefully (SIGTERM: it hands its topics over), SIGKILL after *timeout_s*."""
        self.broker(index).terminate(check_seconds("timeout_s", timeout_s, allow_zero=True))

    def restart_broker(self, index: int, timeout_s: float = 30.0) -> ClusterBroker:
        """Stop broker *index* if it runs, start it again on the same ports, wait until it is listed."""
        broker = self.broker(index)
        broker.terminate(check_seconds("timeout_s", timeout_s, allow_zero=True))
        broker.launch(self._started_home(), self.data_dir, self._environment(self._heap))
        self._wait_ready({broker: lambda: broker.is_ready(self.cluster_name)}, "restart")
        return broker

    def freeze_broker(self, index: int) -> None:
        """SIGSTOP broker *index*: it holds its sockets and its metadata session until thawed or it expires."""
        self.broker(index).send_signal(signal.SIGSTOP)

    def thaw_broker(self, index: int) -> None:
        """SIGCONT broker *index*."""
        self.broker(index).send_signal(signal.SIGCONT)

    # --------------------------------------------------- topics and owners

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        """Create *topic* with *partitions* partitions; return its full name."""
        return self.admin.create_partitioned_topic(topic, partitions)

    def unload_topic(self, topic: str) -> None:
        """Unload *topic* (all partitions of a partitioned one); its clients reconnect."""
        self.admin.unload_topic(topic)

    def unload_namespace(self, namespace: str = "public/default") -> None:
        """Unload every bundle of *namespace*."""
        self.admin.unload_namespace(namespace)

    def unload_bundle(self, namespace: str, bundle: str, to_broker: int | None = None) -> None:
        """Unload one bundle of *namespace*; with *to_broker*, that broker owns it next."""
        destination = None if to_broker is None else self.broker(to_broker).broker_id
        self.admin.unload_bundle(namespace, bundle, destination)

    def owner_of(self, topic: str) -> int:
        """The index of the broker that owns *topic* (a lookup: an unowned topic gets an owner)."""
        answer = self.admin.lookup(topic)
        url = str(answer.get("brokerUrl", ""))
        for broker in self.brokers:
            if url.rstrip("/") == broker.url:
                return broker.index
        raise BrokerError(f"lookup of {topic} names no broker of this cluster: {answer}")

    def move_topic(self, topic: str, to_broker: int, timeout_s: float = 30.0) -> None:
        """Move *topic*'s bundle (and every topic in it) to broker *to_broker*; wait until it owns it."""
        target = self.broker(to_broker)
        deadline = time.monotonic() + check_seconds("timeout_s", timeout_s, allow_zero=False)
        namespace = "/".join(topic_path(topic).split("/")[1:3])
        while self.owner_of(topic) != to_broker:
            if time.monotonic() >= deadline:
                raise BrokerError(f"{topic} did not move to {target.name} within {timeout_s} s")
            self.admin.unload_bundle(namespace, self.admin.topic_bundle(topic), target.broker_id)
            time.sleep(_POLL_INTERVAL_S)

    def spread_partitions(self, topic: str, partitions: int, timeout_s: float = 60.0) -> dict[int, int]:
        """Move the partitions of *topic* so that brokers own them round-robin where bundles allow.

        Partition *p* goes to broker ``p % len(brokers)``; partitions that share a bundle
        go where the first of them goes. Returns partition -> owner index. Raises
        BrokerError if in the end a broker owns none (all partitions in one bundle).
        """
        check_int("partitions", partitions, 1)
        full = "persistent://" + topic_path(topic).split("/", 1)[1]
        placed: dict[str, int] = {}
        for partition in range(partitions):
            name = f"{full}-partition-{partition}"
            bundle = self.admin.topic_bundle(name)
            target = placed.setdefault(bundle, partition % len(self.brokers))
            self.move_topic(name, target, timeout_s)
        owners = {p: self.owner_of(f"{full}-partition-{p}") for p in range(partitions)}
        if partitions >= len(self.brokers) and len(set(owners.values())) < len(self.brokers):
            raise BrokerError(f"the partitions of {topic} share bundles; owners {owners}")
        return owners

    # -------------------------------------------------------------- private

    def _check_started(self) -> None:
        if not self.brokers:
            raise BrokerError("the cluster is not started; call start() first")

    def _started_home(self) -> Path:
        if self._home is None:
            raise BrokerError("the cluster is not started; call start() first")
        return self._home

    def _ensure_data_dir(self) -> None:
        if self._data_dir_arg is not None:
            if self._data_dir_arg.is_dir() and any(self._data_dir_arg.iterdir()):
                # the bookie's cookie names its old port, ZooKeeper holds the old cluster
                raise BrokerError(f"data_dir must be empty or absent: {self._data_dir_arg} is not empty")
            self._data_dir = self._data_dir_arg
        elif self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            self._dir_finalizer = weakref.finalize(self, shutil.rmtree, str(self._data_dir), ignore_errors=True)
        self._data_dir.mkdir(parents=True, exist_ok=True)

    def _start_all(self) -> None:
        home, data = self._started_home(), self.data_dir
        began = time.monotonic()
        self._zk_port = free_loopback_port()
        self._bookie_ports = (free_loopback_port(), free_loopback_port())
        self._write_conf(self.zookeeper, "zookeeper.conf", self._zookeeper_overrides())
        self.zookeeper.launch(home, data, self._environment(None))
        self._wait_ready({self.zookeeper: lambda: _zookeeper_ok(self._zk_port)}, "start")
        self.startup_phases_s = {"zookeeper": time.monotonic() - began}
        self.brokers = [
            ClusterBroker(i, free_loopback_port(), free_loopback_port()) for i in range(self._broker_count)
        ]
        self._initialize_metadata()
        self.startup_phases_s["metadata"] = time.monotonic() - began
        self._write_conf(self.bookie, "bookkeeper.conf", self._bookie_overrides())
        self.bookie.launch(home, data, self._environment(self._heap))
        for broker in self.brokers:
            self._write_conf(broker, "broker.conf", self._broker_overrides(broker))
            broker.launch(home, data, self._environment(self._heap))
        checks: dict[ClusterNode, Callable[[], bool]] = {
            self.bookie: lambda: accepts_connections(self._bookie_ports[0])
        }
        for broker in self.brokers:
            checks[broker] = lambda b=broker: b.is_ready(self.cluster_name)  # type: ignore[misc]
        self._wait_ready(checks, "start")
        self.startup_phases_s["brokers"] = time.monotonic() - began

    def _environment(self, heap: str | None) -> dict[str, str]:
        """The JVMs' environment: ours, without inherited Pulsar/BookKeeper settings."""
        assert self.java_home is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
        env.update(
            JAVA_HOME=str(self.java_home),
            PULSAR_MEM=_ZOOKEEPER_MEM if heap is None else _java_mem(heap),
            PULSAR_GC=_GC,
            PULSAR_GC_LOG=" ",  # non-empty: no GC log files
        )
        return env

    def _write_conf(self, node: ClusterNode, template: str, overrides: Mapping[str, str]) -> None:
        base = (self._started_home() / "conf" / template).read_text(encoding="utf-8")
        (self.data_dir / f"{node.name}.conf").write_text(override_properties(base, overrides), encoding="utf-8")

    def _zookeeper_overrides(self) -> dict[str, str]:
        return {
            "dataDir": str(self.data_dir / "zookeeper"),
            "clientPort": str(self._zk_port),
            "clientPortAddress": LOOPBACK,
            "admin.enableServer": "false",
            "metricsProvider.className": "org.apache.zookeeper.metrics.impl.DefaultMetricsProvider",
            "forceSync": "no",
        }

    def _bookie_overrides(self) -> dict[str, str]:
        ports = self._bookie_ports
        return {
            "bookiePort": str(ports[0]),
            "advertisedAddress": LOOPBACK,
            "listeningInterface": "lo",
            "allowLoopback": "true",
            "httpServerEnabled": "false",
            "prometheusStatsHttpAddress": LOOPBACK,
            "prometheusStatsHttpPort": str(ports[1]),
            "metadataServiceUri": f"zk+null://{LOOPBACK}:{self._zk_port}/ledgers",
            "zkServers": f"{LOOPBACK}:{self._zk_port}",
            "journalDirectory": str(self.data_dir / "bookie" / "journal"),
            "ledgerDirectories": str(self.data_dir / "bookie" / "ledgers"),
            "autoRecoveryDaemonEnabled": "false",
            "dbStorage_writeCacheMaxSizeMb": "32",
            "dbStorage_readAheadCacheMaxSizeMb": "32",
        }

    def _broker_overrides(self, broker: ClusterBroker) -> dict[str, str]:
        store = f"zk:{LOOPBACK}:{self._zk_port}"
        return {
            "clusterName": self.cluster_name,
            "metadataStoreUrl": store,
            "configurationMetadataStoreUrl": store,
            "brokerServicePort": str(broker.port),
            "webServicePort": str(broker.web_port),
            "bindAddress": LOOPBACK,
            "advertisedAddress": LOOPBACK,
            "managedLedgerDefaultEnsembleSize": "1",
            "managedLedgerDefaultWriteQuorum": "1",
            "managedLedgerDefaultAckQuorum": "1",
            "functionsWorkerEnabled": "false",
            "metadataStoreSessionTimeoutMillis": str(self._session_timeout_ms),
            "acknowledgmentAtBatchIndexLevelEnabled": "true",
            "loadBalancerSheddingEnabled": "false",
            "loadBalancerAutoBundleSplitEnabled": "false",
            **self._broker_config,
        }

    def _initialize_metadata(self) -> None:
        """``bin/pulsar initialize-cluster-metadata``: the cluster, public/default, BookKeeper's /ledgers."""
        store = f"zk:{LOOPBACK}:{self._zk_port}"
        argv = [
            str(self._started_home() / "bin" / "pulsar"), "initialize-cluster-metadata",
            "--cluster", self.cluster_name,
            "--metadata-store", store,
            "--configuration-metadata-store", store,
            "--web-service-url", "http://" + ",".join(f"{LOOPBACK}:{b.web_port}" for b in self.brokers),
            "--broker-service-url", "pulsar://" + ",".join(f"{LOOPBACK}:{b.port}" for b in self.brokers),
        ]  # fmt: skip
        log_path = self.data_dir / "initialize-cluster-metadata.log"
        env = {**self._environment(None), "PULSAR_LOG_DIR": str(self.data_dir / "logs" / "setup")}
        with open(log_path, "ab") as log_file:
            try:
                done = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                    cwd=str(self.data_dir), timeout=_SETUP_TIMEOUT_S, check=False,
                    preexec_fn=parent_death_signal_preexec(),
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                raise BrokerError(f"initialize-cluster-metadata took over {_SETUP_TIMEOUT_S} s:\n{read_tail(log_path)}") from None
        if done.returncode != 0:
            raise BrokerError(f"initialize-cluster-metadata exited {done.returncode}:\n{read_tail(log_path)}")

    def _wait_ready(self, checks: dict[ClusterNode, Callable[[], bool]], phase: str) -> None:
        """Poll each node's check until all pass; BrokerError with log tails if one exits or time runs out."""
        deadline = time.monotonic() + self._startup_timeout_s
        pending = dict(checks)
        while pending:
            for node, ready in list(pending.items()):
                code = node.exit_code()
                if code is not None:
                    raise BrokerError(f"{node.name} exited with code {code} during {phase}; "
                                      f"log {node.log_path}:\n{node.log_tail()}")  # fmt: skip
                with contextlib.suppress(OSError):
                    if ready():
                        del pending[node]
            if not pending:
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(f"--- {n.name} ({n.log_path}):\n{n.log_tail()}" for n in pending)
                raise BrokerError(f"not ready within {self._startup_timeout_s} s ({phase}): "
                                  f"{', '.join(n.name for n in pending)}\n{tails}")  # fmt: skip
            time.sleep(_POLL_INTERVAL_S)
