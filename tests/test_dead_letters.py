"""Dead letters exactly as the plain client sends them (issue 22), on Apache Pulsar standalone.

Every scenario runs on the plain ``client.subscribe`` (the control), on
``pulsar_nack.subscribe`` and on ``pulsar_nack.asyncio.subscribe``, and expects the same
dead letters from all three: each message once, after the same number of deliveries to
the application, with its payload, partition key, ordering key, properties and event
time as the plain client's dead letter has them (the C++ client inside pulsar-client
3.13 does not carry the event time: 0 for all three), ``REAL_TOPIC`` the topic it was
received from and ``ORIGIN_MESSAGE_ID`` its id as the client prints it; the original is
acknowledged (backlog 0) and the consumer goes quiet.

The triggers, as in pulsar-client-cpp's ``DeadLetterQueueTest.cc``:

* ``nack``: every delivery is nacked; ``max_redeliver_count=2``: 3 deliveries each;
* ``redeliver``: nothing is settled; ``redeliver_unacknowledged_messages()`` once every
  message out was received; 3 deliveries each;
* ``ack_timeout``: the first delivery is nacked, the second is left to the client's ack
  timeout (10 s, its minimum); ``max_redeliver_count=1``: 2 deliveries each;
* ``reconnect``: the first delivery is left unsettled and the consumer is closed and
  subscribed again. Apache Pulsar 4.0.8 forgets the redelivery counts of a consumer
  that leaves, so the count starts again at 0 after it (for either client); the next
  two deliveries are nacked and the second of them sends it; ``max_redeliver_count=1``:
  3 deliveries each.

Each trigger runs batched or not, on a topic or a topic of 2 partitions (created through
the admin API; messages produced to each partition), Shared and Key_Shared. All runs of
one trigger go at once, in threads (the ack timeout alone takes 10 s), the first time a
test asks for them; each test then checks its own run against the expectation and
against the control.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import importlib.metadata
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import helpers
import pulsar_nack
import pulsar_nack.asyncio
from helpers import wait_for
from pulsar_nack.consumer import settings as consumer_settings
from pulsar_nack.consumer.subscription import Sharing
from pulsar_nack.testing import quiet_client
from pulsar_nack.testing.admin import PulsarAdmin

pytestmark = pytest.mark.broker

N = 4
TRIGGERS = ("nack", "redeliver", "ack_timeout", "reconnect")
MAX_REDELIVER = {"nack": 2, "redeliver": 2, "ack_timeout": 1, "reconnect": 1}
DELIVERIES = {"nack": 3, "redeliver": 3, "ack_timeout": 2, "reconnect": 3}
BUDGET_S = {"nack": 60, "redeliver": 60, "ack_timeout": 90, "reconnect": 60}
ACK_TIMEOUT_MS = 10_000  # the client refuses less
QUIET_S = 1.0  # a run ends once every dead letter arrived and nothing was delivered for this long
CLIENTS = ("plain", "blocking", "asyncio")


def _client_version_tuple() -> tuple[int, ...]:
    """The installed pulsar-client's version, e.g. ``(3, 13, 0)``."""
    return tuple(int(part) for part in importlib.metadata.version("pulsar-client").split(".")[:3] if part.isdigit())

VARIANTS = [
    (batched, partitioned, consumer_type)
    for batched in (False, True)
    for partitioned in (False, True)
    for consumer_type in ("Shared", "KeyShared")
]
EVENT_TIME = 1_700_000_000_000


def variant_id(variant: tuple[bool, bool, str]) -> str:
    batched, partitioned, consumer_type = variant
    return f"{'batched' if batched else 'single'}-{'partitioned' if partitioned else 'topic'}-{consumer_type}"


