"""The Spark integration on a real local SparkSession and Apache Pulsar standalone.

One SparkSession (``local[2,3]``: two cores, a failed task runs up to three times) for
the whole file, stopped at the end together with its JVM. Every test has its own topic.
Waits are conditions with deadlines; the bounds are generous: these tests check
behaviour, the demo and the benchmarks measure.

The handlers below run on the executors. This module is not importable there, so it
is registered with cloudpickle to travel by value.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar
import pytest

import spark_jobs
from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff
from pulsar_nack.spark import (
    ConsumerConfig,
    TaskBudget,
    close_executor_consumers,
    consume_partition,
    consumer_task,
    dead_letter_topic,
    executor_consumer,
    run_consumer_tasks,
)
from pulsar_nack.testing import quiet_client

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[1]
BITS = 8  # the default precision: deadlines may be up to 2**8 - 1 ms early
SLACK_MS = 25  # wall-clock reads on two processes

cloudpickle = pytest.importorskip("pyspark.cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(spark_jobs)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def spark(session_broker):
    """A quiet local SparkSession: log4j at ERROR, UI off, loopback, this interpreter.

    It depends on the brokers so that it stops first: workers never see a broker go.
    """
    from pulsar_nack.spark import local_session, stop_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = local_session(
        "local[2,3]",
        "pulsar-nack tests",
        log_level="ERROR",
        conf={"spark.ui.enabled": "false", "spark.python.worker.reuse": "true"},
    )
    try:
        yield session
    finally:
        stop_session(session)


@pytest.fixture
def url(session_broker) -> str:
    return session_broker.url


@pytest.fixture
def client(url):
    client = quiet_client(url)
    try:
        yield client
    finally:
        client.close()


# ----------------------------------------------------------------------------- helpers


def produce(client, topic: str, n: int, *, batch_size: int = 10) -> None:
    """Produce events ``0..n-1`` (payload: the decimal id), batched; all confirmed."""
    results: list = []
    producer = client.create_producer(
        topic,
        batching_enabled=batch_size > 1,
        batching_max_messages=max(batch_size, 2),
        batching_max_publish_delay_ms=5,
        block_if_queue_full=True,
    )
    for i in range(n):
        producer.send_async(str(i).encode(), lambda result, _id: results.append(result))
    producer.flush()
    producer.close()
    assert len(results) == n and all(r == pulsar.Result.Ok for r in results)


def assert_subscription_empty(url: str, topic: str, subscription: str, wait_ms: int = 1500) -> None:
    """A fresh consumer gets nothing: every message of the subscription was acked."""
    client = quiet_client(url)
    try:
        consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
        try:
            message = consumer.receive(wait_ms)
        except pulsar.Timeout:
            pass
        else:
            pytest.fail(f"left in the subscription: {message.data()!r} (redelivery {message.redelivery_count()})")
        finally:
            consumer.close()
    finally:
        client.close()


def make_config(url: str, *args, **kwargs) -> ConsumerConfig:
    """A ConsumerConfig for the session's broker."""
    return ConsumerConfig(url, *args, **kwargs)


def new_topic() -> str:
    return f"persistent://public/default/spark-{uuid.uuid4().hex[:12]}"


def event_id(message) -> int:
    return int(message.data())


def fails_first_time(payload: bytes) -> bool:
    """Deterministic 10 %: the same events fail (once) in every run."""
    return zlib.crc32(payload) % 10 == 0


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


def transient_handler(message) -> None:
    if message.redelivery_count() == 0 and fails_first_time(message.data()):
        raise Transient(message.data())


def succeed(message) -> None:
    return None


class PermanentEvery:
    """Permanent failure for ids divisible by *every*; transient (first time) for 10 %."""

    def __init__(self, every: int) -> None:
        self.every = every

    def __call__(self, message) -> None:
        if int(message.data()) % self.every == 0:
            raise Permanent(f"cannot process {message.data()!r}")
        transient_handler(message)


class PoisonId:
    def __init__(self, poison: int) -> None:
        self.poison = poison

    def __call__(self, message) -> None:
        if int(message.data()) == self.poison:
            raise Permanent(f"poison event {self.poison}")


