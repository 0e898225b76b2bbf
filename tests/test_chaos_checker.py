"""The chaos checker on synthetic histories: each promise, a history that keeps it and one that breaks it.

No broker: the histories are written by hand, record by record, as the chaos workers write
them (pulsar_nack/testing/chaos/history.py). Each breaking history must be caught with the
promise it breaks, and each documented cause must be attributed instead of reported.
"""

from __future__ import annotations

import itertools
from typing import Any

from pulsar_nack.testing.chaos.checker import DOUBLE_DISPATCH_S, Cause, Promise, check
from pulsar_nack.testing.chaos.fate import Mechanism, fate_of
from pulsar_nack.testing.chaos.history import Ev, HistoryWriter, read_history
from pulsar_nack.testing.chaos.workload import WorkloadSpec, default_workload

SEED = 5
NACK_SUB = "nack-shared"  # Shared, nacks only, max_redeliver_count 3
RETRY_SUB = "retry-keyshared"


def _spec() -> WorkloadSpec:
    return default_workload("pulsar://127.0.0.1:1", SEED, "/nonexistent", "test")


def _id_with(mechanism: Mechanism) -> str:
    """An id of the retry subscription whose fate uses *mechanism*."""
    spec = _spec()
    mechanisms = spec.subscription(RETRY_SUB).mechanisms
    return next(f"e.{i}" for i in itertools.count() if fate_of(SEED, f"e.{i}", mechanisms).mechanism is mechanism)


