"""pulsar-lite on loopback: the light embedded broker of the demo and the examples.

:class:`PulsarLite` starts the ``pulsar-lite`` binary that ships inside the
``pulsar-lite`` wheel as a child process, waits until it accepts
connections, and stops it by the PID it started. It does not use
``pulsar_lite.start_broker()``, which scans a shared port range, appends to
one log file shared by every process and leaves an orphan behind when the
interpreter dies.

pulsar-lite is a look-alike of Apache Pulsar with gaps (no partitioned topics, no
admin API, no redelivery on Failover and Exclusive, batch-index acks that lose
messages, consumer ids shared across clients). Nothing is verified on it alone: the
integration tests run on :class:`~pulsar_nack.testing.PulsarStandalone`. Its
workarounds live in :mod:`pulsar_nack.testing.lite_shim`.

What a started broker looks like::

    data_dir/
        pulsar-lite.toml       [metrics] enabled = false  (no 0.0.0.0:8080)
        broker.log             the broker's stdout and stderr
        db.rocksdb/            messages, cursors, acks (kept by restart())
        db.metadata.json

    127.0.0.1:PORT             the only socket it listens on

Started brokers are recorded in a per-user registry so that
:func:`is_lite_broker_url` can tell, from any process, whether a URL is one of them.

Importing this module starts nothing and does not import ``pulsar``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import urlsplit

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

__all__ = ["LOG_LEVELS", "PulsarLite", "is_lite_broker_url"]

#: Log levels the pulsar-lite binary accepts for ``--log-level``. It silently
#: falls back to ``info`` for anything else, so we validate before starting.
LOG_LEVELS: tuple[str, ...] = ("error", "warn", "info", "debug", "trace")

_TEMP_PREFIX = "pulsar-nack-broker-"
_CONFIG_NAME = "pulsar-lite.toml"
_LOG_NAME = "broker.log"
_DB_NAME = "db"
# pulsar-lite binds a Prometheus endpoint on 0.0.0.0:8080 unless told not to.
_CONFIG_TEXT = "[metrics]\nenabled = false\n"
_POLL_INTERVAL_S = 0.01
_AUTO_PORT_ATTEMPTS = 3


class _PortInUse(Exception):
    """Internal: the chosen port was taken; an automatic port may be retried."""


def _stop_for_finalizer(process: subprocess.Popen[bytes], log_file: IO[bytes], marker_path: Path | None) -> None:
    """Finalizer body: used at interpreter exit and on garbage collection."""
    terminate_process(process, log_file, 5.0, before=lambda: _remove_marker(marker_path, process.pid))


@dataclass(frozen=True)
class _Marker:
    """What a running broker records about itself in the registry."""

    pid: int
    port: int
    data_dir: Path
    temporary: bool = False


def _registry_dir() -> Path:
    """Per-user directory holding one ``<port>.json`` marker per live broker."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"pulsar-nack-lite-{uid}"


def _registry_is_ours(directory: Path) -> bool:
    """True if ``directory`` is a real directory owned by this user."""
    try:
        st = directory.lstat()
    except OSError:
        return False
    owned = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return owned and stat.S_ISDIR(st.st_mode)


