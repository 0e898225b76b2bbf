"""The consumer level: ``NackingConsumer`` beside the plain ``pulsar.Consumer``, one run, Apache Pulsar.

Measurements (issue 13, goals A, B and D; issue 24, points 4 and 5), each system on its
own fresh topic of the same shape, on two Apache Pulsar standalone brokers started by this
program: one with batch-index acks turned on (``acknowledgmentAtBatchIndexLevelEnabled=true``),
one without (the broker's own default, in 3.0 and 4.0 alike). A and D run on both; the
memory measurements on the first.

* **A, receive + acknowledge** (no nack at all): µs per message over ``n`` messages
  already pushed into the consumer's receive queue (``receiver_queue_size=n``; the
  broker's ``msgOutCounter`` is awaited), batched (batches of 10) and non-batched. The systems run side
  by side in one process: each on its own full queue, timed in turns of 1,000 messages, the order
  reversed every turn (:func:`_turns`), so a slow spell of the machine falls on each alike; the first
  repetition is the warmup. Both consumers are
  subscribed with the same keywords (Shared, ``batch_index_ack_enabled=True``, which
  :func:`pulsar_nack.subscribe` sets by default). A third system, ``pulsar-nack-guarding``
  (``always_guard=True``), shows the cost while a consumer reads every id (as it does
  around nacks: see docs/consumer.md); it has no goal.
* **B, bytes per pending nack, batched**: ``n`` messages in batches of 10, the first
  message of each batch nacked with a one-hour delay, the rest acked. Process RSS
  delta (after ``gc.collect`` and ``malloc_trim``, with the receiver queue settled and
  at least half full at both ends) divided by the pending nacks, each run a fresh worker process, three runs
  of each, medians. A control run per system acks everything; the *net* figure
  subtracts its median RSS delta (what receiving alone costs). Ours also reports its
  structures' own estimate.
* **D, negative_acknowledge(message)**: µs per call on received (non-batched) messages,
  one-hour delay, both systems in one process.
* **W, the working case** (issue 36): a consumer at work, receive + acknowledge + nack timed
  together. ``n`` messages already in the receive queue (batched and not), every 100th
  (1 %) or 10th (10 %) received message nacked with a one-hour delay, the rest acked; ours
  (:func:`pulsar_nack.subscribe`) beside the plain consumer with its built-in nack,
  side by side in turns as in A, on both brokers. µs per message.
* **T, with an ack timeout** (issue 33): receive + acknowledge as in A, batched and not, with
  ``unacked_messages_timeout_ms`` of ten minutes on both consumers: ours (which keeps the
  timeout itself) beside the plain consumer with its own ack timeout, repetitions
  interleaved, on both brokers (:func:`run_ack_timeout_calls`). And the bytes each keeps per
  unacked message (``bench/ack_timeout.py``'s :func:`~bench.ack_timeout.run_memory`, on the
  first broker): RSS with the timeout minus without, fresh worker processes, medians of three.
* **Bytes per pending nack, the plain way** (issue 24 point 5): the same workload as B
  with exactly ``n`` messages on the topic, every tenth received message nacked for ten
  minutes, the rest acked; RSS after ``gc.collect()`` before and after the receive loop,
  nothing else (no settled queue, no ``malloc_trim``). Three runs per system, plus a
  control run that acks everything, and the same process's RSS after ``malloc_trim(0)``,
  which shows how much of the delta is freed heap the allocator kept.

Every timed loop records the wall clock and the calling thread's CPU time (``us`` and
``cpu_us`` per system, ``ratio_*`` and ``cpu_ratio_*`` medians): on a loaded shared
machine the CPU time leaves out the waits to be scheduled.

Run: ``python -m bench.consumer [--quick] [--messages N]``; writes
``bench/results/consumer.json`` (``consumer-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ._common import print_table, rss_bytes, run_worker, standalone, start_context, summarize, trim_heap, write_result

HOUR_MS = 3_600_000
TEN_MINUTES_MS = 600_000
BATCH = 10
SYSTEMS = ("plain", "pulsar-nack")
CALL_SYSTEMS = (*SYSTEMS, "pulsar-nack-guarding")
ACK_TIMEOUT_SYSTEMS = ("plain-ack-timeout", "pulsar-nack-ack-timeout")
"""The same two consumers with ``unacked_messages_timeout_ms`` (ten minutes: nothing times out while timed)."""
WORKING_SHARES = {"1pct": 100, "10pct": 10}
"""The working case's nacked shares: every ``k``-th received message is nacked."""