class History:
    """Records as the workers write them, at given times."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add(self, ev: Ev, t: float, proc: str = "nack-blocking", pid: int = 100, **fields: Any) -> History:
        self.records.append({"ev": ev.value, "t": t, "proc": proc, "pid": pid, **fields})
        return self

    def produce(self, t: float, message_id: str, topic: str = "orders", mid: str = "(1,1,0,-1)") -> History:
        return self.add(Ev.PRODUCE, t, "orders-single", 1, id=message_id, topic=topic, mid=mid, batched=False)

    def deliver(self, t: float, message_id: str, *, rc: int = 0, sub: str = NACK_SUB, proc: str = "nack-blocking",
                pid: int = 100, mid: str = "(1,1,0,-1)", copy: str | None = None, gen: int = 1) -> History:  # fmt: skip
        return self.add(Ev.DELIVER, t, proc, pid, id=message_id, sub=sub, gen=gen, rc=rc, mid=mid, copy=copy)

    def ack(self, t: float, message_id: str, *, sub: str = NACK_SUB, proc: str = "nack-blocking", pid: int = 100,
            rc: int = 0, gen: int = 1) -> History:  # fmt: skip
        return self.add(Ev.ACK, t, proc, pid, id=message_id, sub=sub, gen=gen, rc=rc)

    def nack(self, t: float, message_id: str, delay_ms: int, *, floor_ms: int = 0, sub: str = NACK_SUB,
             proc: str = "nack-blocking", pid: int = 100, rc: int = 0, gen: int = 1) -> History:  # fmt: skip
        return self.add(Ev.NACK, t, proc, pid, id=message_id, sub=sub, gen=gen, rc=rc, delay_ms=delay_ms, floor_ms=floor_ms)

    def reconsume(self, t: float, message_id: str, delay_ms: int, token: str, *, rc: int = 0,
                  proc: str = "retry-blocking", pid: int = 200) -> History:  # fmt: skip
        return self.add(Ev.RECONSUME, t, proc, pid, id=message_id, sub=RETRY_SUB, gen=1, rc=rc, delay_ms=delay_ms,
                        token=token)  # fmt: skip

    def dead_letter(self, t: float, message_id: str, sub: str = NACK_SUB, dlq_mid: str = "(9,1,-1,-1)") -> History:
        return self.add(Ev.DEAD_LETTER, t + 0.01, "dead-letters", 300, id=message_id, sub=sub, dlq_mid=dlq_mid,
                        published=t)  # fmt: skip

    def fault(self, t: float, kind: str, target: str, duration_s: float = 0.1) -> History:
        self.add(Ev.FAULT, t, "run", 1, kind=kind, target=target, phase="begin")
        return self.add(Ev.FAULT, t + duration_s, "run", 1, kind=kind, target=target, phase="end")

    def start(self, t: float, proc: str, pid: int) -> History:
        return self.add(Ev.START, t, proc, pid, role="consumer")

    def check(self) -> Any:
        return check(sorted(self.records, key=lambda r: r["t"]), _spec())


def _promises(report: Any) -> list[Promise]:
    return [f.promise for f in report.findings]


def test_a_clean_history_keeps_every_promise() -> None:
    report = (History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 500).deliver(1.6, "m1", rc=1).ack(1.6, "m1", rc=1)
              .check())  # fmt: skip
    assert report.findings == []
    assert report.summary()["totals"]["produced"] == 1
    assert not report.duplicates


def test_a_message_never_settled_is_lost() -> None:
    report = History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 500).check()
    assert _promises(report) == [Promise.LOST]
    assert "m1" in report.lines()[0]


def test_a_delivery_after_an_ack_by_the_same_consumer_is_caught() -> None:
    report = History().produce(0, "m1").deliver(1, "m1").ack(1, "m1").deliver(2, "m1").check()
    assert _promises(report) == [Promise.AFTER_ACK]
    assert "no fault before it" in report.lines()[0]


def test_an_ack_lost_with_a_broker_kill_reaching_another_consumer_is_a_duplicate() -> None:
    history = (History().produce(0, "m1").deliver(1, "m1").ack(1, "m1").fault(5, "broker-kill", "broker-0", 8)
               .deliver(15, "m1", proc="nack-asyncio", pid=101))  # fmt: skip
    report = history.check()
    assert report.findings == []
    assert report.duplicates == {Cause.ACK_LOST_BROKER_KILL.value: 1}
    # the same copy to the consumer that acked it is not excused: it knows its own acks
    same = (History().produce(0, "m1").deliver(1, "m1").ack(1, "m1").fault(5, "broker-kill", "broker-0", 8)
            .deliver(15, "m1").check())  # fmt: skip
    assert _promises(same) == [Promise.AFTER_ACK]
    assert "broker-kill broker-0" in same.lines()[0]


def test_an_ack_lost_with_a_killed_consumer_reaches_the_next_incarnation() -> None:
    history = (History().start(0, "nack-blocking", 100).produce(0, "m1").deliver(1, "m1").ack(1, "m1")
               .fault(1.05, "consumer-kill", "nack-blocking", 1).start(3, "nack-blocking", 102)
               .deliver(4, "m1", pid=102))  # fmt: skip
    report = history.check()
    assert report.findings == []
    assert report.duplicates == {Cause.ACK_LOST_CONSUMER_KILL.value: 1}


def test_a_nacked_message_delivered_before_its_due_time_is_early() -> None:
    report = History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 1000).deliver(1.5, "m1", rc=1).ack(1.5, "m1").check()
    assert _promises(report) == [Promise.EARLY]
    assert "500 ms before due" in report.lines()[0]


def test_the_bucket_floor_is_allowed_and_nothing_more() -> None:
    on_time = History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 1000, floor_ms=255)
    assert on_time.deliver(1.75, "m1", rc=1).ack(1.75, "m1").check().findings == []
    early = History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 1000, floor_ms=255)
    assert _promises(early.deliver(1.73, "m1", rc=1).ack(1.73, "m1").check()) == [Promise.EARLY]


def test_an_early_nack_after_its_consumer_was_killed_is_documented() -> None:
    history = (History().start(0, "nack-blocking", 100).produce(0, "m1").deliver(1, "m1").nack(1, "m1", 5000)
               .fault(2, "consumer-kill", "nack-blocking", 1).deliver(2.5, "m1", rc=1, proc="nack-asyncio", pid=101)
               .ack(2.5, "m1", proc="nack-asyncio", pid=101))  # fmt: skip
    report = history.check()
    assert report.findings == []
    assert report.early_documented == {Cause.SCHEDULE_LOST.value: 1}


def test_an_early_nack_at_another_consumer_after_an_unload_is_documented_but_not_at_the_same() -> None:
    other = (History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 5000).fault(2, "topic-unload", "orders")
             .deliver(2.5, "m1", rc=1, proc="nack-asyncio", pid=101).ack(2.5, "m1", proc="nack-asyncio", pid=101))  # fmt: skip
    report = other.check()
    assert report.findings == []
    assert report.early_documented == {Cause.OTHER_CONSUMER_AFTER_RECONNECT.value: 1}
    same = (History().produce(0, "m1").deliver(1, "m1").nack(1, "m1", 5000).fault(2, "topic-unload", "orders")
            .deliver(2.5, "m1", rc=1).ack(2.5, "m1").check())  # fmt: skip
    assert _promises(same) == [Promise.EARLY]
    assert "topic-unload orders" in same.lines()[0]


def test_a_reconsumed_copy_is_never_early_whatever_the_fault() -> None:
    message = _id_with(Mechanism.RECONSUME)
    history = (History().start(0, "retry-blocking", 200).produce(0, message, topic="events")
               .deliver(1, message, sub=RETRY_SUB, proc="retry-blocking", pid=200).reconsume(1, message, 3000, "tok")
               .fault(1.5, "consumer-kill", "retry-blocking", 1)
               .deliver(2, message, sub=RETRY_SUB, rc=1, copy="tok", proc="retry-asyncio", pid=201)
               .ack(2, message, sub=RETRY_SUB, rc=1, proc="retry-asyncio", pid=201))  # fmt: skip
    assert _promises(history.check()) == [Promise.EARLY]
    on_time = (History().produce(0, message, topic="events").deliver(1, message, sub=RETRY_SUB, proc="retry-blocking", pid=200)
               .reconsume(1, message, 3000, "tok").deliver(4.01, message, sub=RETRY_SUB, rc=1, copy="tok", proc="retry-asyncio",
                                                          pid=201)
               .ack(4.01, message, sub=RETRY_SUB, rc=1, proc="retry-asyncio", pid=201))  # fmt: skip
    assert on_time.check().findings == []


def _poison(history: History, deliveries: int, message: str = "m1") -> History:
    history.produce(0, message)
    for n in range(deliveries):
        history.deliver(1 + n, message, rc=n).nack(1 + n, message, 100, rc=n)
    return history.dead_letter(deliveries + 0.5, message)


def test_a_dead_letter_exactly_at_the_count_and_before_it() -> None:
    exact = _poison(History(), 4).check()
    assert exact.findings == []
    assert exact.dead_letters == {"at the count": 1}
    early = _poison(History(), 3).check()
    assert _promises(early) == [Promise.DEAD_LETTER_EARLY]
    assert "after 3 deliveries" in early.lines()[0]


def test_a_dead_letter_past_the_count_needs_a_count_reset() -> None:
    late = _poison(History(), 5).check()
    assert _promises(late) == [Promise.PAST_COUNT]
    reset = _poison(History().fault(2.5, "topic-unload", "orders"), 5).check()
    assert reset.findings == []
    assert reset.dead_letters == {f"past the count: {Cause.COUNT_RESET.value}": 1}


A, B = ("nack-blocking", 100), ("nack-asyncio", 101)


def _sibling_reset(receivers: list[tuple[str, int]], counts: list[int], sibling_acked: float | None) -> History:
    """m1 (batch index 0 of entry 1:1) delivered to *receivers* with redelivery *counts*, one second apart, nacked
    each time, then dead-lettered; its sibling m2 delivered to B at 1.9 and acked at *sibling_acked* (None: delivered
    to A and acked after the dead letter)."""
    history = History().produce(0, "m1", mid="(1,1,0,0)").produce(0, "m2", mid="(1,1,0,1)")
    for n, ((proc, pid), rc) in enumerate(zip(receivers, counts, strict=True)):
        history.deliver(1 + n, "m1", rc=rc, proc=proc, pid=pid, mid="(1,1,0,0)").nack(1 + n, "m1", 100, rc=rc, proc=proc, pid=pid)
    if sibling_acked is None:
        history.deliver(10, "m2", mid="(1,1,0,1)").ack(10, "m2")
    else:
        history.deliver(1.9, "m2", proc=B[0], pid=B[1], mid="(1,1,0,1)").ack(sibling_acked, "m2", proc=B[0], pid=B[1])
    return history.dead_letter(len(counts) + 0.5, "m1")


SIBLING_RESET = f"past the count: {Cause.SIBLING_ACK_RESET.value}"


def test_a_dead_letter_past_the_count_after_a_sibling_ack_needs_the_reset_in_the_history() -> None:
    """Five deliveries for ``max_redeliver_count`` 3: attributed to the broker's reset by a sibling's ack only when
    the message went to two consumers, its count did not rise across a redelivery, and a sibling of its entry was
    acked in between (or up to GROUPED_ACK_S before the earlier delivery); anything else stays a violation."""
    shared = [A, B, A, B, A]
    reset = _sibling_reset(shared, [0, 1, 1, 2, 3], sibling_acked=2.5).check()
    assert reset.findings == []
    assert reset.dead_letters == {SIBLING_RESET: 1}
    fell = _sibling_reset(shared, [0, 1, 2, 1, 2], sibling_acked=3.5).check()  # count fell: 2 then 1
    assert fell.findings == [] and fell.dead_letters == {SIBLING_RESET: 1}
    same_copy = _sibling_reset(shared, [0, 1, 1, 2, 3], sibling_acked=1.9).check()  # acked with the copy it came in
    assert same_copy.findings == [] and same_copy.dead_letters == {SIBLING_RESET: 1}
    cases = {
        "one consumer": _sibling_reset([A] * 5, [0, 1, 1, 2, 3], sibling_acked=2.5),
        "no sibling acked between": _sibling_reset(shared, [0, 1, 1, 2, 3], sibling_acked=None),
        "acked after the later delivery": _sibling_reset(shared, [0, 1, 2, 2, 3], sibling_acked=4.5),
        "count always rose": _sibling_reset(shared, [0, 1, 2, 3, 4], sibling_acked=2.5),
    }
    for case, history in cases.items():
        report = history.check()
        assert _promises(report) == [Promise.PAST_COUNT], case
        assert report.dead_letters == {"past the count, unexplained": 1}, case


def test_a_consumer_that_received_it_leaving_is_a_count_reset_and_one_that_stays_is_not() -> None:
    """A resubscribe's record ends just before the consumer closes; its close, between the first delivery and the
    dead letter, is a count reset; the same deliveries with no close are a violation."""
    history = History().start(0, "nack-blocking", 100).fault(0.9, "resubscribe", "nack-blocking", 0.001)
    left = _poison(history.add(Ev.CLOSE, 1.01, "nack-blocking", 100, gen=1), 5).check()
    assert left.findings == []
    assert left.dead_letters == {f"past the count: {Cause.COUNT_RESET.value}": 1}
    stayed = _poison(History().start(0, "nack-blocking", 100).fault(0.9, "resubscribe", "nack-blocking", 0.001), 5)
    assert _promises(stayed.check()) == [Promise.PAST_COUNT]


def _after_a_silence(filled: bool) -> History:
    """Every process silent from 1 to 12 (unless *filled*: a message produced and acked at 6); then m1, nacked for
    3 s by A at 12, redelivered to B 30 ms later (a copy of a pending nack after a reconnect)."""
    history = History().produce(0, "m0").deliver(0.5, "m0").ack(1, "m0")
    if filled:
        history.produce(6, "m6").deliver(6, "m6").ack(6, "m6")
    history.produce(11.9, "m1").deliver(12, "m1", proc=A[0], pid=A[1]).nack(12, "m1", 3_000, proc=A[0], pid=A[1])
    history.deliver(12.03, "m1", rc=1, proc=B[0], pid=B[1]).ack(12.03, "m1", rc=1, proc=B[0], pid=B[1])
    return history.produce(20, "m2")


def test_a_stall_of_every_process_is_a_fault_that_drops_connections() -> None:
    """11 s without a record from any process while the producers produce is a stall (the brokers' sessions and
    connections expire): a pending nack's copy at another consumer just after it is documented, as after a frozen
    broker. With a record in between, no stall: the same copy is early."""
    stalled = _after_a_silence(filled=False)
    stalled.deliver(20, "m2").ack(20, "m2")
    report = stalled.check()
    assert report.findings == []
    assert report.summary()["totals"]["faults"] == {"stall": 1}
    assert report.early_documented == {Cause.OTHER_CONSUMER_AFTER_RECONNECT.value: 1}
    filled = _after_a_silence(filled=True)
    filled.deliver(20, "m2").ack(20, "m2")
    report = filled.check()
    assert _promises(report) == [Promise.EARLY]
    assert report.summary()["totals"]["faults"] == {}


def test_one_dispatch_at_both_consumers_is_attributed_only_with_the_same_count_within_the_window() -> None:
    """The broker sent one redelivery to both consumers (the same stored message and count, within
    DOUBLE_DISPATCH_S): after the other's ack, it is a duplicate with that cause, and the answer to the other's nack
    it seems to be is not early; a copy with another count, or later, is still a violation."""

    def after_ack(t: float, rc: int) -> Any:
        history = History().produce(0, "m1").deliver(1, "m1", rc=2, proc=A[0], pid=A[1]).ack(1.001, "m1", rc=2, proc=A[0], pid=A[1])
        return history.deliver(t, "m1", rc=rc, proc=B[0], pid=B[1]).check()

    twin = after_ack(1.004, 2)
    assert twin.findings == [] and twin.duplicates == {Cause.DOUBLE_DISPATCH.value: 1}
    assert after_ack(1 + DOUBLE_DISPATCH_S * 0.9, 2).findings == []  # a busy machine's wait in the receive queue
    assert _promises(after_ack(1 + DOUBLE_DISPATCH_S + 0.2, 2)) == [Promise.AFTER_ACK]
    reconnected = (History().produce(0, "m1").deliver(0.1, "m1", proc=A[0], pid=A[1]).nack(0.1, "m1", 800, proc=A[0], pid=A[1])
                   .fault(0.15, "bundle-unload", "0x9_0xa", 0.01).deliver(0.2, "m1", proc=B[0], pid=B[1])
                   .ack(0.2, "m1", proc=B[0], pid=B[1]).check())  # fmt: skip
    assert reconnected.duplicates == {Cause.OTHER_CONSUMER_AFTER_RECONNECT.value: 1}  # a reconnect between: its own cause
    assert _promises(after_ack(1.004, 3)) == [Promise.AFTER_ACK]

    def nacked(rc: int) -> Any:
        history = (History().produce(0, "m1").deliver(0.5, "m1", proc=A[0], pid=A[1]).nack(0.5, "m1", 100, proc=A[0], pid=A[1])
                   .deliver(1, "m1", rc=1, proc=A[0], pid=A[1]).nack(1, "m1", 1_600, rc=1, proc=A[0], pid=A[1]))  # fmt: skip
        return history.deliver(1.007, "m1", rc=rc, proc=B[0], pid=B[1]).ack(1.007, "m1", rc=rc, proc=B[0], pid=B[1]).check()

    early_twin = nacked(1)
    assert early_twin.findings == [] and early_twin.duplicates == {Cause.DOUBLE_DISPATCH.value: 1}
    assert _promises(nacked(2)) == [Promise.EARLY]


def test_the_second_copy_of_one_dispatch_answers_no_nack_so_each_consumers_next_copy_answers_its_own() -> None:
    """The chaos run's unbatched "early" (bench/results/chaos.json at 1cbcf54): one redelivery (rc 1) reached both
    consumers, each nacked its copy, and the next copy (rc 2, at A) answers A's nack, due on time; the twin at B
    must not take A's nack from the queue, or A's copy is measured against B's later nack and looks early."""
    history = (History().produce(0, "m1")
               .deliver(0.1, "m1", proc=A[0], pid=A[1]).nack(0.1, "m1", 200, floor_ms=255, proc=A[0], pid=A[1])
               .deliver(0.3, "m1", rc=1, proc=A[0], pid=A[1]).nack(0.3, "m1", 400, floor_ms=255, rc=1, proc=A[0], pid=A[1])
               .deliver(0.3005, "m1", rc=1, proc=B[0], pid=B[1]).nack(0.3006, "m1", 400, rc=1, proc=B[0], pid=B[1])
               .deliver(0.555, "m1", rc=2, proc=A[0], pid=A[1]).ack(0.556, "m1", rc=2, proc=A[0], pid=A[1]))  # fmt: skip
    report = history.check()
    assert report.findings == [] and report.duplicates == {Cause.DOUBLE_DISPATCH.value: 1}