# ----------------------------------------------------------------------------- tests


def test_importing_the_module_imports_neither_pyspark_nor_pulsar():
    code = (
        "import sys, pulsar_nack.spark, pulsar_nack.cli.demo, pulsar_nack.cli.broker; "
        "bad = [m for m in ('pyspark', 'pulsar', '_pulsar') if m in sys.modules]; "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


_LAUNCH_AND_STOP = """
import os, sys, time
from pulsar_nack.spark import launch_jvm, stop_session
launch_jvm("local[1]", "launch-and-stop")
children = {int(c) for t in os.listdir("/proc/self/task") for c in open(f"/proc/self/task/{t}/children").read().split()}
stop_session(None)
print(" ".join(map(str, children)), flush=True)
print(" ".join(str(pid) for pid in children if os.path.exists(f"/proc/{pid}")), flush=True)  # before this process ends
"""


def test_a_jvm_launched_without_a_session_ends_with_stop_session(tmp_path):
    """``launch_jvm`` then ``stop_session(None)`` (the demo's path when something fails before the session):
    the JVM the launch started is gone when it returns (looked at before the launching process ends:
    its end would close the JVM's stdin and end it anyway)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-c", _LAUNCH_AND_STOP], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    children, left = (line.split() for line in done.stdout.splitlines()[-2:])
    assert children, "the launch started no process"
    assert not left, f"still running after stop_session: {left} (the launch started {children})"


def test_stop_session_none_leaves_a_running_session_it_did_not_launch(spark):
    """``launch_jvm`` with a session running reuses it; ``stop_session(None)`` then leaves it running
    (it ended the session fixture's JVM once, which every later Spark test of the process met)."""
    from pulsar_nack.spark import launch_jvm, stop_session

    launch_jvm("local[1]", "reuses the running session")
    stop_session(None)
    assert spark.sparkContext.parallelize(range(10), 2).sum() == 45


def test_config_is_validated_and_pickles():
    import pickle

    config = ConsumerConfig(
        "pulsar://127.0.0.1:6650",
        ["a", "b"],
        "s",
        subscription_type=pulsar.ConsumerType.KeyShared,
        redelivery_backoff=MultiplierRedeliveryBackoff(100, 1000),
        retryable=Transient,
        consumer_options={"receiver_queue_size": 100},
    )
    assert config.topics == ("a", "b") and config.subscription_type == "KeyShared"
    assert config.retryable == (Transient,)
    assert repr(pickle.loads(cloudpickle.dumps(config))) == repr(config)  # backoffs have no __eq__
    assert config.retry_delay_ms(0) == 100 and config.retry_delay_ms(5) == 1000
    with pytest.raises(ValueError):
        ConsumerConfig("pulsar://h:1", "t", "s", on_non_retryable="drop")
    with pytest.raises(ValueError):
        ConsumerConfig("pulsar://h:1", "t", "s", subscription_type="Sharded")
    with pytest.raises(ValueError):  # an empty list is a bad value (test_errors.py: the same everywhere)
        ConsumerConfig("pulsar://h:1", [], "s")
    with pytest.raises(TypeError):
        ConsumerConfig("pulsar://h:1", "t", "s", retryable=("ValueError",))
    with pytest.raises(ValueError):
        ConsumerConfig("pulsar://h:1", "t", "s", consumer_options={"negative_ack_redelivery_delay_ms": 5})
    with pytest.raises(ValueError):
        TaskBudget(max_messages=0)
    assert dead_letter_topic("persistent://p/n/t-partition-3", "s") == "persistent://p/n/t-partition-3-s-DLQ"


def test_registry_reuses_the_consumer_and_rebuilds_after_fork_or_close(url, topic):
    from pulsar_nack.spark import registry as spark_module

    config = make_config(url, topic, "registry")
    try:
        first = executor_consumer(config)
        assert executor_consumer(config) is first
        # A forked child inherits the registry but not the client's threads: it starts afresh.
        spark_module._REGISTRY_PID = -1
        after_fork = executor_consumer(config)
        assert after_fork is not first and spark_module._ABANDONED[-1].consumer is first
        # A closed consumer is replaced.
        after_fork.close()
        rebuilt = executor_consumer(config)
        assert rebuilt is not after_fork and not rebuilt.closed
        # A changed consumer setting rebuilds it too.
        changed = executor_consumer(make_config(url, topic, "registry", negative_ack_redelivery_delay_ms=5_000))
        assert changed is not rebuilt and rebuilt.closed
    finally:
        assert close_executor_consumers() == 1
        spark_module._ABANDONED.pop().close()


def test_20k_messages_every_failure_retried_on_time_nothing_lost_consumers_reused(spark, url, client):
    topic = new_topic()
    n = 20_000
    produce(client, topic, n)
    expected_failures = sum(fails_first_time(str(i).encode()) for i in range(n))
    backoff = MultiplierRedeliveryBackoff(min_delay_ms=500, max_delay_ms=5_000)
    config = make_config(url, topic, "spark-20k", redelivery_backoff=backoff, retryable=(Transient,))

    stats = run_consumer_tasks(
        spark,
        config,
        transient_handler,
        4,
        TaskBudget(max_time_ms=120_000, idle_timeout_ms=1_000),
        until_drained=True,
        record_timings=True,
        collect=event_id,
    )

    # Every message acked at least once, and the broker agrees.
    assert set(stats["collected"]) == set(range(n))
    assert_subscription_empty(url, topic, "spark-20k")
    # Each transient failure was nacked once and retried once, after its backoff.
    assert stats["nacked"] == expected_failures == stats["handler_errors"]["Transient"]
    assert stats["non_retryable"] == 0 and stats["unmatched_nacks"] == 0
    assert len(stats["retries"]) == expected_failures
    assert len({key for key, *_ in stats["retries"]}) == expected_failures
    for key, nacked_at, requested_at, arrived_at in stats["retries"]:
        delay = requested_at - nacked_at
        assert delay == backoff.next_delay_ms(0)
        assert arrived_at - nacked_at >= delay - 2**BITS - SLACK_MS, (key, arrived_at - nacked_at)
    assert stats["lateness_ms"]["min"] >= -(2**BITS) - SLACK_MS
    # A worker served two or more tasks with the same consumer.
    by_consumer = Counter(t["consumer_uid"] for t in stats["task_stats"])
    reused = [uid for uid, tasks in by_consumer.items() if tasks >= 2]
    assert reused, by_consumer
    for uid in reused:
        tasks = [t for t in stats["task_stats"] if t["consumer_uid"] == uid]
        assert len({t["worker_pid"] for t in tasks}) == 1
        assert sum(t["consumer_created"] for t in tasks) == 1
        assert sorted(t["consumer_tasks"] for t in tasks) == list(range(1, len(tasks) + 1))
    assert stats["max_tasks_per_consumer"] >= 2 and stats["reused_consumers"] >= 1
    assert stats["peak_pending_nacks"] > 0 and stats["peak_tracker_memory_bytes"] > 0
    assert all(t["pending_nacks"] == 0 for t in stats["task_stats"])


@pytest.mark.parametrize("hold_ms", [0, 2_000], ids=["broker-held", "consumer-held"])
def test_a_durable_task_drains_its_retries_past_its_idle_timeout(url, client, hold_ms):
    """``retries="durable"``: a task that ends on its idle timeout (300 ms) first waits for the
    retries it reconsumed (1.5 s, + grace), so one task handles every copy; the idle timeout runs
    during the grace, so it ends within grace + idle of the last copy (not after both in turn).
    ``consumer-held`` (``retry_hold_ms``): the copies are batched and held by the consumer, with the
    shorter grace."""
    topic = new_topic()
    produce(client, topic, 20)

    def fail_first(message) -> None:
        if message.redelivery_count() == 0:
            raise RuntimeError("later")

    config = make_config(url, topic, "durable-drain", retries="durable", negative_ack_redelivery_delay_ms=1_500, retry_hold_ms=hold_ms)
    try:
        stats = consume_partition(config, fail_first, TaskBudget(max_time_ms=60_000, idle_timeout_ms=300))
    finally:
        close_executor_consumers()
    assert stats["nacked"] == 20 and stats["acked"] == 20 and stats["received"] == 40
    assert stats["pending_nacks"] == 0 and stats["stop_reason"] == "idle"


def test_a_task_takes_no_message_while_its_consumer_is_disconnected(url, client):
    """What a disconnected consumer's receive queue holds came over the old connection: the
    broker redelivers it after the reconnect, maybe to another executor, so a task handling it
    would handle it twice. The connection state is a stand-in here (``is_connected`` reports
    False for 0.5 s after the 10th message, set by the handler); the receive queue and the
    broker are real. Nothing is handled in that window, and nothing is lost."""
    topic = new_topic()
    produce(client, topic, 50)
    config = make_config(url, topic, "disconnected")
    consumer = executor_consumer(config)  # the one the task will use
    away_until = 0.0
    calls: list[float] = []

    def handler(_message) -> None:
        nonlocal away_until
        calls.append(time.monotonic())
        if len(calls) == 10:
            away_until = time.monotonic() + 0.5

    consumer.is_connected = lambda: time.monotonic() >= away_until  # type: ignore[method-assign]
    try:
        stats = consume_partition(config, handler, TaskBudget(max_time_ms=30_000, idle_timeout_ms=300))
    finally:
        close_executor_consumers()
    assert stats["received"] == 50 == len(calls) and stats["acked"] == 50
    assert calls[10] >= away_until, f"a message was handled {away_until - calls[10]:.3f} s before the reconnect"


def _reconnect_then_produce(url, client, away: str, later: int, **options) -> tuple[dict, float]:
    """A task (idle timeout 300 ms) whose consumer's ``is_connected`` reports False for 0.3 s, during the
    task after 10 messages or as the task starts (``away``), then True while the broker has nothing for it;
    *later* messages are produced 1.5 s after the reconnect. Its stats and how long after the reconnect it ended."""
    import threading

    topic = new_topic()
    first = 10 if away == "during-the-task" else 0
    produce(client, topic, first)
    config = make_config(url, topic, f"resubscribe-{away}", **options)
    consumer = executor_consumer(config)  # the one the task will use
    away_until = 0.0 if first else time.monotonic() + 0.3  # during the task: set by the handler
    calls: list[float] = []

    def handler(_message) -> None:
        nonlocal away_until
        calls.append(time.monotonic())
        if len(calls) == first:
            away_until = time.monotonic() + 0.3

    def produce_later() -> None:
        deadline = time.monotonic() + 30
        while (len(calls) < first or time.monotonic() < away_until + 1.5) and time.monotonic() < deadline:
            time.sleep(0.05)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(first, first + later):
            producer.send(str(i).encode())
        producer.close()

    consumer.is_connected = lambda: time.monotonic() >= away_until  # type: ignore[method-assign]
    thread = threading.Thread(target=produce_later, daemon=True)
    thread.start()
    try:
        stats = consume_partition(config, handler, TaskBudget(max_time_ms=60_000, idle_timeout_ms=300))
        ended = time.monotonic()
    finally:
        thread.join(30)
        close_executor_consumers()
    return stats, ended - away_until


@pytest.mark.parametrize("away", ["during-the-task", "before-the-task"])
def test_a_task_is_not_idle_after_a_reconnect_until_its_consumer_gets_a_message(url, client, away):
    """The C++ client reports a consumer connected as soon as it has a connection, before the broker has
    answered its subscribe; after a failover the new owner loads the topic first, seconds on a loaded
    machine, and sends nothing meanwhile (``test_faults.py``'s Spark demo kill: the tasks ended there
    with the backlog left). So after a reconnect the idle timeout runs from the consumer's first message
    (or the client's operation timeout). The reconnect is a stand-in (``is_connected``), as no broker
    can hold a subscribe answer back on cue; the broker's silence is real (the 40 messages come 1.5 s
    after the reconnect, 5 idle timeouts). A reconnect seen as the task starts (``executor_consumer``'s
    health check) counts too."""
    stats, _after = _reconnect_then_produce(url, client, away, later=40)
    first = 10 if away == "during-the-task" else 0
    assert stats["received"] == first + 40 and stats["acked"] == first + 40, stats["stop_reason"]
    assert stats["stop_reason"] == "idle"


def test_after_a_reconnect_with_nothing_to_get_a_task_ends_after_the_operation_timeout(url, client):
    """The wait for a first message after a reconnect is bounded by the client's operation timeout
    (``operation_timeout_seconds``, 2 s here): a subscribe unanswered that long fails, and the consumer is
    disconnected again. With nothing more to get, the task ends idle the idle timeout after that."""
    stats, after = _reconnect_then_produce(url, client, "during-the-task", later=0, client_options={"operation_timeout_seconds": 2})
    assert stats["received"] == 10 and stats["stop_reason"] == "idle"
    assert 2.3 <= after < 2.3 + 5, f"the task ended {after:.2f} s after the reconnect"  # (+ 5 s: a loaded machine)


def test_a_task_reports_when_its_first_message_came(url, client):
    """``first_received_at_ms`` (the demo's ``first_message_s``): after the task began, no
    later than the handler's first call; None for a task that got nothing."""
    topic = new_topic()
    produce(client, topic, 50)
    calls: list[float] = []

    def handler(_message) -> None:
        time.sleep(0.002)  # the messages of one task do not share a millisecond
        calls.append(time.time() * 1000)

    config = make_config(url, topic, "first-message")
    try:
        stats = consume_partition(config, handler, TaskBudget(max_time_ms=30_000, idle_timeout_ms=500))
        empty = consume_partition(config, handler, TaskBudget(max_time_ms=30_000, idle_timeout_ms=300))
    finally:
        close_executor_consumers()
    assert stats["received"] == 50 == len(calls)
    assert stats["first_received_at_ms"] is not None
    assert stats["started_at_ms"] <= stats["first_received_at_ms"] <= calls[0] < calls[1]
    assert empty["received"] == 0 and empty["first_received_at_ms"] is None


@pytest.mark.parametrize("action", ["ack", "dead_letter"])
def test_non_retryable_errors_are_handled_as_configured(spark, url, client, action):
    topic = new_topic()
    n, every = 2_000, 97
    produce(client, topic, n)
    permanent = {i for i in range(n) if i % every == 0}
    dlq = dead_letter_topic(topic, "nonretry")
    dlq_consumer = client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
    config = make_config(
        url,
        topic,
        "nonretry",
        redelivery_backoff=MultiplierRedeliveryBackoff(300, 3_000),
        retryable=(Transient,),
        on_non_retryable=action,
    )
    stats = run_consumer_tasks(
        spark, config, PermanentEvery(every), 2, TaskBudget(idle_timeout_ms=800), until_drained=True, collect=event_id
    )
    # At least once: a batch redelivered to the other worker shows a permanent failure again.
    assert stats["handler_errors"]["Permanent"] == stats["non_retryable"] >= len(permanent)
    assert stats["handler_errors"]["Transient"] == stats["nacked"] > 0
    assert set(stats["collected"]) == set(range(n)) - permanent
    assert stats["dead_lettered"] == (stats["non_retryable"] if action == "dead_letter" else 0)
    assert_subscription_empty(url, topic, "nonretry")
    dead = []
    try:
        while True:
            message = dlq_consumer.receive(1000 if action == "dead_letter" else 500)
            dead.append(message)
            dlq_consumer.acknowledge(message)
    except pulsar.Timeout:
        pass
    dlq_consumer.close()
    if action == "dead_letter":
        # At least once all along: the checker may see a dead letter twice too.
        assert {int(m.data()) for m in dead} == permanent and len(dead) >= len(permanent)
        assert {m.properties()["REAL_TOPIC"] for m in dead} == {topic}
        assert all(m.properties()["PULSAR_NACK_ERROR"].startswith("Permanent: ") for m in dead)
    else:
        assert dead == []


def test_on_non_retryable_raise_fails_the_job_with_the_worker_traceback_and_loses_nothing(spark, url, client):
    from pyspark.errors import PythonException

    topic = new_topic()
    n, poison = 300, 150
    produce(client, topic, n)
    config = make_config(url, topic, "raise", negative_ack_redelivery_delay_ms=200, retryable=(Transient,), on_non_retryable="raise")
    with pytest.raises(PythonException) as failure:
        run_consumer_tasks(spark, config, PoisonId(poison), 1, TaskBudget(idle_timeout_ms=500))
    assert "Permanent: poison event 150" in str(failure.value)
    assert "Traceback" in str(failure.value)
    # The poison message went back to the subscription: a tolerant run still gets it.
    stats = run_consumer_tasks(
        spark, config, succeed, 2, TaskBudget(idle_timeout_ms=800), until_drained=True, collect=event_id
    )
    assert poison in stats["collected"]
    assert_subscription_empty(url, topic, "raise")


def test_a_python_worker_killed_mid_batch_with_acks_in_flight_loses_nothing_and_keeps_backoffs(
    spark, apache_broker, tmp_path
):
    """SIGKILL a Python worker from inside its handler, mid-task, with acks still grouped.

    The worker dies in the middle of a handler call: that message is not acked, and the
    acks of the last ~100 ms are still in the client's grouping timer. Spark retries the
    task on a new worker. Checked before any broker restart (there is none): every id
    handled successfully at least once, the subscription empty, and every retry no
    earlier than its backoff minus 2**8 ms -- except the retries the dead worker held,
    which the broker returns at once (counted apart).
    """
    url, n = apache_broker.url, 5_000
    client = quiet_client(url)
    try:
        topic = new_topic()
        produce(client, topic, n)
    finally:
        client.close()
    config = make_config(
        url, topic, "killed", redelivery_backoff=MultiplierRedeliveryBackoff(spark_jobs.MIN_BACKOFF_MS, spark_jobs.MAX_BACKOFF_MS),
        retryable=(spark_jobs.Transient,),
    )
    handler = spark_jobs.RecordingHandler(str(tmp_path), kill_after=1_000)
    stats = run_consumer_tasks(spark, config, handler, 2, TaskBudget(max_time_ms=60_000, idle_timeout_ms=1_500),
                               until_drained=True)
    marker = tmp_path / "killed"
    assert marker.exists(), "the handler never killed its worker"
    killed = int(marker.read_text())
    assert any(t["attempt"] >= 1 for t in stats["task_stats"]), "Spark did not retry the killed task"
    report = spark_jobs.check_calls(tmp_path, n, {killed})
    assert_subscription_empty(url, topic, "killed")
    calls = spark_jobs.read_calls(tmp_path)
    again = sum(1 for events in calls.values()
                if any(pid == killed and outcome == "OK" for _, _, outcome, pid in events)
                and any(pid != killed and outcome == "OK" for _, _, outcome, pid in events))
    print(f"python worker kill: {report}; handled by the dead worker and again elsewhere: {again}")


class DieAfterTask:
    """Run the consumer task, then SIGKILL this worker at once (first attempt only)."""

    def __init__(self, task, marker: str) -> None:
        self.task, self.marker = task, marker

    def __call__(self, partition):
        stats = list(self.task(partition))
        if spark_jobs.claim(Path(self.marker)):
            os.kill(os.getpid(), signal.SIGKILL)
        return iter(stats)


@pytest.mark.parametrize("n", [2_500, 1_700])
def test_a_python_worker_killed_right_after_its_task_loses_no_acks(spark, apache_broker, tmp_path, n):
    """The worker dies the moment its task returns: its acks were on the wire already.

    The task ends on its last message; the wrapper kills the worker right after it
    returns, from inside the Spark task. Spark retries the task on a new worker, which
    must receive nothing: an ack left in the dead client would bring its message back.
    Broken on purpose with ``ack_flush_ms=0``, the retry receives the unsent acks'
    messages and this test fails (see docs/spark.md).

    The C++ client sends grouped acks every 100 ms, and at once whenever 1,000 are
    pending; *n* is no multiple of 1,000, so the last acks always wait for the timer.
    The sabotage can still pass when the worker is descheduled for a timer period
    between its last ack and the kill (seen once in four runs on a loaded machine), so
    the test runs twice.
    """
    url = apache_broker.url
    client = quiet_client(url)
    try:
        topic = new_topic()
        produce(client, topic, n)
    finally:
        client.close()
    config = make_config(url, topic, "flush")
    task = consumer_task(config, succeed, TaskBudget(max_messages=n, idle_timeout_ms=1_500))
    marker = tmp_path / "killed"
    sc = spark.sparkContext
    (retry,) = sc.parallelize([0], 1).mapPartitions(DieAfterTask(task, str(marker))).collect()
    assert marker.exists() and retry["attempt"] == 1, retry["attempt"]
    assert retry["received"] == 0, f"{retry['received']} messages came back: their acks died with the worker"
    assert_subscription_empty(url, topic, "flush", wait_ms=2000)


def run_demo(*args: str, timeout_s: float = 240) -> tuple[dict[str, Any], str]:
    """``pulsar-nack demo ARGS --json`` in a fresh process: (its summary, its stderr).

    A demo still running after *timeout_s* fails the test with every thread's stack:
    the process runs with ``PYTHONFAULTHANDLER`` and gets SIGABRT, which dumps them.
    """
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    with subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
        env=env,
        start_new_session=True,  # its own group: a fork of it left behind (holding our pipes) is killed with it
    ) as demo:
        try:
            stdout, stderr = demo.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            demo.send_signal(signal.SIGABRT)
            try:
                _, stderr = demo.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                stderr = ""
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)  # and any fork of it, else communicate() waits for ever
            _, rest = demo.communicate(timeout=30)
            pytest.fail(f"the demo ran for more than {timeout_s:g} s; its threads:\n{(stderr or rest)[-6000:]}")
    assert demo.returncode == 0, f"stderr: {stderr[-3000:]}\nstdout: {stdout[-3000:]}"
    assert len(stdout.splitlines()) == 1, f"stdout holds more than the JSON line: {stdout[:2000]}"
    return json.loads(stdout), stderr


