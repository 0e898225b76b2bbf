"""Run a pulsar-lite broker on loopback for tests, examples and the demo.

:class:`EmbeddedBroker` starts the ``pulsar-lite`` binary that ships inside
the ``pulsar-lite`` wheel as a child process, waits until it accepts
connections, and stops it by the PID it started. It does not use
``pulsar_lite.start_broker()``, which scans a shared port range, appends to
one log file shared by every process and leaves an orphan behind when the
interpreter dies.

What a started broker looks like::

    data_dir/
        pulsar-lite.toml       [metrics] enabled = false  (no 0.0.0.0:8080)
        broker.log             the broker's stdout and stderr
        db.rocksdb/            messages, cursors, acks (kept by restart())
        db.metadata.json
        consumer-id-slots/     leases for the consumer-id test shim

    127.0.0.1:PORT             the only socket it listens on

The module also holds a **test-only shim** for a pulsar-lite limitation:
the broker keys consumers by ``(topic, subscription, consumer id)``, and the
consumer id is chosen by the client, starting at 0 in every client. Two
processes that each open one consumer on the same Shared subscription
therefore collide: the second is refused with ``Consumer 0 already exists``
(and its whole connection is closed). A real Apache Pulsar broker keys
consumers per connection and has no such problem.
:func:`apply_embedded_broker_consumer_id_shim` gives each client a distinct
range of consumer ids, and refuses to touch anything that is not an
:class:`EmbeddedBroker` running on this machine.

Importing this module starts nothing and does not import ``pulsar``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

from ._validate import check_int

__all__ = [
    "LOG_LEVELS",
    "EmbeddedBroker",
    "EmbeddedBrokerError",
    "apply_embedded_broker_consumer_id_shim",
    "claim_embedded_broker_consumer_slot",
    "is_embedded_broker_url",
    "quiet_client",
    "reserve_consumer_ids_for_embedded_broker",
]

#: Log levels the pulsar-lite binary accepts for ``--log-level``. It silently
#: falls back to ``info`` for anything else, so we validate before starting.
LOG_LEVELS: tuple[str, ...] = ("error", "warn", "info", "debug", "trace")

_LOOPBACK = "127.0.0.1"
_TEMP_PREFIX = "pulsar-nack-broker-"
_CONFIG_NAME = "pulsar-lite.toml"
_LOG_NAME = "broker.log"
_DB_NAME = "db"
_SLOTS_DIR_NAME = "consumer-id-slots"
# Without this, pulsar-lite serves Prometheus metrics on 0.0.0.0:8080. It
# ignores unknown keys silently and even kept running when given an
# unparsable file, so a typo here would go unnoticed. Keep this exact.
_CONFIG_TEXT = "[metrics]\nenabled = false\n"
_POLL_INTERVAL_S = 0.01
_CONNECT_TIMEOUT_S = 0.2
_LOG_TAIL_BYTES = 4000
_AUTO_PORT_ATTEMPTS = 3
_MAX_SLOTS = 4096
_DEFAULT_SCRATCH_TOPIC = "pulsar-nack-embedded-consumer-id-shim"
_DEFAULT_CONSUMERS_PER_CLIENT = 16
_PR_SET_PDEATHSIG = 1

# Slot leases held by this process: open files with an flock on them. The
# kernel drops the lock when the process exits, which frees the slot.
_SLOT_LEASES: list[IO[str]] = []
_SLOT_LEASES_LOCK = threading.Lock()
_SLOT_LEASES_REGISTERED = False


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker failed to start, or was used in a wrong state.

    Startup failures carry the tail of the broker's log in the message.
    """


class _PortInUse(Exception):
    """Internal: the chosen port was taken; an automatic port may be retried."""


# --------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------


def _check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    """Return ``value`` as a float of seconds, or raise TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return seconds


def _free_loopback_port() -> int:
    """Ask the kernel for a free port on 127.0.0.1 and release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts_connections(port: int) -> bool:
    """Return True if something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection((_LOOPBACK, port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _read_tail(path: Path, offset: int) -> str:
    """Return at most the last few KB that ``path`` gained after ``offset``."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - _LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace").strip()
    except OSError as exc:
        return f"<log unreadable: {exc}>"