@contextlib.contextmanager
def _registry_locked(directory: Path) -> Iterator[None]:
    """Serialize marker writes and pruning among processes (``flock``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    with open(directory / ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _read_marker(path: Path) -> _Marker | None:
    """Parse a marker file, or None if it is missing or malformed."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return _Marker(
            pid=int(raw["pid"]),
            port=int(raw["port"]),
            data_dir=Path(raw["data_dir"]),
            temporary=bool(raw.get("temporary", False)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _is_our_temp_dir(path: Path) -> bool:
    """True if ``path`` looks like a data directory made by :meth:`PulsarLite.start`."""
    return path.parent == Path(tempfile.gettempdir()) and path.name.startswith(_TEMP_PREFIX)


def _prune_stale_markers(directory: Path) -> None:
    """Drop markers of brokers that are gone, with their temporary data dirs.

    A broker whose parent was killed (so no atexit hook ran; the broker then
    died of ``PR_SET_PDEATHSIG``) leaves its marker and temporary directory
    behind. The next broker started by this user cleans them up. Caller
    holds the registry lock.
    """
    for path in directory.glob("*.json"):
        marker = _read_marker(path)
        if marker is None or _is_pulsar_lite_process(marker.pid, marker.port):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
        if marker.temporary and _is_our_temp_dir(marker.data_dir):
            shutil.rmtree(marker.data_dir, ignore_errors=True)


def _write_marker(marker: _Marker) -> Path | None:
    """Record a running broker; return the marker path, or None if unsafe."""
    directory = _registry_dir()
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        if not _registry_is_ours(directory):
            return None  # someone else's directory: never trust or write it
        path = directory / f"{marker.port}.json"
        tmp = directory / f".{marker.port}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        payload = {
            "pid": marker.pid,
            "port": marker.port,
            "data_dir": str(marker.data_dir),
            "temporary": marker.temporary,
        }
        with _registry_locked(directory):
            _prune_stale_markers(directory)
            tmp.write_text(json.dumps(payload), encoding="utf-8")
            os.replace(tmp, path)
        return path
    except OSError:
        return None


def _remove_marker(path: Path | None, pid: int) -> None:
    """Remove a marker if it still names ``pid`` (a newer broker may own it)."""
    if path is None:
        return
    with contextlib.suppress(OSError), _registry_locked(path.parent):
        marker = _read_marker(path)
        if marker is not None and marker.pid == pid:
            path.unlink()


def _is_pulsar_lite_process(pid: int, port: int) -> bool:
    """Return True if ``pid`` is a live pulsar-lite serving 127.0.0.1:port."""
    proc_cmdline = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self/cmdline").exists():
        try:
            argv = proc_cmdline.read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            return False
        if not argv or "pulsar-lite" not in os.path.basename(argv[0]):
            return False
        wanted = f"{LOOPBACK}:{port}"
        return any(a == "--addr" and b == wanted for a, b in itertools.pairwise(argv))
    try:  # no /proc: the best we can do is "a process with that PID lives"
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours, so not an PulsarLite we started
    return True


