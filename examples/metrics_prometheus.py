"""Export pulsar-nack's metrics to Prometheus: ``/metrics`` on loopback.

Needs the OpenTelemetry SDK and its Prometheus exporter, which are not installed with
pulsar-nack itself: ``pip install 'pulsar-nack[otel]' opentelemetry-sdk
opentelemetry-exporter-prometheus`` (the ``test`` extra has them too). No broker: a
tracker stands in for a consumer, so that the example runs anywhere;
``instrument(consumer)`` works the same on a ``NackingConsumer`` or an asyncio consumer
and adds the topic and subscription attributes.

    python examples/metrics_prometheus.py --port 9464
    curl -s http://127.0.0.1:9464/metrics | grep pulsar

It prints the URL it serves, then feeds the tracker one nack every 10 ms for
``--serve-seconds`` (default 30) and exits. While it runs, ``/metrics`` shows the
``pulsar_nack_*`` instruments (pending nacks, their memory, nacks and redeliveries
counted, redelivery lateness; see docs/metrics.md). Without the packages it says so in
one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
import time

try:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server
except ImportError as error:  # before anything else: one line, at once
    print(
        f"metrics_prometheus.py needs the OpenTelemetry SDK and Prometheus exporter ({error}): "
        "pip install 'pulsar-nack[otel]' opentelemetry-sdk opentelemetry-exporter-prometheus",
        file=sys.stderr,
    )
    sys.exit(2)

from pulsar_nack import NegativeAcksTracker
from pulsar_nack.metrics import instrument

TOPIC = "persistent://public/default/orders"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9464, help="0 picks a free port")
    parser.add_argument("--serve-seconds", type=float, default=30.0, help="how long to serve (default 30)")
    args = parser.parse_args()

    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    server, _thread = start_http_server(args.port, addr="127.0.0.1")
    print(
        f"serving http://127.0.0.1:{server.server_port}/metrics for {args.serve_seconds:g} s "
        "(one nack every 10 ms; Ctrl-C stops)",
        flush=True,
    )

    redelivered: list[object] = []
    tracker = NegativeAcksTracker(redelivered.append, delay_ms=200, default_topic=TOPIC)
    instrument(tracker, provider.get_meter("pulsar_nack"), subscription="billing")
    end = time.monotonic() + args.serve_seconds
    entry = 0
    try:
        while time.monotonic() < end:  # a steady stream of failures: one nack every 10 ms
            tracker.add((TOPIC, 1, entry, -1))
            entry += 1
            time.sleep(0.01)
    except KeyboardInterrupt:
        pass
    finally:
        tracker.close()
        server.shutdown()
    print(f"done: {entry:,} nacks, {len(redelivered):,} redelivery batches released")


if __name__ == "__main__":
    main()
