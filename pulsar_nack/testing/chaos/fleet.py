"""The worker processes of a chaos run, started, signalled, killed and restarted by name.

Each worker is ``python -m pulsar_nack.testing.chaos.worker SPEC ROLE NAME`` with its
output in ``<run>/logs/<name>.log``. Processes are signalled only through their ``Popen``
(which never signals a PID it has already reaped) and die with the run's process on Linux
(``PR_SET_PDEATHSIG``; the fleet is driven from the main thread for that reason).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from .._process import parent_death_signal_preexec, terminate_process

__all__ = ["Fleet"]


class Fleet:
    """Worker processes by name.

    Parameters
    ----------
    spec_path : path
        The run's workload JSON.
    logs : path
        Where each worker's standard output and error go.
    """

    def __init__(self, spec_path: str | os.PathLike[str], logs: str | os.PathLike[str]) -> None:
        self.spec_path = str(spec_path)
        self.logs = Path(logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.roles: dict[str, str] = {}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._outputs: dict[str, IO[bytes]] = {}
        self.exits: list[tuple[str, int]] = []
        """``(name, exit code)`` of every worker that ended when nobody stopped or killed it."""

    def start(self, role: str, name: str) -> int:
        """Start worker *name* (again); return its PID."""
        self.roles[name] = role
        output = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115  (closed when the worker is reaped)
        self._processes[name] = subprocess.Popen(
            [sys.executable, "-m", "pulsar_nack.testing.chaos.worker", self.spec_path, role, name],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            preexec_fn=parent_death_signal_preexec(),  # noqa: PLW1509  (set from the main thread only)
        )  # fmt: skip
        self._outputs[name] = output
        return self._processes[name].pid

    def pid(self, name: str) -> int:
        return self._processes[name].pid

    def names(self, role: str) -> list[str]:
        return sorted(n for n, r in self.roles.items() if r == role)

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send *sig* to worker *name* if it runs."""
        process = self._processes[name]
        if process.poll() is None:
            process.send_signal(sig)

    def kill(self, name: str) -> None:
        """SIGKILL worker *name* and reap it."""
        process = self._processes[name]
        if process.poll() is None:
            process.kill()
        process.wait()
        self._outputs[name].close()

    def stop(self, name: str, timeout_s: float = 60.0) -> int | None:
        """SIGTERM worker *name*, SIGKILL after *timeout_s*; return its exit code."""
        terminate_process(self._processes[name], self._outputs[name], timeout_s)
        return self._processes[name].returncode

    def reap_exited(self) -> list[str]:
        """Names of workers that ended on their own since the last call (each recorded in :attr:`exits`)."""
        ended = []
        for name, process in self._processes.items():
            code = process.poll()
            if code is not None and not self._outputs[name].closed:
                self._outputs[name].close()
                self.exits.append((name, code))
                ended.append(name)
        return ended

    def stop_all(self, timeout_s: float = 60.0) -> None:
        for name in list(self._processes):
            self.stop(name, timeout_s)