@dataclasses.dataclass
class Run:
    """What one scenario saw."""

    deliveries: collections.Counter[bytes] = dataclasses.field(default_factory=collections.Counter)
    received_as: dict[bytes, tuple[str, str]] = dataclasses.field(default_factory=dict)  # last (topic, id)
    dead: dict[bytes, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    backlog: int | None = None
    error: str | None = None


def dead_letter_record(message: Any) -> dict[str, Any]:
    return {
        "partition_key": message.partition_key(),
        "ordering_key": message.ordering_key(),
        "properties": dict(message.properties()),
        "event_timestamp": message.event_timestamp(),
    }


# ---------------------------------------------------------------- the three clients, one interface


class AsyncLoop:
    """An event loop on its own thread, with the module's ``pulsar.asyncio.Client``."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dlq-test-loop", daemon=True)
        self.thread.start()
        self.client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout_s: float = 60) -> Any:
        return self.submit(coro).result(timeout_s)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def on_loop() -> Any:
            return fn()

        return self.run(on_loop())

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Driver:
    """One consumer (plain, blocking or asyncio) behind blocking calls; receive returns None on timeout."""

    def __init__(self, kind: str, lab: Lab, topic: str, **subscribe: Any) -> None:
        self.kind, self.lab, self.topic, self.options = kind, lab, topic, subscribe
        self._pending: concurrent.futures.Future[Any] | None = None
        self.consumer: Any = None
        self.subscribe()

    def subscribe(self) -> None:
        options = dict(self.options, negative_ack_redelivery_delay_ms=100)
        if self.kind == "plain":
            self.consumer = self.lab.client.subscribe(self.topic, "sub", **options)
        elif self.kind == "blocking":
            self.consumer = pulsar_nack.subscribe(self.lab.client, self.topic, "sub", **options)
        else:
            self.consumer = self.lab.aio.run(pulsar_nack.asyncio.subscribe(self.lab.aio.client, self.topic, "sub", **options))

    def receive(self, timeout_ms: int) -> Any | None:
        if self.kind != "asyncio":
            try:
                return self.consumer.receive(timeout_ms)
            except pulsar.Timeout:
                return None
        if self._pending is None:  # one receive at a time, never cancelled (that would lose a message)
            self._pending = self.lab.aio.submit(self.consumer.receive())
        try:
            message = self._pending.result(timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            return None
        self._pending = None
        return message

    def nack(self, message: Any, delay_ms: int | None = None) -> None:
        more = {} if delay_ms is None else {"delay_ms": delay_ms}  # per-call delays: ours only
        if self.kind == "asyncio":
            self.lab.aio.run(self.consumer.negative_acknowledge(message, **more))
        else:
            self.consumer.negative_acknowledge(message, **more)

    def redeliver(self) -> None:
        if self.kind == "asyncio":
            self.lab.aio.call(self.consumer.redeliver_unacknowledged_messages)
        else:
            self.consumer.redeliver_unacknowledged_messages()

    def close(self) -> None:
        if self.kind != "asyncio":
            self.consumer.close()
            return
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self.lab.aio.run(self.consumer.close())

    def reconnect(self) -> None:
        self.close()
        self.subscribe()


class Lab:
    """The module's clients, and the runs of each trigger (made on first use)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.admin = PulsarAdmin(broker.admin_url)
        self.client = quiet_client(broker.url)
        self.aio = AsyncLoop(broker.url)
        self.results: dict[str, dict[tuple[tuple[bool, bool, str], str], Run]] = {}
        self.lock = threading.Lock()

    def runs(self, trigger: str) -> dict[tuple[tuple[bool, bool, str], str], Run]:
        with self.lock:
            if trigger not in self.results:
                jobs = [(variant, kind) for variant in VARIANTS for kind in CLIENTS]
                with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                    futures = {job: pool.submit(run_scenario, self, trigger, *job) for job in jobs}
                    self.results[trigger] = {job: future.result() for job, future in futures.items()}
                self._rerun_unsound_controls(trigger)
            return self.results[trigger]

    def _rerun_unsound_controls(self, trigger: str) -> None:
        """Run a control again (twice at most) whose own run broke the plain client's rules.

        The C++ client inside pulsar-client sometimes breaks them for a batch: in one full CI
        run in several it delivered a batch a fourth time with ``max_redeliver_count=2``, or
        sent a batch member's dead letter after a reconnect with its payload garbled
        (``b' >'`` for ``m3``). Such a run is no reference for ours; the plain test still
        fails if no try of the control is sound, and each unsound try is printed.
        """
        results = self.results[trigger]
        for variant in VARIANTS:
            for _attempt in range(2):
                faults = control_faults(trigger, variant, results[(variant, "plain")])
                if not faults:
                    break
                print(f"control {trigger}/{variant_id(variant)} unsound, run again: {faults}")
                results[(variant, "plain")] = run_scenario(self, trigger, variant, "plain")

    def close(self) -> None:
        self.aio.close()
        self.client.close()


@pytest.fixture(scope="module")
def lab(apache_broker: Any) -> Iterator[Lab]:
    lab = Lab(apache_broker)
    yield lab
    lab.close()


def new_topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def produce(lab: Lab, topic: str, partitioned: bool, batched: bool, count: int = N) -> None:
    """*count* messages m0, m1, ...: to each partition in turn; in one batch per partition if *batched*."""
    targets = [f"{topic}-partition-{p}" for p in range(2)] if partitioned else [topic]
    producers = [
        lab.client.create_producer(
            t, batching_enabled=batched, batching_max_messages=max(count, 2), batching_max_publish_delay_ms=500
        )
        for t in targets
    ]
    for i in range(count):
        producers[i % len(producers)].send_async(
            f"m{i}".encode(),
            None,
            properties={"pk-1": "pv-1", "i": str(i)},
            partition_key="p-key",
            ordering_key="o-key",
            event_timestamp=EVENT_TIME + i,
        )
    for producer in producers:
        producer.flush()
        producer.close()


def drain_dead(checker: Any, run: Run) -> None:
    while True:
        try:
            message = checker.receive(10)
        except pulsar.Timeout:
            return
        run.dead.setdefault(message.data(), []).append(dead_letter_record(message))
        checker.acknowledge(message)


def run_scenario(lab: Lab, trigger: str, variant: tuple[bool, bool, str], kind: str) -> Run:
    batched, partitioned, consumer_type = variant
    run = Run()
    topic = new_topic(f"dl-{trigger}-{kind}")
    try:
        if partitioned:
            lab.broker.create_partitioned_topic(topic, 2)
        dlq = f"{topic}-dead"
        checker = lab.client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
        options: dict[str, Any] = {
            "consumer_type": getattr(pulsar.ConsumerType, consumer_type),
            "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(
                max_redeliver_count=MAX_REDELIVER[trigger], dead_letter_topic=dlq
            ),
        }
        if trigger == "ack_timeout":
            options["unacked_messages_timeout_ms"] = ACK_TIMEOUT_MS
        driver = Driver(kind, lab, topic, **options)
        try:
            produce(lab, topic, partitioned, batched)
            _consume(driver, checker, trigger, run)
        finally:
            driver.close()
        wait_for(lambda: lab.admin.backlog(topic, "sub") == 0, 10, 0.1)
        run.backlog = lab.admin.backlog(topic, "sub")
        drain_dead(checker, run)  # one more look: nothing may come twice
        checker.close()
    except Exception as exc:  # reported by the test that reads this run
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def _consume(driver: Driver, checker: Any, trigger: str, run: Run) -> None:
    """Receive and settle per *trigger* until every dead letter arrived and the consumer is quiet."""
    end = time.monotonic() + BUDGET_S[trigger]
    idle_since = time.monotonic()
    outstanding = 0
    while time.monotonic() < end:
        message = driver.receive(100)
        now = time.monotonic()
        if message is None:
            drain_dead(checker, run)
            if len(run.dead) >= N and now - idle_since > QUIET_S:
                return
            if outstanding and now - idle_since > 0.3 and trigger in ("redeliver", "reconnect"):
                driver.redeliver() if trigger == "redeliver" else driver.reconnect()
                outstanding, idle_since = 0, time.monotonic()
            continue
        idle_since = now
        payload = message.data()
        run.deliveries[payload] += 1
        run.received_as[payload] = (message.topic_name(), str(message.message_id()))
        seen = run.deliveries[payload]
        if trigger == "nack" or (trigger == "ack_timeout" and seen == 1) or (trigger == "reconnect" and seen > 1):
            driver.nack(message)
        else:
            outstanding += 1