def _topic(kind: str) -> str:
    return f"persistent://public/default/bench-consumer-{kind}-{uuid.uuid4().hex[:8]}"


def _produce(client: Any, topic: str, n: int, batched: bool, payload: Callable[[int], bytes] | None = None) -> None:
    """*n* messages in batches of ``BATCH`` (or not); message *i* carries ``payload(i)`` (16 bytes by default)."""
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=BATCH,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=10_000,
    )
    for i in range(n):
        producer.send_async(b"x" * 16 if payload is None else payload(i), None)
    producer.flush()
    producer.close()


def _subscribe(client: Any, system: str, topic: str, delay_ms: int = HOUR_MS, queue: int = 1000) -> Any:
    import pulsar

    import pulsar_nack

    kwargs = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "batch_index_ack_enabled": True,
        "negative_ack_redelivery_delay_ms": delay_ms,
        "receiver_queue_size": queue,
    }
    if system.endswith("-ack-timeout"):
        kwargs["unacked_messages_timeout_ms"] = TEN_MINUTES_MS
        system = system.removesuffix("-ack-timeout")
    if system == "plain":
        return client.subscribe(topic, "bench", **kwargs)
    if system == "pulsar-nack-guarding":  # reads every id and records every ack, all the time
        from pulsar_nack.consumer.settings import ConsumerSettings

        delay = kwargs.pop("negative_ack_redelivery_delay_ms")
        inner = client.subscribe(topic, "bench", negative_ack_redelivery_delay_ms=100, **kwargs)
        settings = ConsumerSettings(negative_ack_redelivery_delay_ms=delay, always_guard=True)
        return pulsar_nack.NackingConsumer.wrap(inner, topic, settings, handoff_delay_ms=100)
    return pulsar_nack.subscribe(client, topic, "bench", **kwargs)


def _close(consumer: Any) -> None:
    if hasattr(consumer, "tracker"):
        consumer.close(redeliver_pending=False)
    else:
        consumer.close()


Cost = tuple[float, float]
"""µs per message: wall clock, and the calling thread's CPU time (``time.thread_time``)."""


BLOCK = 1_000
"""Messages per timed turn: the systems of a case take turns over their queued messages (:func:`_turns`)."""

Blocks = Callable[[int, int], None]
"""Handles messages ``[start, stop)`` of one prepared consumer."""


def _turns(loops: dict[str, Blocks], count: int) -> dict[str, Cost]:
    """Each system's *count* messages in turns of :data:`BLOCK`, the order reversed every turn: wall and
    thread-CPU µs per message.

    The systems of a case run side by side, each with its own queue already full, so a slow spell of the
    machine (another job, the host, the broker's work on the acks) falls on each alike, not on whichever
    system's loop it happened to meet. The CPU time leaves out the time the thread waited to be scheduled;
    work done on other threads (the client's I/O and timer threads, ours or the plain client's) is in
    neither side's figure.
    """
    wall, cpu = dict.fromkeys(loops, 0.0), dict.fromkeys(loops, 0.0)
    order = list(loops)
    for start in range(0, count, BLOCK):
        stop = min(count, start + BLOCK)
        for system in order:
            began, began_cpu = time.perf_counter(), time.thread_time()
            loops[system](start, stop)
            wall[system] += time.perf_counter() - began
            cpu[system] += time.thread_time() - began_cpu
        order.reverse()
    return {system: (wall[system] / count * 1e6, cpu[system] / count * 1e6) for system in loops}


def _side_by_side(systems: Sequence[str], prepare: Callable[[str], tuple[Any, Blocks]], count: int) -> dict[str, Cost]:
    """Prepare a consumer of each of *systems* (``prepare(system)``: the consumer and its loop), time them
    over *count* messages in turns (:func:`_turns`), close them."""
    prepared = {system: prepare(system) for system in systems}
    try:
        return _turns({system: loop for system, (_consumer, loop) in prepared.items()}, count)
    finally:
        for consumer, _loop in prepared.values():
            _close(consumer)