def test_a_reconnects_copy_at_another_consumer_answers_no_nack_and_its_retries_are_duplicates() -> None:
    """The chaos run's "delivered after an ack" (bench/results/chaos.json at 1cbcf54): A nacked m1; a bundle unload
    made the broker send the unacked m1 to B too (rc 0, not a redelivery a nack asked for), and B nacked it. A's
    answer (rc 1) is acked; B's answer (rc 2) comes just after: the retry of a duplicate, not a violation. The
    same history without the unload (no reconnect between, B's copy later than a double dispatch) still breaks
    the promise."""
    b_copy = 0.0005 + DOUBLE_DISPATCH_S + 0.2

    def run(unload: bool) -> Any:
        history = History().produce(0, "m1")
        if unload:
            history.fault(b_copy - 0.14, "bundle-unload", "0x9_0xa")
        history = (history.deliver(0.0005, "m1", proc=A[0], pid=A[1]).nack(0.0006, "m1", 800, proc=A[0], pid=A[1])
                   .deliver(b_copy, "m1", proc=B[0], pid=B[1]).nack(b_copy, "m1", 200, floor_ms=255, proc=B[0], pid=B[1])
                   .deliver(b_copy + 0.16, "m1", rc=1, proc=A[0], pid=A[1]).ack(b_copy + 0.16, "m1", rc=1, proc=A[0], pid=A[1])
                   .deliver(b_copy + 0.161, "m1", rc=2, proc=B[0], pid=B[1]).ack(b_copy + 0.161, "m1", rc=2, proc=B[0], pid=B[1]))  # fmt: skip
        return history.check()

    report = run(unload=True)
    assert report.findings == [], report.lines()
    assert report.duplicates == {Cause.OTHER_CONSUMER_AFTER_RECONNECT.value: 1,
                                 f"retry of a duplicate ({Cause.OTHER_CONSUMER_AFTER_RECONNECT.value})": 1}  # fmt: skip
    assert Promise.AFTER_ACK in _promises(run(unload=False))


