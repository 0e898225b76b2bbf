"""Process plumbing shared by the test brokers: ports, readiness, log tails, stopping by PID.

Nothing here knows which broker it runs. Every child is started so that it dies with
this interpreter (``PR_SET_PDEATHSIG`` on Linux, a :func:`weakref.finalize` otherwise)
and is stopped by the PID we started, never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = [
    "LOOPBACK",
    "accepts_connections",
    "free_loopback_port",
    "parent_death_signal_preexec",
    "read_tail",
    "terminate_process",
]

LOOPBACK = "127.0.0.1"
_CONNECT_TIMEOUT_S = 0.2
_LOG_TAIL_BYTES = 4000
_PR_SET_PDEATHSIG = 1


def free_loopback_port() -> int:
    """Ask the kernel for a free port on 127.0.0.1 and release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def accepts_connections(port: int) -> bool:
    """Return True if something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def read_tail(path: Path, offset: int = 0) -> str:
    """Return at most the last few KB that ``path`` gained after ``offset``."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - _LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace").strip()
    except OSError as exc:
        return f"<log unreadable: {exc}>"


def parent_death_signal_preexec() -> Callable[[], None] | None:
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


def terminate_process(
    process: subprocess.Popen[bytes],
    log_file: IO[bytes] | None,
    timeout_s: float,
    before: Callable[[], None] | None = None,
) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; close the log.

    ``Popen`` never signals a PID it has already reaped, so this cannot hit
    an unrelated process that reused the PID. *before* runs first (for example to
    drop a registry marker that names the PID).
    """
    if before is not None:
        before()
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    if log_file is not None:
        log_file.close()
