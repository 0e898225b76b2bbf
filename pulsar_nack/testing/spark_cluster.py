"""A Spark standalone cluster on 127.0.0.1 for tests: one master and N workers, each its own JVM.

Started with the ``spark-class`` launcher that ships in the pyspark wheel (no separate
Spark download), on free loopback ports, with quiet log4j2 and its logs and work
directories under one temporary directory. Every JVM is started by PID (``spark-class``
``exec``\\ s the JVM, so the PID we hold is the JVM's), dies with this interpreter, and
is stopped by that PID. Executors are launched by the workers, as children of the
worker JVMs; :meth:`executor_pids` finds them.

>>> SparkStandaloneCluster(workers=0)
Traceback (most recent call last):
...
ValueError: workers must be >= 1, got 0
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .._validate import check_int, check_seconds
from ..errors import BrokerError
from ._process import LOOPBACK, free_loopback_port, parent_death_signal_preexec, read_tail, terminate_process

__all__ = ["EXECUTOR_CLASS", "SparkStandaloneCluster"]

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
"""The main class of an executor JVM (in its command line)."""

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _spark_home() -> Path:
    """The pyspark wheel's directory, which holds ``bin/spark-class`` and ``jars/``."""
    try:
        import pyspark
    except ImportError as error:
        raise BrokerError("pyspark is not installed (pip install 'pulsar-nack[spark]')") from error
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise BrokerError(f"no bin/spark-class in {home}: this pyspark has no launcher")
    return home


class SparkStandaloneCluster:
    """A master and *workers* workers on 127.0.0.1; a context manager.

    Parameters
    ----------
    workers : int
        How many worker JVMs (default 2).
    cores_per_worker : int
        Cores each worker offers (default 1).
    worker_memory : str
        Memory each worker offers to executors (default ``"1g"``).
    start_timeout_s : float
        How long the master and the workers get to register (default 120 s).

    Attributes
    ----------
    master_url : str
        ``spark://127.0.0.1:PORT``, valid once started.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 1,
        worker_memory: str = "1g",
        start_timeout_s: float = 120.0,
    ) -> None:
        self.workers = check_int("workers", workers, 1)
        self.cores_per_worker = check_int("cores_per_worker", cores_per_worker, 1)
        if not isinstance(worker_memory, str):
            raise TypeError(f"worker_memory must be a str, not {type(worker_memory).__name__}")
        self.worker_memory = worker_memory
        self.start_timeout_s = check_seconds("start_timeout_s", start_timeout_s, allow_zero=False)
        self.master_url = ""
        self._ui_port = 0
        self._dir: Path | None = None
        self._processes: list[tuple[subprocess.Popen[bytes], IO[bytes], Path]] = []

    # -- state -----------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """PIDs of the master's and the workers' JVMs (master first)."""
        return [process.pid for process, _, _ in self._processes if process.poll() is None]

    @property
    def work_dir(self) -> Path:
        """Where the workers keep each application's executor directories and logs."""
        if self._dir is None:
            raise BrokerError("the cluster is not started")
        return self._dir / "work"

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs the workers run now. O(processes)."""
        import psutil

        found = []
        for process, _, _ in self._processes[1:]:
            try:
                children = psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:
                    if EXECUTOR_CLASS in " ".join(child.cmdline()):
                        found.append(child.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return found

    def state(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``): workers, applications."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self._ui_port}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
            return state

    def __repr__(self) -> str:
        return f"SparkStandaloneCluster({self.master_url or 'stopped'}, workers={self.workers})"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> SparkStandaloneCluster:
        """Start the master, then the workers; return when all workers are ALIVE."""
        if self._processes:
            return self
        home = _spark_home()
        self._dir = Path(tempfile.mkdtemp(prefix="pulsar-nack-spark-cluster-"))
        (self._dir / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")
        try:
            port, self._ui_port = free_loopback_port(), free_loopback_port()
            self._launch(home, "master", [_MASTER_CLASS, "--host", LOOPBACK, "--port", str(port),
                                          "--webui-port", str(self._ui_port)])
            self.master_url = f"spark://{LOOPBACK}:{port}"
            self._wait(lambda: self.state().get("status") == "ALIVE", "the master")
            for index in range(self.workers):
                self._launch(home, f"worker-{index}", [
                    _WORKER_CLASS, "--host", LOOPBACK, "--webui-port", str(free_loopback_port()),
                    "--cores", str(self.cores_per_worker), "--memory", self.worker_memory,
                    "--work-dir", str(self.work_dir), self.master_url,
                ])
            self._wait(self._workers_alive, f"{self.workers} workers")
        except BaseException:
            self.stop()
            raise
        return self

    def _workers_alive(self) -> bool:
        alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        return len(alive) >= self.workers

    def _launch(self, home: Path, name: str, arguments: list[str]) -> None:
        assert self._dir is not None
        log_path = self._dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by stop()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": LOOPBACK,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_LOG_DIR": str(self._dir),
            "SPARK_DAEMON_JAVA_OPTS": f"-Dlog4j2.configurationFile=file:{self._dir / 'log4j2.properties'}",
        }
        process = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *arguments],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self._dir),
            preexec_fn=parent_death_signal_preexec(),  # noqa: PLW1509 - resolved before the fork
        )
        self._processes.append((process, log_file, log_path))

    def _wait(self, ready: Any, what: str) -> None:
        """Poll *ready* until true; raise with the logs' tails if a JVM exits or time runs out."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for process, _, log_path in self._processes:
                if process.poll() is not None:
                    raise BrokerError(f"{log_path.stem} exited with {process.returncode}:\n{read_tail(log_path)}")
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass  # the master's UI is not up yet, or serves its HTML page at /json/ still (seen in a CI run)
            time.sleep(0.2)  # the JVMs start in seconds; polling the master's UI is cheap
        tails = "\n".join(f"--- {p.stem}\n{read_tail(p)}" for _, _, p in self._processes)
        raise BrokerError(f"{what} not ready within {self.start_timeout_s:.0f} s:\n{tails}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the workers (which stop their executors), then the master; by PID. Idempotent."""
        while self._processes:
            process, log_file, _ = self._processes.pop()
            terminate_process(process, log_file, timeout_s)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.master_url = ""

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