def test_a_dead_letter_past_the_count_by_one_dispatch_at_both_consumers() -> None:
    """Counts 0-3 at A, and 3 again at B 5 ms after A's: five deliveries for max_redeliver_count 3, one the broker
    sent twice; B's copy past DOUBLE_DISPATCH_S later is a violation."""

    def poisoned(t: float) -> Any:
        history = History().produce(0, "m1")
        for n in range(4):
            history.deliver(1 + n, "m1", rc=n, proc=A[0], pid=A[1]).nack(1 + n, "m1", 100, rc=n, proc=A[0], pid=A[1])
        history.deliver(t, "m1", rc=3, proc=B[0], pid=B[1]).nack(t, "m1", 100, rc=3, proc=B[0], pid=B[1])
        return history.dead_letter(6, "m1").check()

    twin = poisoned(4.005)
    assert twin.findings == []
    assert twin.dead_letters == {f"past the count: {Cause.DOUBLE_DISPATCH.value}": 1}
    assert Promise.PAST_COUNT in _promises(poisoned(4 + DOUBLE_DISPATCH_S + 0.5))


def test_a_reconsumed_message_is_dead_lettered_only_from_the_last_reconsume() -> None:
    message = _id_with(Mechanism.RECONSUME)
    history = History().produce(0, message, topic="events")
    for n in range(3):
        history.deliver(1 + n * 10, message, sub=RETRY_SUB, rc=n, copy=f"t{n}" if n else None, proc="retry-blocking", pid=200)
        history.reconsume(1 + n * 10, message, 200, f"t{n + 1}", rc=n)
    early = History()
    early.records = list(history.records)
    assert _promises(early.dead_letter(25, message, sub=RETRY_SUB).check()) == [Promise.DEAD_LETTER_EARLY]
    history.deliver(31, message, sub=RETRY_SUB, rc=3, copy="t3", proc="retry-blocking", pid=200)
    history.reconsume(31, message, 200, "t4", rc=3)
    exact = history.dead_letter(31.1, message, sub=RETRY_SUB).check()
    assert exact.findings == []
    assert exact.dead_letters == {"at the count": 1}