def comparable(run: Run) -> dict[bytes, dict[str, Any]]:
    """Each message's dead letter without what differs between runs (ids, topic names)."""
    out = {}
    for payload, (letter, *_) in run.dead.items():
        properties = {k: v for k, v in letter["properties"].items() if k not in ("REAL_TOPIC", "ORIGIN_MESSAGE_ID")}
        out[payload] = dict(letter, properties=properties)
    return out


def control_faults(trigger: str, variant: tuple[bool, bool, str], run: Run) -> list[str]:
    """How a plain client's run breaks the rules every run of *trigger* must keep (none: [])."""
    try:
        check_run(trigger, variant, "plain", run)
    except AssertionError as exc:
        return [str(exc).splitlines()[0]]
    return []


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_dead_letters_as_the_plain_client_sends_them(lab: Lab, trigger: str, variant: Any, kind: str) -> None:
    runs = lab.runs(trigger)
    run, control = runs[(variant, kind)], runs[(variant, "plain")]
    check_run(trigger, variant, kind, run)
    assert comparable(run) == comparable(control)


def check_run(trigger: str, variant: tuple[bool, bool, str], kind: str, run: Run) -> None:
    """The rules one run keeps, whichever client made it."""
    assert run.error is None, run.error
    payloads = {f"m{i}".encode() for i in range(N)}
    assert set(run.dead) == payloads, f"dead letters {sorted(run.dead)}; deliveries {dict(run.deliveries)}"
    allowed = helpers.dead_letters_allowed(kind, batched=variant[0])
    assert all(len(letters) <= allowed for letters in run.dead.values()), f"a message was dead-lettered twice: {run.dead}"
    expected = dict.fromkeys(payloads, DELIVERIES[trigger])
    # Fixed: members of a batch were dead-lettered one delivery early (2 of 3) in about one
    # full CI run in two: the broker's count of an entry was above the copies that came. The
    # count is now bounded by the core's own tally of deliveries (unit test:
    # test_nacking.py::test_a_broker_count_that_jumps_by_two_for_one_copy_does_not_dead_letter_early).
    assert dict(run.deliveries) == expected, "deliveries to the application"
    for payload, (letter, *_) in run.dead.items():
        i = int(payload[1:])
        topic, message_id = run.received_as[payload]
        assert letter["partition_key"] == "p-key"
        assert letter["ordering_key"] == "o-key"
        assert letter["properties"] == {"pk-1": "pv-1", "i": str(i), "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": message_id}
        assert letter["event_timestamp"] == 0  # the C++ client does not carry it
    assert run.backlog == 0, "an original stayed unacknowledged"


