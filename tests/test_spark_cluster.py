"""The Spark integration on a real Spark standalone cluster and Apache Pulsar.

One cluster for the module: a master and two workers, each its own JVM, started with
the ``spark-class`` launcher of the pyspark wheel on 127.0.0.1 (see
:class:`pulsar_nack.testing.spark_cluster.SparkStandaloneCluster`). Every driver runs
in a process of its own (``spark-submit``, the ``pulsar-nack`` command, or
tests/spark_jobs.py), so the executors are never the driver's process: they are JVMs
the workers launch. Waits are conditions with deadlines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pulsar
import pytest

from helpers import pid_gone, wait_for
from pulsar_nack.testing import quiet_client
from spark_jobs import check_calls, read_calls

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# Two executors of one core each (one per worker), small enough for a 2-core machine.
EXECUTOR_CONF = {"spark.executor.memory": "512m", "spark.cores.max": "2", "spark.executor.cores": "1"}


@pytest.fixture(scope="module")
def cluster():
    from pulsar_nack.testing.spark_cluster import SparkStandaloneCluster

    with SparkStandaloneCluster(workers=2, cores_per_worker=1, worker_memory="1g") as started:
        yield started


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def _produce(url: str, topic: str, n: int) -> None:
    """Produce events ``0..n-1``, batched; every send confirmed by the broker."""
    results: list = []
    client = quiet_client(url)
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
        )
        for i in range(n):
            producer.send_async(str(i).encode(), lambda result, _id: results.append(result))
        producer.flush()
        producer.close()
    finally:
        client.close()
    assert len(results) == n and all(r == pulsar.Result.Ok for r in results)


def _left_in_subscription(url: str, topic: str, subscription: str) -> int:
    client = quiet_client(url)
    left = 0
    try:
        consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
        try:
            while True:
                consumer.receive(1500)
                left += 1
        except pulsar.Timeout:
            pass
        consumer.close()
    finally:
        client.close()
    return left


def _executor_dirs(cluster) -> list[Path]:
    return sorted(p for p in cluster.work_dir.glob("app-*/*") if p.is_dir())


def test_spark_submit_runs_the_example_on_the_cluster(cluster, apache_broker):
    from pyspark import __file__ as pyspark_file

    topic = f"persistent://public/default/submit-{uuid.uuid4().hex[:10]}"
    before = set(_executor_dirs(cluster))
    submit = Path(pyspark_file).parent / "bin" / "spark-submit"
    conf = [arg for key, value in EXECUTOR_CONF.items() for arg in ("--conf", f"{key}={value}")]
    done = subprocess.run(
        [str(submit), "--master", cluster.master_url, *conf,
         "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
         str(REPO_ROOT / "examples" / "spark_foreach_partition.py"),
         "--service-url", apache_broker.url, "--topic", topic, "--messages", "3000", "--tasks", "2"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=str(REPO_ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = [json.loads(line.split(": ", 1)[1].replace("'", '"')) for line in done.stdout.splitlines()
              if line.startswith("round ")]
    assert sum(r["acked"] for r in rounds) >= 3000 and rounds[-1]["received"] == 0, done.stdout
    assert sum(r["nacked"] for r in rounds) > 0  # 5 % fail once and are retried
    assert _left_in_subscription(apache_broker.url, topic, "spark-example") == 0
    # The executors were JVMs the workers launched for this application.
    assert len(set(_executor_dirs(cluster)) - before) >= 2


def test_demo_on_the_cluster_against_apache_pulsar(cluster, apache_broker):
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--service-url", apache_broker.url,
         "--master", cluster.master_url, "--messages", "small", "--tasks", "2", "--json"],
        capture_output=True, text=True, timeout=400, env=_env(), cwd=str(REPO_ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["lost"] == 0 and summary["left_in_subscription"] == 0 and summary["ok"]
    assert summary["master"] == cluster.master_url
    assert summary["nacked"] > 0 and summary["redelivery_lateness_ms"]["count"] == summary["nacked"]
    assert summary["duplicates"] <= 0.01 * summary["produced"], summary
    # Executors in processes other than the driver's.
    assert summary["worker_pids"] and summary["driver_pid"] not in summary["worker_pids"]


def _start_driver(args: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(TESTS / "spark_jobs.py"), json.dumps(args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(REPO_ROOT),
    )


def _never_got_going(cluster, driver: subprocess.Popen) -> None:
    """Fail with what the master and the driver say: a job that never handled a quarter of its events."""
    try:
        state = cluster.state()
        master = {"apps": [(a.get("name"), a.get("state"), a.get("cores")) for a in state.get("activeapps", [])],
                  "workers": [(w.get("state"), w.get("coresused"), w.get("cores")) for w in state.get("workers", [])]}  # fmt: skip
    except (OSError, ValueError) as error:
        master = {"unreadable": repr(error)}
    if driver.poll() is None:
        driver.kill()
    _, err = driver.communicate()
    pytest.fail(f"the job never got going (driver exit {driver.returncode}; master {master}); driver stderr: {err[-3000:]}")


def _finish(driver: subprocess.Popen, timeout_s: float = 300) -> dict:
    try:
        out, err = driver.communicate(timeout=timeout_s)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_an_executor_jvm_killed_mid_run_loses_nothing_and_keeps_backoffs(cluster, apache_broker, tmp_path):
    """SIGKILL a whole executor JVM while its tasks run; the worker starts a new one.

    Checked with no broker restart: every id handled successfully at least once, the
    subscription empty, every retry no earlier than its backoff minus 2**8 ms (retries
    nacked by the killed executor's Python workers come back early by design and are
    counted apart).
    """
    url, n = apache_broker.url, 6_000
    topic = f"persistent://public/default/killjvm-{uuid.uuid4().hex[:10]}"
    _produce(url, topic, n)
    args = {"master": cluster.master_url, "url": url, "topic": topic, "subscription": "killjvm",
            "record_dir": str(tmp_path), "tasks": 2, "delay_ms": 1.0, "conf": EXECUTOR_CONF}
    # Both cores: an earlier test's application may still be giving its executors back.
    assert wait_for(lambda: not cluster.state().get("activeapps"), 60, 0.2), cluster.state().get("activeapps")
    driver = _start_driver(args)
    try:
        going = wait_for(lambda: driver.poll() is not None or sum(len(v) for v in read_calls(tmp_path).values()) >= n // 4, 180, 0.1)
        if not going or driver.poll() is not None:
            _never_got_going(cluster, driver)
        import psutil

        executors = cluster.executor_pids()
        assert len(executors) == 2, executors
        victim = psutil.Process(executors[0])
        killed = {victim.pid} | {child.pid for child in victim.children(recursive=True)}
        victim.send_signal(signal.SIGKILL)
        assert wait_for(lambda: pid_gone(victim.pid), 10)
    except BaseException:
        driver.kill()
        raise
    result = _finish(driver)
    assert result["driver_pid"] not in result["worker_pids"]
    report = check_calls(tmp_path, n, killed)
    assert _left_in_subscription(url, topic, "killjvm") == 0
    print(f"executor JVM kill: {report}")
    assert wait_for(lambda: not cluster.executor_pids(), 60), "executors outlived their application"