def test_a_copy_past_the_dead_letter_count_is_caught() -> None:
    message = _id_with(Mechanism.RECONSUME)
    history = History().produce(0, message, topic="events")
    for n in range(5):
        history.deliver(1 + n * 10, message, sub=RETRY_SUB, rc=n, copy=f"t{n}" if n else None, proc="retry-blocking", pid=200)
        history.reconsume(1 + n * 10, message, 200, f"t{n + 1}", rc=n)
    history.deliver(60, message, sub=RETRY_SUB, rc=5, copy="t5", proc="retry-blocking", pid=200)
    history.ack(60, message, sub=RETRY_SUB, rc=5, proc="retry-blocking", pid=200)
    assert Promise.PAST_COUNT in _promises(history.check())


def test_a_duplicate_without_a_cause_is_caught_and_one_in_flight_at_a_kill_is_not() -> None:
    report = History().produce(0, "m1").deliver(1, "m1").deliver(2, "m1", proc="nack-asyncio", pid=101).ack(2, "m1").check()
    assert _promises(report) == [Promise.UNEXPLAINED_DUPLICATE]
    killed = (History().start(0, "nack-blocking", 100).produce(0, "m1").deliver(1, "m1")
              .fault(1.5, "consumer-kill", "nack-blocking", 1).deliver(2, "m1", proc="nack-asyncio", pid=101)
              .ack(2, "m1", proc="nack-asyncio", pid=101).check())  # fmt: skip
    assert killed.findings == []
    assert killed.duplicates == {Cause.IN_FLIGHT.value: 1}


