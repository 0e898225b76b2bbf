"""Export pulsar-nack's metrics to Prometheus: ``/metrics`` on loopback.

Needs ``pip install 'pulsar-nack[otel]' opentelemetry-sdk opentelemetry-exporter-prometheus``.
A tracker stands in for a consumer here so that the example runs without a broker;
``instrument(consumer)`` works the same on a ``NackingConsumer`` or an asyncio consumer
and adds the topic and subscription attributes.

    python examples/metrics_prometheus.py --port 9464
    curl -s http://127.0.0.1:9464/metrics | grep pulsar
"""

from __future__ import annotations

import argparse
import time

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from pulsar_nack import NegativeAcksTracker
from pulsar_nack.metrics import instrument

TOPIC = "persistent://public/default/orders"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9464, help="0 picks a free port")
    parser.add_argument("--serve-seconds", type=float, default=30.0)
    args = parser.parse_args()

    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    server, _thread = start_http_server(args.port, addr="127.0.0.1")
    print(f"serving http://127.0.0.1:{server.server_port}/metrics", flush=True)

    redelivered: list[object] = []
    tracker = NegativeAcksTracker(redelivered.append, delay_ms=200, default_topic=TOPIC)
    instrument(tracker, provider.get_meter("pulsar_nack"), subscription="billing")
    end = time.monotonic() + args.serve_seconds
    entry = 0
    while time.monotonic() < end:  # a steady stream of failures: one nack every 10 ms
        tracker.add((TOPIC, 1, entry, -1))
        entry += 1
        time.sleep(0.01)
    tracker.close()
    server.shutdown()


if __name__ == "__main__":
    main()
