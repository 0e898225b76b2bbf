"""Regression tests for what the chaos runs found (bench/chaos.py, docs/benchmarks.md "Chaos and soak").

Each test reproduces one violation of a documented promise outside the chaos harness, on
the session's Apache Pulsar standalone, with the plain client as the control where the
promise is "as the plain client does". A test of a violation that is not fixed yet is a
strict xfail: it fails while the bug is there, and turns into an XPASS (a failure) once it
is fixed, so that the mark gets removed.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import pulsar_nack
from pulsar_nack.testing import quiet_client
from pulsar_nack.testing.waits import wait_until

MAX_REDELIVER = 2
MESSAGES = 100


def _consumers(kind: str, client: Any, topic: str, dlq: str) -> list[Any]:
    import pulsar

    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=MAX_REDELIVER, dead_letter_topic=dlq,
                                             initial_subscription_name="check")  # fmt: skip
    options = {"consumer_type": pulsar.ConsumerType.Shared, "dead_letter_policy": policy,
               "negative_ack_redelivery_delay_ms": 100, "receiver_queue_size": 10}  # fmt: skip  (both get messages)
    subscribe = client.subscribe if kind == "plain" else lambda *a, **k: pulsar_nack.subscribe(client, *a, **k)
    return [subscribe(topic, "two", consumer_name=f"c{i}", **options) for i in range(2)]


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["plain", "ours"])
def test_two_consumers_on_one_shared_subscription_dead_letter_at_the_count(apache_broker: Any, topic: str, kind: str) -> None:
    """Every message nacked at every delivery, by whichever of two consumers gets it: each goes to the
    dead-letter topic after exactly max_redeliver_count + 1 deliveries in all, as with the plain client.

    The broker sometimes dispatches one redelivery to both consumers (the same redelivery count,
    a few ms apart), with the plain client as with ours; either client delivers both copies, and
    when both consumers nack theirs the broker counts two redeliveries, so the message may skip a
    count and come over the limit, which the C++ client routes on arrival without a delivery
    (``ConsumerImpl``: ``redeliveryCount > maxRedeliverCount``). :func:`_dead_lettered_at_the_count`
    checks each message's deliveries against that model of the broker's count.

    Ours adds one case: the copy of the other consumer's redelivery can reach a consumer whose own
    nack of that message is pending, which swallows it (a message comes back once per nack, its
    own redelivery brings it). The broker counted that copy, so its next count skips one, and ours
    counts deliveries, not the broker's figure (``DeliveryCounts.seen``): the delivery at the
    limit may carry a count above it (seen in a clean-clone CI run: counts 0, 1, 1, 3).
    """
    import pulsar

    client = quiet_client(apache_broker.url)
    dlq = f"{topic}-DLQ"
    deliveries: dict[bytes, list[tuple[int, int]]] = {}  # payload: (consumer, redelivery count) of each delivery
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        reader = client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest,
                                  consumer_type=pulsar.ConsumerType.Shared)  # the dead-letter sender subscribes too
        consumers = _consumers(kind, client, topic, dlq)

        def pump(index: int, consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                with lock:
                    deliveries.setdefault(message.data(), []).append((index, message.redelivery_count()))
                consumer.negative_acknowledge(message)

        threads += [threading.Thread(target=pump, args=(i, c), daemon=True) for i, c in enumerate(consumers)]
        for thread in threads:
            thread.start()
        producer = client.create_producer(topic, batching_enabled=False)
        payloads = [f"m{i:03d}".encode() for i in range(MESSAGES)]
        for payload in payloads:
            producer.send(payload)
        _await_dead_letters(reader, MESSAGES, 90)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
    wrong = {p.decode(): deliveries.get(p) for p in payloads if not _dead_lettered_at_the_count(deliveries.get(p, []), swallows=kind == "ours")}
    assert not wrong, f"deliveries (consumer, redelivery count) not ending in a dead letter at the count: {wrong}"
    duplicates = sum(len(seen) - len({count for _, count in seen}) for seen in deliveries.values())
    assert duplicates <= MESSAGES // 5, f"{duplicates} copies the broker sent to both consumers: {deliveries}"


def _dead_lettered_at_the_count(deliveries: list[tuple[int, int]], *, swallows: bool = False) -> bool:
    """True if one message's *deliveries* (consumer, redelivery count) end in its dead letter at the count.

    The broker's count goes up by one for each copy of a redelivery a consumer nacks while the
    broker has it pending there: by one, or by two when it dispatched that redelivery to both
    consumers. So the counts delivered start at 0, each next one is 1 to (copies of the one
    before) higher, none is over the limit, and the last is the limit (its nack sends the dead
    letter) or its copies push the next count over the limit (that copy goes on arrival).
    Without copies this is exactly counts 0, 1, ..., limit, once each.

    *swallows*: a consumer that swallows a copy of a message whose nack it has pending (ours). That
    copy skips a count, so the rule above holds for the deliveries' rounds (the i-th distinct count
    delivered is round i) in place of their counts, and a count skipped is never more than the
    copies of the round before allow.

    >>> _dead_lettered_at_the_count([(0, 0), (1, 1), (0, 2)]), _dead_lettered_at_the_count([(0, 0), (1, 1)])
    (True, False)
    >>> _dead_lettered_at_the_count([(0, 0), (0, 1), (1, 1)]), _dead_lettered_at_the_count([(0, 0), (0, 1), (1, 1), (1, 2)])
    (True, True)
    >>> deliveries = [(0, 0), (0, 1), (1, 1), (1, 3)]
    >>> _dead_lettered_at_the_count(deliveries), _dead_lettered_at_the_count(deliveries, swallows=True)
    (False, True)
    >>> _dead_lettered_at_the_count([(0, 0), (0, 1), (1, 1), (1, 3), (0, 4)], swallows=True)  # a round too many
    False
    """
    copies = Counter(count for _, count in deliveries)
    counts = sorted(copies)
    if not counts or counts[0] != 0:
        return False
    steps_fit = all(1 <= after - before <= copies[before] for before, after in itertools.pairwise(counts))
    last, rounds = counts[-1], len(counts) - 1  # rounds: the last delivery's round, 0 for the first
    if not swallows and last > MAX_REDELIVER:  # the plain client routes it on arrival
        return False
    at = rounds if swallows else last
    return steps_fit and at <= MAX_REDELIVER and (at == MAX_REDELIVER or at + copies[last] > MAX_REDELIVER)


COPIES = 30


@pytest.mark.broker
@pytest.mark.parametrize(
    "hold_ms",
    [
        pytest.param(0, id="copies-held-by-the-broker"),
        pytest.param(5_000, id="copies-held-by-the-consumer"),
    ],
)  # fmt: skip
def test_a_retry_copy_is_delivered_once_across_a_retry_topic_unload(apache_broker: Any, topic: str, hold_ms: int) -> None:
    """30 retries pending (due 3 s later) when the retry topic is unloaded: each copy reaches the application
    once, whether the broker holds it until due or the consumer does (``retry_hold_ms``)."""
    import pulsar

    client = quiet_client(apache_broker.url)
    seen: Counter[tuple[bytes, int]] = Counter()
    try:
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared, retry_enable=True,
                                         retry_hold_ms=hold_ms)  # fmt: skip
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(COPIES):
            producer.send(f"r{i:02d}".encode())
        for _ in range(COPIES):
            consumer.reconsume_later(consumer.receive(10_000), 3_000)
        apache_broker.admin.unload_topic(f"{topic}-s-RETRY")  # every copy pending, some held in the consumer
        while True:
            try:
                message = consumer.receive(5_000)  # a second copy would come within the retry's 3 s
            except pulsar.Timeout:
                break
            seen[(message.data(), message.redelivery_count())] += 1
            consumer.acknowledge(message)
        consumer.close()
    finally:
        client.close()
    assert len(seen) == COPIES, f"{len(seen)} of {COPIES} copies came back"
    twice = {f"{p.decode()} rc {rc}": n for (p, rc), n in seen.items() if n > 1}
    assert not twice, f"retry copies delivered more than once: {twice}"


ENTRIES = 20


@pytest.mark.broker
@pytest.mark.parametrize(
    "consumers",
    [
        pytest.param(1, id="one-consumer"),
        pytest.param(2, id="two-consumers"),
    ],
)  # fmt: skip
def test_a_nacked_batch_member_is_never_early_on_a_shared_subscription(apache_broker: Any, topic: str, consumers: int) -> None:
    """20 entries of 10: member 0 nacked for 300 ms, member 1 for 4 s, the rest acked, by whichever consumer gets the
    entry; member 1 comes back no earlier than its bucket allows (8 bits: 255 ms), also when member 0's handoff
    brings the entry back first."""
    import pulsar

    client = quiet_client(apache_broker.url)
    due: dict[bytes, float] = {}
    arrived: dict[bytes, float] = {}
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        group = [pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared, consumer_name=f"c{i}")
                 for i in range(consumers)]  # fmt: skip

        def pump(consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                payload, now = message.data(), time.monotonic()
                index = int(payload) % 10
                with lock:
                    first = payload not in due and payload not in arrived
                    if not first:
                        arrived.setdefault(payload, now)
                    elif index == 1:
                        due[payload] = now + 4.0 - 0.255
                if first and index < 2:
                    consumer.negative_acknowledge(message, 300 if index == 0 else 4_000)
                else:
                    consumer.acknowledge(message)

        threads += [threading.Thread(target=pump, args=(c,), daemon=True) for c in group]
        for thread in threads:
            thread.start()
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                          batching_max_publish_delay_ms=100)  # fmt: skip
        for i in range(ENTRIES * 10):
            producer.send_async(f"{i:04d}".encode(), None)
        producer.flush()
        assert wait_until(lambda: len(due) == ENTRIES and all(p in arrived for p in due), 60), "not every retry came back"
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
    early = {p.decode(): round((due[p] - arrived[p]) * 1000) for p in due if arrived[p] < due[p] - 0.010}
    assert not early, f"ms before due: {early}"


@pytest.mark.broker
@pytest.mark.parametrize(
    ("gap_s", "hold_s"),
    [
        pytest.param(0.0, 0.6, id="member-held"),
        pytest.param(0.05, 0.05, id="member-queued"),
    ],
)  # fmt: skip
def test_on_a_shared_subscription_an_entry_waits_while_the_application_may_still_settle_a_member(
    apache_broker: Any, topic: str, gap_s: float, hold_s: float
) -> None:
    """An entry of 3: member 0 nacked at once, member 1 taken *gap_s* later and held *hold_s*, then nacked for 1 s.

    Member 0's handoff is due before member 1 is settled (held in the application, or still
    in the receive queue). Had the entry gone back then, a second consumer of the subscription
    could have received it and delivered member 1 before its time (the chaos run's and CI's
    early deliveries); on a Shared subscription the entry goes back once member 1 is settled,
    and when the last of its nacks is due: member 0 comes back with member 1, not before.
    """
    import pulsar

    client = quiet_client(apache_broker.url)
    try:
        consumer = pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                          batching_max_publish_delay_ms=100)  # fmt: skip
        for i in range(3):
            producer.send_async(f"{i}".encode(), None)
        producer.flush()
        first = consumer.receive(10_000)
        assert first.data() == b"0"
        consumer.negative_acknowledge(first, 0)
        time.sleep(gap_s)  # the application works on member 0 after nacking it
        second = consumer.receive(10_000)
        assert second.data() == b"1"
        time.sleep(hold_s)  # and on member 1
        due = time.monotonic() + 1.0 - 0.255  # the 8-bit bucket may fire up to 255 ms before
        consumer.negative_acknowledge(second, 1_000)
        consumer.acknowledge(consumer.receive(10_000))
        back = {}
        while len(back) < 2:
            message = consumer.receive(10_000)
            back.setdefault(message.data(), time.monotonic())
            consumer.acknowledge(message)
        consumer.close()
    finally:
        client.close()
    early = {p.decode(): round((due - t) * 1000) for p, t in back.items() if t < due - 0.010}
    assert not early, f"ms before member 1's nack was due: {early}"


LEAK_MESSAGES = 1_000


@pytest.mark.broker
def test_two_consumers_hold_no_more_per_message_than_one(apache_broker: Any, topic: str, monkeypatch: Any) -> None:
    """1,000 messages, each nacked once (100 ms) and acked on its return, with a dead-letter policy (so the consumers
    count deliveries): the Python memory the consumer code keeps afterwards is no larger with two consumers sharing
    the work than with one (what one consumer keeps is its bounded memory of settled messages). The consumers'
    clock jumps ``STALE_MS`` after each 100 messages (and each of 10 more twice, last), so that the counts of messages
    the other consumer settled age out as they would in a soak (the leak bench.chaos --soak found: they stayed)."""
    from pulsar_nack.consumer import admission
    from pulsar_nack.core.timer import monotonic_ms

    jumped = [0]
    monkeypatch.setattr(admission, "monotonic_ms", lambda: monotonic_ms() + jumped[0])
    one = _kept_bytes(apache_broker.url, f"{topic}-one", 1, jumped)
    two = _kept_bytes(apache_broker.url, f"{topic}-two", 2, jumped)
    assert two <= 1.3 * one + 10_000, f"kept by pulsar_nack/consumer: {one} bytes with one consumer, {two} with two"


def _kept_bytes(url: str, topic: str, consumers: int, jumped: list[int]) -> int:
    """Bytes of Python objects allocated by pulsar_nack/consumer/ during LEAK_MESSAGES messages and still alive.

    After each 100 messages settled, the ledgers' clock (offset by ``jumped[0]`` ms) jumps ``STALE_MS``.
    """
    import pulsar

    from pulsar_nack.timing import STALE_MS

    client = quiet_client(url)
    acked: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=5, dead_letter_topic=f"{topic}-DLQ")
    try:
        group = [pulsar_nack.subscribe(client, topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                       consumer_name=f"c{i}", dead_letter_policy=policy) for i in range(consumers)]  # fmt: skip

        def pump(consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                if message.redelivery_count() == 0:
                    consumer.negative_acknowledge(message, 100)
                    continue
                consumer.acknowledge(message)
                with lock:
                    acked.add(message.data())

        threads += [threading.Thread(target=pump, args=(c,), daemon=True) for c in group]
        for thread in threads:
            thread.start()
        producer = client.create_producer(topic, batching_enabled=False)

        def send(start: int, count: int, step: int = 100) -> None:
            for chunk in range(start, start + count, step):  # in steps, so that retries do not queue behind fresh messages
                for i in range(chunk, chunk + step):
                    producer.send_async(f"{i:05d}".encode(), None)
                producer.flush()
                assert wait_until(lambda: len(acked) == chunk + step, 60), f"{len(acked)} of {chunk + step} acked"  # noqa: B023
                jumped[0] += STALE_MS  # nothing in flight: the next handoffs age the ledgers' knowledge

        send(0, 200)  # warm-up: the consumers' tables and the client's buffers reach their size
        tracemalloc.start()
        try:
            send(200, LEAK_MESSAGES)
            send(200 + LEAK_MESSAGES, 20, step=10)  # two small generations last: what is kept of them is small
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
    kept = snapshot.filter_traces([tracemalloc.Filter(True, "*pulsar_nack/consumer/*")])
    return sum(stat.size for stat in kept.statistics("filename"))


SIBLING_ENTRIES = 6
SIBLINGS = 3  # members 1-3; member 0 is nacked at every delivery
SIBLING_MAX = 3


def _produce_entries(client: Any, topic: str) -> None:
    """SIBLING_ENTRIES batch entries of 1 + SIBLINGS members, ``e<entry>-<member>``; each group is one entry."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=SIBLINGS + 1,
                                      batching_max_publish_delay_ms=10_000)  # fmt: skip
    entries: dict[str, set[tuple[int, int]]] = {}
    for e in range(SIBLING_ENTRIES):
        ids: list[Any] = []
        for j in range(SIBLINGS + 1):
            producer.send_async(f"e{e}-{j}".encode(), lambda _res, mid: ids.append(mid))  # noqa: B023
        producer.flush()
        assert wait_until(lambda: len(ids) == SIBLINGS + 1, 10)  # noqa: B023
        entries[f"e{e}"] = {(m.ledger_id(), m.entry_id()) for m in ids}
    assert all(len(e) == 1 for e in entries.values()), f"each group is one entry: {entries}"