def test_a_message_stored_twice_by_the_producer_is_attributed() -> None:
    history = (History().produce(0, "m1", mid="(1,1,0,-1)").deliver(1, "m1", mid="(1,1,0,-1)").ack(1, "m1")
               .deliver(2, "m1", mid="(1,7,0,-1)", proc="nack-asyncio", pid=101).ack(2, "m1", proc="nack-asyncio", pid=101))
    report = history.check()
    assert report.findings == []
    assert report.duplicates == {Cause.STORED_TWICE.value: 1}


def test_a_failed_settlement_is_not_an_ack() -> None:
    history = History().produce(0, "m1").deliver(1, "m1").ack(1, "m1")
    history.add(Ev.ERROR, 1.01, "nack-blocking", 100, op="settle", id="m1", sub=NACK_SUB, gen=1, error="Timeout")
    report = history.check()
    assert _promises(report) == [Promise.LOST]


def test_the_history_files_survive_a_cut_line(tmp_path: Any) -> None:
    writer = HistoryWriter(tmp_path, "w")
    writer.write(Ev.START, role="consumer")
    writer.write(Ev.ACK, id="m1", sub=NACK_SUB)
    writer.close()
    with open(writer.path, "a", encoding="utf-8") as f:
        f.write('{"ev":"ack","t":')  # a SIGKILL in the middle of a line
    records = read_history(tmp_path)
    assert [r["ev"] for r in records] == ["start", "ack"]


def test_a_message_left_unacknowledged_in_the_subscription_is_caught() -> None:
    """An ack the application made that never reached the broker: the history says acked, the broker holds it."""
    history = History().produce(0, "m1").deliver(1, "m1").ack(1, "m1")
    assert history.check().findings == []
    history.add(Ev.LEFTOVER, 9, "run", 1, id="m1", sub=NACK_SUB, mid="(1,1,0,-1)", rc=0, topic="orders")
    report = history.check()
    assert _promises(report) == [Promise.LEFT_UNACKED]
    assert "m1" in report.lines()[0]


def test_the_retries_of_a_duplicate_are_duplicates_with_its_cause() -> None:
    """A copy redelivered after an ack lost with a broker kill, nacked by the consumer that got it: its retry
    is a duplicate with the same cause, not a delivery after an ack."""
    history = (History().produce(0, "m1").deliver(1, "m1").ack(1, "m1").fault(5, "broker-kill", "broker-0", 8)
               .deliver(15, "m1", proc="nack-asyncio", pid=101).nack(15, "m1", 500, proc="nack-asyncio", pid=101)
               .deliver(15.6, "m1", rc=1).ack(15.6, "m1", rc=1))  # fmt: skip
    report = history.check()
    assert report.findings == []
    assert report.duplicates == {Cause.ACK_LOST_BROKER_KILL.value: 1,
                                 f"retry of a duplicate ({Cause.ACK_LOST_BROKER_KILL.value})": 1}  # fmt: skip


def test_a_batched_copy_at_another_consumer_just_after_an_ack_is_the_entry_limit() -> None:
    """A batch entry redelivered to another consumer within the grouped-ack window: the documented limit;
    a second later it is a delivery after an ack."""
    soon = (History().produce(0, "m1", mid="(1,1,0,3)").deliver(1, "m1", mid="(1,1,0,3)").ack(1, "m1")
            .deliver(1.05, "m1", mid="(1,1,0,3)", proc="nack-asyncio", pid=101).check())  # fmt: skip
    assert soon.findings == []
    assert soon.duplicates == {Cause.ENTRY_TO_OTHER_CONSUMER.value: 1}
    late = (History().produce(0, "m1", mid="(1,1,0,3)").deliver(1, "m1", mid="(1,1,0,3)").ack(1, "m1")
            .deliver(3, "m1", mid="(1,1,0,3)", proc="nack-asyncio", pid=101).check())  # fmt: skip
    assert _promises(late) == [Promise.AFTER_ACK]


