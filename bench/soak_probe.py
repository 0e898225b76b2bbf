"""A fast soak probe: the memory of single consumer processes, ours beside the plain client, in one run.

``python -m bench.soak_probe --minutes 15`` starts one standalone broker and, for each
variant, a consumer process with a subscription of its own; this process produces to two
topics at ``--nack-rate`` and ``--retry-rate`` messages per second. Each consumer settles
a message as the soak's fates do (:mod:`pulsar_nack.testing.chaos.fate`: half acked at
once, a quarter failing once, a sixth twice, 8 % poison, up to a dead-letter topic after
``max_redeliver_count`` 3) and records every 10 s its RSS, its anonymous RSS and glibc's
bytes in use (``mallinfo2``); at the end it frees glibc's free memory (``malloc_trim``) and
records the anonymous RSS again (what comes back was free memory, not memory in use).

Variants: ``plain-nack`` (``client.subscribe``: the control, its dead letters sent by the
C++ client), ``nack`` (``negative_acknowledge`` with a backoff) and ``retry``
(``reconsume_later``), and ``nack-unkept`` and ``retry-unkept``: the same with
:class:`~pulsar_nack.consumer.message_pool.KeepingProducer` bypassed (each sent message
freed on the client's I/O thread, as before it). Slopes are fitted after ``--warmup``
seconds. Result: ``bench/results/soak_probe.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ._common import finish, parser, standalone, start_context

VARIANTS = ("plain-nack", "nack", "retry", "nack-unkept", "retry-unkept")
SAMPLE_S = 10.0
_FAILURES = ((50, 0), (75, 1), (92, 2), (100, 99))
"""(percentile bound, failed deliveries) of a message by its number mod 100: the soak's fates."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    made = parser(__doc__, "bench.soak_probe")
    made.add_argument("--minutes", type=float, default=15.0, help="length of the load (default 15)")
    made.add_argument("--warmup", type=float, default=180.0, help="seconds left out of the fit (default 180)")
    made.add_argument("--nack-rate", type=float, default=30.0, help="messages/s to the nack topic (default 30)")
    made.add_argument("--retry-rate", type=float, default=10.0, help="messages/s to the retry topic (default 10)")
    made.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated (default {','.join(VARIANTS)})")
    made.add_argument("--worker", nargs=4, metavar=("VARIANT", "URL", "TOPIC", "FILE"), help=argparse.SUPPRESS)
    return made.parse_args(argv)


# ---------------------------------------------------------------------- a consumer process


def _memory(libc: Any) -> dict[str, int]:
    info = libc.mallinfo2()
    fields = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "Threads"):
                fields[key] = int(value.split()[0]) * (1 if key == "Threads" else 1024)
    return {"rss": fields["VmRSS"], "anon": fields["RssAnon"], "threads": fields["Threads"],
            "heap_in_use": info.uordblks, "heap_mmapped": info.hblkhd}  # fmt: skip


def _subscribe(variant: str, client: Any, topic: str) -> Any:
    import pulsar

    import pulsar_nack

    options: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": 100, "negative_ack_redelivery_delay_ms": 1000,
        "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=3, dead_letter_topic=f"{topic}-{variant}-DLQ"),
    }  # fmt: skip
    if variant == "plain-nack":
        return client.subscribe(topic, variant, **options)
    if variant.endswith("-unkept"):
        _unkeep()
    backoff = pulsar_nack.MultiplierRedeliveryBackoff(200, 3000, 2.0)
    return pulsar_nack.subscribe(client, topic, variant, redelivery_backoff=backoff,
                                 retry_enable=variant.startswith("retry"), **options)  # fmt: skip


def _unkeep() -> None:
    """The code before KeepingProducer: the dead-letter and retry producers send as the raw producer does."""
    from pulsar_nack.consumer import dead_letter, message_pool, retry

    class Unkept(message_pool.KeepingProducer):
        def __init__(self, producer: Any) -> None:
            super().__init__(producer)
            self.raw = producer

        def send_async(self, message: Any, callback: Any) -> None:
            self.raw.send_async(message, callback)  # the client's I/O thread frees the message

    dead_letter.KeepingProducer = retry.KeepingProducer = Unkept  # type: ignore[misc]


def _settle(consumer: Any, message: Any, retrying: bool) -> bool:
    """Settle as the message's fate says; True if that sends a message (a retry copy or a dead letter)."""
    number = int(message.data()) % 100
    failures = next(f for bound, f in _FAILURES if number < bound)
    if retrying:
        if int(message.properties().get("RECONSUMETIMES", "0")) < failures:
            consumer.reconsume_later(message, 500)
            return True
        consumer.acknowledge(message)
        return False
    if message.redelivery_count() < failures:
        consumer.negative_acknowledge(message)
        return message.redelivery_count() == 3  # dead-lettered at its next delivery
    consumer.acknowledge(message)
    return False


