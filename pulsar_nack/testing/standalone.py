"""Apache Pulsar's own standalone broker on loopback, for tests, benchmarks and the demo.

:class:`PulsarStandalone` runs ``org.apache.pulsar.PulsarStandaloneStarter`` from the
release that :mod:`~pulsar_nack.testing.distribution` fetches from Maven Central (through
the distribution's ``bin/pulsar standalone``, or ``java -cp`` for a release served only as
jars): one JVM with the broker, one in-process bookie and a RocksDB metadata store,
without the functions worker or stream storage. What a started broker looks like::

    data_dir/
        standalone.conf        the release's, with our overrides appended
        broker.log             the JVM's stdout and stderr
        logs/                  log4j's own files
        metadata/  bookkeeper/ RocksDB metadata and the bookie's ledgers (kept by restart())

    127.0.0.1:PORT             the binary protocol  (url)
    127.0.0.1:HTTP_PORT        the admin REST API   (admin_url)
    127.0.0.1:*                the bookie (a port the JVM picks)

Every socket is bound to 127.0.0.1. Batch-index acknowledgement
(``acknowledgmentAtBatchIndexLevelEnabled``) is the version's own default, unless
``batch_index_ack`` says otherwise: off in both 3.0.7 and 4.0.8 (read back from their
admin API). The JVM gets its own ``JAVA_HOME`` (the newest installed JDK that runs the
release) and a bounded heap.

Example, from a plain Python shell (the first call fetches about 250 MB; the test suite
runs it with the tests marked ``broker``)::

    >>> from pulsar_nack.testing import PulsarStandalone, quiet_client
    >>> with PulsarStandalone() as broker:
    ...     client = quiet_client(broker.url)
    ...     message_id = client.create_producer("persistent://public/default/x").send(b"hi")
    ...     client.close()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import weakref
from collections.abc import Mapping, Sequence
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
from .admin import PulsarAdmin
from .distribution import (
    CLASSPATH_JVM_FLAGS,
    STANDALONE_STARTER,
    PulsarRelease,
    choose_release,
    ensure_distribution,
    matching_releases,
)

__all__ = ["DEFAULT_HEAP", "DEFAULT_JVM_OPTIONS", "PulsarStandalone"]

_BATCH_INDEX_ACK = "acknowledgmentAtBatchIndexLevelEnabled"
DEFAULT_HEAP = "768m"
"""The broker JVM's ``-Xmx``: enough for the tests and benchmarks, small beside Spark."""
DEFAULT_JVM_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)
"""The JVM options of a broker that is given none: the C1 compiler only.

With the JVM's default tiered compilation, the C2 compiler's threads take about half
the CPU a start needs (median 10.5 s of CPU to ready, against 5.4 s with C1 only;
``broker_phases`` in ``bench/results/startup.json``) and keep taking it while the demo
or a test runs beside the broker on a 2-core machine. A broker used for tests and demos
never runs long enough to repay C2. Pass ``jvm_options=()`` for tiered compilation.
"""
_TEMP_PREFIX = "pulsar-nack-standalone-"
_POLL_INTERVAL_S = 0.25


def _stop_for_finalizer(process: subprocess.Popen[bytes], log_file: IO[bytes]) -> None:
    terminate_process(process, log_file, 20.0)