def _case_result(
    wall: dict[str, list[float]], cpu: dict[str, list[float]], systems: tuple[str, str] = SYSTEMS, **fields: Any
) -> dict[str, Any]:
    """One case's summary: each system's wall and CPU µs, and ours (and guarding) over plain, medians.

    *systems*: the plain consumer's name and ours.
    """
    plain, ours = systems
    stats = {s: summarize(v) for s, v in wall.items() if v}
    cpu_stats = {s: summarize(v) for s, v in cpu.items() if v}
    result: dict[str, Any] = {
        **fields,
        "us": stats,
        "cpu_us": cpu_stats,
        "ratio_ours_over_plain": stats[ours]["median"] / stats[plain]["median"],
        "cpu_ratio_ours_over_plain": cpu_stats[ours]["median"] / cpu_stats[plain]["median"],
    }
    if "pulsar-nack-guarding" in stats:
        result["ratio_guarding_over_plain"] = stats["pulsar-nack-guarding"]["median"] / stats["plain"]["median"]
        result["cpu_ratio_guarding_over_plain"] = (
            cpu_stats["pulsar-nack-guarding"]["median"] / cpu_stats["plain"]["median"]
        )
    return result


def _prefill(admin: Any, topic: str, n: int) -> bool:
    """Wait (deadline 60 s) until the broker has pushed all *n* messages into the consumer's queue.

    Then the timed loop measures the client side (receive from the queue, acknowledge),
    not the broker's dispatch.
    """
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if _messages_out(admin, topic) >= n:
            return True
        time.sleep(0.05)
    return False


def _messages_out(admin: Any, topic: str) -> int:
    return int(admin.topic_stats(topic)["subscriptions"]["bench"].get("msgOutCounter", 0))


def _queued_when_settled(admin: Any, topic: str, consumed: int) -> int:
    """Messages in the consumer's receiver queue once the broker's dispatch has settled.

    The client grants permits in steps (about half its queue at a time), so the queue holds
    between half and all of ``QUEUE`` messages; this waits (deadline 60 s) until the broker's
    ``msgOutCounter`` is at least half a queue ahead of *consumed* and unchanged for 0.5 s.
    """
    end = time.monotonic() + 60
    last, since = -1, time.monotonic()
    while time.monotonic() < end:
        out = _messages_out(admin, topic)
        if out != last:
            last, since = out, time.monotonic()
        elif out - consumed >= QUEUE // 2 and time.monotonic() - since >= 0.5:
            break
        time.sleep(0.05)
    return last - consumed


def backlog_consumer(client: Any, admin: Any, system: str, n: int, batched: bool, kind: str) -> Any:
    """A *system* consumer on a fresh topic of *n* messages, its first received and acked, the rest in its queue."""
    topic = _topic(kind)
    _produce(client, topic, n, batched)
    consumer = _subscribe(client, system, topic, queue=n)
    consumer.acknowledge(consumer.receive(30_000))
    if not _prefill(admin, topic, n):
        print("  (the receive queue did not fill within 60 s; timing includes dispatch)", flush=True)
    return consumer


def _receive_ack(client: Any, admin: Any, system: str, n: int, batched: bool) -> tuple[Any, Blocks]:
    """Receive + acknowledge over *n* - 1 messages already in the consumer's queue."""
    consumer = backlog_consumer(client, admin, system, n, batched, "a")
    receive, acknowledge = consumer.receive, consumer.acknowledge

    def loop(start: int, stop: int) -> None:
        for _ in range(start, stop):
            acknowledge(receive(30_000))

    return consumer, loop


def _nack(client: Any, system: str, n: int) -> tuple[Any, Blocks]:
    """``negative_acknowledge(message)`` on *n* received non-batched messages."""
    topic = _topic("d")
    _produce(client, topic, n, batched=False)
    consumer = _subscribe(client, system, topic)
    messages = [consumer.receive(30_000) for _ in range(n)]
    nack = consumer.negative_acknowledge

    def loop(start: int, stop: int) -> None:
        for i in range(start, stop):
            nack(messages[i])

    return consumer, loop


