"""The promises of docs/consumer.md, checked on the history of a chaos run.

:func:`check` reads every record of a run (:mod:`.history`) and checks, per subscription
and message:

lost
    every produced message is acknowledged or dead-lettered in each of its subscriptions.
left unacknowledged
    after the drain, no subscription holds a message its consumers did not acknowledge (an
    ack the application made but the consumer never sent, for example).
after ack
    no delivery after the message was acknowledged (or dead-lettered) in that subscription,
    except where docs/consumer.md says an ack is lost: acks the broker had not persisted
    when it was killed, and acks the client had grouped but not sent (100 ms) when its
    connection dropped (a topic or bundle unload, a broker killed or frozen) or its process
    was killed; then the copy reaches *another* consumer (or the next incarnation of the
    killed one), which handles it again. Such a delivery is a duplicate with its cause; a
    copy of its own ack delivered by the same consumer is a violation.
early
    a nacked message is not delivered again before its due time (the nack's time plus its
    delay, less its bucket's floor, :attr:`ConsumerSpec.floor_ms`, less
    :data:`SLACK_S`), except where the docs say the schedule is lost: the nacking consumer
    was killed or closed before the message came back ("Durable retries", "Close"), or the
    copy reached another consumer after a reconnect ("Limits that are Pulsar's own": only
    the nacking consumer knows of the nack). A reconsumed copy is never delivered before its
    ``reconsume_later`` call plus its delay, across every fault.
dead letter
    a message is dead-lettered only after the configured deliveries: a nacked one after
    ``max_redeliver_count + 1`` deliveries to the application, a reconsumed one after its
    ``reconsume_later`` at ``RECONSUMETIMES == max_redeliver_count``; and never a copy past
    that count. More deliveries than the count are attributed to a fault that makes the
    broker forget its counts (the last consumer leaving, an unload, a broker restart), or a
    consumer that received the message leaving before its dead letter; or, where the history
    shows it, to the broker resetting its count when a batch sibling was acked while the
    message went to several consumers (docs/consumer.md, "Dead letters": each consumer
    counts only its own deliveries above the broker's count). Shown means: the message was
    delivered to two or more consumer incarnations, and between two of its deliveries of
    one entry the broker's count did not rise (a redelivery after a reset counts 1 again)
    while a sibling of that entry was acked.
duplicates
    every delivery that answers nothing (not the first, not the first after a nack, not the
    first copy of a reconsume) is a duplicate, attributed to a documented cause (an ack
    lost with a fault, a message in flight when its consumer was killed or closed or whose
    settlement failed, a copy of a pending nack handed to another consumer after a
    reconnect, a message the producer stored twice, the copy of a reconsume that raised but
    was stored); one without a cause is a violation.

The faults are the nemesis's, and the stalls the history shows (:data:`STALL`: every process
silent for :data:`STALL_S` while the producers produce; the machine, not the nemesis,
stopped them), which drop connections as a frozen broker does.

:meth:`Report.lines` prints one line per violation, with the message id and the fault just
before it.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .fate import Mechanism, fate_of
from .history import Ev
from .workload import WorkloadSpec

__all__ = ["SLACK_S", "Cause", "Finding", "Promise", "Report", "check"]

SLACK_S = 0.010
"""Clock slack: a delivery this much before its due time still counts as on time."""
GROUPED_ACK_S = 1.0
"""An ack this long before a connection dropped may have been grouped and never sent (the
client sends them every 100 ms; the window allows for a busy machine)."""
SETTLE_CALL_S = 5.0
"""A reconsume waits for a produce (its copy or its dead letter): a kill this soon after it may have stopped it."""
RECONNECT_S = 5.0
"""A consumer's reconnect may complete this long after the fault that dropped its connection ended."""
DOUBLE_DISPATCH_S = 0.5
"""Two deliveries of one stored message with the same redelivery count to two consumers this close, with no
reconnect between them, are one dispatch sent twice (:attr:`Cause.DOUBLE_DISPATCH`). The broker
counts every redelivery it is asked for, so only it (or a reconnect, a cause of its own) sends one count twice;
the gap the history shows adds each consumer's wait in its receive queue, which a busy machine stretches
(``tests/test_chaos_findings.py::test_the_broker_can_dispatch_a_redelivery_to_both_shared_consumers`` checks the
plain client's copies against it)."""
_MAX_LINES_PER_PROMISE = 25
_FIRST = "first"


class Promise(str, enum.Enum):
    LOST = "lost"
    LEFT_UNACKED = "left unacknowledged in the subscription"
    AFTER_ACK = "delivered after an ack"
    EARLY = "early"
    DEAD_LETTER_EARLY = "dead letter before the count"
    PAST_COUNT = "delivered past the dead-letter count"
    UNEXPLAINED_DUPLICATE = "duplicate without a documented cause"