def _await_dead_letters(reader: Any, count: int, timeout_s: float, wanted: str = "") -> None:
    """Read the dead-letter topic until *count* distinct payloads ending in *wanted* are there."""
    import pulsar

    dead: set[bytes] = set()

    def all_dead() -> bool:
        try:
            message = reader.receive(200)
        except pulsar.Timeout:
            return False
        reader.acknowledge(message)
        if message.data().endswith(wanted.encode()):
            dead.add(message.data())
        return len(dead) == count

    assert wait_until(all_dead, timeout_s), f"{len(dead)} of {count} dead-lettered"


def _sibling_reset_run(url: str, topic: str, kind: str, consumers: int) -> dict[str, list[tuple[str, int]]]:
    """The sibling-ack scenario: entries of 1 + SIBLINGS members on a Shared subscription with a dead-letter
    policy (``max_redeliver_count`` SIBLING_MAX), *consumers* consumers of *kind* ("plain": ``client.subscribe``
    with batch-index acks, as ours subscribe; "plain-entry-acks": with pulsar's default, none; "ours":
    ``pulsar_nack.subscribe``). Member 0 is nacked at every delivery; sibling j is nacked at its first
    j - 1 deliveries and acked at its j-th. Returns, per member 0, its deliveries (consumer, ``redelivery_count()``)
    until its dead letter is stored."""
    import pulsar

    client = quiet_client(url)
    dlq = f"{topic}-DLQ"
    seen: dict[str, list[tuple[str, int]]] = {}
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=SIBLING_MAX, dead_letter_topic=dlq,
                                             initial_subscription_name="check")  # fmt: skip
    options = {"consumer_type": pulsar.ConsumerType.Shared, "dead_letter_policy": policy,
               "negative_ack_redelivery_delay_ms": 1_000, "receiver_queue_size": 10}  # fmt: skip
    if kind == "plain":  # the control, with ours' batch-index acks (False is pulsar's default)
        options["batch_index_ack_enabled"] = True
    subscribe = client.subscribe if kind.startswith("plain") else lambda *a, **k: pulsar_nack.subscribe(client, *a, **k)
    try:
        reader = client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest,
                                  consumer_type=pulsar.ConsumerType.Shared)  # fmt: skip
        group = [subscribe(topic, "s", consumer_name=f"c{i}", **options) for i in range(consumers)]

        def pump(name: str, consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                payload = message.data().decode()
                member = int(payload.split("-")[1])
                with lock:
                    counts[payload] += 1
                    if member == 0:
                        seen.setdefault(payload, []).append((name, message.redelivery_count()))
                if member and counts[payload] == member:
                    consumer.acknowledge(message)
                else:
                    consumer.negative_acknowledge(message)

        threads += [threading.Thread(target=pump, args=(f"c{i}", c), daemon=True) for i, c in enumerate(group)]
        for thread in threads:
            thread.start()
        _produce_entries(client, topic)
        _await_dead_letters(reader, SIBLING_ENTRIES, 120, wanted="-0")  # member 0 of every entry
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        client.close()
    with lock:
        return {payload: list(deliveries) for payload, deliveries in seen.items()}


def _reset_seen(deliveries: list[tuple[str, int]]) -> bool:
    """The broker's count did not rise across a redelivery: a sibling's ack reset it."""
    return any(b[1] <= a[1] for a, b in itertools.pairwise(deliveries))


@pytest.mark.broker
def test_a_sibling_ack_resets_the_brokers_count_of_a_nacked_member(apache_broker: Any, topic: str) -> None:
    """With batch-index acks, acking one member of a batch entry makes the broker forget its entry's redelivery count
    (``PersistentSubscription.acknowledgeMessage`` calls ``redeliveryTracker.removeBatch`` with the entry's position
    for a partial ack too). The nacked member's ``redelivery_count()`` then runs 0, 1, 1, 1, 2, 3 and the plain client
    with batch-index acks (the control, as ours subscribe) delivers it 6 times instead of ``max_redeliver_count + 1``
    = 4, with one consumer or two; with pulsar's default (no batch-index acks: the client acks the entry once whole)
    nothing resets and it gets 4. Ours count what the application saw: with one consumer, exactly 4 deliveries; with
    two, each consumer counts only its own deliveries above the broker's count, so a member can get more than 4,
    never more than the control's, and only when both consumers received it (docs/consumer.md, "Dead letters")."""
    kinds = ("plain", "plain-entry-acks", "ours")
    runs = {(kind, n): _sibling_reset_run(apache_broker.url, f"{topic}-{kind}-{n}", kind, n) for kind in kinds for n in (1, 2)}
    report = {f"{kind} x{n}": sorted(Counter(len(d) for d in run.values()).items()) for (kind, n), run in runs.items()}
    print(f"deliveries of each nacked member before its dead letter (deliveries, members): {report}")
    for n in (1, 2):
        plain, entry_acks = runs[("plain", n)], runs[("plain-entry-acks", n)]
        assert all([rc for _, rc in d] == [0, 1, 1, 1, 2, 3] for d in plain.values()), f"plain x{n}: {plain}"
        assert not any(_reset_seen(d) for d in entry_acks.values()), f"plain-entry-acks x{n}: {entry_acks}"
        assert all(len(d) == SIBLING_MAX + 1 for d in entry_acks.values()), f"plain-entry-acks x{n}: {entry_acks}"
    one = runs[("ours", 1)]
    assert all(_reset_seen(d) for d in one.values()), f"ours x1: the count never fell back: {one}"
    assert all(len(d) == SIBLING_MAX + 1 for d in one.values()), f"ours x1: not exactly at the count: {one}"
    most = max(len(d) for d in runs[("plain", 2)].values())
    two = runs[("ours", 2)]
    assert all(SIBLING_MAX + 1 <= len(d) <= most for d in two.values()), f"ours x2 (the control's most {most}): {two}"
    past = {p: d for p, d in two.items() if len(d) > SIBLING_MAX + 1}
    assert all(len({name for name, _ in d}) > 1 and _reset_seen(d) for d in past.values()), f"ours x2 past: {past}"


TWIN_MESSAGES = 2_000
TWIN_TRIES = 10
TWIN_TOP = 2  # each message is nacked at counts 0-1 and acked at 2
# (with 3, under pytest, the plain client's third redeliveries never came, in 3 runs of 3; outside it they did: not
# pinned down)


def _send_in_steps(producer: Any, received: Any) -> None:
    """Send TWIN_MESSAGES in steps of 50, each received (``received()``: how many) before the next, as a steady
    producer sends."""
    for step in range(0, TWIN_MESSAGES, 50):
        for i in range(step, step + 50):
            producer.send_async(f"m{i:05d}".encode(), None)
        producer.flush()
        assert wait_until(lambda: received() >= step + 50, 10), f"{received()} of {step + 50} received"  # noqa: B023


def _stop_all(stop: threading.Event, threads: list[threading.Thread], clients: list[Any]) -> None:
    """Set *stop*, wait for the *threads* (up to 5 s each), close the *clients*."""
    stop.set()
    for thread in threads:
        thread.join(5)
    for client in clients:
        client.close()


def _twin_run(broker: Any, topic: str, kind: str) -> dict[tuple[bytes, int], list[tuple[int, float]]]:
    """TWIN_MESSAGES unbatched messages on 4 partitions, two consumers of *kind* (two clients, as two processes
    would have) on one Shared subscription, each message nacked until its count is TWIN_TOP, then acked. Returns
    (payload, ``redelivery_count()``) -> the deliveries of it: (consumer, arrival)."""
    import pulsar

    broker.create_partitioned_topic(topic, 4)
    clients = [quiet_client(broker.url) for _ in range(2)]
    seen: dict[tuple[bytes, int], list[tuple[int, float]]] = {}
    acked: set[bytes] = set()
    firsts: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    options = {"consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": 100}
    try:
        if kind == "plain":
            group = [c.subscribe(topic, "s", consumer_name=f"c{i}", negative_ack_redelivery_delay_ms=100, **options)
                     for i, c in enumerate(clients)]  # fmt: skip
        else:
            group = [pulsar_nack.subscribe(c, topic, "s", consumer_name=f"c{i}", **options) for i, c in enumerate(clients)]

        def pump(index: int, consumer: Any) -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    continue
                payload, count = message.data(), message.redelivery_count()
                with lock:
                    seen.setdefault((payload, count), []).append((index, time.monotonic()))
                    if count == 0:
                        firsts.add(payload)
                if count < TWIN_TOP:
                    consumer.negative_acknowledge(message)
                    continue
                consumer.acknowledge(message)
                with lock:
                    acked.add(payload)

        threads += [threading.Thread(target=pump, args=(i, c), daemon=True) for i, c in enumerate(group)]
        for thread in threads:
            thread.start()
        _send_in_steps(clients[0].create_producer(topic, batching_enabled=False), lambda: len(firsts))
        assert wait_until(lambda: len(acked) == TWIN_MESSAGES, 120), (
            f"{len(acked)} of {TWIN_MESSAGES} acked; {len(seen)} deliveries, counts {Counter(c for _, c in seen)}")
    finally:
        _stop_all(stop, threads, clients)
    with lock:
        return dict(seen)


def _twins(seen: dict[tuple[bytes, int], list[tuple[int, float]]]) -> list[int]:
    """The gaps (ms) between the two consumers' copies of each delivery (one payload, one count) both received."""
    return sorted(round((max(t for _, t in got) - min(t for _, t in got)) * 1000)
                  for got in seen.values() if len({index for index, _ in got}) > 1)  # fmt: skip


RARE_ENV = "PULSAR_NACK_RARE"
"""Set to 1 to run the tests of rare broker races: each tries until the race shows, for minutes, and can miss it."""


@pytest.mark.broker
@pytest.mark.skipif(os.environ.get(RARE_ENV) != "1", reason=f"a rare broker race, minutes of tries: {RARE_ENV}=1 runs it")
def test_the_broker_can_dispatch_a_redelivery_to_both_shared_consumers(apache_broker: Any, topic: str) -> None:
    """One nacked message, redelivered once, reaches *both* consumers of a Shared subscription with the same
    ``redelivery_count()``, milliseconds apart: with the plain client (the control), so the broker's doing, not the
    wrapper's (the chaos runs' "one stored message delivered by both consumers with the same count"). Each try
    nacks 2,000 messages twice; it is rare, so the plain client's tries go on until one shows it (up to
    TWIN_TRIES); ours get two tries, counted, not asserted. The
    copies are at most ``DOUBLE_DISPATCH_S`` apart, the window in which the chaos checker attributes a second copy
    to this (``pulsar_nack/testing/chaos/checker.py``)."""
    from pulsar_nack.testing.chaos.checker import DOUBLE_DISPATCH_S

    found: dict[str, list[list[int]]] = {"plain": [], "ours": []}
    for attempt in range(TWIN_TRIES):
        found["plain"].append(_twins(_twin_run(apache_broker, f"{topic}-plain-{attempt}", "plain")))
        if found["plain"][-1]:
            break
    for attempt in range(2):
        found["ours"].append(_twins(_twin_run(apache_broker, f"{topic}-ours-{attempt}", "ours")))
    print(f"deliveries received by both consumers, per try (gaps in ms): {found}")
    assert found["plain"][-1], f"the plain client never got one delivery at both consumers in {TWIN_TRIES} tries"
    gaps = [gap for tries in found.values() for run in tries for gap in run]
    assert max(gaps) <= DOUBLE_DISPATCH_S * 1000, f"gaps (ms) wider than the checker's window: {found}"



CLOSE_RACE_SECONDS = 300.0
CLOSE_RACE_HOLD_S = 0.2


def _hold_then_ack(consumer: Any, until: Callable[[], bool], arrived: Callable[[Any], None] = lambda m: None) -> list[Any]:
    """Receive and acknowledge each message CLOSE_RACE_HOLD_S after it arrived (a worker at its task), until
    *until()*; *arrived* sees each message. Returns the messages still held then."""
    import pulsar

    held: collections.deque[tuple[float, Any]] = collections.deque()
    while not until():
        try:
            message = consumer.receive(20)
            arrived(message)
            held.append((time.monotonic() + CLOSE_RACE_HOLD_S, message))
        except pulsar.Timeout:
            pass
        while held and held[0][0] <= time.monotonic():
            consumer.acknowledge(held.popleft()[1])
    return [message for _, message in held]


class _Twice:
    """The gaps (ms) between two arrivals of one message (ledger, entry, batch index); *stop* set at the first."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.gaps: list[int] = []
        self._arrivals: dict[tuple[int, int, int], float] = {}

    def arrived(self, message: Any) -> None:
        mid, now = message.message_id(), time.monotonic()
        key = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        if key in self._arrivals:
            self.gaps.append(round((now - self._arrivals[key]) * 1000))
            self.stop.set()
        self._arrivals[key] = now


def _produce_until(producer: Any, stop: threading.Event) -> None:
    """Send 10 messages every 10 ms until *stop*."""
    sent = 0
    while not stop.is_set():
        for _ in range(10):
            producer.send_async(f"m{sent}".encode(), None)
            sent += 1
        time.sleep(0.01)


def _close_race_run(broker: Any, topic: str, kind: str, seconds: float, close: bool = True) -> list[int]:
    """A Shared subscription, a steady batched producer and two consumers (two clients) that each hold a message
    CLOSE_RACE_HOLD_S before acknowledging it: a *kind* one (the plain client or ours), and a plain one that closes
    every second (with *close*) holding what it received last, unacknowledged, and subscribes again. For
    *seconds*, or until the first consumer receives one message (ledger, entry, batch index) twice; returns the
    gaps (ms) between such copies."""
    import pulsar

    clients = [quiet_client(broker.url) for _ in range(2)]
    options = {"consumer_type": pulsar.ConsumerType.Shared, "receiver_queue_size": 100}
    stop = threading.Event()
    twice = _Twice(stop)
    threads: list[threading.Thread] = []
    try:
        if kind == "plain":
            steady = clients[1].subscribe(topic, "s", consumer_name="steady", **options)
        else:
            steady = pulsar_nack.subscribe(clients[1], topic, "s", consumer_name="steady", **options)
        producer = clients[0].create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
        threads += [threading.Thread(target=_hold_then_ack, args=(steady, stop.is_set, twice.arrived), daemon=True),
                    threading.Thread(target=_produce_until, args=(producer, stop), daemon=True)]  # fmt: skip
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + seconds
        cycler = None
        while time.monotonic() < deadline and not stop.is_set():
            cycler = cycler or clients[0].subscribe(topic, "s", consumer_name="cycler", **options)
            cycle_end = time.monotonic() + 1.0
            held = _hold_then_ack(cycler, lambda: time.monotonic() >= cycle_end)  # noqa: B023
            if close:
                cycler.close()
                cycler = None
            else:  # the control of the control: no close, no replay
                for message in held:
                    cycler.acknowledge(message)
    finally:
        _stop_all(stop, threads, clients)
    return twice.gaps


@pytest.mark.broker
@pytest.mark.skipif(os.environ.get(RARE_ENV) != "1", reason=f"a rare broker race, minutes of tries: {RARE_ENV}=1 runs it")
def test_a_consumers_close_can_send_one_message_twice_to_another_consumer(apache_broker: Any, topic: str) -> None:
    """A consumer of a Shared subscription closes while it holds messages unacknowledged: the broker can then send
    one message twice to the subscription's other consumer, milliseconds apart (a race of the kind of
    apache/pulsar#16795). With the plain client on both sides (the control): the broker's doing, not the
    wrapper's (the chaos run's "one retry copy delivered twice to the consumer that holds copies", attributed to
    it by the chaos checker when another consumer of the subscription closed near it, ``Cause.CLOSE_RACE``). The
    plain client's run goes on until the race shows (up to CLOSE_RACE_SECONDS); ours as the other consumer runs
    30 s, counted, not asserted. The copies are at most ``DOUBLE_DISPATCH_S`` apart."""
    from pulsar_nack.testing.chaos.checker import DOUBLE_DISPATCH_S

    plain = _close_race_run(apache_broker, f"{topic}-plain", "plain", CLOSE_RACE_SECONDS)
    ours = _close_race_run(apache_broker, f"{topic}-ours", "ours", 30.0)
    print(f"messages received twice by the steady consumer (gaps in ms): plain {plain}, ours {ours}")
    assert plain, f"the plain client's steady consumer never received a message twice in {CLOSE_RACE_SECONDS:.0f} s"
    assert max(plain + ours) <= DOUBLE_DISPATCH_S * 1000, f"gaps (ms) wider than the checker's window: {plain}, {ours}"