# ---------------------------------------------------------------- one scenario at a time


def nack_until_quiet(driver: Driver, want: int, quiet_s: float, budget_s: float = 30) -> collections.Counter[bytes]:
    """Nack every delivery until *want* deliveries were seen and nothing came for *quiet_s*."""
    deliveries: collections.Counter[bytes] = collections.Counter()
    end = time.monotonic() + budget_s
    idle_since = time.monotonic()
    while time.monotonic() < end:
        message = driver.receive(100)
        if message is None:
            if sum(deliveries.values()) >= want and time.monotonic() - idle_since > quiet_s:
                break
            continue
        idle_since = time.monotonic()
        deliveries[message.data()] += 1
        driver.nack(message)
    return deliveries


def read_all(lab: Lab, topic: str, subscription: str = "check", wait_ms: int = 1_000) -> list[Any]:
    """Every message of *topic* from the start (a new subscription, or an existing one)."""
    return helpers.read_all(lab.client, topic, subscription, wait_ms)


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_dead_letter_the_broker_refuses_leaves_the_original_unacknowledged(lab: Lab, kind: str, batched: bool) -> None:
    """The dead-letter topic is in a namespace that does not exist yet: its producer is refused.

    Both originals stay unacknowledged and are not delivered again. Once the namespace
    exists, ours store each dead letter once and acknowledge the originals (they keep
    trying, every ``DEAD_LETTER_RETRY_MS``); the plain client does not try again by
    itself (its dead-letter producer's callbacks are dropped when the creation fails).
    Batched, the two are one entry (a backlog of 1): the copy that retries one member's
    dead letter must not be taken for acked because its sibling's nack made the entry's
    knowledge complete (the chaos run's lost members).
    """
    namespace = f"public/dl-{uuid.uuid4().hex[:8]}"
    dlq = f"persistent://{namespace}/dead"
    topic = new_topic(f"refused-{kind}")
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq)
    driver = Driver(kind, lab, topic, consumer_type=pulsar.ConsumerType.Shared, dead_letter_policy=policy)
    try:
        produce(lab, topic, partitioned=False, batched=batched, count=2)
        deliveries = nack_until_quiet(driver, want=4, quiet_s=3)
        assert dict(deliveries) == {b"m0": 2, b"m1": 2}, "a message whose dead letter was refused came back"
        assert lab.admin.backlog(topic, "sub") == (1 if batched else 2), "an original was acknowledged without its dead letter"
        if kind == "plain":
            return
        lab.admin.request("PUT", f"namespaces/{namespace}")
        end = time.monotonic() + 30
        while lab.admin.backlog(topic, "sub") and time.monotonic() < end:
            # The application keeps receiving: the retries are routed as they arrive.
            assert driver.receive(200) is None, "a message came back after its dead letter was refused"
        assert lab.admin.backlog(topic, "sub") == 0, "not acknowledged once stored"
    finally:
        driver.close()
    assert sorted(m.data() for m in read_all(lab, dlq)) == [b"m0", b"m1"]


