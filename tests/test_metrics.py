"""pulsar_nack.metrics against the OpenTelemetry SDK's in-memory reader, on known workloads.

No broker here: a tracker is what the instruments read. The consumer's counters (nack,
handoff bursts, swallowed copies) are checked on Apache Pulsar in tests/test_asyncio.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import FakeClock

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from pulsar_nack import NegativeAcksTracker
from pulsar_nack.metrics import NACK_COUNTER, instrument, topic_attributes

TOPIC = "persistent://public/default/orders-partition-1"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _reader() -> tuple[InMemoryMetricReader, Any]:
    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader]).get_meter("test")


def _points(reader: InMemoryMetricReader) -> dict[str, Any]:
    """Metric name -> its single data point (the tests use one attribute set)."""
    found: dict[str, Any] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                (point,) = metric.data.data_points
                found[metric.name] = point
    return found


def _values(reader: InMemoryMetricReader) -> dict[str, Any]:
    return {name: getattr(p, "value", None) for name, p in _points(reader).items()}


def test_counters_and_gauges_match_a_known_workload():
    clock = FakeClock(0)
    tracker = NegativeAcksTracker(delay_ms=100, precision_bits=0, clock=clock, default_topic=TOPIC)
    reader, meter = _reader()
    instrument(tracker, meter, subscription="billing")
    for entry in range(10):
        tracker.add((TOPIC, 7, entry, -1))
    for index in range(5):  # five messages of one batched entry, due later
        tracker.add((TOPIC, 8, 0, index), 200)
    assert sum(map(len, tracker.pop_due(100).values())) == 10

    values = _values(reader)
    assert values[NACK_COUNTER] == 15
    assert values["pulsar_nack.message.redelivered"] == 10
    assert values["pulsar_nack.redeliver.errors"] == 0
    assert values["pulsar_nack.pending.messages"] == 5
    assert values["pulsar_nack.pending.entries"] == 1
    assert values["pulsar_nack.buckets"] == 1
    assert values["pulsar_nack.memory"] == tracker.stats()["memory_bytes"] > 0
    assert "pulsar_nack.handoff.bursts" not in values  # a consumer counter

    tracker.drain()  # keys leave unreleased: the nack count must not go down
    values = _values(reader)
    assert values[NACK_COUNTER] == 15
    assert values["pulsar_nack.pending.messages"] == 0
    assert values["pulsar_nack.buckets"] == 0


def test_the_buckets_gauge_counts_open_and_sealed_buckets_and_says_so():
    """Its name stays the one dashboards know, and it counts every bucket (``stats()["buckets"]``)."""
    tracker = NegativeAcksTracker(delay_ms=0, precision_bits=0, max_open_buckets=2, clock=FakeClock(0))
    reader, meter = _reader()
    handle = instrument(tracker, meter)
    for deadline in range(10):  # ten buckets: two open, eight sealed into a page
        tracker.add((TOPIC, 7, deadline, -1), deadline)
    with tracker._lock:
        tracker._buckets.seal_all()
    gauge = handle.instruments["pulsar_nack.buckets"]
    assert _values(reader)["pulsar_nack.buckets"] == tracker.stats()["buckets"] == 10
    assert "open" not in gauge.description.lower().replace("open and sealed", "")


def test_attributes_follow_the_java_client():
    reader, meter = _reader()
    tracker = NegativeAcksTracker(delay_ms=100, clock=FakeClock(0), default_topic=TOPIC)
    instrument(tracker, meter, subscription="billing")
    attributes = dict(_points(reader)[NACK_COUNTER].attributes)
    assert attributes == {
        "pulsar.tenant": "public",
        "pulsar.namespace": "public/default",
        "pulsar.topic": "persistent://public/default/orders",
        "pulsar.partition": 1,
        "pulsar.subscription": "billing",
    }
    assert topic_attributes("non-persistent://t/ns/x") == {
        "pulsar.tenant": "t",
        "pulsar.namespace": "t/ns",
        "pulsar.topic": "non-persistent://t/ns/x",
    }


def _wait(condition: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.005)


def test_lateness_histogram_gets_one_value_per_release_burst():
    released: list[int] = []
    tracker = NegativeAcksTracker(lambda due: released.extend(map(len, due.values())), delay_ms=20, precision_bits=0)
    reader, meter = _reader()
    instrument(tracker, meter, topic=TOPIC)
    try:
        for burst in range(3):
            for entry in range(4):
                tracker.add((TOPIC, burst, entry, -1), 20 + 200 * burst)
        _wait(lambda: sum(released) == 12)
        _wait(lambda: tracker._timer is not None and tracker._timer.wait_idle(0.01))
        histogram = _points(reader)["pulsar_nack.redelivery.lateness"]
        assert histogram.count == len(released) >= 3  # one per release burst, not per message
        assert histogram.min >= 0 and histogram.max < 1000
        assert histogram.max >= tracker.stats()["last_lateness_ms"]
    finally:
        tracker.close()


def test_redeliver_errors_are_counted_and_keys_retried():
    calls: list[int] = []

    def redeliver(due: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("client down")

    tracker = NegativeAcksTracker(redeliver, delay_ms=10, precision_bits=0, retry_delay_ms=10)
    reader, meter = _reader()
    instrument(tracker, meter)
    try:
        tracker.add((TOPIC, 1, 1, -1))
        _wait(lambda: len(calls) == 2 and tracker.wait_idle(0.01))
        values = _values(reader)
        assert values["pulsar_nack.redeliver.errors"] == 1
        assert values["pulsar_nack.message.redelivered"] == 1
        assert values[NACK_COUNTER] == 1
        assert _points(reader)["pulsar_nack.redelivery.lateness"].count == 1  # the failed burst is not a release
    finally:
        tracker.close()


def test_close_detaches_the_instruments():
    tracker = NegativeAcksTracker(lambda due: None, delay_ms=10, precision_bits=0)
    reader, meter = _reader()
    handle = instrument(tracker, meter)
    handle.close()
    handle.close()  # idempotent
    assert not tracker._release_listeners
    tracker.add((TOPIC, 1, 1, -1))
    assert tracker.wait_idle(5.0)
    assert _values(reader) == {}
    tracker.close()


def test_bad_input_raises_and_registers_nothing():
    reader, meter = _reader()
    tracker = NegativeAcksTracker(delay_ms=10)
    with pytest.raises(TypeError):
        instrument(object(), meter)
    with pytest.raises(TypeError):
        instrument(tracker, meter, topic=5)
    with pytest.raises(TypeError):
        tracker.add_release_listener("not callable")  # type: ignore[arg-type]
    assert _values(reader) == {} and not tracker._release_listeners


def test_the_core_imports_no_opentelemetry():
    code = (
        "import sys, pulsar_nack, pulsar_nack.core.tracker, pulsar_nack.core.baseline, pulsar_nack.metrics;"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_prometheus_example_serves_the_instruments():
    pytest.importorskip("opentelemetry.exporter.prometheus")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "metrics_prometheus.py"), "--port", "0", "--serve-seconds", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line
        url = line.split()[1]
        names = (
            "pulsar_client_consumer_message_nack_total",
            "pulsar_nack_message_redelivered_total",
            "pulsar_nack_pending_messages",
            "pulsar_nack_memory",
            "pulsar_nack_redelivery_lateness",
        )
        page = ""
        end = time.monotonic() + 30
        while not all(name in page for name in names):  # the first release comes after 200 ms
            assert time.monotonic() < end, page[-2000:]
            page = urllib.request.urlopen(url, timeout=5).read().decode()
            time.sleep(0.05)
        assert 'pulsar_topic="persistent://public/default/orders"' in page
    finally:
        process.terminate()
        process.wait(10)


def test_spark_run_stats_export_from_the_driver():
    from pulsar_nack.metrics import RunStatsExporter
    from pulsar_nack.spark import aggregate_task_stats

    reader, meter = _reader()
    exporter = RunStatsExporter(meter, topic="orders", subscription="spark")
    run = dict(aggregate_task_stats([], wall_ms=1000.0))
    run.update(received=12, acked=10, nacked=4, redelivered=3, swallowed=1, dead_lettered=0)
    run["retries"] = [(("t", 1, 1, -1), 0.0, 1000.0, 1030.0), (("t", 1, 2, -1), 0.0, 1000.0, 990.0)]
    exporter.record(run)
    exporter.record(run)  # a second run adds up
    points = _points(reader)
    assert points[NACK_COUNTER].value == 8
    assert points["pulsar_nack.message.received"].value == 24
    assert points["pulsar_nack.message.swallowed"].value == 2
    lateness = points["pulsar_nack.redelivery.lateness"]
    assert (lateness.count, lateness.sum, lateness.min, lateness.max) == (4, 60, 0, 30)
    assert points["pulsar_nack.redelivery.early"].value == 2  # the -10 ms retry, twice
    assert points[NACK_COUNTER].attributes["pulsar.subscription"] == "spark"
    with pytest.raises(ValueError):
        exporter.record({"nacked": 1})
    with pytest.raises(TypeError):
        exporter.record([run])  # type: ignore[arg-type]
    assert _points(reader)[NACK_COUNTER].value == 8  # bad input added nothing
