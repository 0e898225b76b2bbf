"""Chunked messages nacked: the plain client beside ours, on Apache Pulsar 4.0.8 and 3.0.7 (issue 33).

Each broker runs standalone with ``maxMessageSize=102400``. A producer with
``chunking_enabled=True`` (batching off) sends four 300 KB payloads (three chunks each)
and four small ones; each consumer (``client.subscribe`` and ``pulsar_nack.subscribe``,
both Shared with ``negative_ack_redelivery_delay_ms=500``) nacks every message on its
first delivery and acks it on its second, for up to 20 s. Recorded per consumer: how many
of each kind came back, whole, how often, the ms from nack to return, and the backlog left.

Run: ``python -m bench.chunks``; writes ``bench/results/chunks.json``.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from ._common import finish, parser, start_context

VERSIONS = ("4.0.8", "3.0.7")
MAX_MESSAGE_SIZE = 102_400
BIG, BIG_COUNT, SMALL_COUNT = 300_000, 4, 4
DELAY_MS = 500
BUDGET_S = 20.0


def run_consumer(client: Any, admin: Any, kind: str) -> dict[str, Any]:
    """One consumer's run of the scenario on a fresh topic."""
    import pulsar

    import pulsar_nack

    topic = f"persistent://public/default/chunks-{kind}-{uuid.uuid4().hex[:8]}"
    options = {"consumer_type": pulsar.ConsumerType.Shared, "negative_ack_redelivery_delay_ms": DELAY_MS}
    consumer = client.subscribe(topic, "sub", **options) if kind == "plain" else pulsar_nack.subscribe(client, topic, "sub", **options)
    sent = {f"big-{i}".encode().ljust(8, b"-"): os.urandom(BIG) for i in range(BIG_COUNT)}
    sent.update({f"small-{i}".encode().ljust(8, b"-"): b"" for i in range(SMALL_COUNT)})
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    for name, body in sent.items():
        producer.send(name + body)
    producer.close()
    nacked: dict[bytes, float] = {}
    returns: dict[bytes, list[int]] = {name: [] for name in sent}
    whole = True
    end = time.monotonic() + BUDGET_S
    while time.monotonic() < end and not all(returns.values()):
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        name = message.data()[:8]
        whole &= message.data() == name + sent[name]
        if name not in nacked:
            nacked[name] = time.monotonic()
            consumer.negative_acknowledge(message)
        else:
            returns[name].append(round((time.monotonic() - nacked[name]) * 1000))
            consumer.acknowledge(message)
    time.sleep(0.3)  # the client's grouped acks (100 ms) reach the broker before the backlog is read
    backlog = admin.backlog(topic, "sub")
    consumer.close()
    kinds = {"chunked": [n for n in sent if n.startswith(b"big")], "small": [n for n in sent if n.startswith(b"small")]}
    return {
        "consumer": kind,
        "whole": whole,
        "backlog_left": backlog,
        **{
            name: {
                "sent": len(names),
                "back": sum(1 for n in names if returns[n]),
                "back_more_than_once": sum(1 for n in names if len(returns[n]) > 1),
                "ms_to_return": sorted(ms for n in names for ms in returns[n][:1]),
            }
            for name, names in kinds.items()
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser(__doc__ or "", "bench.chunks").parse_args(argv)
    from pulsar_nack.testing import PulsarStandalone, quiet_client
    from pulsar_nack.testing.admin import PulsarAdmin

    start = start_context()
    runs = []
    for version in VERSIONS:
        with PulsarStandalone(version=version, config={"maxMessageSize": str(MAX_MESSAGE_SIZE)}) as broker:
            client = quiet_client(broker.url)
            admin = PulsarAdmin(broker.admin_url)
            try:
                for kind in ("plain", "ours"):
                    runs.append({"broker": f"Apache Pulsar {broker.version} standalone", **run_consumer(client, admin, kind)})
            finally:
                client.close()
    payload = {
        "parameters": {"max_message_size": MAX_MESSAGE_SIZE, "big_bytes": BIG, "big": BIG_COUNT, "small": SMALL_COUNT,
                       "delay_ms": DELAY_MS, "budget_s": BUDGET_S},
        "runs": runs,
    }
    from .report import chunks_table

    finish(args, "chunks", payload, start, table=chunks_table)
    return payload


if __name__ == "__main__":
    main()
