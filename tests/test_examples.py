"""Every example in examples/ runs as a user would run it, on Apache Pulsar.

The consumer and Spark examples get the session's broker with ``--service-url`` (each
starts Apache Pulsar standalone itself when run without it); the metrics example needs
no broker. ``test_every_example_is_tested`` keeps this list complete.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TESTED = {"wrap_consumer.py", "asyncio_consumer.py", "spark_foreach_partition.py", "metrics_prometheus.py"}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.py")} == TESTED


def test_every_example_says_what_it_needs_and_starts_apache_pulsar_or_takes_a_service_url():
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text()
        docstring = text.split('"""')[1]
        assert "Needs" in docstring, f"{path.name} does not say what it needs"
        if path.name != "metrics_prometheus.py":  # the one without a broker
            assert "PulsarStandalone" in text and "--service-url" in text, path.name


@pytest.mark.broker
@pytest.mark.parametrize("script", ["wrap_consumer.py", "asyncio_consumer.py"])
def test_consumer_example_retries_and_finishes(script, session_broker):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--service-url", session_broker.url, "--messages", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("failed") == 3
    assert result.stdout.count("succeeded on retry") == 3
    assert "'pending_messages': 0" in result.stdout
    assert "ERROR" not in result.stdout and "WARN" not in result.stdout  # the client's log is not on stdout


@pytest.mark.broker
@pytest.mark.spark
def test_spark_example_acks_every_message_once_and_drains(session_broker):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "spark_foreach_partition.py"), "--service-url", session_broker.url,
         "--messages", "2000", "--tasks", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=str(REPO),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert rounds and rounds[-1].endswith("{'received': 0, 'acked': 0, 'nacked': 0, 'dead_lettered': 0}"), result.stdout
    total = re.search(r"total: ([\d,]+) acked of 2,000 produced \(([\d,]+) delivered twice\), ([\d,]+) nacked", result.stdout)
    assert total, result.stdout
    acked, twice, nacked = (int(g.replace(",", "")) for g in total.groups())
    # Batch-index acks on: every message acked at least once, duplicates within the 1 % bound.
    assert 2000 <= acked <= 2020 and twice == acked - 2000, result.stdout
    assert 40 <= nacked <= 160, result.stdout  # about 5 % fail once


def test_metrics_example_serves_pulsar_nack_metrics_then_exits():
    with subprocess.Popen(
        [sys.executable, str(EXAMPLES / "metrics_prometheus.py"), "--port", "0", "--serve-seconds", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        first = process.stdout.readline()
        url = re.search(r"serving (http://127\.0\.0\.1:\d+/metrics)", first)
        assert url, first + process.stderr.read()
        bodies: list[str] = []

        def scraped() -> bool:
            bodies.append(urllib.request.urlopen(url.group(1), timeout=5).read().decode())
            return "pulsar_nack_pending_messages" in bodies[-1]

        assert wait_for(scraped, 4), bodies[-1][-2000:]
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out.startswith("done: ")


def test_metrics_example_without_opentelemetry_says_what_to_install_in_one_line(tmp_path):
    blocker = tmp_path / "opentelemetry"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named opentelemetry (blocked by the test)')\n")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "metrics_prometheus.py")],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    assert time.monotonic() - started < 10
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "pip install" in result.stderr and "opentelemetry-exporter-prometheus" in result.stderr