class Cause(str, enum.Enum):
    """Documented reasons for a copy the application sees again, or for an early nack."""

    ACK_LOST_BROKER_KILL = "ack lost: broker killed before persisting it"
    ACK_LOST_CONNECTION = "ack lost: grouped ack dropped with the connection"
    ACK_LOST_CONSUMER_KILL = "ack lost: consumer process killed with grouped acks"
    IN_FLIGHT = "in flight when its consumer was killed or closed"
    SETTLE_FAILED = "its ack, nack or reconsume failed"
    FAILED_RECONSUME_STORED = ("a copy of a reconsume that failed (its send timed out across a fault), stored "
                               "nonetheless; the application reconsumed the redelivered original again")  # fmt: skip
    SETTLE_IN_FLIGHT = "its reconsume (a produce, or a dead letter's) still in flight when its consumer was killed"
    OTHER_CONSUMER_AFTER_RECONNECT = "a pending nack's copy delivered by another consumer after a reconnect"
    SCHEDULE_LOST = "nacking consumer killed or closed (its schedule is lost)"
    STORED_TWICE = "stored twice by the producer (a send retried across a broker fault)"
    ENTRY_TO_OTHER_CONSUMER = ("a batch entry redelivered to another consumer before the ack reached the broker "
                               "(a consumer knows only its own acks)")  # fmt: skip
    COUNT_RESET = "dead-letter count forgotten by the broker (a consumer left, an unload, a broker restart)"
    DOUBLE_DISPATCH = ("the broker dispatched one redelivery to two consumers at once (the same redelivery count, "
                       "no reconnect between; the plain client's too)")  # fmt: skip
    CLOSE_RACE = ("the broker dispatched one message twice to one consumer while another consumer of the "
                  "subscription closed or was killed (the plain client's too)")  # fmt: skip
    SIBLING_ACK_RESET = ("dead-letter count reset by the broker when a batch sibling was acked, the message "
                         "delivered to several consumers (each counts only its own deliveries)")  # fmt: skip


STALL = "stall"
"""Not a fault of the nemesis: every process of the run silent for :data:`STALL_S` or more while the producers
were producing (the machine stalled; :class:`_Faults` finds it in the history)."""
STALL_S = 10.0
"""A stall this long freezes the brokers too, past their ZooKeeper session (6 s in PulsarCluster) and the
clients' operation timeout: their sessions expire and connections drop after it, as after a frozen broker (the
nemesis freezes one broker for less than the session). The producers write several records a second."""
RECONNECTS = ("topic-unload", "bundle-unload", "broker-kill", "broker-freeze", STALL)
"""Faults that drop the consumers' connections."""
CONSUMER_ENDS = ("consumer-kill", "resubscribe")
COUNT_RESETS = (*RECONNECTS, *CONSUMER_ENDS)


@dataclass(frozen=True)
class Finding:
    """One violated promise."""

    promise: Promise
    sub: str
    message_id: str
    t: float
    detail: str
    processes: tuple[str, ...] = ()
    """The consumer processes involved: the nacker and the receiver of an early delivery, those that
    received a message dead-lettered past the count, the settler and the receiver of a copy after an ack."""
    mid: str | None = None
    """The id of the delivery that broke the promise, as the client prints it."""
    copy: bool = False
    """That delivery was a reconsumed copy."""


@dataclass
class _Fault:
    kind: str
    target: str
    begin: float
    end: float


class _Faults:
    """The run's faults in time order, and the process incarnations that ended."""

    def __init__(self, history: Sequence[dict[str, Any]]) -> None:
        self.faults: list[_Fault] = []
        open_: dict[tuple[str, str], _Fault] = {}
        for r in history:
            if r["ev"] != Ev.FAULT.value:
                continue
            key = (r["kind"], r["target"])
            if r["phase"] == "begin":
                open_[key] = _Fault(r["kind"], r["target"], r["t"], float("inf"))
                self.faults.append(open_[key])
            elif key in open_:
                open_.pop(key).end = r["t"]
        self.faults += _stalls(history)
        self.faults.sort(key=lambda f: f.begin)
        self._begins = [f.begin for f in self.faults]

    def overlapping(self, start: float, stop: float, kinds: Iterable[str]) -> list[_Fault]:
        """Faults of *kinds* active at some moment of ``[start, stop]``."""
        wanted = set(kinds)
        last = bisect.bisect_right(self._begins, stop)
        return [f for f in self.faults[:last] if f.kind in wanted and f.end >= start]

    def before(self, t: float) -> str:
        """The last fault that began at or before *t*, as text."""
        i = bisect.bisect_right(self._begins, t)
        if not i:
            return "no fault before it"
        f = self.faults[i - 1]
        return f"{f.kind} {f.target} {t - f.begin:.1f} s before"


def _stalls(history: Sequence[dict[str, Any]]) -> list[_Fault]:
    """The stalls of the run: every process silent for :data:`STALL_S` or more between the first and the
    last record of a produce."""
    produced = [r["t"] for r in history if r["ev"] == Ev.PRODUCE.value]
    if not produced:
        return []
    first, last = min(produced), max(produced)
    times = sorted(r["t"] for r in history if first <= r["t"] <= last)
    return [_Fault(STALL, "every process", a, b) for a, b in itertools.pairwise(times) if b - a >= STALL_S]