Measured = dict[str, dict[str, Cost]]
"""Case -> system -> cost, for one repetition."""


def _repeat(reps: int, measure: Callable[[int], Measured]) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """*reps* repetitions of ``measure(rep)`` after a warmup (rep 0): the wall and CPU samples, per case and system."""
    wall: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    for rep in range(reps + 1):
        costs = measure(rep)
        if rep:  # the first repetition is the warmup
            for case, by_system in costs.items():
                for system, (elapsed, thread) in by_system.items():
                    wall.setdefault(case, {}).setdefault(system, []).append(elapsed)
                    cpu.setdefault(case, {}).setdefault(system, []).append(thread)
        _print_rep(rep, costs)
    return wall, cpu


def _rotated(systems: Sequence[str], rep: int) -> list[str]:
    """*systems*, reversed on odd repetitions (which one takes the first turn alternates)."""
    return list(systems) if rep % 2 == 0 else list(systems)[::-1]


def run_calls(url: str, admin: Any, n: int, reps: int) -> dict[str, Any]:
    """Goals A and D: every system side by side in this process, repeated."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    nacks = min(n, 20_000)

    def measure(rep: int) -> Measured:
        return {
            "receive_ack_batched": _side_by_side(
                _rotated(CALL_SYSTEMS, rep), partial(_receive_ack, client, admin, n=n, batched=True), n - 1),
            "receive_ack_unbatched": _side_by_side(
                _rotated(CALL_SYSTEMS, rep), partial(_receive_ack, client, admin, n=n, batched=False), n - 1),
            "nack_message": _side_by_side(_rotated(SYSTEMS, rep), partial(_nack, client, n=nacks), nacks),
        }  # fmt: skip

    wall, cpu = _repeat(reps, measure)
    client.close()
    return {
        case: _case_result(wall[case], cpu[case], messages=n if case != "nack_message" else nacks)
        for case in wall
    }


def run_ack_timeout_calls(url: str, admin: Any, n: int, reps: int) -> dict[str, Any]:
    """Receive + acknowledge with an ack timeout: ours beside the plain consumer with its own, side by side."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

    def measure(rep: int) -> Measured:
        return {
            f"ack_timeout_receive_ack_{kind}": _side_by_side(
                _rotated(ACK_TIMEOUT_SYSTEMS, rep), partial(_receive_ack, client, admin, n=n, batched=kind == "batched"),
                n - 1)
            for kind in ("batched", "unbatched")
        }  # fmt: skip

    wall, cpu = _repeat(reps, measure)
    client.close()
    return {
        case: _case_result(wall[case], cpu[case], ACK_TIMEOUT_SYSTEMS, messages=n, timeout_ms=TEN_MINUTES_MS)
        for case in wall
    }


def _print_rep(rep: int, costs: Measured) -> None:
    for case, by_system in costs.items():
        print(f"  rep {rep} {case}: " + ", ".join(f"{s} {w:.2f} µs ({t:.2f} CPU)" for s, (w, t) in by_system.items()),
              flush=True)  # fmt: skip


def _working(client: Any, admin: Any, system: str, n: int, batched: bool, every: int) -> tuple[Any, Blocks]:
    """A working consumer: every *every*-th message nacked (one hour), the rest acked.

    *n* messages already in the consumer's queue, as in :func:`_receive_ack`; the nacks
    stay pending through the loop, so ours guards throughout (what a consumer pays at work).
    """
    consumer = backlog_consumer(client, admin, system, n, batched, "w")
    receive, acknowledge, nack = consumer.receive, consumer.acknowledge, consumer.negative_acknowledge

    def loop(start: int, stop: int) -> None:
        for i in range(start, stop):
            message = receive(30_000)
            if i % every == 0:
                nack(message)
            else:
                acknowledge(message)

    return consumer, loop


def working_cases() -> dict[str, tuple[bool, int]]:
    """The working case's names: ``working_<share>_<batched|unbatched>`` -> (batched, nack every k-th)."""
    return {
        f"working_{share}_{'batched' if batched else 'unbatched'}": (batched, every)
        for share, every in WORKING_SHARES.items()
        for batched in (True, False)
    }