PLAIN_DLQ_CRASHES = _client_version_tuple() < (3, 10)
"""pulsar-client 3.9.0's own dead-letter path crashes the process (SIGSEGV) about 30 s after a
consumer with a ``dead_letter_policy`` closed while its dead letter's send was failing: the send
timeout's callback calls ``ConsumerImpl::redeliverUnacknowledgedMessages`` on the closed consumer
(gdb on the core of the client matrix's run: ``ProducerImpl::handleSendTimeout`` ->
``ConsumerImpl::processPossibleToDLQ`` lambda -> ``redeliverUnacknowledgedMessages`` lambda).
Only the plain client's arm passes the policy to the client; ours send dead letters themselves."""


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=pytest.mark.skipif(k == "plain" and PLAIN_DLQ_CRASHES, reason="pulsar-client < 3.10 crashes in its own DLQ path (PLAIN_DLQ_CRASHES)")) for k in CLIENTS],
)
def test_a_dead_letter_whose_send_fails_leaves_the_original_unacknowledged(lab: Lab, kind: str) -> None:
    """The dead-letter producer exists (m0 went through), then its topic is terminated: m1's send fails."""
    topic = new_topic(f"terminated-{kind}")
    dlq = f"{topic}-dead"
    checker = lab.client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq)
    driver = Driver(kind, lab, topic, consumer_type=pulsar.ConsumerType.Shared, dead_letter_policy=policy)
    try:
        produce(lab, topic, partitioned=False, batched=False, count=1)
        assert nack_until_quiet(driver, want=2, quiet_s=0.5) == {b"m0": 2}
        assert checker.receive(10_000).data() == b"m0"
        assert wait_for(lambda: lab.admin.backlog(topic, "sub") == 0, 10, 0.1)
        checker.close()
        lab.admin.request("POST", f"persistent/{dlq.split('://', 1)[1]}/terminate")
        producer = lab.client.create_producer(topic)
        producer.send(b"m1")
        producer.close()
        assert nack_until_quiet(driver, want=2, quiet_s=3) == {b"m1": 2}, "m1 came back after its dead letter failed"
        assert lab.admin.backlog(topic, "sub") == 1, "m1 was acknowledged without its dead letter"
    finally:
        driver.close()
    assert [m.data() for m in read_all(lab, dlq, "again")] == [b"m0"]