def _parent_death_signal_preexec() -> Callable[[], None] | None:
    """Build a ``preexec_fn`` that makes the child die with its parent.

    Linux only. ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` fires when the *thread*
    that forked the child exits, not the process, so it is only used when the
    broker is started from the main thread (which lives as long as the
    interpreter). Everything the child runs is resolved here, before the fork.
    Returns None where it is not available; the atexit hook still applies.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent_pid = os.getpid()
    kill_signal = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill_signal, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl ran
            os.kill(os.getpid(), kill_signal)

    return preexec


# --------------------------------------------------------------------------
# Registry of brokers started on this machine (for the consumer-id shim)
# --------------------------------------------------------------------------


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
    return Path(tempfile.gettempdir()) / f"pulsar-nack-embedded-{uid}"


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
    """True if ``path`` looks like a data directory made by :meth:`EmbeddedBroker.start`."""
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
        wanted = f"{_LOOPBACK}:{port}"
        return any(a == "--addr" and b == wanted for a, b in zip(argv, argv[1:]))
    try:  # no /proc: the best we can do is "a process with that PID lives"
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours, so not an EmbeddedBroker we started
    return True


def _lookup_embedded_broker(url: object) -> _Marker | None:
    """Return the marker of the embedded broker behind ``url``, or None."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:  # e.g. a multi-host service URL
        return None
    if parts.scheme != "pulsar" or host not in (_LOOPBACK, "localhost") or port is None:
        return None
    directory = _registry_dir()
    if not _registry_is_ours(directory):
        return None
    marker = _read_marker(directory / f"{port}.json")
    if marker is None or marker.port != port or not _is_pulsar_lite_process(marker.pid, port):
        return None
    return marker


def is_embedded_broker_url(url: str) -> bool:
    """Tell whether ``url`` points at an :class:`EmbeddedBroker` on this machine.

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
    >>> is_embedded_broker_url("pulsar://pulsar.example.com:6650")
    False
    >>> with EmbeddedBroker() as broker:
    ...     is_embedded_broker_url(broker.url)
    True
    """
    return _lookup_embedded_broker(url) is not None


# --------------------------------------------------------------------------
# Process cleanup (module level so finalizers hold no reference to a broker)
# --------------------------------------------------------------------------