def test_demo_runs_quietly_and_loses_nothing():
    summary, stderr = run_demo("--messages", "small")
    assert summary["lost"] == 0 and summary["left_in_subscription"] == 0 and summary["ok"]
    assert summary["result"].startswith("OK: nothing lost")
    assert summary["produced"] == 10_000 and summary["acked"] >= 10_000
    assert summary["nacked"] == summary["handler_errors"]["TransientError"] > 0
    assert summary["redelivery_lateness_ms"]["count"] == summary["nacked"]
    # The start-up timings (bench/startup.py reads them): broker, then Spark, then the
    # first message, all within the run.
    started = summary["broker_start_s"] + summary["spark_start_s"]
    assert summary["broker_start_s"] >= 0 and started - 0.05 <= summary["first_message_s"] <= summary["wall_s"]
    # Quiet: no log4j / Spark / pulsar client log lines, no Java stack traces.
    noisy = [
        line
        for line in stderr.splitlines()
        if re.search(r"\b(INFO|WARN|WARNING|ERROR)\b|^\s+at [\w.$]+\(|Exception", line)
    ]
    assert not noisy, noisy[:10]


def test_demo_with_the_builtin_tracker_runs_the_same_pipeline_on_apache_pulsar(apache_broker):
    """``--tracker builtin``: pulsar-client's own nack, fixed at the demo's first delay (500 ms).

    Nothing lost (a delay too long for the run, e.g. 60 s, fails here), every nack
    paired with its retry, no retry before 500 ms after its nack (beyond clock noise: a
    builtin consumer built with a shorter delay fails here), and the built-in tracker's
    state reported as unknown, not as zeros.
    """
    summary, _ = run_demo("--service-url", apache_broker.url, "--tracker", "builtin", "--messages", "2000")
    assert summary["tracker"] == "builtin" and summary["ok"]
    assert summary["lost"] == 0 and summary["left_in_subscription"] == 0 and summary["produced"] == 2000
    assert summary["nacked"] == summary["handler_errors"]["TransientError"] > 0
    late = summary["redelivery_lateness_ms"]
    assert late["count"] == summary["nacked"]
    assert late["min"] >= -50, f"a retry came {-late['min']} ms before its requested delay"
    wait = summary["retry_wait_ms"]  # arrival - nack, whatever delay the config asked for
    assert wait["min"] >= 450, f"a retry waited {wait['min']} ms, not the demo's first backoff (500 ms)"
    assert summary["peak_pending_nacks"] is None and summary["peak_tracker_memory_bytes"] is None