@dataclass
class Report:
    """What :func:`check` found."""

    findings: list[Finding] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    early_documented: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    totals: dict[str, Any] = field(default_factory=dict)
    excused: list[Finding] = field(default_factory=list)
    """Findings on messages the producer's broker stored twice (see :attr:`Cause.STORED_TWICE`)."""

    def count(self, promise: Promise) -> int:
        return sum(1 for f in self.findings if f.promise is promise)

    def lines(self) -> list[str]:
        """One line per violation (at most 25 per promise, then how many more)."""
        out: list[str] = []
        by_promise: dict[Promise, list[Finding]] = defaultdict(list)
        for finding in self.findings:
            by_promise[finding.promise].append(finding)
        for promise, found in by_promise.items():
            for f in found[:_MAX_LINES_PER_PROMISE]:
                out.append(f"VIOLATION {promise.value}: {f.sub} {f.message_id}: {f.detail}")
            if len(found) > _MAX_LINES_PER_PROMISE:
                out.append(f"VIOLATION {promise.value}: ... and {len(found) - _MAX_LINES_PER_PROMISE} more")
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "totals": {**self.totals, **{p.name.lower(): self.count(p) for p in Promise},
                       "duplicates": sum(self.duplicates.values())},
            "duplicates_by_cause": dict(self.duplicates),
            "early_documented_by_cause": dict(self.early_documented),
            "dead_letters": dict(self.dead_letters),
            "by_promise_one_consumer": dict(Counter(f.promise.name.lower() for f in self.findings
                                                    if len(set(f.processes)) <= 1)),
            "by_promise_two_consumers": dict(Counter(f.promise.name.lower() for f in self.findings
                                                     if len(set(f.processes)) > 1)),
            "excused_stored_twice": [f"{f.promise.value}: {f.sub} {f.message_id}: {f.detail}" for f in self.excused],
        }  # fmt: skip