def _terminate_process(
    process: subprocess.Popen[bytes],
    log_file: IO[bytes],
    marker_path: Path | None,
    timeout_s: float,
) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; close the log.

    ``Popen`` never signals a PID it has already reaped, so this cannot hit
    an unrelated process that reused the PID.
    """
    _remove_marker(marker_path, process.pid)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    log_file.close()


def _stop_for_finalizer(
    process: subprocess.Popen[bytes], log_file: IO[bytes], marker_path: Path | None
) -> None:
    """Finalizer body: used at interpreter exit and on garbage collection."""
    _terminate_process(process, log_file, marker_path, 5.0)


# --------------------------------------------------------------------------
# EmbeddedBroker
# --------------------------------------------------------------------------


class EmbeddedBroker:
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
    see :func:`apply_embedded_broker_consumer_id_shim` for the last one).

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
    >>> with EmbeddedBroker() as broker:
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
        self._startup_timeout_s = _check_seconds("startup_timeout_s", startup_timeout_s, allow_zero=False)
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
        EmbeddedBrokerError
            If no port is known yet (never started and no ``port`` given).
        """
        return f"pulsar://{_LOOPBACK}:{self.port}"

    @property
    def port(self) -> int:
        """The loopback port the broker listens on.

        Raises
        ------
        EmbeddedBrokerError
            If no port is known yet (never started and no ``port`` given).
        """
        if self._port is None:
            raise EmbeddedBrokerError("the broker has no port yet; call start() first")
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
        EmbeddedBrokerError
            If it is a temporary directory that does not exist yet or was
            removed by :meth:`stop`.
        """
        if self._data_dir is None:
            raise EmbeddedBrokerError("no data directory: the broker is not started")
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
        return f"EmbeddedBroker(port={self._port}, data_dir={self._data_dir!s}, {state})"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections.

        With no ``port`` given, a free loopback port is chosen (and another
        one tried, up to 3 times, if it was taken in between). After
        :meth:`stop` of a broker with a temporary directory, ``start`` makes
        a fresh, empty one.

        Returns
        -------
        EmbeddedBroker
            ``self``, to allow ``broker = EmbeddedBroker().start()``.

        Raises
        ------
        EmbeddedBrokerError
            If it is already running, exits early, or is not ready within
            ``startup_timeout_s``; the message includes the log tail.
        FileNotFoundError
            If the pulsar-lite binary cannot be found.
        """
        with self._lock:
            if self.is_running():
                raise EmbeddedBrokerError(f"already running: {self!r}")
            self._cleanup_process(timeout_s=5.0)  # a process that died by itself
            self._ensure_data_dir()
            attempts = _AUTO_PORT_ATTEMPTS if self._requested_port is None and self._port is None else 1
            for attempt in range(attempts):
                if self._port is None:
                    self._port = _free_loopback_port()
                try:
                    self._launch()
                    return self
                except _PortInUse as exc:
                    if attempt + 1 >= attempts:
                        raise EmbeddedBrokerError(str(exc)) from None
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
        timeout = _check_seconds("timeout_s", timeout_s, allow_zero=True)
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

    def restart(self, timeout_s: float = 5.0) -> EmbeddedBroker:
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
        EmbeddedBroker
            ``self``.

        Raises
        ------
        EmbeddedBrokerError
            If it was never started, or the new process fails to start (for
            example because another process took the port meanwhile).
        """
        timeout = _check_seconds("timeout_s", timeout_s, allow_zero=True)
        with self._lock:
            if self._data_dir is None or self._port is None:
                raise EmbeddedBrokerError("restart() needs a broker that was started")
            self._cleanup_process(timeout_s=timeout)
            try:
                self._launch()
            except _PortInUse as exc:
                raise EmbeddedBrokerError(str(exc)) from None
            return self

    def __enter__(self) -> EmbeddedBroker:
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
        if _accepts_connections(port):
            raise _PortInUse(f"port {port} on {_LOOPBACK} is already in use by another process")
        argv = [
            find_pulsar_lite_binary(),
            "--config",
            str(data_dir / _CONFIG_NAME),
            "--addr",
            f"{_LOOPBACK}:{port}",
            "--db-path",
            str(data_dir / _DB_NAME),
            "--log-level",
            self._log_level,
        ]
        log_path = data_dir / _LOG_NAME
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by _terminate_process
        log_offset = log_file.tell()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(data_dir),
                close_fds=True,
                preexec_fn=_parent_death_signal_preexec(),  # noqa: PLW1509 - see its docstring
            )
        except BaseException:
            log_file.close()
            raise
        self._process, self._log_file = process, log_file
        self._process_finalizer = weakref.finalize(self, _stop_for_finalizer, process, log_file, None)

        deadline = time.monotonic() + self._startup_timeout_s
        while True:
            if process.poll() is not None:
                tail = _read_tail(log_path, log_offset)
                self._cleanup_process(timeout_s=0.0)
                message = (
                    f"pulsar-lite exited with code {process.returncode} before accepting "
                    f"connections on {_LOOPBACK}:{port}; log {log_path}:\n{tail or '<empty>'}"
                )
                if "AddrInUse" in tail or "Address already in use" in tail:
                    raise _PortInUse(message)
                raise EmbeddedBrokerError(message)
            if _accepts_connections(port) and process.poll() is None:
                break
            if time.monotonic() >= deadline:
                self._cleanup_process(timeout_s=1.0)
                tail = _read_tail(log_path, log_offset)
                raise EmbeddedBrokerError(
                    f"pulsar-lite did not accept connections on {_LOOPBACK}:{port} within "
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
            _terminate_process(process, log_file, marker_path, timeout_s)


# --------------------------------------------------------------------------
# Client helpers
# --------------------------------------------------------------------------


def quiet_client(url: str, **kwargs: Any) -> pulsar.Client:
    """Create a ``pulsar.Client`` that logs only warnings and errors.

    The C++ client logs several INFO lines per connection, producer and
    consumer to stderr. ``pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)``
    drops them (checked with pulsar-client 3.13). Works for any URL.

    Parameters
    ----------
    url : str
        The Pulsar service URL.
    **kwargs
        Passed to ``pulsar.Client``. A ``logger`` given here wins.

    Returns
    -------
    pulsar.Client
        A new client; the caller closes it.

    Raises
    ------
    TypeError
        If ``url`` is not a str.

    Examples
    --------
    >>> with EmbeddedBroker() as broker:
    ...     client = quiet_client(broker.url)
    ...     client.close()
    """
    import pulsar

    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    kwargs.setdefault("logger", pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    return pulsar.Client(url, **kwargs)


# --------------------------------------------------------------------------
# Test-only consumer-id shim
# --------------------------------------------------------------------------


def _prune_slot_leases() -> None:
    """Close leases whose broker directory is gone. Caller holds the lock."""
    global _SLOT_LEASES_REGISTERED
    if not _SLOT_LEASES_REGISTERED:
        atexit.register(_close_slot_leases)
        _SLOT_LEASES_REGISTERED = True
    for lease in list(_SLOT_LEASES):
        if not os.path.exists(lease.name):
            _SLOT_LEASES.remove(lease)
            lease.close()


def _close_slot_leases() -> None:
    """atexit hook: release every lease this process holds."""
    with _SLOT_LEASES_LOCK:
        while _SLOT_LEASES:
            _SLOT_LEASES.pop().close()


_SLOT_ROTATION = 64
"""Claims start at a rotating offset among the first 64 slots: a slot freed by a killed
process (whose consumer pulsar-lite may still hold, see docs/spark.md) is not handed out
again at once, while slot numbers, and so the shim's throwaway consumers, stay small."""


