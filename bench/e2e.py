"""End-to-end redelivery lateness on a real broker: NackingConsumer vs built-in.

For each case a fresh topic gets ``n`` messages. The consumer receives each one and
negatively acknowledges it with the case's delay, then acknowledges its redelivery.
Lateness is ``arrival - (nack time + delay)`` per message, in ms.

* ``stream``: messages are produced one every ``interval`` ms, so the consumer nacks
  at that pace: a steady failure stream lasting ``max(5 s, 1.5 x delay)``.
* ``burst``: all ``n`` messages are nacked at once, then nothing else happens.

Systems, measured in the same run on the same broker:

* ``pulsar-nack``: :func:`pulsar_nack.subscribe` (defaults: 8 precision bits, so up to
  255 ms early by design, never later than the bucket plus the client's handoff);
* ``built-in``: ``client.subscribe(negative_ack_redelivery_delay_ms=delay)`` and the
  client's own ``negative_acknowledge``.

The broker is Apache Pulsar standalone; the result records its version.

Run: ``python -m bench.e2e [--quick] [--messages N] [--delays 1000,10000] [--modes stream,burst]``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pulsar

import pulsar_nack
from pulsar_nack.testing import quiet_client

from ._common import broker_label, dist, finish, parser, standalone

SYSTEMS = ("pulsar-nack", "built-in")


def producer_thread(client: pulsar.Client, topic: str, n: int, interval_s: float) -> threading.Thread:
    """Send *n* messages (their index as payload), one every *interval_s*, from a daemon thread."""

    def run() -> None:
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        next_send = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, next_send - time.monotonic()))
            producer.send_async(str(i).encode(), None)
            next_send += interval_s
        producer.flush()
        producer.close()

    thread = threading.Thread(target=run, name="bench-producer", daemon=True)
    thread.start()
    return thread


class Tally:
    """A case's bookkeeping: each message is nacked on first receipt and acked when it comes back.

    :meth:`nack` says what to do with a received message; lateness is arrival minus the
    requested time (nack time + delay), in ms. Any other copy counts as a duplicate.
    """

    def __init__(self, n: int, delay_ms: int) -> None:
        self.n, self.delay_s = n, delay_ms / 1000
        self.requested: dict[bytes, float] = {}
        self.lateness: list[float] = []
        self.duplicates = 0

    @property
    def done(self) -> bool:
        return len(self.lateness) >= self.n

    def nack(self, message: Any) -> bool:
        """True: nack *message* (its first delivery); False: ack it (tallied)."""
        now, data = time.monotonic(), message.data()
        if message.redelivery_count() == 0 and data not in self.requested:
            self.requested[data] = now + self.delay_s
            return True
        if self.requested.get(data, -1.0) > 0:
            self.lateness.append((now - self.requested[data]) * 1000)
            self.requested[data] = -1.0  # seen back
        else:
            self.duplicates += 1
        return False

    def result(self, **case: Any) -> dict[str, Any]:
        return {**case, "messages": self.n, "redelivered": len(self.lateness), "lost_or_timed_out": self.n - len(self.lateness),
                "duplicates": self.duplicates, "lateness_ms": dist(self.lateness, samples=True)}


def run_case(client: pulsar.Client, system: str, delay_ms: int, mode: str, n: int, subscription: str = "Shared") -> dict[str, Any]:
    """One (system, delay, mode, subscription type) case; returns lateness stats and counts.

    On Failover and Exclusive the client redelivers every unacked message on a nack, so
    ``duplicates`` counts the extra deliveries that causes (for either system).
    """
    topic = f"persistent://public/default/e2e-{uuid.uuid4().hex[:10]}"
    kwargs = {"consumer_type": getattr(pulsar.ConsumerType, subscription), "receiver_queue_size": 1000,
              "negative_ack_redelivery_delay_ms": delay_ms}
    if system == "pulsar-nack":
        consumer: Any = pulsar_nack.subscribe(client, topic, "bench", **kwargs)
    else:
        consumer = client.subscribe(topic, "bench", **kwargs)
    stream_s = max(5.0, 1.5 * delay_ms / 1000)
    interval_s = stream_s / n if mode == "stream" else 0.0
    producer, tally = producer_thread(client, topic, n, interval_s), Tally(n, delay_ms)
    give_up = time.monotonic() + stream_s + delay_ms / 1000 + 60
    while not tally.done and time.monotonic() < give_up:
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        (consumer.negative_acknowledge if tally.nack(message) else consumer.acknowledge)(message)
    producer.join(30)
    consumer.close()
    return tally.result(system=system, subscription=subscription, delay_ms=delay_ms, mode=mode,
                        nack_interval_ms=round(interval_s * 1000, 3), stream_s=stream_s if mode == "stream" else 0.0)


def run(messages: int, delays: list[int], modes: list[str], subscriptions: tuple[str, ...] = ("Shared",)) -> dict[str, Any]:
    results = []
    with standalone() as broker:
        client = quiet_client(broker.url)
        try:
            for delay_ms in delays:
                for mode in modes:
                    for subscription in subscriptions:
                        for system in SYSTEMS:
                            results.append(run_case(client, system, delay_ms, mode, messages, subscription))
                            print(f"  {system} {subscription} {mode} {delay_ms} ms: {results[-1]['redelivered']} back", flush=True)
        finally:
            client.close()
    return {"broker": broker_label(broker), "cases": results}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.e2e", "200 messages, 1 s delay only")
    args_parser.add_argument("--messages", type=int, default=None)
    args_parser.add_argument("--delays", default=None, help="comma-separated ms (default 1000,10000)")
    args_parser.add_argument("--modes", default="stream,burst")
    args_parser.add_argument("--subscriptions", default=None, help="consumer types (default Shared; full run adds Failover)")
    args = args_parser.parse_args(argv)
    delays = [int(d) for d in (args.delays or ("1000" if args.quick else "1000,10000")).split(",")]
    subscriptions = tuple((args.subscriptions or ("Shared" if args.quick else "Shared,Failover")).split(","))
    payload = run(args.messages or (200 if args.quick else 1000), delays, args.modes.split(","), subscriptions)
    from .report import e2e_table

    print(e2e_table(payload))
    finish(args, "e2e", payload)
    return payload


if __name__ == "__main__":
    main()