def test_a_retry_copy_stored_twice_is_attributed() -> None:
    message = _id_with(Mechanism.RECONSUME)
    history = (History().produce(0, message, topic="events").deliver(1, message, sub=RETRY_SUB, proc="retry-blocking", pid=200)
               .reconsume(1, message, 200, "tok")
               .deliver(1.3, message, sub=RETRY_SUB, rc=1, copy="tok", mid="(5,1,-1,-1)", proc="retry-blocking", pid=200)
               .ack(1.3, message, sub=RETRY_SUB, rc=1, proc="retry-blocking", pid=200)
               .deliver(4, message, sub=RETRY_SUB, rc=1, copy="tok", mid="(6,1,-1,-1)", proc="retry-blocking", pid=200))  # fmt: skip
    report = history.check()
    assert report.findings == []
    assert report.duplicates == {Cause.STORED_TWICE.value: 1}


def test_a_retry_chain_forked_by_a_duplicate_may_deliver_after_the_other_chain_settled() -> None:
    """One retry copy dispatched to both consumers (a documented duplicate) starts two chains of retries; the
    duplicate's chain reaches the dead-letter count first, and the original chain's copy, reconsumed before that,
    arrives just after: a retry of the duplicate. Without the fork, a copy after the dead letter is a violation."""
    message = _id_with(Mechanism.RECONSUME)
    other = ("retry-asyncio", 201)

    def chains(forked: bool) -> Any:
        history = History().produce(0, message, topic="events")
        history.deliver(1, message, sub=RETRY_SUB, rc=0, proc="retry-blocking", pid=200)
        history.reconsume(1, message, 200, "t1", rc=0)
        history.deliver(2, message, sub=RETRY_SUB, rc=1, copy="t1", mid="(2,1,-1,-1)", proc="retry-blocking", pid=200)
        history.reconsume(2, message, 200, "t2", rc=1)
        history.deliver(3, message, sub=RETRY_SUB, rc=2, copy="t2", mid="(2,2,-1,-1)", proc="retry-blocking", pid=200)
        history.reconsume(3, message, 200, "t3", rc=2)
        if forked:  # the same copy at the other consumer 1 ms later (one dispatch, two consumers)
            history.deliver(3.001, message, sub=RETRY_SUB, rc=2, copy="t2", mid="(2,2,-1,-1)", proc=other[0], pid=other[1])
            history.reconsume(3.001, message, 200, "u3", rc=2, proc=other[0], pid=other[1])
            history.deliver(4, message, sub=RETRY_SUB, rc=3, copy="u3", mid="(2,3,-1,-1)", proc="retry-blocking", pid=200)
            history.reconsume(4, message, 200, "u4", rc=3)
            history.dead_letter(4, message, sub=RETRY_SUB)
        else:  # one chain, dead-lettered; then a copy of it again
            history.deliver(4, message, sub=RETRY_SUB, rc=3, copy="t3", mid="(2,4,-1,-1)", proc="retry-blocking", pid=200)
            history.reconsume(4, message, 200, "t4", rc=3)
            history.dead_letter(4, message, sub=RETRY_SUB)
        return history.deliver(4.003, message, sub=RETRY_SUB, rc=3, copy="t3", mid="(2,4,-1,-1)",
                               proc="retry-blocking", pid=200).check()  # fmt: skip

    forked = chains(True)
    assert Promise.AFTER_ACK not in _promises(forked), forked.findings
    assert forked.duplicates[f"retry of a duplicate ({Cause.DOUBLE_DISPATCH.value})"] >= 1
    assert Promise.AFTER_ACK in _promises(chains(False))