class PulsarStandalone:
    """An Apache Pulsar standalone broker process on ``127.0.0.1``, owned by this object.

    Parameters
    ----------
    data_dir : path, optional
        Where the broker keeps its data, config and log. None: a fresh temporary
        directory, removed by :meth:`stop`.
    heap : str
        The JVM's ``-Xmx`` (and the bound on direct memory). Default ``"768m"``.
    startup_timeout_s : float
        How long :meth:`start` waits for the admin API to list ``public/default``.
    config : mapping, optional
        Extra ``standalone.conf`` settings, appended after ours (so they win).
    jvm_options : sequence of str, optional
        JVM options after ours; none may contain whitespace (``bin/pulsar`` splits
        them on it). None: :data:`DEFAULT_JVM_OPTIONS`.
    version : str, optional
        Which Apache Pulsar: ``"4.0.8"``, ``"4.0"``, ``"3.x"``... (see
        :func:`~pulsar_nack.testing.distribution.matching_releases`). None: the newest
        release an installed JDK runs.
    batch_index_ack : bool, optional
        ``acknowledgmentAtBatchIndexLevelEnabled``. None (default): the version's own
        default (off in 3.0.7 and in 4.0.8). A ``config`` entry for the same key wins.
    port, http_port : int, optional
        The loopback ports of the binary protocol and the admin REST API. None (default):
        a free port each, picked at :meth:`start`.

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it (a *version* we cannot run is a ValueError).
    BrokerError
        From :meth:`start`: no JDK that runs the version, no ``mvn``, a failed download,
        or a broker that exits or is not ready in time (with the tail of its log).

    Notes
    -----
    Cleanup, so that no broker outlives its test: :meth:`stop` and the context manager
    stop it by PID (SIGTERM, then SIGKILL after a timeout); a :func:`weakref.finalize`
    stops it at interpreter exit; on Linux the JVM also gets ``PR_SET_PDEATHSIG``, so it
    dies with the interpreter even when that is killed with SIGKILL.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        heap: str = DEFAULT_HEAP,
        startup_timeout_s: float = 180.0,
        config: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] | None = None,
        version: str | None = None,
        batch_index_ack: bool | None = None,
        port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(f"data_dir must be a str, os.PathLike or None, got {type(data_dir).__name__}")
        if not isinstance(heap, str):
            raise TypeError(f"heap must be a str such as '768m', got {type(heap).__name__}")
        if not heap[:-1].isdigit() or heap[-1:].lower() not in ("m", "g"):
            raise ValueError(f"heap must look like '768m' or '1g', got {heap!r}")
        if config is not None and not (
            isinstance(config, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in config.items())
        ):
            raise TypeError("config must map str to str")
        if jvm_options is None:
            jvm_options = DEFAULT_JVM_OPTIONS
        if isinstance(jvm_options, str) or not all(isinstance(o, str) for o in jvm_options):
            raise TypeError("jvm_options must be a sequence of str or None")
        if any(not o or any(c.isspace() for c in o) for o in jvm_options):
            raise ValueError(f"jvm_options must be non-empty and hold no whitespace, got {list(jvm_options)!r}")
        if batch_index_ack is not None and not isinstance(batch_index_ack, bool):
            raise TypeError(f"batch_index_ack must be a bool or None, got {type(batch_index_ack).__name__}")
        matching_releases(version)  # TypeError / ValueError now, not at start()
        self._fixed_ports = tuple(None if v is None else check_int(n, v, 1, 65535)
                                  for n, v in (("port", port), ("http_port", http_port)))
        if port is not None and port == http_port:
            raise ValueError(f"port and http_port must differ, got {port} for both")
        self._data_dir_arg = None if data_dir is None else Path(os.fspath(data_dir)).absolute()
        self._heap = heap
        self._startup_timeout_s = check_seconds("startup_timeout_s", startup_timeout_s, allow_zero=False)
        self._version_spec = version
        self._extra_config = {} if batch_index_ack is None else {_BATCH_INDEX_ACK: str(batch_index_ack).lower()}
        self._extra_config.update(config or {})
        self._extra_jvm_options = tuple(jvm_options)
        self._data_dir: Path | None = self._data_dir_arg
        self._ports: tuple[int, int] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._dir_finalizer: weakref.finalize | None = None
        self.release: PulsarRelease | None = None
        self.java_home: Path | None = None

    # ------------------------------------------------------------------ info

    @property
    def url(self) -> str:
        """The service URL, ``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://{LOOPBACK}:{self._started_ports()[0]}"

    @property
    def admin_url(self) -> str:
        """The admin REST API, ``http://127.0.0.1:HTTP_PORT``."""
        return f"http://{LOOPBACK}:{self._started_ports()[1]}"

    @property
    def admin(self) -> PulsarAdmin:
        """A small client of the admin REST API."""
        return PulsarAdmin(self.admin_url)

    @property
    def version(self) -> str:
        """The Pulsar version that runs (known once started)."""
        if self.release is None:
            raise BrokerError("the broker is not started")
        return self.release.version

    @property
    def batch_index_ack(self) -> bool:
        """Whether the running broker acknowledges at batch-index level, as it reports it.

        Read from the admin API (``acknowledgmentAtBatchIndexLevelEnabled`` in
        ``/admin/v2/brokers/configuration/runtime``) on each call.
        """
        value = self.admin.runtime_configuration().get(_BATCH_INDEX_ACK)
        if value not in ("true", "false"):
            raise BrokerError(f"the broker reports {_BATCH_INDEX_ACK}={value!r}")
        return value == "true"

    @property
    def pid(self) -> int | None:
        """PID of the broker JVM while it runs, else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise BrokerError("no data directory: the broker is not started")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The JVM's stdout and stderr, ``data_dir / "broker.log"``."""
        return self.data_dir / "broker.log"

    def is_running(self) -> bool:
        return self.pid is not None

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        """Create *topic* with *partitions* partitions; return its full name."""
        return self.admin.create_partitioned_topic(topic, partitions)

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        version = self.release.version if self.release is not None else self._version_spec
        return f"PulsarStandalone(version={version}, ports={self._ports}, data_dir={self._data_dir!s}, {state})"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> PulsarStandalone:
        """Fetch the distribution if needed, start the broker and wait until it is ready."""
        if self.is_running():
            raise BrokerError(f"already running: {self!r}")
        self.release, self.java_home = choose_release(version=self._version_spec)
        home = ensure_distribution(self.release)
        self._ensure_data_dir()
        if self._ports is None:
            self._ports = (self._fixed_ports[0] or free_loopback_port(), self._fixed_ports[1] or free_loopback_port())
        self._launch(home)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker by PID: SIGTERM, then SIGKILL after *timeout_s*. Idempotent.

        Removes the data directory if it was a temporary one.
        """
        timeout = check_seconds("timeout_s", timeout_s, allow_zero=True)
        self._cleanup_process(timeout)
        if self._dir_finalizer is not None:
            self._dir_finalizer()
            self._dir_finalizer = None
            self._data_dir = None
            self._ports = None

    def restart(self, timeout_s: float = 30.0) -> PulsarStandalone:
        """Stop the broker and start it again with the same data and ports.

        Clients left open reconnect by themselves; unacked messages are redelivered.
        """
        timeout = check_seconds("timeout_s", timeout_s, allow_zero=True)
        if self._data_dir is None or self._ports is None or self.release is None:
            raise BrokerError("restart() needs a broker that was started")
        self._cleanup_process(timeout)
        self._launch(ensure_distribution(self.release))
        return self

    def kill(self) -> None:
        """SIGKILL the broker (a crash); :meth:`restart` brings it back with its data."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self) -> PulsarStandalone:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -------------------------------------------------------------- private

    def _started_ports(self) -> tuple[int, int]:
        if self._ports is None:
            raise BrokerError("the broker has no ports yet; call start() first")
        return self._ports

    def _ensure_data_dir(self) -> None:
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            self._dir_finalizer = weakref.finalize(self, shutil.rmtree, str(self._data_dir), ignore_errors=True)
        self._data_dir.mkdir(parents=True, exist_ok=True)

    def _write_config(self, home: Path) -> Path:
        port, http_port = self._started_ports()
        overrides = {
            "clusterName": "standalone",
            "brokerServicePort": str(port),
            "webServicePort": str(http_port),
            "bindAddress": LOOPBACK,
            "advertisedAddress": LOOPBACK,
            # The in-process bookie reads this file too: bind it to loopback as well.
            "listeningInterface": "lo",
            "allowLoopback": "true",
            **self._extra_config,
        }
        base = (home / "conf" / "standalone.conf").read_text(encoding="utf-8")
        lines = "".join(f"{key}={value}\n" for key, value in overrides.items())
        path = self.data_dir / "standalone.conf"
        path.write_text(f"{base.rstrip()}\n\n# pulsar-nack overrides (later keys win)\n{lines}", encoding="utf-8")
        return path

    def _jvm_options(self) -> tuple[str, str]:
        """(memory, GC) options of the broker JVM."""
        memory = f"-Xms128m -Xmx{self._heap} -XX:MaxDirectMemorySize={self._heap}"
        return memory, "-XX:+UseG1GC -XX:+PerfDisableSharedMem"

    def _environment(self, config_path: Path) -> dict[str, str]:
        assert self.java_home is not None
        env = dict(os.environ)
        for name in ("PULSAR_MEM", "PULSAR_GC", "PULSAR_EXTRA_OPTS", "PULSAR_LOG_CONF", "PULSAR_PREFIX_"):
            env.pop(name, None)
        memory, gc = self._jvm_options()
        env.update(
            JAVA_HOME=str(self.java_home),
            PULSAR_MEM=memory,
            PULSAR_GC=gc,
            PULSAR_GC_LOG=" ",  # non-empty: no GC log files
            PULSAR_EXTRA_OPTS=" ".join(self._extra_jvm_options),
            PULSAR_LOG_DIR=str(self.data_dir / "logs"),
            PULSAR_STANDALONE_CONF=str(config_path),
        )
        return env

    def _command(self, home: Path, config_path: Path) -> list[str]:
        """``bin/pulsar standalone ...``, or for a classpath release the ``java`` line it would run."""
        assert self.release is not None and self.java_home is not None
        if self.release.kind == "classpath":
            memory, gc = self._jvm_options()
            classpath = f"{home / 'conf'}{os.pathsep}{home / 'lib' / '*'}"
            head = [str(self.java_home / "bin" / "java"), *memory.split(), *gc.split(), *self._extra_jvm_options, *CLASSPATH_JVM_FLAGS]
            head += ["-cp", classpath, STANDALONE_STARTER, "--config", str(config_path)]
        else:
            head = [str(home / "bin" / "pulsar"), "standalone"]
        data = self.data_dir
        return [
            *head,
            "--no-functions-worker",
            "--no-stream-storage",
            "--metadata-dir",
            str(data / "metadata"),
            "--bookkeeper-dir",
            str(data / "bookkeeper"),
        ]

    def _launch(self, home: Path) -> None:
        config_path = self._write_config(home)
        port, http_port = self._started_ports()
        for taken in (port, http_port):
            if accepts_connections(taken):
                raise BrokerError(f"port {taken} on {LOOPBACK} is already in use by another process")
        argv = self._command(home, config_path)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed by terminate_process
        offset = log_file.tell()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(self.data_dir),
                env=self._environment(config_path),
                close_fds=True,
                preexec_fn=parent_death_signal_preexec(),  # noqa: PLW1509 - see its docstring
            )
        except BaseException:
            log_file.close()
            raise
        self._process, self._log_file = process, log_file
        self._finalizer = weakref.finalize(self, _stop_for_finalizer, process, log_file)
        self._wait_ready(process, offset)

    def _wait_ready(self, process: subprocess.Popen[bytes], offset: int) -> None:
        """Ready when the binary port accepts connections and the admin API lists public/default."""
        deadline = time.monotonic() + self._startup_timeout_s
        port = self._started_ports()[0]
        while True:
            if process.poll() is not None:
                code = process.returncode
                tail = read_tail(self.log_path, offset)
                self._cleanup_process(0.0)
                raise BrokerError(f"Apache Pulsar exited with code {code} while starting; log {self.log_path}:\n{tail}")
            if accepts_connections(port) and "public/default" in self._namespaces():
                return
            if time.monotonic() >= deadline:
                tail = read_tail(self.log_path, offset)
                self._cleanup_process(5.0)
                raise BrokerError(
                    f"Apache Pulsar was not ready within {self._startup_timeout_s} s; log {self.log_path}:\n{tail}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _namespaces(self) -> list[str]:
        try:
            return self.admin.namespaces("public")
        except (urllib.error.URLError, OSError, ValueError, BrokerError):
            return []

    def _cleanup_process(self, timeout_s: float) -> None:
        process, log_file, finalizer = self._process, self._log_file, self._finalizer
        self._process = self._log_file = self._finalizer = None
        if finalizer is not None:
            finalizer.detach()
        if process is not None:
            terminate_process(process, log_file, timeout_s)