@pytest.mark.parametrize("kind", CLIENTS)
def test_default_dead_letter_topics_and_initial_subscription(lab: Lab, kind: str) -> None:
    """No ``dead_letter_topic``: one per partition, ``<topic>-partition-N-<subscription>-DLQ``,
    as the C++ client names them; ``initial_subscription_name`` exists on each from its
    first message (created before the producer, from the earliest position)."""
    topic = new_topic(f"default-{kind}")
    lab.broker.create_partitioned_topic(topic, 2)
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, initial_subscription_name="init")
    driver = Driver(kind, lab, topic, consumer_type=pulsar.ConsumerType.Shared, dead_letter_policy=policy)
    try:
        produce(lab, topic, partitioned=True, batched=False, count=4)
        assert nack_until_quiet(driver, want=8, quiet_s=1) == dict.fromkeys([b"m0", b"m1", b"m2", b"m3"], 2)
    finally:
        driver.close()
    for partition, payloads in ((0, [b"m0", b"m2"]), (1, [b"m1", b"m3"])):
        letters = read_all(lab, f"{topic}-partition-{partition}-sub-DLQ", "init")
        assert sorted(m.data() for m in letters) == payloads
        assert {m.properties()["REAL_TOPIC"] for m in letters} == {f"{topic}-partition-{partition}"}


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("consumer_type", ["Failover", "Exclusive"])
def test_failover_and_exclusive_dead_letters(lab: Lab, kind: str, consumer_type: str) -> None:
    """Apache Pulsar counts no redeliveries on Failover and Exclusive subscriptions (every
    ``redelivery_count()`` is 0), so the plain client never dead-letters there. Ours count
    the application's nacks, so a message nacked ``max_redeliver_count + 1`` times goes to
    the dead-letter topic there too. The one documented difference from the plain client."""
    topic = new_topic(f"{consumer_type.lower()}-{kind}")
    dlq = f"{topic}-dead"
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq)
    driver = Driver(kind, lab, topic, consumer_type=getattr(pulsar.ConsumerType, consumer_type), dead_letter_policy=policy)
    try:
        produce(lab, topic, partitioned=False, batched=False, count=1)
        deliveries: collections.Counter[bytes] = collections.Counter()
        end = time.monotonic() + 20
        while time.monotonic() < end and deliveries[b"m0"] < 4:
            message = driver.receive(2_000)
            if message is None:
                break
            deliveries[message.data()] += 1
            driver.nack(message)
    finally:
        driver.close()
    letters = read_all(lab, dlq)
    if kind == "plain":
        assert deliveries[b"m0"] == 4 and letters == []
    else:
        assert deliveries[b"m0"] == 2 and [m.data() for m in letters] == [b"m0"]


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_swallowed_batch_copies_do_not_count(lab: Lab, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch [a, b], ``max_redeliver_count=1``. b is nacked for 3 s, a for the fixed 100 ms:
    a's redelivery brings a copy of b, swallowed (b's nack is pending), and the broker counts
    it. When b's own handoff brings the entry back (count 2), the application has seen b
    once: it gets it a second time (its last), and its nack sends it. a, left unsettled after
    its second delivery, comes with that same entry and goes to the dead-letter topic.

    A Shared subscription (the broker counts there) whose one consumer is told it is the one
    active consumer (``Sharing.ONE_ACTIVE``, as ``subscribe`` says for Exclusive and
    Failover, where the broker counts nothing): with ``Sharing.SHARED`` the entry waits for
    b's time, so a's redelivery never brings a copy of b (docs/consumer.md, "Batches")."""
    monkeypatch.setattr(consumer_settings, "sharing_of", lambda _consumer_type: Sharing.ONE_ACTIVE)
    topic = new_topic(f"copies-{kind}")
    dlq = f"{topic}-dead"
    checker = lab.client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq)
    driver = Driver(kind, lab, topic, consumer_type=pulsar.ConsumerType.Shared, dead_letter_policy=policy)
    run = Run()
    try:
        produce(lab, topic, partitioned=False, batched=True, count=2)
        first = {}
        while len(first) < 2:
            message = driver.receive(10_000)
            assert message is not None
            first[message.data()] = message
            run.deliveries[message.data()] += 1
        driver.nack(first[b"m1"], delay_ms=3_000)
        driver.nack(first[b"m0"])
        end = time.monotonic() + 30
        while len(run.dead) < 2 and time.monotonic() < end:
            message = driver.receive(100)
            if message is None:
                drain_dead(checker, run)
                continue
            run.deliveries[message.data()] += 1
            if message.data() == b"m1":
                driver.nack(message)  # its last delivery: sends it
    finally:
        driver.close()
    assert dict(run.deliveries) == {b"m0": 2, b"m1": 2}, "the swallowed copy of m1 was counted as a delivery"
    assert {p: len(letters) for p, letters in run.dead.items()} == {b"m0": 1, b"m1": 1}
    checker.close()