def _worker(variant: str, url: str, topic: str, file: str, minutes: float) -> None:
    import pulsar

    from pulsar_nack.testing import quiet_client

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    consumer = _subscribe(variant, quiet_client(url), topic)
    retrying = variant.startswith("retry")
    started = time.monotonic()
    stop, next_sample, delivered, sends = started + minutes * 60, 0.0, 0, 0
    with open(file, "w", encoding="utf-8") as out:
        while time.monotonic() < stop:
            now = time.monotonic()
            if now >= next_sample:
                next_sample = now + SAMPLE_S
                out.write(
                    json.dumps({"t": round(now - started, 1), "delivered": delivered, "sends": sends, **_memory(libc)})
                    + "\n"
                )
                out.flush()
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            delivered += 1
            sends += _settle(consumer, message, retrying)
        before = _memory(libc)
        libc.malloc_trim(0)
        out.write(json.dumps({"trim": {"anon_before": before["anon"], "anon_after": _memory(libc)["anon"]}}) + "\n")
    os._exit(0)  # the samples are written; closing is not what is measured


# ---------------------------------------------------------------------- the run


def _produce(client: Any, topic: str, rate: float, stop: float) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
    number = 0
    while time.monotonic() < stop:
        producer.send_async(str(number).encode(), None)
        number += 1
        time.sleep(1 / rate)
    producer.flush()


def _summary(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    from pulsar_nack.testing.chaos.soak import MIB, slope_per_hour

    series = [s for s in samples if "t" in s]
    fitted = [s for s in series if s["t"] >= warmup_s]
    trim: dict[str, int] = next((s["trim"] for s in samples if "trim" in s), {})

    def slope(key: str) -> float | None:
        value = slope_per_hour([(s["t"], s[key] / MIB) for s in fitted])
        return None if value is None else round(value, 2)

    return {
        "samples": len(series), "fitted_samples": len(fitted), "delivered": series[-1]["delivered"],
        "sends": series[-1]["sends"], "threads": series[-1]["threads"],
        "rss_slope_mib_per_h": slope("rss"), "anon_slope_mib_per_h": slope("anon"),
        "heap_in_use_slope_mib_per_h": slope("heap_in_use"),
        "anon_mib_after_warmup": round(fitted[0]["anon"] / MIB, 2) if fitted else None,
        "anon_mib_last": round(series[-1]["anon"] / MIB, 2),
        "anon_mib_after_malloc_trim": round(trim["anon_after"] / MIB, 2) if trim else None,
        "series": [[s["t"], s["rss"], s["anon"], s["heap_in_use"]] for s in series],
    }  # fmt: skip


def _table(payload: dict[str, Any]) -> str:
    from ._common import md_table

    rows = [
        [name, p["delivered"], p["sends"], p["anon_mib_after_warmup"], p["anon_mib_last"], p["rss_slope_mib_per_h"],
         p["anon_slope_mib_per_h"], p["heap_in_use_slope_mib_per_h"]]
        for name, p in payload["processes"].items()
    ]  # fmt: skip
    return md_table(["consumer", "deliveries", "sends", "anon RSS after warm-up (MiB)", "at the end (MiB)",
                     "RSS slope (MiB/h)", "anon slope (MiB/h)", "heap in use slope (MiB/h)"], rows)  # fmt: skip


def _run(args: argparse.Namespace) -> None:
    from pulsar_nack.testing import quiet_client

    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    start = start_context()
    rates = {"nack": args.nack_rate, "retry": args.retry_rate}
    with standalone() as broker, tempfile.TemporaryDirectory() as scratch:
        topics = {kind: f"persistent://public/default/soak-probe-{kind}-{uuid.uuid4().hex[:6]}" for kind in rates}
        files = {v: str(Path(scratch) / f"{v}.jsonl") for v in variants}
        workers = [
            subprocess.Popen([sys.executable, "-m", "bench.soak_probe", "--minutes", str(args.minutes), "--worker", v,
                              broker.url, topics["retry" if v.startswith("retry") else "nack"], files[v]])
            for v in variants
        ]  # fmt: skip
        client = quiet_client(broker.url)
        time.sleep(10)  # the subscriptions exist before the first message
        stop = time.monotonic() + args.minutes * 60
        producers = [
            threading.Thread(target=_produce, args=(client, topics[k], rate, stop), daemon=True)
            for k, rate in rates.items()
        ]
        for thread in producers:
            thread.start()
        codes = [worker.wait() for worker in workers]
        client.close()
        samples = {v: [json.loads(line) for line in Path(files[v]).read_text().splitlines()] for v in variants}
    if any(codes):
        raise SystemExit(f"a consumer process failed: {dict(zip(variants, codes))}")
    payload = {
        "minutes": args.minutes, "warmup_s": args.warmup, "sample_s": SAMPLE_S, "rates_per_s": rates,
        "broker": getattr(broker, "version", None),
        "series_columns": ["s since start", "rss bytes", "anonymous rss bytes", "heap bytes in use (mallinfo2)"],
        "processes": {v: _summary(samples[v], args.warmup) for v in variants},
    }  # fmt: skip
    finish(args, "soak_probe", payload, start, table=_table)


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    if args.worker:
        variant, url, topic, file = args.worker
        _worker(variant, url, topic, file, args.minutes)
    else:
        _run(args)


if __name__ == "__main__":
    main()