def run_working(url: str, admin: Any, n: int, reps: int) -> dict[str, Any]:
    """Goal W: ours and the plain consumer side by side, each share, batched and not, repeated."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    cases = working_cases()

    def measure(rep: int) -> Measured:
        return {
            case: _side_by_side(
                _rotated(SYSTEMS, rep), partial(_working, client, admin, n=n, batched=batched, every=every), n - 1)
            for case, (batched, every) in cases.items()
        }  # fmt: skip

    wall, cpu = _repeat(reps, measure)
    client.close()
    return {
        case: _case_result(wall[case], cpu[case], messages=n, nacked_share=1 / every)
        for case, (_batched, every) in cases.items()
    }


QUEUE = 1000
"""The memory workers' receiver queue (the client's default)."""
TAIL = 3 * QUEUE
"""Messages produced beyond the *n* a memory worker handles: its queue is never drained."""


def _memory_worker(url: str, admin_url: str, system: str, topic: str, n: int, nack: bool = True) -> dict[str, Any]:
    """Fresh process: receive *n* of the batched backlog, nack one message per batch, ack the rest.

    With *nack* False (the control run) every message is acked: what receiving alone costs.
    The first message is nacked (acked in the control) before the first RSS read, so the
    one-off cost of a system's nack machinery (a timer thread, its first structures)
    stays out of the per-nack figure.
    The topic holds ``n + TAIL`` messages and RSS is read with the receiver queue settled
    at both ends (see :func:`_queued_when_settled`; both counts are recorded), so the queued
    messages cancel out of the delta instead of making it negative.
    """
    import pulsar

    from pulsar_nack.testing.admin import PulsarAdmin

    admin = PulsarAdmin(admin_url)
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = _subscribe(client, system, topic, queue=QUEUE)
    first = consumer.receive(30_000)
    if nack:  # start the nack machinery (timer thread, first structures) before the first RSS read
        consumer.negative_acknowledge(first)
    else:
        consumer.acknowledge(first)
    del first
    queued_at_start = _queued_when_settled(admin, topic, consumed=1)
    gc.collect()
    trim_heap()
    before = rss_bytes()
    nacked = 0
    for _ in range(n):
        message = consumer.receive(30_000)
        if nack and message.message_id().batch_index() == 0:
            consumer.negative_acknowledge(message)
            nacked += 1
        else:
            consumer.acknowledge(message)
    del message
    queued_at_end = _queued_when_settled(admin, topic, consumed=1 + n)
    gc.collect()
    trim_heap()
    after = rss_bytes()
    result: dict[str, Any] = {
        "system": system,
        "nack": nack,
        "messages": n,
        "pending_nacks": nacked,
        "queued_at_start": queued_at_start,
        "queued_at_end": queued_at_end,
        "queue_full_at_both_ends": min(queued_at_start, queued_at_end) >= QUEUE // 2,
        "rss_delta_bytes": after - before,
        "bytes_per_pending_nack": (after - before) / max(nacked, 1),
    }
    if system == "pulsar-nack":
        result.update(_structures(consumer, nacked))
    _close(consumer)
    client.close()
    return result


def _structures(consumer: Any, nacked: int) -> dict[str, Any]:
    """Our structures' own estimate: the tracker, and admission (nack sets, complete entries, entry table)."""
    stats = consumer.stats()
    tracker, admission = stats["tracker"]["memory_bytes"], consumer._core.memory_bytes()
    return {
        "tracker_memory_bytes": tracker,
        "pending_set_bytes": admission,
        "structures_bytes_per_pending_nack": (tracker + admission) / max(nacked, 1),
        "tracked": len(consumer.tracker),
    }