class _Message:
    """The records of one message in one subscription, in time order."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.dead_letters: dict[str, float] = {}  # dead-letter id -> publish time


def _incarnation(r: dict[str, Any]) -> tuple[str, int, int]:
    return r["proc"], r["pid"], r.get("gen", 0)


class _Checker:
    def __init__(self, history: Sequence[dict[str, Any]], spec: WorkloadSpec) -> None:
        self.spec = spec
        self.faults = _Faults(history)
        self.report = Report()
        self.produced: dict[str, dict[str, Any]] = {}
        self.produced_twice: set[str] = set()
        self.messages: dict[tuple[str, str], _Message] = defaultdict(_Message)
        self.ended: dict[tuple[str, int, int], float] = {}  # incarnation -> when it closed or was killed
        self._index(history)

    # ------------------------------------------------------------------ indexing

    def _index(self, history: Sequence[dict[str, Any]]) -> None:
        self._kills: dict[str, list[float]] = defaultdict(list)
        self._pids: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self._last_settle: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._delivered_mid: dict[tuple[tuple[str, int, int], str, str], str] = {}
        """(incarnation, subscription, message id) -> the stored message id it received last."""
        self._entry_acks: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = defaultdict(list)
        """(subscription, entry) -> the acks of its messages, in time order."""
        handlers = {
            Ev.PRODUCE.value: self._on_produce, Ev.DELIVER.value: self._on_record, Ev.ACK.value: self._on_settle,
            Ev.NACK.value: self._on_settle, Ev.RECONSUME.value: self._on_settle, Ev.DEAD_LETTER.value: self._on_dead_letter,
            Ev.ERROR.value: self._on_error, Ev.LEFTOVER.value: self._on_leftover, Ev.FAULT.value: self._on_fault,
            Ev.CLOSE.value: lambda r: self.ended.__setitem__(_incarnation(r), r["t"]),
            Ev.START.value: lambda r: self._pids[r["proc"]].append((r["t"], r["pid"])),
        }  # fmt: skip
        for r in history:
            handler = handlers.get(r["ev"])
            if handler is not None:
                handler(r)

    def _on_produce(self, r: dict[str, Any]) -> None:
        if r["id"] in self.produced:
            self.produced_twice.add(r["id"])
        self.produced.setdefault(r["id"], r)

    def _on_record(self, r: dict[str, Any]) -> None:
        self.messages[(r["sub"], r["id"])].records.append(r)
        if r["ev"] == Ev.DELIVER.value:
            self._delivered_mid[(_incarnation(r), r["sub"], r["id"])] = r["mid"]

    def _on_settle(self, r: dict[str, Any]) -> None:
        self._on_record(r)
        mid = self._delivered_mid.get((_incarnation(r), r["sub"], r["id"]))
        if r["ev"] == Ev.ACK.value and mid is not None:
            self._entry_acks[(r["sub"], _entry(mid))].append(r)
        self._last_settle[(r["proc"], r["pid"], r["id"])] = r

    def _on_dead_letter(self, r: dict[str, Any]) -> None:
        # publish times are whole ms, truncated: the dead letter was stored up to 1 ms after it
        self.messages[(r["sub"], r["id"])].dead_letters.setdefault(r["dlq_mid"], r["published"] + 0.001)

    def _on_error(self, r: dict[str, Any]) -> None:
        settle = self._last_settle.get((r["proc"], r["pid"], r.get("id") or ""))
        if r.get("op") == "settle" and settle is not None:
            settle["failed"] = True  # the call after the record raised

    def _on_leftover(self, r: dict[str, Any]) -> None:
        self._violate(Promise.LEFT_UNACKED, r["sub"], r["id"], r["t"],
                      f"{r['mid']} on {r['topic']} still unacknowledged after the drain (rc {r['rc']})")

    def _on_fault(self, r: dict[str, Any]) -> None:
        if r["kind"] == "consumer-kill" and r["phase"] == "begin":
            self._kills[r["target"]].append(r["t"])

    def _killed_at(self, proc: str, pid: int) -> float | None:
        """When incarnation *pid* of *proc* was killed by the nemesis (the first kill after it started)."""
        starts = self._pids.get(proc, [])
        began = next((t for t, p in starts if p == pid), None)
        if began is None:
            return None
        return next((t for t in self._kills.get(proc, []) if t >= began), None)

    def _ended_at(self, who: tuple[str, int, int]) -> float | None:
        """When an incarnation stopped consuming: its close, or its process's kill."""
        times = [t for t in (self.ended.get(who), self._killed_at(who[0], who[1])) if t is not None]
        return min(times) if times else None

    # ------------------------------------------------------------------ checks

    def run(self) -> Report:
        deliveries = 0
        for (sub, message_id), message in sorted(self.messages.items()):
            deliveries += sum(1 for r in message.records if r["ev"] == Ev.DELIVER.value)
            self._check_message(sub, message_id, message)
        self._check_lost()
        self._excuse_stored_twice()
        self.report.totals.update(
            produced=len(self.produced), deliveries=deliveries,
            delivered_not_produced=sum(1 for (_, i) in self.messages if i not in self.produced),
            dead_lettered=sum(len(m.dead_letters) > 0 for m in self.messages.values()),
            faults=dict(Counter(f.kind for f in self.faults.faults)),
        )  # fmt: skip
        expected = sum(len(self.spec.subscriptions_of(p["topic"])) for p in self.produced.values())
        self.report.totals["duplicate_rate"] = round(sum(self.report.duplicates.values()) / max(expected, 1), 6)
        return self.report

    def _excuse_stored_twice(self) -> None:
        """Findings on a message the broker stored twice are not the consumer's: its two copies share an id."""
        twice = set(self.produced_twice)
        for (_, message_id), message in self.messages.items():
            entries = {_entry(r["mid"]) for r in message.records if r["ev"] == Ev.DELIVER.value and r["copy"] is None}
            if len(entries) > 1:
                twice.add(message_id)
        self.report.excused = [f for f in self.report.findings if f.message_id in twice]
        self.report.findings = [f for f in self.report.findings if f.message_id not in twice]
        self.report.totals["stored_twice"] = len(twice)

    def _violate(self, promise: Promise, sub: str, message_id: str, t: float, detail: str,
                 processes: tuple[str, ...] = (), delivery: dict[str, Any] | None = None) -> None:  # fmt: skip
        mid = None if delivery is None else delivery["mid"]
        copy = delivery is not None and delivery["copy"] is not None
        self.report.findings.append(Finding(promise, sub, message_id, t, f"{detail}; {self.faults.before(t)}", processes,
                                            mid, copy))  # fmt: skip

    def _check_lost(self) -> None:
        for message_id, produced in self.produced.items():
            for sub in self.spec.subscriptions_of(produced["topic"]):
                message = self.messages.get((sub, message_id))
                if message is None or not (message.dead_letters or any(_acked(r) for r in message.records)):
                    last = message.records[-1] if message and message.records else produced
                    seen = len([r for r in message.records if r["ev"] == Ev.DELIVER.value]) if message else 0
                    self._violate(Promise.LOST, sub, message_id, last["t"],
                                  f"produced {produced['mid']}, delivered {seen} times, never acked or dead-lettered; "
                                  f"last record {last['ev']}")  # fmt: skip

    def _check_message(self, sub: str, message_id: str, message: _Message) -> None:
        spec_sub = self.spec.subscription(sub)
        fate = fate_of(self.spec.seed, message_id, spec_sub.mechanisms)
        state = _State()
        settled_at = min(message.dead_letters.values(), default=None)
        settler: tuple[str, int, int] | None = None
        for r in message.records:
            ev = r["ev"]
            who = _incarnation(r)
            failed = bool(r.get("failed"))
            if ev == Ev.DELIVER.value:
                answered = self._answer(sub, message_id, r, state)
                state.delivered(r, self._classify(sub, message_id, r, state, answered, settled_at, settler))
                if r["copy"] is not None and r["rc"] > spec_sub.max_redeliver_count:
                    self._violate(Promise.PAST_COUNT, sub, message_id, r["t"], f"copy with RECONSUMETIMES {r['rc']}")
                continue
            state.settled(who, r["t"], failed)
            if failed:
                if ev == Ev.RECONSUME.value:  # a timed-out send may still have stored its copy
                    state.failed_tokens.add(r["token"])
                continue
            chain = state.duplicate_of.get(who)
            if ev == Ev.ACK.value and settled_at is None:
                settled_at, settler = r["t"], who
            elif ev == Ev.NACK.value:
                state.nacks.append((r, chain))
            elif ev == Ev.RECONSUME.value and r["rc"] < spec_sub.max_redeliver_count:
                state.tokens[r["token"]] = (r, chain)
        self._check_dead_letters(sub, message_id, message, fate.mechanism, spec_sub.max_redeliver_count)

    # --------------------------------------------------------------- deliveries

    def _answer(self, sub: str, message_id: str, r: dict[str, Any], state: _State) -> _Answer | str | None:
        """What delivery *r* answers (checked for earliness): the reconsume of its copy, the oldest
        unanswered nack it can answer, :data:`_FIRST` for the first delivery; None for nothing (a duplicate)."""
        if r["copy"] is not None:
            answer = state.tokens.pop(r["copy"], None)
            if answer is None:
                return None
            reconsume = answer[0]
            due = reconsume["t"] + reconsume["delay_ms"] / 1000
            if r["t"] < due - SLACK_S:
                self._violate(Promise.EARLY, sub, message_id, r["t"],
                              f"reconsumed copy {reconsume['token']} delivered {(due - r['t']) * 1000:.0f} ms before due "
                              f"(reconsumed by {reconsume['proc']}, delivered by {r['proc']})",
                              (reconsume["proc"], r["proc"]), r)  # fmt: skip
            return answer
        if not state.first_seen:
            return _FIRST
        if state.twin_of(r, self.faults) is not None:  # a dispatch sent twice answers one nack, at its first receiver
            return None
        for i, answer in enumerate(state.nacks):  # the oldest nack it can answer: not one a reconnect's copy shows
            if not self._reconnect_copy(answer[0], r):
                del state.nacks[i]
                self._check_nack_answer(sub, message_id, answer[0], r, None)
                return answer
        return None

    def _classify(self, sub: str, message_id: str, r: dict[str, Any], state: _State, answered: _Answer | str | None,
                  settled_at: float | None, settler: tuple[str, int, int] | None) -> str | None:  # fmt: skip
        """Count delivery *r* as expected, a duplicate with its cause, or a violation; return the
        duplicate's cause (its retries are duplicates too), else None."""
        if isinstance(answered, tuple) and answered[1] is not None:  # answers the retry of a duplicate
            cause = f"retry of a duplicate ({answered[1]})"
            self.report.duplicates[cause] += 1
            return cause
        if settled_at is None or r["t"] <= settled_at:
            if answered is not None:
                return None
            found = self._duplicate_cause(message_id, r, state)
            if found is None:
                first = state.first_receiver.get((r["mid"], r["rc"]), r["proc"])  # the same delivery at another consumer
                self._violate(Promise.UNEXPLAINED_DUPLICATE, sub, message_id, r["t"],
                              f"delivery to {r['proc']}.{r['pid']} answers no nack or reconsume (rc {r['rc']}, {r['mid']}; "
                              f"first received by {first})", (first, r["proc"]), r)  # fmt: skip
                return None
            self.report.duplicates[found.value] += 1
            state.fork = state.fork or found.value  # the message now has two lives: this copy's retries and the original's
            return found.value
        if isinstance(answered, tuple) and answered[0]["t"] > settled_at:
            self._violate(Promise.AFTER_ACK, sub, message_id, r["t"],
                          f"delivered to {r['proc']}.{r['pid']}, a retry of a copy delivered after an ack", (r["proc"],), r)
            return None
        if isinstance(answered, tuple) and state.fork is not None:  # one of two retry chains: the other one settled it
            cause = f"retry of a duplicate ({state.fork})"
            self.report.duplicates[cause] += 1
            return cause
        return self._after_settled(sub, message_id, r, state, settled_at, settler)

    def _check_nack_answer(self, sub: str, message_id: str, nack: dict[str, Any], r: dict[str, Any],
                           twin: tuple[str, int, int] | None) -> None:  # fmt: skip
        """Check that delivery *r*, which answers *nack*, is not early (*twin*: the consumer that received the
        same dispatch just before, if any)."""
        due = nack["t"] + (nack["delay_ms"] - nack["floor_ms"]) / 1000
        if r["t"] >= due - SLACK_S:
            return
        nacker, receiver = _incarnation(nack), _incarnation(r)
        ended = self._ended_at(nacker)
        if ended is not None and nack["t"] <= ended <= r["t"]:
            self.report.early_documented[Cause.SCHEDULE_LOST.value] += 1
            return
        if receiver != nacker and self.faults.overlapping(nack["t"] - RECONNECT_S, r["t"], RECONNECTS):
            self.report.early_documented[Cause.OTHER_CONSUMER_AFTER_RECONNECT.value] += 1
            return
        if twin == nacker and nack["rc"] == r["rc"]:  # the nacked delivery's second copy, not an answer to the nack
            self.report.early_documented[Cause.DOUBLE_DISPATCH.value] += 1
            return
        self._violate(Promise.EARLY, sub, message_id, r["t"],
                      f"delivered {(due - r['t']) * 1000:.0f} ms before due (nacked {nack['delay_ms']} ms by "
                      f"{nack['proc']}.{nack['pid']}, delivered to {r['proc']}.{r['pid']}, {r['mid']})",
                      (nack["proc"], r["proc"]), r)  # fmt: skip

    def _reconnect_copy(self, nack: dict[str, Any], r: dict[str, Any]) -> bool:
        """Whether delivery *r* is the broker's redelivery of *nack*'s copy after a reconnect, not its answer: at
        another consumer, with no higher redelivery count than the nacked delivery (the broker counts each
        redelivery a nack asks for, not those a dropped connection makes), with a reconnect between."""
        return (_incarnation(r) != _incarnation(nack) and r["rc"] <= nack["rc"]
                and bool(self.faults.overlapping(nack["t"] - RECONNECT_S, r["t"], RECONNECTS)))  # fmt: skip

    def _duplicate_cause(self, message_id: str, r: dict[str, Any], state: _State) -> Cause | None:
        if self._stored_twice(message_id, r, state):
            return Cause.STORED_TWICE
        if r["copy"] in state.failed_tokens:
            return Cause.FAILED_RECONSUME_STORED
        if state.twin_of(r, self.faults) is not None:
            return Cause.DOUBLE_DISPATCH
        if self._twice_past_a_close(r, state):
            return Cause.CLOSE_RACE
        if any(self._reconnect_copy(nack, r) for nack, _ in state.nacks):
            return Cause.OTHER_CONSUMER_AFTER_RECONNECT
        for who, (t, failed) in state.unsettled.items():
            if failed:
                return Cause.SETTLE_FAILED
            ended = self._ended_at(who)
            if ended is not None and t <= ended <= r["t"]:
                return Cause.IN_FLIGHT
        last = state.settle_of.get(r["copy"] or "") or state.last_settle
        if last is not None and last[0] != _incarnation(r):
            return self._lost_ack_cause(last[0], last[1], r)
        return None

    def _twice_past_a_close(self, r: dict[str, Any], state: _State) -> bool:
        """Whether delivery *r* repeats one dispatch to its own consumer (the same stored message and redelivery
        count, at most :data:`DOUBLE_DISPATCH_S` earlier, no reconnect between) while another consumer of the
        subscription ended, from that window before the first copy to the second (:attr:`Cause.CLOSE_RACE`)."""
        me = _incarnation(r)
        for who, t in state.dispatched.get((r["mid"], r["rc"]), ()):
            if who == me and 0 <= r["t"] - t <= DOUBLE_DISPATCH_S and not self.faults.overlapping(t, r["t"], RECONNECTS):
                return self._other_consumer_ended(r["sub"], me, t - DOUBLE_DISPATCH_S, r["t"])
        return False

    def _other_consumer_ended(self, sub: str, me: tuple[str, int, int], start: float, stop: float) -> bool:
        """Whether a consumer of *sub* other than *me* closed (its record, or the nemesis's resubscribe) or was
        killed within ``[start, stop]``."""
        if any(start <= t <= stop and who != me and self._subscription_of(who[0]) == sub for who, t in self.ended.items()):
            return True
        return any(start <= f.begin <= stop and f.target != me[0] and self._subscription_of(f.target) == sub
                   for f in self.faults.overlapping(start, stop, CONSUMER_ENDS))  # fmt: skip

    def _subscription_of(self, consumer: str) -> str | None:
        """The subscription of the consumer named *consumer* in the workload, None for another name."""
        return next((c.subscription for c in self.spec.consumers if c.name == consumer), None)

    def _stored_twice(self, message_id: str, r: dict[str, Any], state: _State) -> bool:
        """Whether *r* delivers another stored copy of the message (or of its retry copy) than the first."""
        if message_id in self.produced_twice:
            return True
        if r["copy"] is not None:
            seen = state.copy_entries.get(r["copy"])
            return seen is not None and seen != _entry(r["mid"])
        produced = self.produced.get(message_id)
        return produced is not None and _entry(r["mid"]) != _entry(produced["mid"])

    def _lost_ack_cause(self, acker: tuple[str, int, int], acked: float, r: dict[str, Any]) -> Cause | None:
        """Why an ack (or a nack's or reconsume's settlement) of *acker* at *acked* may not have kept
        delivery *r*, to another consumer, away."""
        delivered = r["t"]
        if self.faults.overlapping(acked, delivered, ("broker-kill",)):
            return Cause.ACK_LOST_BROKER_KILL
        if self.faults.overlapping(acked, min(delivered, acked + GROUPED_ACK_S), RECONNECTS):
            return Cause.ACK_LOST_CONNECTION
        killed = self._killed_at(acker[0], acker[1])
        if killed is not None and acked <= killed <= min(delivered, acked + GROUPED_ACK_S):
            return Cause.ACK_LOST_CONSUMER_KILL
        if killed is not None and acked <= killed <= min(delivered, acked + SETTLE_CALL_S):
            return Cause.SETTLE_IN_FLIGHT
        ended = self.ended.get(acker)
        if ended is not None and acked <= ended <= delivered:
            return Cause.IN_FLIGHT
        if _batch_index(r["mid"]) >= 0 and delivered - acked <= GROUPED_ACK_S:
            return Cause.ENTRY_TO_OTHER_CONSUMER
        return None

    def _after_settled(self, sub: str, message_id: str, r: dict[str, Any], state: _State, settled_at: float,
                       settler: tuple[str, int, int] | None) -> str | None:  # fmt: skip
        """Classify a delivery after the message was acked or dead-lettered; return its cause."""
        if settler is None:  # dead-lettered: the consumer that sent it is the last to have received it
            settler = next((_incarnation(x) for x in reversed(self.messages[(sub, message_id)].records)
                            if x["ev"] == Ev.DELIVER.value and x["t"] <= settled_at), None)  # fmt: skip
        acker, acked = state.settle_of.get(r["copy"] or "") or (settler, settled_at)
        cause = None
        if acker is not None and acker != _incarnation(r):
            cause = self._lost_ack_cause(acker, acked, r)
            if cause is None and state.twin_of(r, self.faults) == acker:  # the copy the acker received was sent twice
                cause = Cause.DOUBLE_DISPATCH
        elif acker is not None and self._twice_past_a_close(r, state):  # its own copy, sent twice in a close's race
            cause = Cause.CLOSE_RACE
        if self._stored_twice(message_id, r, state):
            cause = Cause.STORED_TWICE
        if cause is None:
            self._violate(Promise.AFTER_ACK, sub, message_id, r["t"],
                          f"delivered to {r['proc']}.{r['pid']} {r['t'] - acked:.3f} s after it was settled by "
                          f"{acker[0] if acker else '?'}.{acker[1] if acker else '?'} ({r['mid']}, rc {r['rc']})",
                          (acker[0] if acker else "?", r["proc"]), r)  # fmt: skip
            return None
        self.report.duplicates[cause.value] += 1
        return cause.value

    # ------------------------------------------------------------- dead letters

    def _check_dead_letters(self, sub: str, message_id: str, message: _Message, mechanism: Mechanism,
                            max_count: int) -> None:  # fmt: skip
        if not message.dead_letters:
            return
        first = min(message.dead_letters.values())
        if len(message.dead_letters) > 1:
            self.report.dead_letters["sent twice"] += 1
        before = [r for r in message.records if r["t"] <= first]
        if mechanism is Mechanism.RECONSUME:
            last = [r for r in before if r["ev"] == Ev.RECONSUME.value and r["rc"] >= max_count]
            if not last:
                top = max((r["rc"] for r in before if r["ev"] == Ev.RECONSUME.value), default=None)
                self._violate(Promise.DEAD_LETTER_EARLY, sub, message_id, first,
                              f"dead-lettered after reconsumes up to RECONSUMETIMES {top} (count {max_count})")
            else:
                self.report.dead_letters["at the count"] += 1
            return
        seen = [r for r in before if r["ev"] == Ev.DELIVER.value]
        if len(seen) < max_count + 1:
            consumers = ", ".join(f"{r['proc']} rc {r['rc']}" for r in seen)
            self._violate(Promise.DEAD_LETTER_EARLY, sub, message_id, first,
                          f"dead-lettered after {len(seen)} deliveries (count {max_count}: {max_count + 1} deliveries): "
                          f"{consumers}", tuple(sorted({r["proc"] for r in seen})), seen[-1] if seen else None)  # fmt: skip
        elif len(seen) == max_count + 1:
            self.report.dead_letters["at the count"] += 1
        elif self.faults.overlapping(seen[0]["t"], first, COUNT_RESETS) or self._receiver_left(seen, first):
            self.report.dead_letters[f"past the count: {Cause.COUNT_RESET.value}"] += 1
        elif len(seen) - _double_dispatched(seen, self.faults) <= max_count + 1:
            self.report.dead_letters[f"past the count: {Cause.DOUBLE_DISPATCH.value}"] += 1
        elif self._sibling_ack_reset(sub, message_id, seen):
            self.report.dead_letters[f"past the count: {Cause.SIBLING_ACK_RESET.value}"] += 1
        else:
            self.report.dead_letters["past the count, unexplained"] += 1
            consumers = ", ".join(f"{r['proc']} rc {r['rc']}" for r in seen)
            self._violate(Promise.PAST_COUNT, sub, message_id, first,
                          f"dead-lettered after {len(seen)} deliveries (count {max_count}) with no count reset: {consumers}",
                          processes=tuple(sorted({r["proc"] for r in seen})))

    def _receiver_left(self, seen: list[dict[str, Any]], dead_lettered: float) -> bool:
        """Whether a consumer that received the message was closed or killed between its first delivery and its
        dead letter (its count goes with it; a nemesis record may end just before the close it causes)."""
        begin = seen[0]["t"]
        ends = (self._ended_at(who) for who in {_incarnation(r) for r in seen})
        return any(end is not None and begin <= end <= dead_lettered for end in ends)

    def _sibling_ack_reset(self, sub: str, message_id: str, seen: list[dict[str, Any]]) -> bool:
        """Whether the history shows the broker's count of the message reset by a sibling's ack while the message
        went to several consumers: two deliveries of one entry, the later with a count no higher (after a reset
        the next redelivery counts 1), and an ack of a sibling in that entry between them (from
        :data:`GROUPED_ACK_S` before the first: a grouped ack reaches the broker later; the members of one
        copy are received in order)."""
        if len({_incarnation(r) for r in seen}) < 2:
            return False  # one consumer's own tally is exact whatever the broker counts
        for before, after in itertools.pairwise(seen):
            entry = _entry(before["mid"])
            if after["rc"] > before["rc"] or _entry(after["mid"]) != entry:
                continue
            acks = self._entry_acks.get((sub, entry), [])
            lo = bisect.bisect_left(acks, before["t"] - GROUPED_ACK_S, key=lambda a: a["t"])
            hi = bisect.bisect_right(acks, after["t"], key=lambda a: a["t"])
            if any(a["id"] != message_id and not a.get("failed") for a in acks[lo:hi]):
                return True
        return False

