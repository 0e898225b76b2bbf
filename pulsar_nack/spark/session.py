"""A quiet local SparkSession for tests, examples and the demo, and its full shutdown.

:func:`local_session` starts the JVM itself (log4j2 quiet, loopback, this interpreter
for the Python workers); :func:`stop_session` stops the session and that JVM. Under
``spark-submit``, or when a SparkContext already runs, the existing one is used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

__all__ = ["LaunchedJvm", "launch_jvm", "local_session", "stop_session"]

_LOG4J2_TEMPLATE = """\
# Written by pulsar_nack.spark.local_session: only {level} and worse, on stderr.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# A logger of its own keeps Spark from printing "Setting default log level to WARN".
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
"""

# Lines the JVM prints whatever the log4j configuration says.
_JVM_NOISE = (
    re.compile(rb"^WARNING: Using incubator modules"),
    re.compile(rb"^Setting default log level to"),
    re.compile(rb"^To adjust logging level use sc\.setLogLevel"),
)

_SESSION_STATE: dict[str, Any] = {}


def _shutdown_gateway(gateway: Any) -> None:
    """``gateway.shutdown()``, typed loosely: py4j's gateway is untyped."""
    gateway.shutdown()


def _relay_stderr(read_fd: int) -> None:
    """Copy the JVM's stderr to ours line by line, without its fixed noise lines."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not any(p.match(line) for p in _JVM_NOISE))
            if out:
                with contextlib.suppress(OSError):
                    os.write(2, out)
        if pending and not any(p.match(pending) for p in _JVM_NOISE):
            with contextlib.suppress(OSError):
                os.write(2, pending)


def local_session(
    master: str = "local[2]",
    app_name: str = "pulsar-nack",
    *,
    log_level: str = "ERROR",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or get) a quiet local SparkSession on loopback, for tests, examples, demos.

    - ``SPARK_LOCAL_IP=127.0.0.1`` and the driver bound to 127.0.0.1; UI off; no
      console progress bar;
    - ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = this interpreter, so the workers
      import the same packages;
    - log4j2 at *log_level* from a properties file passed with
      ``spark.driver.extraJavaOptions``, ``sc.setLogLevel(log_level)``, and the JVM's
      fixed start-up lines (``WARNING: Using incubator modules``) filtered from its
      stderr.

    If a SparkContext is already running, or the script runs under ``spark-submit``
    (which launched the JVM), the session is ``SparkSession.builder.getOrCreate()``
    and *master*, *log_level* and *conf* are not applied. Stop it with
    :func:`stop_session`, which also ends a JVM started here. Same as
    ``launch_jvm(...).session()`` (:func:`launch_jvm`).

    Parameters
    ----------
    master : str
        ``local[N]``, or ``local[N,F]`` to let a failed task run F times.
    app_name : str
    log_level : str
        log4j level name: ``ERROR`` (default), ``WARN``, ``INFO``, ``FATAL``, ``OFF``.
    conf : mapping, optional
        More Spark settings, e.g. ``{"spark.python.worker.reuse": "false"}``.
    """
    return launch_jvm(master, app_name, log_level=log_level, conf=conf).session()


class LaunchedJvm:
    """A JVM :func:`launch_jvm` started, before its SparkContext: :meth:`session` makes it.

    Launching forks this process (PySpark starts the JVM with a ``preexec_fn``, Python code
    run in the child before ``exec``), which can deadlock the child when other threads hold
    locks at the fork; a program that starts threads (a Pulsar client, a producer) launches
    the JVM first, starts them, then makes the session, which does not fork.
    """

    __slots__ = ("_conf", "_gateway", "_level")

    def __init__(self, gateway: Any, spark_conf: Any, level: str) -> None:
        self._gateway, self._conf, self._level = gateway, spark_conf, level

    def session(self) -> SparkSession:
        """The SparkSession on this JVM (or the running one). Stop it with :func:`stop_session`."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        if self._gateway is not None and SparkContext._active_spark_context is None:
            sc = SparkContext(conf=self._conf, gateway=self._gateway)
            sc.setLogLevel(self._level)
        return SparkSession.builder.getOrCreate()


def launch_jvm(
    master: str = "local[2]",
    app_name: str = "pulsar-nack",
    *,
    log_level: str = "ERROR",
    conf: Mapping[str, str] | None = None,
) -> LaunchedJvm:
    """Start the JVM of a :func:`local_session` (the parameters are its), without the session yet.

    :func:`stop_session` (``stop_session(None)`` before the session exists) ends it.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        # Running already, or under spark-submit: its master and settings apply.
        return LaunchedJvm(None, None, "")
    level = log_level.upper()
    if level not in ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"):
        raise ValueError(f"unknown log level {log_level!r}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_dir = tempfile.mkdtemp(prefix="pulsar-nack-spark-")
    atexit.register(shutil.rmtree, log_dir, True)  # if stop_session is never called
    log_config = os.path.join(log_dir, "log4j2.properties")
    with open(log_config, "w", encoding="utf-8") as fh:
        fh.write(_LOG4J2_TEMPLATE.format(level=level.lower()))
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    spark_conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        **dict(conf or {}),
    }.items():
        spark_conf.set(key, str(value))
    read_fd, write_fd = os.pipe()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_fd})
    except BaseException:
        os.close(read_fd)
        shutil.rmtree(log_dir, ignore_errors=True)
        raise
    finally:
        os.close(write_fd)
    threading.Thread(target=_relay_stderr, args=(read_fd,), name="spark-stderr", daemon=True).start()
    _SESSION_STATE.update(gateway=gateway, log_dir=log_dir)
    return LaunchedJvm(gateway, spark_conf, level)


def stop_session(spark: Any, timeout_s: float = 30.0) -> None:
    """Stop the SparkSession and, if :func:`local_session` started it, its JVM.

    ``spark.stop()`` leaves the JVM gateway running until the Python process exits;
    this also ends it (closing its stdin, as PySpark does at exit), which stops the
    PySpark daemon and its Python workers. ``stop_session(None)`` ends a JVM that
    :func:`launch_jvm` started and no session runs on; a running session is stopped only
    when passed. Idempotent.
    """
    from pyspark import SparkContext

    if spark is None and SparkContext._active_spark_context is not None:
        return  # launch_jvm reused a running session: not this caller's to end
    if spark is not None:
        spark.stop()
    gateway: Any = _SESSION_STATE.pop("gateway", None)
    log_dir = _SESSION_STATE.pop("log_dir", None)
    if gateway is not None and SparkContext._gateway in (gateway, None):  # None: launched, no session made
        proc = getattr(gateway, "proc", None)
        with contextlib.suppress(Exception):
            _shutdown_gateway(gateway)
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the JVM exits when its stdin closes
            try:
                proc.wait(timeout=timeout_s)
            except Exception:
                proc.kill()
                proc.wait()
    if log_dir is not None:
        shutil.rmtree(log_dir, ignore_errors=True)