def _plain_memory_worker(url: str, system: str, topic: str, n: int, nack: bool) -> dict[str, Any]:
    """Fresh process: bytes per pending nack the way a user measures them (issue 24, point 5).

    Subscribe, ``gc.collect()``, read RSS; receive the *n* messages of the topic, nacking
    every tenth for ten minutes and acking the rest (all acked in the control run);
    ``gc.collect()``, read RSS again. Then ``malloc_trim(0)`` and a third read: the part of
    the delta that was freed heap kept by the allocator.
    """
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = _subscribe(client, system, topic, delay_ms=TEN_MINUTES_MS, queue=QUEUE)
    gc.collect()
    before = rss_bytes()
    nacked = 0
    for i in range(n):
        message = consumer.receive(30_000)
        if nack and i % 10 == 0:
            consumer.negative_acknowledge(message)
            nacked += 1
        else:
            consumer.acknowledge(message)
    del message
    gc.collect()
    after = rss_bytes()
    trim_heap()
    trimmed = rss_bytes()
    result: dict[str, Any] = {
        "system": system,
        "nack": nack,
        "messages": n,
        "pending_nacks": nacked,
        "rss_delta_bytes": after - before,
        "bytes_per_pending_nack": (after - before) / max(nacked, 1),
        "rss_delta_after_trim_bytes": trimmed - before,
    }
    if system == "pulsar-nack":
        result.update(_structures(consumer, nacked))
    _close(consumer)
    client.close()
    return result