def _double_dispatched(seen: list[dict[str, Any]], faults: _Faults) -> int:
    """How many of the deliveries *seen* are the second copy of one dispatch (:attr:`Cause.DOUBLE_DISPATCH`)."""
    state = _State()
    twins = 0
    for r in seen:
        twins += state.twin_of(r, faults) is not None
        state.dispatched.setdefault((r["mid"], r["rc"]), []).append((_incarnation(r), r["t"]))
    return twins


def _acked(r: dict[str, Any]) -> bool:
    return r["ev"] == Ev.ACK.value and not r.get("failed")


def _batch_index(mid: str) -> int:
    """The batch index of a message id as the client prints it (-1: not batched)."""
    return int(mid.strip("()").split(",")[3])


def _entry(mid: str) -> tuple[str, ...]:
    """``(ledger, entry, partition)`` of a message id as the client prints it: a batch shares its entry."""
    return tuple(mid.strip("()").split(",")[:3])


_Answer = tuple[dict[str, Any], "str | None"]
"""A nack or reconsume record, and the cause of the duplicate it retried (None for an expected delivery)."""


@dataclass
class _State:
    """Where one message stands in one subscription while its records are read in order."""

    first_seen: bool = False
    nacks: list[_Answer] = field(default_factory=list)
    tokens: dict[str, _Answer] = field(default_factory=dict)
    failed_tokens: set[str] = field(default_factory=set)
    """The tokens of reconsumes that raised: their copies may have been stored all the same."""
    first_receiver: dict[tuple[str, int], str] = field(default_factory=dict)
    dispatched: dict[tuple[str, int], list[tuple[tuple[str, int, int], float]]] = field(default_factory=dict)
    """(Stored message id, redelivery count) -> the consumers that received that delivery, and when."""
    """(Stored message id, redelivery count) -> the consumer process that received that delivery first."""
    copy_entries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Token -> the entry of the first delivery of that retry copy."""
    unsettled: dict[tuple[str, int, int], tuple[float, bool]] = field(default_factory=dict)
    last_settle: tuple[tuple[str, int, int], float] | None = None
    settle_of: dict[str, tuple[tuple[str, int, int], float]] = field(default_factory=dict)
    """The last settlement of each stored message: the original (``""``) and each retry copy (its token)."""
    delivered_last: dict[tuple[str, int, int], str] = field(default_factory=dict)
    """Per consumer: which stored message it received last (``""`` or a token)."""
    duplicate_of: dict[tuple[str, int, int], str | None] = field(default_factory=dict)
    """Per consumer: the cause of the duplicate it received last (None: an expected delivery)."""
    fork: str | None = None
    """The cause of the first duplicate delivered before the message was settled: from then on two chains of
    retries (the duplicate's and the original's) may be in flight, and when one settles the message a copy of
    the other, asked for before that, still comes."""

    def delivered(self, r: dict[str, Any], duplicate: str | None) -> None:
        self.first_seen = True
        self.unsettled[_incarnation(r)] = (r["t"], False)
        self.duplicate_of[_incarnation(r)] = duplicate
        self.delivered_last[_incarnation(r)] = r["copy"] or ""
        self.first_receiver.setdefault((r["mid"], r["rc"]), r["proc"])
        self.dispatched.setdefault((r["mid"], r["rc"]), []).append((_incarnation(r), r["t"]))
        if r["copy"] is not None:
            self.copy_entries.setdefault(r["copy"], _entry(r["mid"]))

    def twin_of(self, r: dict[str, Any], faults: _Faults) -> tuple[str, int, int] | None:
        """The other consumer that received the same dispatch as delivery *r* just before it (the same stored
        message and redelivery count, at most :data:`DOUBLE_DISPATCH_S` earlier, no reconnect between), or None."""
        for who, t in self.dispatched.get((r["mid"], r["rc"]), ()):
            if (who != _incarnation(r) and 0 <= r["t"] - t <= DOUBLE_DISPATCH_S
                    and not faults.overlapping(t, r["t"], RECONNECTS)):  # fmt: skip
                return who
        return None

    def settled(self, who: tuple[str, int, int], t: float, failed: bool) -> None:
        if failed:
            if who in self.unsettled:
                self.unsettled[who] = (self.unsettled[who][0], True)
            return
        self.unsettled.pop(who, None)
        self.last_settle = (who, t)
        self.settle_of[self.delivered_last.get(who, "")] = (who, t)


def check(history: Sequence[dict[str, Any]], spec: WorkloadSpec) -> Report:
    """Check the promises (see the module's docstring) on *history* (:func:`~.history.read_history`)."""
    return _Checker(history, spec).run()
