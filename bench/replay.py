"""Where a retry's time goes while a consumer drains a backlog: our handoff, then the broker.

The Spark demo's retries come back late while its consumers drain the backlog that built
up during Spark's start. This benchmark reproduces that with one ``NackingConsumer``
(no Spark) and splits each retry's lateness into two stages:

* **handoff - requested**: when our tracker handed the entry to the client, against
  nack time + backoff (negative: early, by design, see docs/consumer.md);
* **arrival - handoff**: from the handoff to the retry's arrival in ``receive()`` (the
  client's 100 ms nack delay, the redeliver request, the broker's replay, the queue).

Each case: a backlog of ``n`` messages on a fresh topic, then one consumer receives as
fast as it can with a fixed handler cost (``--spin-us``, so every case runs at about the
same rate), nacks 10 % of the messages on first delivery (backoff from 500 ms) and
acks everything else, until every message is acked. Cases:

* ``unbatched``: messages not batched;
* ``batched``: batches of 10, one message of each batch nacked, its siblings acked
  (batch-index acks, the broker's ``acknowledgmentAtBatchIndexLevelEnabled=true``);
* ``batched-whole``: batches of 10, every message of one batch in ten nacked;
* ``batched-no-index-ack``: as ``batched``, on a broker with batch-index acks off: the
  whole entry comes back, acked siblings included (counted as ``duplicates``).

Run: ``python -m bench.replay [--quick]``; writes ``bench/results/replay.json``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from ._common import broker_label, dist, finish, parser, percentile, start_context
from .consumer import BATCH, _produce

MIN_BACKOFF_MS, MAX_BACKOFF_MS = 500, 10_000
RECEIVER_QUEUE = 1000  # the client's default, set explicitly: the permits column is read against it
CASES = {
    # name: (batched, nack whole batches, broker batch-index acks)
    "unbatched": (False, False, True),
    "batched": (True, False, True),
    "batched-whole": (True, True, True),
    "batched-no-index-ack": (True, False, False),
}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _PermitWatch:
    """Samples the broker's view of one topic's consumers every *interval_s* (a daemon thread).

    ``availablePermits`` is how many more messages the broker may push to the consumer.
    The client grants permits as its receiver queue drains, so with a queue of ``q`` it
    stays at or below ``q``, unless the client returns permits it was never charged for.
    """

    def __init__(self, admin: Any, topic: str, interval_s: float = 0.25) -> None:
        self.peak_permits = 0
        self.samples = 0
        self._admin, self._topic, self._interval_s = admin, topic, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="permit-watch", daemon=True)

    def start(self) -> _PermitWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                stats = self._admin.topicdist(self._topic)
            except Exception:  # a missed sample is not a failed run; the count says how many were taken
                continue
            for subscription in stats.get("subscriptions", {}).values():
                for consumer in subscription.get("consumers", []):
                    self.peak_permits = max(self.peak_permits, int(consumer.get("availablePermits", 0)))
            self.samples += 1


def run_case(client: Any, name: str, n: int, spin_us: float, admin: Any = None) -> dict[str, Any]:
    """One case on *client*'s broker: drain a backlog of *n*; lateness by stage.

    With *admin* (the broker's :class:`~pulsar_nack.testing.admin.PulsarAdmin`), the
    consumer's ``availablePermits`` is sampled too (:class:`_PermitWatch`).
    """
    import pulsar

    import pulsar_nack
    from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff

    batched, whole, _ = CASES[name]
    topic = f"persistent://public/default/replay-{name}-{uuid.uuid4().hex[:8]}"
    consumer = pulsar_nack.subscribe(
        client,
        topic,
        "bench",
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=RECEIVER_QUEUE,
        redelivery_backoff=MultiplierRedeliveryBackoff(MIN_BACKOFF_MS, MAX_BACKOFF_MS),
    )
    handed_at: dict[tuple[int, int], float] = {}
    hand_off = consumer._core._hand_off_ids  # a spy on the handoff: when each entry left our tracker

    def spy(ids: list[Any]) -> None:
        now = time.time() * 1000
        for message_id in ids:
            handed_at[(message_id.ledger_id(), message_id.entry_id())] = now
        hand_off(ids)

    consumer._core._hand_off_ids = spy
    _produce(client, topic, n, batched, payload=lambda i: str(i).encode())
    nacked_at: dict[bytes, float] = {}
    acked: set[bytes] = set()
    stages: list[tuple[float, float, float]] = []  # (nacked at, handoff - requested, arrival - handoff)
    duplicates = 0
    watch = _PermitWatch(admin, topic).start() if admin is not None else None
    start = time.time() * 1000
    while len(acked) < n:
        message = consumer.receive(30_000)
        _spin(spin_us / 1e6)
        now, data = time.time() * 1000, message.data()
        index = int(data)
        fails = (index // BATCH) % 10 == 3 if whole else index % 10 == 3
        if fails and message.redelivery_count() == 0 and data not in nacked_at:
            consumer.negative_acknowledge(message)
            nacked_at[data] = now
            continue
        if data in acked:
            duplicates += 1
        elif data in nacked_at:
            mid = message.message_id()
            handed = handed_at.get((mid.ledger_id(), mid.entry_id()))
            if handed is not None:
                requested = nacked_at[data] + MIN_BACKOFF_MS
                stages.append((nacked_at[data] - start, handed - requested, now - handed))
        consumer.acknowledge(message)
        acked.add(data)
    elapsed_s = (time.time() * 1000 - start) / 1000
    if watch is not None:
        watch.stop()
    consumer.close()
    per_second: dict[int, list[float]] = {}
    for at, _, wait in stages:
        per_second.setdefault(int(at // 1000), []).append(wait)
    return {
        "case": name,
        "messages": n,
        "batched": batched,
        "whole_batches_nacked": whole,
        "nacked": len(nacked_at),
        "retries_timed": len(stages),
        "duplicates": duplicates,
        "receiver_queue_size": RECEIVER_QUEUE,
        "peak_available_permits": None if watch is None else watch.peak_permits,
        "permit_samples": None if watch is None else watch.samples,
        "messages_per_s": round(n / elapsed_s),
        "lateness_ms": dist([h + w for _, h, w in stages]),
        "handoff_minus_requested_ms": dist([h for _, h, _ in stages]),
        "arrival_minus_handoff_ms": dist([w for _, _, w in stages]),
        "arrival_minus_handoff_p50_by_second_of_nack": {
            str(second): round(percentile(waits, 50), 1) for second, waits in sorted(per_second.items())
        },
    }


def run(n: int, spin_us: float) -> dict[str, Any]:
    from pulsar_nack.testing import PulsarStandalone, quiet_client

    cases, brokers = [], {}
    for index_ack in (True, False):
        names = [name for name, (_, _, on) in CASES.items() if on == index_ack]
        config = {"acknowledgmentAtBatchIndexLevelEnabled": str(index_ack).lower()}
        with PulsarStandalone(config=config) as broker:
            brokers[f"batch_index_ack_{str(index_ack).lower()}"] = broker_label(broker)
            client = quiet_client(broker.url)
            try:
                for name in names:
                    size = n if CASES[name][0] else n // 2
                    cases.append(run_case(client, name, size, spin_us, broker.admin))
                    print(f"  {name}: {cases[-1]['lateness_ms']}", flush=True)
            finally:
                client.close()
    return {"brokers": brokers, "spin_us": spin_us, "backoff_ms": [MIN_BACKOFF_MS, MAX_BACKOFF_MS], "cases": cases}


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__, "bench.replay", "20,000 messages per batched case")
    args_parser.add_argument("--messages", type=int, default=200_000, help="backlog of each batched case (unbatched: half)")
    args_parser.add_argument("--spin-us", type=float, default=30.0, help="the handler's cost per message")
    args = args_parser.parse_args(argv)
    context = start_context()
    payload = run(20_000 if args.quick else args.messages, args.spin_us)
    from .report import replay_table

    finish(args, "replay", payload, context, table=replay_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