def run_memory_plain(url: str, n: int, reps: int) -> dict[str, Any]:
    """Issue 24 point 5: *reps* runs per system of the plain-way worker, and as many control runs."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {(s, nack): [] for s in SYSTEMS for nack in (True, False)}
    for _rep in range(reps):
        for key in runs:
            topic = _topic("p")
            _produce(client, topic, n, batched=True)
            system, nack = key
            runs[key].append(run_worker("bench.consumer", "plain", url, system, topic, str(n), str(int(nack))))
    client.close()
    cases = []
    for system in SYSTEMS:
        nacked, controls = runs[system, True], runs[system, False]
        pending = max(int(nacked[0]["pending_nacks"]), 1)
        case: dict[str, Any] = {
            "system": system,
            "messages": n,
            "pending_nacks": pending,
            "bytes_per_pending_nack_runs": [run["bytes_per_pending_nack"] for run in nacked],
            "bytes_per_pending_nack": _median_of(nacked, "bytes_per_pending_nack"),
            "rss_delta_bytes_runs": [run["rss_delta_bytes"] for run in nacked],
            "rss_delta_after_trim_bytes_runs": [run["rss_delta_after_trim_bytes"] for run in nacked],
            "control_rss_delta_bytes_runs": [run["rss_delta_bytes"] for run in controls],
            "control_rss_delta_after_trim_bytes_runs": [run["rss_delta_after_trim_bytes"] for run in controls],
        }
        case["net_bytes_per_pending_nack"] = (
            _median_of(nacked, "rss_delta_bytes") - _median_of(controls, "rss_delta_bytes")
        ) / pending
        case["after_trim_bytes_per_pending_nack"] = _median_of(nacked, "rss_delta_after_trim_bytes") / pending
        if system == "pulsar-nack":
            case["structures_bytes_per_pending_nack"] = _median_of(nacked, "structures_bytes_per_pending_nack")
        cases.append(case)
    plain, ours = cases
    return {
        "runs_per_case": reps,
        "cases": cases,
        "ratio_ours_over_plain": ours["bytes_per_pending_nack"] / plain["bytes_per_pending_nack"],
        "net_ratio_ours_over_plain": ours["net_bytes_per_pending_nack"] / plain["net_bytes_per_pending_nack"],
    }


def _median_of(runs: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(run[field] for run in runs))


def run_memory(url: str, admin_url: str, n: int, reps: int) -> dict[str, Any]:
    """Goal B: each run a fresh process on its own topic of the same shape; *reps* runs of each.

    Runs alternate system and control so that drift on the machine falls on all of them.
    The net figure is the median nack run's RSS delta minus the median control's.
    """
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {(s, nack): [] for s in SYSTEMS for nack in (True, False)}
    for _rep in range(reps):
        for key in runs:
            topic = _topic("b")
            _produce(client, topic, n + TAIL, batched=True)
            system, nack = key
            runs[key].append(run_worker("bench.consumer", url, admin_url, system, topic, str(n), str(int(nack))))
    client.close()
    cases = []
    for system in SYSTEMS:
        nacked, controls = runs[system, True], runs[system, False]
        case = dict(nacked[0])
        for field in ("rss_delta_bytes", "pending_nacks", "structures_bytes_per_pending_nack"):
            if field in case:
                case[field] = _median_of(nacked, field)
        case["pending_nacks"] = int(case["pending_nacks"])
        pending = max(case["pending_nacks"], 1)
        case["bytes_per_pending_nack"] = case["rss_delta_bytes"] / pending
        case["rss_delta_bytes_runs"] = [run["rss_delta_bytes"] for run in nacked]
        case["control_rss_delta_bytes"] = _median_of(controls, "rss_delta_bytes")
        case["control_rss_delta_bytes_runs"] = [run["rss_delta_bytes"] for run in controls]
        case["queue_full_at_both_ends"] = all(run["queue_full_at_both_ends"] for run in nacked + controls)
        case["net_bytes_per_pending_nack"] = (case["rss_delta_bytes"] - case["control_rss_delta_bytes"]) / pending
        cases.append(case)
    plain, ours = cases
    return {
        "runs_per_case": reps,
        "cases": cases,
        "ratio_ours_over_plain": ours["bytes_per_pending_nack"] / plain["bytes_per_pending_nack"],
        "net_ratio_ours_over_plain": ours["net_bytes_per_pending_nack"] / plain["net_bytes_per_pending_nack"],
    }


def run(n: int, memory_n: int, reps: int) -> dict[str, Any]:
    """Both broker settings in one run: A, D and W on each, the memory measurements on the first."""
    from pulsar_nack.testing import PulsarStandalone

    from . import ack_timeout

    with standalone() as broker:
        calls = run_calls(broker.url, broker.admin, n, reps)
        working = run_working(broker.url, broker.admin, n, reps)
        timed = run_ack_timeout_calls(broker.url, broker.admin, n, reps)
        memory = run_memory(broker.url, broker.admin_url, memory_n, 3)
        plain_way = run_memory_plain(broker.url, memory_n, 3)
        unacked = ack_timeout.run_memory(broker.url, min(memory_n, ack_timeout.UNACKED), 3)
        version = broker.version
    with PulsarStandalone(batch_index_ack=False) as broker:
        calls_without = run_calls(broker.url, broker.admin, n, reps)
        working_without = run_working(broker.url, broker.admin, n, reps)
        timed_without = run_ack_timeout_calls(broker.url, broker.admin, n, reps)
    return {
        "broker": f"Apache Pulsar {version} standalone",
        "batch_size": BATCH,
        "repetitions": reps,
        **calls,
        **working,
        **timed,
        "no_batch_index_acks": {
            "broker": f"Apache Pulsar {version} standalone, acknowledgmentAtBatchIndexLevelEnabled=false",
            **calls_without,
            **working_without,
            **timed_without,
        },
        "pending_nack_memory_batched": memory,
        "pending_nack_memory_plain_way": plain_way,
        "ack_timeout_memory": unacked,
    }


def _report(payload: dict[str, Any]) -> None:
    rows = []
    for setting, calls in (("batch-index acks", payload), ("no batch-index acks", payload["no_batch_index_acks"])):
        for case in ("receive_ack_batched", "receive_ack_unbatched", "nack_message"):
            c = calls[case]
            guarding = c["us"].get("pulsar-nack-guarding")
            rows.append(
                [setting, case, f"{c['messages']:,}", f"{c['us']['plain']['median']:.2f}",
                 f"{c['us']['pulsar-nack']['median']:.2f}", f"{c['ratio_ours_over_plain']:.2f}x",
                 f"{guarding['median']:.2f}" if guarding else "-"]
            )
    print_table(["broker", "case", "messages", "plain µs", "pulsar-nack µs", "ours/plain", "guarding µs"], rows,
                title="Per-message cost")
    _report_working(payload)
    memory = payload["pending_nack_memory_batched"]
    print_table(
        ["system", "messages", "pending nacks", "RSS delta", "control RSS delta", "B/pending nack", "net B/nack"],
        [[c["system"], f"{c['messages']:,}", f"{c['pending_nacks']:,}", f"{int(c['rss_delta_bytes']):,}",
          f"{int(c['control_rss_delta_bytes']):,}", f"{c['bytes_per_pending_nack']:.1f}",
          f"{c['net_bytes_per_pending_nack']:.1f}"] for c in memory["cases"]],
        title="Bytes per pending nack, batched workload",
    )
    print(f"memory ours/plain: {memory['ratio_ours_over_plain']:.3f} (net {memory['net_ratio_ours_over_plain']:.3f})")
    plain_way = payload["pending_nack_memory_plain_way"]
    print_table(
        ["system", "B/pending nack (runs)", "median", "net of control", "after malloc_trim"],
        [[c["system"], ", ".join(f"{v:.0f}" for v in c["bytes_per_pending_nack_runs"]),
          f"{c['bytes_per_pending_nack']:.1f}", f"{c['net_bytes_per_pending_nack']:.1f}",
          f"{c['after_trim_bytes_per_pending_nack']:.1f}"] for c in plain_way["cases"]],
        title="Bytes per pending nack, the plain way",
    )
    print(f"plain way ours/plain: {plain_way['ratio_ours_over_plain']:.3f}")
    _report_ack_timeout(payload)


def _report_ack_timeout(payload: dict[str, Any]) -> None:
    """The ack-timeout case's table (receive + ack µs, and bytes per unacked message)."""
    rows = []
    plain, ours = ACK_TIMEOUT_SYSTEMS
    for setting, calls in (("batch-index acks", payload), ("no batch-index acks", payload["no_batch_index_acks"])):
        for kind in ("batched", "unbatched"):
            c = calls[f"ack_timeout_receive_ack_{kind}"]
            rows.append([setting, kind, f"{c['us'][plain]['median']:.2f}", f"{c['us'][ours]['median']:.2f}",
                         f"{c['ratio_ours_over_plain']:.2f}x", f"{c['cpu_ratio_ours_over_plain']:.2f}x"])
    print_table(["broker", "case", "plain µs", "pulsar-nack µs", "ours/plain", "CPU ours/plain"], rows,
                title="Receive + acknowledge with an ack timeout")
    memory = payload["ack_timeout_memory"]
    print(f"bytes per unacked message: plain {memory['plain']['bytes_per_unacked']:.1f}, "
          f"ours {memory['pulsar-nack']['bytes_per_unacked']:.1f}")