@pytest.fixture(scope="module")
def forgetful_broker() -> Any:
    """Apache Pulsar standalone, batch-index acks on as the demo's own, that deletes a topic
    idle for 1 s with no subscription (the stock setting does so after a minute; a slow Spark
    start can take that long)."""
    from pulsar_nack.testing import PulsarStandalone

    idle = {"brokerDeleteInactiveTopicsFrequencySeconds": "1", "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1"}
    broker = PulsarStandalone(batch_index_ack=True, config=idle).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_demo_loses_nothing_on_a_broker_that_deletes_idle_topics_before_spark_starts(forgetful_broker):
    """The demo's producer is done (and closed) long before Spark's tasks subscribe: the
    subscription exists before the first event, so the broker keeps the topic and its events."""
    summary, _ = run_demo("--service-url", forgetful_broker.url, "--messages", "2000")
    assert summary["lost"] == 0 and summary["left_in_subscription"] == 0 and summary["ok"], summary["result"]
    assert summary["produced"] == 2000 and summary["acked"] >= 2000


def test_demo_with_durable_retries_loses_nothing_and_no_retry_is_early(apache_broker):
    """``--retries durable``: every failure reconsumed through the retry letter topic, none early.

    The session's broker has the stock 1 s delayed-delivery tick, which delivers the
    demo's 500 ms retries at once; the consumers hold them until due (the lateness of
    each retry is its arrival minus its reconsume call plus its delay).
    """
    summary, _ = run_demo("--service-url", apache_broker.url, "--retries", "durable", "--messages", "2000")
    assert summary["retries"] == "durable" and summary["ok"]
    assert summary["lost"] == 0 and summary["left_in_subscription"] == 0 and summary["produced"] == 2000
    assert summary["nacked"] == summary["handler_errors"]["TransientError"] > 0
    late = summary["redelivery_lateness_ms"]
    assert late["count"] == summary["nacked"]  # each reconsume paired with its copy (by ORIGIN_MESSAGE_ID)
    assert late["min"] >= -2, f"a retry came {-late['min']} ms early"  # (ms rounding of publish times)


