"""Dead letters sent when the plain client sends them: at the redelivery, without a further receive (issue 33).

The C++ client's ``DeadLetterQueueTest`` scenarios ``testSendDLQTriggerByRedeliverUnacknowledgedMessages``
and ``testSendDLQTriggerByAckTimeOutAndNeAck`` (pulsar-client-cpp ``tests/DeadLetterQueueTest.cc``),
re-expressed: ``max_redeliver_count=3``, an explicit dead-letter topic, messages with a
partition key, an ordering key and a property; batched or not, on a topic or a
partitioned one (2 partitions), Shared and Key_Shared; on the plain client (the control),
``pulsar_nack.subscribe`` and ``pulsar_nack.asyncio.subscribe``.

* ``redeliver``: receive ``(3 + 1) * N`` messages, settling none, and call
  ``redeliver_unacknowledged_messages()`` after every N;
* ``ack_timeout``: ``unacked_messages_timeout_ms`` 10 s (the Python client's minimum; the C++
  test uses 200 ms) and a 100 ms nack delay; receive ``(3 + 1) * N`` messages and nack about
  half of them (seeded), leaving the rest to the ack timeout.

Then the consumer receives **no more**: every message must reach the dead-letter topic,
once, with its keys and properties, sent at the last redelivery (the C++ client sends it
from the copy it kept at the message's last delivery).
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest
from test_dead_letters import CLIENTS, VARIANTS, Driver, Lab, new_topic, produce, variant_id

from helpers import dead_letters_allowed

pytestmark = pytest.mark.broker

N = 10
MAX_REDELIVER = 3
ACK_TIMEOUT_MS = 10_000
RECEIVE_MS = 30_000
DEAD_WAIT_MS = {"redeliver": 10_000, "ack_timeout": 25_000}
SCENARIOS = ("redeliver", "ack_timeout")


class Outcome:
    """What one run saw: the dead letters (payload -> records), an error, how long receiving took."""

    def __init__(self) -> None:
        self.dead: dict[bytes, list[dict[str, Any]]] = {}
        self.error: str | None = None


def run(lab: Lab, scenario: str, variant: tuple[bool, bool, str], kind: str) -> Outcome:
    batched, partitioned, consumer_type = variant
    outcome = Outcome()
    topic = new_topic(f"dlr-{scenario}-{kind}")
    try:
        if partitioned:
            lab.broker.create_partitioned_topic(topic, 2)
        dlq = f"{topic}-sub-DLQ"
        options: dict[str, Any] = {
            "consumer_type": getattr(pulsar.ConsumerType, consumer_type),
            "dead_letter_policy": pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=MAX_REDELIVER, dead_letter_topic=dlq),
        }
        if scenario == "ack_timeout":
            options["unacked_messages_timeout_ms"] = ACK_TIMEOUT_MS
        driver = Driver(kind, lab, topic, **options)
        try:
            produce(lab, topic, partitioned, batched, count=N)
            consume(driver, scenario, random.Random(zlib.crc32(repr((scenario, variant)).encode())))  # same choices every run
            # No receive from here on: the dead letters must come by themselves.
            read_dead_letters(lab, dlq, DEAD_WAIT_MS[scenario], outcome)
        finally:
            driver.close()
    except Exception as exc:  # reported by the test that reads this run
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def consume(driver: Driver, scenario: str, chooser: random.Random) -> None:
    """The C++ test's loop: ``(max + 1) * N`` receives, a redelivery after every N, or about half nacked."""
    for i in range(1, (MAX_REDELIVER + 1) * N + 1):
        message = driver.receive(RECEIVE_MS)
        if message is None:
            raise AssertionError(f"receive {i} of {(MAX_REDELIVER + 1) * N} timed out")
        if scenario == "redeliver" and i % N == 0:
            driver.redeliver()
        elif scenario == "ack_timeout" and chooser.random() < 0.5:
            driver.nack(message)


def read_dead_letters(lab: Lab, dlq: str, wait_ms: int, outcome: Outcome) -> None:
    """Read the dead-letter topic from the start for up to *wait_ms* (until N arrived), then 500 ms more."""
    checker = lab.client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
    try:
        end = time.monotonic() + wait_ms / 1000
        while time.monotonic() < end and len(outcome.dead) < N:
            try:
                letter = checker.receive(200)
            except pulsar.Timeout:
                continue
            props = letter.properties()
            outcome.dead.setdefault(letter.data(), []).append(
                {"partition_key": letter.partition_key(), "ordering_key": letter.ordering_key(),
                 "pk-1": props.get("pk-1"), "real_topic": props.get("REAL_TOPIC", ""),
                 "origin": props.get("ORIGIN_MESSAGE_ID", "")}
            )
            checker.acknowledge(letter)
        try:  # nothing twice
            letter = checker.receive(500)
            outcome.dead.setdefault(letter.data(), []).append({})
        except pulsar.Timeout:
            pass
    finally:
        checker.close()


class Runs:
    """Every (variant, client) of a scenario, run at once in threads the first time a test asks."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.done: dict[str, dict[tuple[tuple[bool, bool, str], str], Outcome]] = {}
        self.lock = threading.Lock()

    def of(self, scenario: str) -> dict[tuple[tuple[bool, bool, str], str], Outcome]:
        with self.lock:
            if scenario not in self.done:
                jobs = [(variant, kind) for variant in VARIANTS for kind in CLIENTS]
                with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                    futures = {job: pool.submit(run, self.lab, scenario, *job) for job in jobs}
                    self.done[scenario] = {job: future.result() for job, future in futures.items()}
            return self.done[scenario]


@pytest.fixture(scope="module")
def runs(apache_broker: Any) -> Iterator[Runs]:
    lab = Lab(apache_broker)
    yield Runs(lab)
    lab.close()


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dead_letters_at_the_last_redelivery_without_a_further_receive(runs, scenario, variant, kind):
    outcome = runs.of(scenario)[(variant, kind)]
    assert outcome.error is None, outcome.error
    assert sorted(outcome.dead) == sorted(f"m{i}".encode() for i in range(N)), (
        f"dead letters of {sorted(outcome.dead)} only, {DEAD_WAIT_MS[scenario]} ms after the last receive"
    )
    for payload, letters in outcome.dead.items():
        assert len(letters) <= dead_letters_allowed(kind, batched=variant[0]), f"{payload!r} dead-lettered {len(letters)} times"
        letter = letters[0]  # the first (a plain client's second copy may lack keys and properties)
        assert (letter["partition_key"], letter["ordering_key"], letter["pk-1"]) == ("p-key", "o-key", "pv-1")
        assert letter["real_topic"] and letter["origin"]