def _next_slot_start(slots_dir: Path) -> int:
    """The next rotating start slot, from a counter file shared by every process (flock)."""
    import fcntl

    with open(slots_dir / "next-start", "a+", encoding="utf-8") as counter:
        fcntl.flock(counter.fileno(), fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        start = int(text) % _SLOT_ROTATION if text.isdigit() else 0
        counter.seek(0)
        counter.truncate(0)
        counter.write(f"{(start + 1) % _SLOT_ROTATION}\n")
        counter.flush()
    return start


def claim_embedded_broker_consumer_slot(service_url: str) -> int:
    """Claim a consumer-id slot number, unique among live processes.

    **Embedded-broker test shim.** Slots are lock files
    ``data_dir/consumer-id-slots/slot-<k>.lock`` of the broker behind
    ``service_url``. A claim takes the smallest ``k`` whose file it can
    ``flock`` exclusively and keeps the file open until this process exits;
    the kernel then drops the lock, so a crashed process frees its slot and
    numbers stay small. ``flock`` locks belong to an open file, so two
    claims conflict even inside one process (each client gets its own slot)
    and a forked child never shares its parent's slot. A PID modulo N
    would not be unique; a counter file would grow without bound.

    Runtime complexity: O(k) lock attempts for the returned slot ``k``.

    Parameters
    ----------
    service_url : str
        URL of an :class:`EmbeddedBroker` running on this machine.

    Returns
    -------
    int
        The slot, ``0 <= slot < 4096``.

    Raises
    ------
    TypeError
        If ``service_url`` is not a str.
    ValueError
        If ``service_url`` is not an embedded broker on this machine.
    EmbeddedBrokerError
        If all slots are taken.

    Examples
    --------
    >>> with EmbeddedBroker() as broker:
    ...     a = claim_embedded_broker_consumer_slot(broker.url)
    ...     b = claim_embedded_broker_consumer_slot(broker.url)
    ...     a != b
    True
    """
    import fcntl

    marker = _lookup_embedded_broker(service_url)
    if marker is None:
        raise ValueError(f"{service_url!r} is not an EmbeddedBroker running on this machine")
    slots_dir = marker.data_dir / _SLOTS_DIR_NAME
    slots_dir.mkdir(exist_ok=True)
    with _SLOT_LEASES_LOCK:
        _prune_slot_leases()
        start = _next_slot_start(slots_dir)
        for slot in [*range(start, _MAX_SLOTS), *range(start)]:
            lease = open(slots_dir / f"slot-{slot}.lock", "a+", encoding="utf-8")  # noqa: SIM115
            try:
                fcntl.flock(lease.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lease.close()
                continue
            except BaseException:
                lease.close()
                raise
            lease.truncate(0)
            lease.write(f"{os.getpid()}\n")
            lease.flush()
            _SLOT_LEASES.append(lease)
            return slot
    raise EmbeddedBrokerError(f"all {_MAX_SLOTS} consumer-id slots are taken in {slots_dir}")


def reserve_consumer_ids_for_embedded_broker(
    client: pulsar.Client,
    slot: int,
    *,
    service_url: str,
    consumers_per_client: int = _DEFAULT_CONSUMERS_PER_CLIENT,
    scratch_topic: str = _DEFAULT_SCRATCH_TOPIC,
) -> int:
    """Skip consumer ids so that this client's next consumers get unique ones.

    **Embedded-broker test shim.** pulsar-lite refuses a consumer whose
    client-chosen id already exists on the same topic and subscription, and
    every client numbers its consumers 0, 1, 2, ... So this creates and
    closes ``slot * consumers_per_client`` throwaway consumers on
    ``scratch_topic`` (a subscription name unique to this call), moving the
    client's counter to ``slot * consumers_per_client``. The client's next
    ``consumers_per_client`` consumers then have ids no other slot uses.

    Call it on a fresh client, before it creates any consumer. It refuses
    to run unless ``service_url`` is an :class:`EmbeddedBroker` on this
    machine (see :func:`is_embedded_broker_url`); it never runs against a
    real cluster, which needs no such thing.

    Runtime complexity: O(slot * consumers_per_client) subscribe round
    trips, well under 1 ms each on loopback.

    Parameters
    ----------
    client : pulsar.Client
        The client to advance, connected to ``service_url``.
    slot : int
        A slot from :func:`claim_embedded_broker_consumer_slot`, >= 0.
    service_url : str
        The URL ``client`` was created with.
    consumers_per_client : int, default 16
        Width of each slot's id range: how many consumers the client may
        create before its ids reach the next slot's range.
    scratch_topic : str
        Topic for the throwaway consumers; nothing is ever published to it.

    Returns
    -------
    int
        The consumer id the client's next consumer will get.

    Raises
    ------
    TypeError
        If an argument has the wrong type.
    ValueError
        If ``slot`` or ``consumers_per_client`` is out of range, or
        ``service_url`` is not an embedded broker on this machine.

    Examples
    --------
    >>> with EmbeddedBroker() as broker:
    ...     client = quiet_client(broker.url)
    ...     first_id = reserve_consumer_ids_for_embedded_broker(
    ...         client, 2, service_url=broker.url, consumers_per_client=4)
    ...     client.close()
    >>> first_id
    8
    """
    import pulsar

    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
    check_int("slot", slot, 0, _MAX_SLOTS - 1)
    check_int("consumers_per_client", consumers_per_client, 1)
    if not isinstance(scratch_topic, str):
        raise TypeError(f"scratch_topic must be a str, got {type(scratch_topic).__name__}")
    if not scratch_topic:
        raise ValueError("scratch_topic must not be empty")
    if not is_embedded_broker_url(service_url):
        raise ValueError(
            f"refusing the consumer-id shim: {service_url!r} is not an EmbeddedBroker "
            "running on this machine"
        )
    count = slot * consumers_per_client
    subscription = f"consumer-id-shim-{os.getpid()}-{uuid.uuid4().hex}"
    for _ in range(count):
        consumer = client.subscribe(scratch_topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
        consumer.unsubscribe()
    return count


def apply_embedded_broker_consumer_id_shim(
    client: pulsar.Client,
    service_url: str,
    *,
    consumers_per_client: int = _DEFAULT_CONSUMERS_PER_CLIENT,
) -> int | None:
    """Apply the consumer-id shim if, and only if, the URL is an embedded broker.

    **Embedded-broker test shim**, the one call a per-process consumer
    factory (such as a Spark executor's) needs: against an
    :class:`EmbeddedBroker` on this machine it claims a slot with
    :func:`claim_embedded_broker_consumer_slot` and advances ``client``
    with :func:`reserve_consumer_ids_for_embedded_broker`; against anything
    else it does nothing. Call it right after creating the client.

    Runtime complexity: O(slot * consumers_per_client).

    Parameters
    ----------
    client : pulsar.Client
        A fresh client created with ``service_url``.
    service_url : str
        The URL ``client`` was created with.
    consumers_per_client : int, default 16
        Width of each slot's consumer-id range.

    Returns
    -------
    int or None
        The claimed slot, or None if the shim did not apply.

    Raises
    ------
    TypeError
        If ``service_url`` is not a str or ``client`` not a pulsar.Client.

    Examples
    --------
    >>> with EmbeddedBroker() as broker:
    ...     client = quiet_client(broker.url)
    ...     slot = apply_embedded_broker_consumer_id_shim(client, broker.url)
    ...     client.close()
    >>> slot is not None
    True
    """
    import pulsar

    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
    if not is_embedded_broker_url(service_url):
        return None
    slot = claim_embedded_broker_consumer_slot(service_url)
    reserve_consumer_ids_for_embedded_broker(
        client, slot, service_url=service_url, consumers_per_client=consumers_per_client
    )
    return slot