def test_a_durable_task_rejects_non_retryable_messages_to_the_retry_path_dead_letter_topic(url, client):
    """``retries="durable"``: a non-retryable failure is the consumer's ``reject``: the dead letter
    a reconsume past the limit would send (Java's topic and form, ``RECONSUMETIMES``), at once,
    the handler's error beside it; the original acked."""
    topic = new_topic()
    produce(client, topic, 10)
    dlq = client.subscribe(f"{topic}-durable-reject-DLQ", "check", initial_position=pulsar.InitialPosition.Earliest)
    config = make_config(
        url, topic, "durable-reject", retries="durable", retryable=(Transient,), on_non_retryable="dead_letter"
    )
    try:
        stats = consume_partition(config, PermanentEvery(3), TaskBudget(max_time_ms=60_000, idle_timeout_ms=500))
    finally:
        close_executor_consumers()
    poison = {0, 3, 6, 9}
    assert stats["dead_lettered"] == stats["non_retryable"] == len(poison)
    dead = []
    try:
        while True:
            message = dlq.receive(2_000)
            dead.append(message)
            dlq.acknowledge(message)
    except pulsar.Timeout:
        pass
    dlq.close()
    assert {int(m.data()) for m in dead} == poison
    assert all(m.properties()["RECONSUMETIMES"] == "1" for m in dead)
    assert all(m.properties()["PULSAR_NACK_ERROR"].startswith("Permanent: ") for m in dead)
    assert_subscription_empty(url, topic, "durable-reject")