def test_one_retry_copy_twice_at_one_consumer_is_attributed_only_with_another_consumers_close_near() -> None:
    """The record of the clean-clone CI run that failed (bench/results/chaos-ci-findings.json, "ci-k"): one retry
    copy delivered twice to the consumer that holds copies, 32 ms apart, 154 ms after the nemesis resubscribed the
    subscription's other consumer. The broker replays a redelivery twice when it races a consumer's close (the
    plain client's too: tests/test_chaos_findings.py); so with a close of another consumer of the subscription
    within DOUBLE_DISPATCH_S before the first copy it is a duplicate with that cause, and the second chain's
    retries are its retries. Without the close, with a close of another subscription's consumer, or with the close
    further back, it is a violation."""
    message = _id_with(Mechanism.RECONSUME)
    holder = ("retry-asyncio", 201)

    def twice(close: tuple[float, str] | None) -> Any:
        history = History().produce(0, message, topic="events")
        history.deliver(1, message, sub=RETRY_SUB, rc=0, proc="retry-blocking", pid=200)
        history.reconsume(1, message, 200, "t1", rc=0)
        history.deliver(1.2, message, sub=RETRY_SUB, rc=1, copy="t1", mid="(2,1,-1,-1)", proc=holder[0], pid=holder[1])
        history.reconsume(1.2, message, 200, "t2", rc=1, proc=holder[0], pid=holder[1])
        if close is not None:
            history.fault(close[0], "resubscribe", close[1], 0.0001)
        for t, token in ((1.45, "t3"), (1.482, "u3")):  # the same copy (one mid, one count) twice
            history.deliver(t, message, sub=RETRY_SUB, rc=2, copy="t2", mid="(2,2,-1,0)", proc=holder[0], pid=holder[1])
            history.reconsume(t, message, 1_200, token, rc=2, proc=holder[0], pid=holder[1])
        history.deliver(2.7, message, sub=RETRY_SUB, rc=3, copy="t3", mid="(2,3,-1,0)", proc=holder[0], pid=holder[1])
        history.reconsume(2.7, message, 1_200, "t4", rc=3, proc=holder[0], pid=holder[1])
        history.dead_letter(2.7, message, sub=RETRY_SUB)
        history.deliver(2.73, message, sub=RETRY_SUB, rc=3, copy="u3", mid="(2,4,-1,0)", proc=holder[0], pid=holder[1])
        history.reconsume(2.73, message, 1_200, "u4", rc=3, proc=holder[0], pid=holder[1])
        history.dead_letter(2.73, message, sub=RETRY_SUB, dlq_mid="(9,2,-1,-1)")
        return history.check()

    raced = twice((1.45 - 0.154, "retry-blocking"))
    assert raced.findings == [], raced.lines()
    assert raced.duplicates[Cause.CLOSE_RACE.value] == 1
    assert raced.duplicates[f"retry of a duplicate ({Cause.CLOSE_RACE.value})"] >= 1
    assert Promise.UNEXPLAINED_DUPLICATE in _promises(twice(None))
    assert Promise.UNEXPLAINED_DUPLICATE in _promises(twice((1.45 - 0.154, "nack-asyncio")))  # another subscription's
    assert Promise.UNEXPLAINED_DUPLICATE in _promises(twice((1.45 - DOUBLE_DISPATCH_S - 0.1, "retry-blocking")))


def test_one_copy_twice_at_its_acker_past_another_consumers_close_is_attributed_after_the_ack_too() -> None:
    """The same race when the consumer acked the message before its second copy came: a duplicate with the
    close's cause, not a delivery after an ack; without the other consumer's close, a violation."""

    def acked_then_again(close: bool) -> Any:
        history = History().produce(0, "m1").deliver(1, "m1", proc=A[0], pid=A[1]).ack(1.001, "m1", proc=A[0], pid=A[1])
        if close:
            history.fault(0.9, "resubscribe", B[0], 0.0001)
        return history.deliver(1.005, "m1", proc=A[0], pid=A[1]).check()

    raced = acked_then_again(True)
    assert raced.findings == [] and raced.duplicates == {Cause.CLOSE_RACE.value: 1}
    assert _promises(acked_then_again(False)) == [Promise.AFTER_ACK]


def test_the_copy_of_a_reconsume_that_failed_yet_was_stored_is_attributed() -> None:
    """A reconsume whose send timed out across a broker kill raises, so the original is not acked and comes back;
    the application reconsumes it again. The first copy had been stored all the same: both copies arrive (the
    shape of a clean-clone CI run's fixed-seed finding)."""
    message = _id_with(Mechanism.RECONSUME)
    asyncio_consumer = {"proc": "retry-asyncio", "pid": 201}
    history = (History().produce(0, message, topic="events", mid="(4,1,-1,-1)")
               .deliver(1, message, sub=RETRY_SUB, mid="(4,1,-1,-1)", **asyncio_consumer)
               .reconsume(1, message, 2_500, "first", **asyncio_consumer)
               .fault(1.1, "broker-kill", "broker-0", 20))  # fmt: skip
    history.add(Ev.ERROR, 31, op="settle", id=message, sub=RETRY_SUB, gen=1, error="Timeout", **asyncio_consumer)
    (history.deliver(31.01, message, sub=RETRY_SUB, mid="(4,1,-1,-1)", **asyncio_consumer)
     .reconsume(31.01, message, 2_500, "second", **asyncio_consumer)
     .deliver(36, message, sub=RETRY_SUB, rc=1, copy="first", mid="(7,1,-1,-1)", proc="retry-blocking", pid=200)
     .ack(36, message, sub=RETRY_SUB, rc=1, proc="retry-blocking", pid=200)
     .deliver(56, message, sub=RETRY_SUB, rc=1, copy="second", mid="(8,1,-1,-1)", proc="retry-blocking", pid=200)
     .ack(56, message, sub=RETRY_SUB, rc=1, proc="retry-blocking", pid=200))  # fmt: skip
    report = history.check()
    assert report.findings == []
    cause = Cause.FAILED_RECONSUME_STORED.value
    failed = Cause.SETTLE_FAILED.value  # the original again, its reconsume having raised; then its copy's retry
    assert report.duplicates == {failed: 1, f"retry of a duplicate ({failed})": 1, cause: 1}