def _lookup_lite_broker(url: object) -> _Marker | None:
    """Return the marker of the embedded broker behind ``url``, or None."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:  # e.g. a multi-host service URL
        return None
    if parts.scheme != "pulsar" or host not in (LOOPBACK, "localhost") or port is None:
        return None
    directory = _registry_dir()
    if not _registry_is_ours(directory):
        return None
    marker = _read_marker(directory / f"{port}.json")
    if marker is None or marker.port != port or not _is_pulsar_lite_process(marker.pid, port):
        return None
    return marker


def is_lite_broker_url(url: str) -> bool:
    """Tell whether ``url`` points at an :class:`PulsarLite` on this machine.

    A started broker writes a marker ``<port>.json`` (its PID, port and data
    directory) into a per-user directory under the system temp directory,
    and removes it when stopped. The answer is True only if all hold:

    - the URL is ``pulsar://127.0.0.1:PORT`` or ``pulsar://localhost:PORT``;
    - a marker for PORT exists in a registry directory owned by this user;
    - the PID in it is alive, and (on Linux, via ``/proc``) is a
      ``pulsar-lite`` process started with ``--addr 127.0.0.1:PORT``.

    A real cluster fails the first or the last check, so test shims guarded
    by this function never run against one. It works across processes
    (Spark executors, subprocesses), unlike an in-memory registry.

    Runtime complexity: O(1) file reads.

    Parameters
    ----------
    url : str
        A Pulsar service URL.

    Returns
    -------
    bool
        True if the URL belongs to a running embedded broker.

    Raises
    ------
    TypeError
        If ``url`` is not a str.

    Examples
    --------
    >>> is_lite_broker_url("pulsar://pulsar.example.com:6650")
    False
    >>> with PulsarLite() as broker:
    ...     is_lite_broker_url(broker.url)
    True
    """
    return _lookup_lite_broker(url) is not None



class PulsarLite:
    """A pulsar-lite broker process on ``127.0.0.1``, owned by this object.

    The broker listens only on a loopback port (a free one unless ``port``
    is given), runs with metrics disabled, and writes its log to
    ``data_dir/broker.log``. :meth:`restart` keeps the data *and* the port,
    so open clients reconnect by themselves (measured: well under a second).

    Cleanup, so that no broker outlives its test:

    - :meth:`stop` and the context manager stop it by PID: SIGTERM, then
      SIGKILL after a timeout;
    - a :func:`weakref.finalize` per started process stops it when the
      broker object is garbage collected and at interpreter exit (atexit);
      keep a reference to the broker while you use it;
    - on Linux, when started from the main thread, the child also gets
      ``PR_SET_PDEATHSIG = SIGKILL``, so it dies even if this interpreter is
      killed with SIGKILL and no atexit hook runs.

    Not for production: one process, no replication, and pulsar-lite has
    known gaps (partitioned topics, redelivery on Failover and Exclusive
    subscriptions, Key_Shared nacks, consumer ids shared across clients;
    see :mod:`pulsar_nack.testing.lite_shim` for the last one).

    Parameters
    ----------
    data_dir : str or os.PathLike or None, default None
        Where the broker keeps its data, config and log. None: a fresh
        temporary directory, removed by :meth:`stop`. A given path is
        created if missing and kept.
    port : int or None, default None
        Loopback port to listen on, 1-65535. None: a free port chosen by the
        kernel at the first start.
    log_level : {"error", "warn", "info", "debug", "trace"}, default "warn"
        The broker's log level. ``warn`` keeps the log empty in normal runs.
    startup_timeout_s : float, default 10.0
        How long :meth:`start` waits for the broker to accept connections.

    Raises
    ------
    TypeError
        If an argument has the wrong type.
    ValueError
        If an argument has a bad value.

    Examples
    --------
    >>> with PulsarLite() as broker:
    ...     broker.is_running(), broker.url.startswith("pulsar://127.0.0.1:")
    (True, True)
    >>> broker.is_running()
    False
    """

    _data_dir_arg: Path | None
    _requested_port: int | None
    _log_level: str
    _startup_timeout_s: float
    _lock: threading.RLock
    _port: int | None
    _data_dir: Path | None
    _owns_data_dir: bool
    _process: subprocess.Popen[bytes] | None
    _log_file: IO[bytes] | None
    _marker_path: Path | None
    _process_finalizer: weakref.finalize | None
    _dir_finalizer: weakref.finalize | None

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        log_level: str = "warn",
        startup_timeout_s: float = 10.0,
    ) -> None:
        if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(f"data_dir must be a str, os.PathLike or None, got {type(data_dir).__name__}")
        if port is not None:
            check_int("port", port, 1, 65535)
        if not isinstance(log_level, str):
            raise TypeError(f"log_level must be a str, got {type(log_level).__name__}")
        if log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {log_level!r}")
        if data_dir is not None and os.fspath(data_dir) in ("", b""):
            raise ValueError("data_dir must not be empty")
        self._data_dir_arg = None if data_dir is None else Path(os.fspath(data_dir)).absolute()
        self._requested_port = port
        self._log_level = log_level.lower()
        self._startup_timeout_s = check_seconds("startup_timeout_s", startup_timeout_s, allow_zero=False)
        self._lock = threading.RLock()
        self._port = port
        self._data_dir = self._data_dir_arg
        self._owns_data_dir = False
        self._process = None
        self._log_file = None
        self._marker_path = None
        self._process_finalizer = None
        self._dir_finalizer = None

    # ------------------------------------------------------------------ info

    @property
    def url(self) -> str:
        """The service URL, ``pulsar://127.0.0.1:PORT``.

        Raises
        ------
        BrokerError
            If no port is known yet (never started and no ``port`` given).
        """
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def admin_url(self) -> None:
        """None: pulsar-lite has no admin API."""
        return None

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        """Refused: pulsar-lite has no admin API and no per-topic partitions.

        Raises
        ------
        BrokerError
            Always; use :class:`~pulsar_nack.testing.PulsarStandalone` for partitioned topics.
        """
        raise BrokerError("pulsar-lite cannot create partitioned topics; use PulsarStandalone")

    @property
    def port(self) -> int:
        """The loopback port the broker listens on.

        Raises
        ------
        BrokerError
            If no port is known yet (never started and no ``port`` given).
        """
        if self._port is None:
            raise BrokerError("the broker has no port yet; call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """PID of the broker process while it runs, else None."""
        process = self._process
        if process is None or process.poll() is not None:
            return None
        return process.pid

    @property
    def data_dir(self) -> Path:
        """The directory holding the broker's data, config and log.

        Raises
        ------
        BrokerError
            If it is a temporary directory that does not exist yet or was
            removed by :meth:`stop`.
        """
        if self._data_dir is None:
            raise BrokerError("no data directory: the broker is not started")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The broker's log file, ``data_dir / "broker.log"``."""
        return self.data_dir / _LOG_NAME

    def is_running(self) -> bool:
        """Return True while the broker process this object started is alive.

        Runtime complexity: O(1) (one ``waitpid`` with WNOHANG).
        """
        process = self._process
        return process is not None and process.poll() is None

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running() else "stopped"
        return f"PulsarLite(port={self._port}, data_dir={self._data_dir!s}, {state})"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> PulsarLite:
        """Start the broker and wait until it accepts connections.

        With no ``port`` given, a free loopback port is chosen (and another
        one tried, up to 3 times, if it was taken in between). After
        :meth:`stop` of a broker with a temporary directory, ``start`` makes
        a fresh, empty one.

        Returns
        -------
        PulsarLite
            ``self``, to allow ``broker = PulsarLite().start()``.

        Raises
        ------
        BrokerError
            If it is already running, exits early, or is not ready within
            ``startup_timeout_s``; the message includes the log tail.
        FileNotFoundError
            If the pulsar-lite binary cannot be found.
        """
        with self._lock:
            if self.is_running():
                raise BrokerError(f"already running: {self!r}")
            self._cleanup_process(timeout_s=5.0)  # a process that died by itself
            self._ensure_data_dir()
            attempts = _AUTO_PORT_ATTEMPTS if self._requested_port is None and self._port is None else 1
            for attempt in range(attempts):
                if self._port is None:
                    self._port = free_loopback_port()
                try:
                    self._launch()
                    return self
                except _PortInUse as exc:
                    if attempt + 1 >= attempts:
                        raise BrokerError(str(exc)) from None
                    self._port = None
            raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker: SIGTERM, wait, then SIGKILL after ``timeout_s``.

        Idempotent. Removes the data directory if it was a temporary one.
        pulsar-lite keeps its data through SIGTERM and SIGKILL alike.

        Parameters
        ----------
        timeout_s : float, default 5.0
            How long to wait after SIGTERM before sending SIGKILL.

        Raises
        ------
        TypeError
            If ``timeout_s`` is not a number.
        ValueError
            If ``timeout_s`` is negative or not finite.
        """
        timeout = check_seconds("timeout_s", timeout_s, allow_zero=True)
        with self._lock:
            self._cleanup_process(timeout_s=timeout)
            if self._dir_finalizer is not None:
                self._dir_finalizer()  # removes the temporary directory
                self._dir_finalizer = None
                self._data_dir = None
                self._owns_data_dir = False
            if self._requested_port is None:
                # A later start() picks a fresh port; restart() keeps it.
                self._port = None

    def restart(self, timeout_s: float = 5.0) -> PulsarLite:
        """Stop the broker and start it again with the same data and port.

        Clients left open reconnect by themselves. Messages that were
        delivered but not acknowledged are delivered again; note that
        pulsar-lite resets ``redelivery_count`` to 0 across a restart.

        Parameters
        ----------
        timeout_s : float, default 5.0
            How long to wait after SIGTERM before sending SIGKILL.

        Returns
        -------
        PulsarLite
            ``self``.

        Raises
        ------
        BrokerError
            If it was never started, or the new process fails to start (for
            example because another process took the port meanwhile).
        """
        timeout = check_seconds("timeout_s", timeout_s, allow_zero=True)
        with self._lock:
            if self._data_dir is None or self._port is None:
                raise BrokerError("restart() needs a broker that was started")
            self._cleanup_process(timeout_s=timeout)
            try:
                self._launch()
            except _PortInUse as exc:
                raise BrokerError(str(exc)) from None
            return self

    def __enter__(self) -> PulsarLite:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -------------------------------------------------------------- private

    def _ensure_data_dir(self) -> None:
        """Create the data directory (temporary or given) and the config."""
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            self._owns_data_dir = True
            self._dir_finalizer = weakref.finalize(
                self, shutil.rmtree, str(self._data_dir), ignore_errors=True
            )
        self._data_dir.mkdir(parents=True, exist_ok=True)
        (self._data_dir / _CONFIG_NAME).write_text(_CONFIG_TEXT, encoding="utf-8")

    def _launch(self) -> None:
        """Start the process on ``self._port`` and wait until it is ready."""
        from pulsar_lite.binary_finder import find_pulsar_lite_binary

        assert self._data_dir is not None and self._port is not None
        data_dir, port = self._data_dir, self._port
        if accepts_connections(port):
            raise _PortInUse(f"port {port} on {LOOPBACK} is already in use by another process")
        argv = [
            find_pulsar_lite_binary(),
            "--config",
            str(data_dir / _CONFIG_NAME),
            "--addr",
            f"{LOOPBACK}:{port}",
            "--db-path",
            str(data_dir / _DB_NAME),
            "--log-level",
            self._log_level,
        ]
        log_path = data_dir / _LOG_NAME
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by terminate_process
        log_offset = log_file.tell()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(data_dir),
                close_fds=True,
                preexec_fn=parent_death_signal_preexec(),  # noqa: PLW1509 - see its docstring
            )
        except BaseException:
            log_file.close()
            raise
        self._process, self._log_file = process, log_file
        self._process_finalizer = weakref.finalize(self, _stop_for_finalizer, process, log_file, None)

        deadline = time.monotonic() + self._startup_timeout_s
        while True:
            if process.poll() is not None:
                tail = read_tail(log_path, log_offset)
                self._cleanup_process(timeout_s=0.0)
                message = (
                    f"pulsar-lite exited with code {process.returncode} before accepting "
                    f"connections on {LOOPBACK}:{port}; log {log_path}:\n{tail or '<empty>'}"
                )
                if "AddrInUse" in tail or "Address already in use" in tail:
                    raise _PortInUse(message)
                raise BrokerError(message)
            if accepts_connections(port) and process.poll() is None:
                break
            if time.monotonic() >= deadline:
                self._cleanup_process(timeout_s=1.0)
                tail = read_tail(log_path, log_offset)
                raise BrokerError(
                    f"pulsar-lite did not accept connections on {LOOPBACK}:{port} within "
                    f"{self._startup_timeout_s} s; log {log_path}:\n{tail or '<empty>'}"
                )
            time.sleep(_POLL_INTERVAL_S)

        marker_path = _write_marker(
            _Marker(pid=process.pid, port=port, data_dir=data_dir, temporary=self._owns_data_dir)
        )
        self._marker_path = marker_path
        self._process_finalizer.detach()
        self._process_finalizer = weakref.finalize(
            self, _stop_for_finalizer, process, log_file, marker_path
        )

    def _cleanup_process(self, timeout_s: float) -> None:
        """Stop and forget the current process, if any. Idempotent."""
        process, log_file = self._process, self._log_file
        finalizer, marker_path = self._process_finalizer, self._marker_path
        self._process = self._log_file = self._process_finalizer = self._marker_path = None
        if finalizer is not None:
            finalizer.detach()
        if process is not None and log_file is not None:
            terminate_process(process, log_file, timeout_s, before=lambda: _remove_marker(marker_path, process.pid))


# --------------------------------------------------------------------------
# Client helpers
# --------------------------------------------------------------------------

