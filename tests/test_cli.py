"""The ``pulsar-nack`` command line as a user runs it: ``broker`` and the command wiring.

``pulsar-nack demo`` runs in tests/test_spark.py (local) and tests/test_spark_cluster.py
(a standalone cluster, on Apache Pulsar).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import pid_gone, wait_for
from pulsar_nack.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_command_line_lists_its_commands_and_rejects_unknown_ones(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "broker", "bench"))
    with pytest.raises(SystemExit) as done:
        main(["broker", "--lite"])  # the one broker is Apache Pulsar
    assert done.value.code == 2


def test_the_installed_script_runs_bench_from_a_checkout_root_only(tmp_path):
    """``pulsar-nack bench`` as installed: its script's directory, not the working
    directory, is on sys.path, so bench/ (not in the wheel) is loaded from the checkout."""
    script = Path(sys.executable).with_name("pulsar-nack")
    assert script.is_file(), f"no installed script next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [str(script), "bench", "--help"]
    here = subprocess.run(run, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert here.returncode == 0 and "--only" in here.stdout, here.stderr
    elsewhere = subprocess.run(run[:2], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode == 2 and "run it from the root of a checkout" in elsewhere.stderr, elsewhere.stderr


def _lines(stream) -> queue.Queue:
    """Read *stream* line by line on a thread; the lines arrive in the queue."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for_urls(lines: queue.Queue, timeout_s: float) -> dict[str, str]:
    """Collect ``name: value`` lines until the broker pid is printed, within a deadline."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while "broker pid" not in found:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"no broker pid printed within {timeout_s} s; got {found}")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail(f"the command exited before printing its URLs; got {found}")
        match = re.match(r"^(service URL|admin URL|broker pid):\s+(\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


@pytest.mark.broker
def test_broker_command_serves_until_ctrl_c_then_stops_its_broker():

    from pulsar_nack.testing import quiet_client

    process = subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
    )
    try:
        found = _wait_for_urls(_lines(process.stdout), 180)
        assert found["service URL"].startswith("pulsar://127.0.0.1:")
        assert found["admin URL"].startswith("http://127.0.0.1:")
        jvm = int(found["broker pid"])
        client = quiet_client(found["service URL"])
        try:
            producer = client.create_producer(f"persistent://public/default/cli-{os.getpid()}")
            producer.send(b"hello")  # the broker answers
            producer.close()
        finally:
            client.close()
        assert process.poll() is None, "the command must keep running until Ctrl-C"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read()[-2000:]
        assert wait_for(lambda: pid_gone(jvm), 15), f"broker process {jvm} still running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