def _report_working(payload: dict[str, Any]) -> None:
    """The working case's table (receive + ack + nack, µs per message)."""
    rows = []
    for setting, calls in (("batch-index acks", payload), ("no batch-index acks", payload["no_batch_index_acks"])):
        for case in working_cases():
            c = calls[case]
            rows.append([setting, case, f"{c['messages']:,}", f"{c['us']['plain']['median']:.2f}",
                         f"{c['us']['pulsar-nack']['median']:.2f}", f"{c['ratio_ours_over_plain']:.2f}x"])
    print_table(["broker", "case", "messages", "plain µs", "pulsar-nack µs", "ours/plain"], rows,
                title="Working consumer: receive + ack + nack, per message")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:2] == ["--worker", "plain"]:
        url, system, topic = argv[2:5]
        print(json.dumps(_plain_memory_worker(url, system, topic, int(argv[5]), bool(int(argv[6])))))
        return None
    if argv and argv[0] == "--worker":
        url, admin_url, system, topic = argv[1:5]
        print(json.dumps(_memory_worker(url, admin_url, system, topic, int(argv[5]), bool(int(argv[6])))))
        return None
    parser = argparse.ArgumentParser(prog="python -m bench.consumer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 messages, 3 repetitions")
    parser.add_argument("--messages", type=int, default=None, help="backlog per call-cost case (default 100,000)")
    parser.add_argument("--memory-messages", type=int, default=200_000, help="messages of the memory case")
    parser.add_argument("--repetitions", type=int, default=None, help="call-cost repetitions after the warmup (default 5)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    start = start_context()
    n = args.messages or (20_000 if args.quick else 100_000)
    memory_n = 50_000 if args.quick else args.memory_messages
    payload = run(n, memory_n, args.repetitions or (3 if args.quick else 5))
    _report(payload)
    path = write_result(args.out or ("consumer-quick" if args.quick else "consumer"), payload, start)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
