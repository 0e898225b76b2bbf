"""``bench._common.pinned_apart``: the benchmarks' broker on one CPU, the benchmark on the others.

A ``sleep`` child process stands in for the broker (only its PID and threads matter here)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench._common import pinned_apart

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin apart"
)


def test_the_broker_and_the_benchmark_run_on_separate_cpus_until_the_end() -> None:
    before = os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pinned_apart(SimpleNamespace(pid=child.pid)) as pinned:
            assert pinned is not None
            assert os.sched_getaffinity(child.pid) == set(pinned["broker"]) == {max(before)}
            assert os.sched_getaffinity(0) == set(pinned["bench"]) == before - {max(before)}
        assert os.sched_getaffinity(0) == before
    finally:
        child.kill()
        child.wait()


def test_a_launcher_scripts_child_is_pinned_with_it() -> None:
    """``bin/pulsar`` may run the JVM as its child: the broker's descendants go to its CPU too."""
    before = os.sched_getaffinity(0)
    launcher = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)'; true"])
    try:
        deadline = time.monotonic() + 10
        while not (children := _children(launcher.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert children, "the launcher started no child"
        with pinned_apart(SimpleNamespace(pid=launcher.pid)):
            assert os.sched_getaffinity(children[0]) == {max(before)}
    finally:
        launcher.kill()
        launcher.wait()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_broker_it_did_not_start_is_left_alone() -> None:
    before = os.sched_getaffinity(0)
    with pinned_apart(SimpleNamespace(url="pulsar://127.0.0.1:6650")) as pinned:
        assert pinned is None
        assert os.sched_getaffinity(0) == before
