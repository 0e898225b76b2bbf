"""Where a ``pulsar.Client`` made by this project logs: standard error, through the C++ client.

Not ``pulsar.ConsoleLogger``: it writes to **stdout** (checked with pulsar-client 3.13), where
the client's lines would mix with a program's output (``pulsar-nack demo --json``, or the
driver's stdout in Spark's local mode).

Not a Python :class:`logging.Logger` either: with one, pulsar-client 3.13.0 calls into
Python from its own threads for every log line, whatever the logger's level, and a line
logged while the interpreter shuts down aborts the process ("terminate called without an
active exception", exit status 134) in about half of the runs, after ``client.close()`` too
(tests/test_cli.py runs it five times). Users who pass their own Python logger to
``pulsar.Client`` meet the same; that is pulsar-client's, not ours.
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import Any

__all__ = [
    "LEVELS",
    "stderr_logger",
]

STDERR_PATH = "/dev/stderr"
"""The file the loggers write to: this process's standard error."""

LEVELS = ("debug", "info", "warn", "error")
"""The level names :func:`stderr_logger` takes, lowest first."""


def stderr_logger(level: str = "warn") -> Any:
    """A ``pulsar.FileLogger`` writing lines at *level* and above to standard error.

    When standard error is a regular file (``2> file`` opens it without ``O_APPEND``), it is
    switched to append mode first, so that Python's writes and the client's (which opens the
    file again, appending) do not overwrite each other.

    Raises
    ------
    TypeError
        If ``level`` is not a str.
    ValueError
        If ``level`` is not one of :data:`LEVELS`.
    """
    import pulsar

    if not isinstance(level, str):
        raise TypeError(f"level must be a str, got {type(level).__name__}")
    if level.lower() not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    _append_if_regular_file(2)
    levels = {
        "debug": pulsar.LoggerLevel.Debug,
        "info": pulsar.LoggerLevel.Info,
        "warn": pulsar.LoggerLevel.Warn,
        "error": pulsar.LoggerLevel.Error,
    }
    return pulsar.FileLogger(levels[level.lower()], STDERR_PATH)


def _append_if_regular_file(fd: int) -> None:
    """Put *fd* in append mode when it is a regular file (a tty or a pipe needs nothing)."""
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    except OSError:  # a closed or unusual stderr: the client's own file still appends
        pass
