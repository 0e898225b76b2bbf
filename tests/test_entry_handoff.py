"""The batch handoff rule on the admission ledger alone (no broker): when an entry with nacked members goes back.

On a shared subscription (``Sharing.SHARED``) an entry waits for its last pending nacked
member (its due keys parked until a key of the entry falls due again), and while the application may still settle members of it (the member it was given
last is unsettled, or the entry was read from within ``COPY_DRAIN_MS``); with one active
consumer each member goes at its own time.

On a broker the rule's effect is tested end to end in tests/test_consumer.py
(``test_batch_siblings_retry_by_the_subscriptions_rule``) and tests/test_chaos_findings.py
(two consumers on one Shared subscription); these tests pin the ledger's steps: which keys
wait, until when, and that nothing is left behind. The tracker is played by hand here:
``hand_off`` is given the keys a tracker would release at each step.
"""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

from pulsar_nack.consumer.admission import AdmissionLedger, MessageState
from pulsar_nack.consumer.settings import ConsumerSettings, subscribe_settings
from pulsar_nack.consumer.subscription import Sharing
from pulsar_nack.core.timer import monotonic_ms
from pulsar_nack.testing.waits import wait_until
from pulsar_nack.timing import COPY_DRAIN_MS, STALE_MS

T = "persistent://public/default/t"
A, B, C = (7, 1, 0), (7, 1, 1), (7, 1, 2)


RECHECK_MS = 500


def _ledger(sharing: Sharing) -> AdmissionLedger:
    wait_for_last = sharing is Sharing.SHARED  # as NackingCore builds it
    return AdmissionLedger(None, lead_ms=0, always_guard=False, guard_messages=10, start_guard=10, wait_for_last=wait_for_last,
                           recheck_ms=RECHECK_MS)  # fmt: skip


def _nack(ledger: AdmissionLedger, item: tuple[int, int, int], size: int = 10) -> None:
    """Nack *item* of an entry of *size* members; an entry whose every member is nacked here has no member left to settle."""
    assert ledger.note_nack(item, size, None)


class HoldBack:
    """The tracker's ``add_at`` as the ledger sees it: records what it is given; refuses when ``closed``."""

    def __init__(self, closed: bool = False) -> None:
        self.closed = closed
        self.held: list[tuple[Any, int]] = []

    def __call__(self, key: Any, deadline_ms: int) -> bool:
        if self.closed:
            return False
        self.held.append((key, deadline_ms))
        return True


def _entries(ids: list[Any]) -> list[tuple[int, int]]:
    return [(i.ledger_id(), i.entry_id()) for i in ids]


def test_shared_an_entry_waits_for_its_last_pending_member_then_goes_once() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=2)
    _nack(ledger, B, size=2)
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [], "an entry with a member pending for longer must not go back to the broker"
    assert hold_back.held == [] and ledger.waiting_entries() == 1, "the due member waits, parked, for B's own key"
    assert ledger.state_of(A) is MessageState.PENDING  # its copies are still swallowed meanwhile
    ledger._check(1)
    ids, _ = ledger.hand_off({T: [(T, *B)]}, hold_back)  # B's key falls due: A comes back with it
    assert _entries(ids) == [(7, 1)]
    assert ledger.state_of(A) is ledger.state_of(B) is MessageState.HANDED_OFF
    assert ledger.waiting_entries() == 0
    ledger._check(0)


def test_shared_an_entry_goes_when_its_last_member_is_due_whatever_other_entries_wait_for() -> None:
    """The broker-kill finding: members of one entry falling due in two bursts (a bucket apart) made the entry
    wait for the latest deadline noted for *any* message (another entry's 18 s retry), 14.7 s past its own."""
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    other = (7, 9, 0)
    _nack(ledger, other, size=2)  # another entry's member, nacked for much longer (its key falls due much later)
    _nack(ledger, (7, 9, 1), size=2)
    _nack(ledger, A, size=2)
    _nack(ledger, B, size=2)  # B's key falls in the next bucket
    assert ledger.hand_off({T: [(T, *A)]}, hold_back)[0] == []
    ids, _ = ledger.hand_off({T: [(T, *B)]}, hold_back)
    assert _entries(ids) == [(7, 1)], "the entry must go with its own last member, not with another entry's deadline"
    assert hold_back.held == [] and ledger.state_of(other) is MessageState.PENDING
    ledger._check(2)


def test_shared_a_member_acked_meanwhile_leaves_the_wait_late_never_early_and_nothing_behind() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=3)
    _nack(ledger, B, size=3)
    _nack(ledger, C, size=3)
    ledger.note_ack(*C, 3, made_up=False, topic=T)  # the longest nack is acked: its key stays in the tracker
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [] and ledger.waiting_entries() == 1
    ids, _ = ledger.hand_off({T: [(T, *C)]}, hold_back)  # C's stale key: B still pending, A waits on
    assert ids == [] and ledger.state_of(A) is MessageState.PENDING
    ledger.note_ack(*B, 3, made_up=False, topic=T)  # no member pending but the parked one
    assert ledger.waiting_entries() == 1 and ledger.state_of(A) is MessageState.PENDING
    ids, _ = ledger.hand_off({T: [(T, *B)]}, hold_back)  # B's stale key brings A back: the entry goes
    assert _entries(ids) == [(7, 1)] and ledger.state_of(A) is MessageState.HANDED_OFF
    assert ledger.waiting_entries() == 0
    _nack(ledger, A, size=3)  # nacked again: nothing of the entry's last wait is left
    _nack(ledger, B, size=3)
    assert ledger.hand_off({T: [(T, *A)]}, hold_back)[0] == []
    assert _entries(ledger.hand_off({T: [(T, *B)]}, hold_back)[0]) == [(7, 1)]
    assert hold_back.held == [] and ledger.waiting_entries() == 0
    ledger._check(0)


def test_shared_a_parked_entry_whose_handoff_the_client_refused_is_parked_again() -> None:
    """The tracker retries only the keys it released: the undo parks the entry's other due keys again."""
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=2)
    _nack(ledger, B, size=2)
    ledger.hand_off({T: [(T, *A)]}, hold_back)
    ids, undo = ledger.hand_off({T: [(T, *B)]}, hold_back)
    assert len(ids) == 1
    undo()
    assert ledger.state_of(A) is ledger.state_of(B) is MessageState.PENDING and ledger.waiting_entries() == 1
    assert _entries(ledger.hand_off({T: [(T, *B)]}, hold_back)[0]) == [(7, 1)]  # the tracker's retry of B
    assert ledger.state_of(A) is MessageState.HANDED_OFF
    ledger._check(0)


def test_shared_a_reset_returns_the_parked_keys_with_the_trackers() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=2)
    _nack(ledger, B, size=2)
    ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ledger.reset(False, lambda: {T: [(T, *B)]}) == {T: [(T, *B), (T, *A)]}
    assert ledger.waiting_entries() == 0
    ledger._check(0)


def test_shared_an_entry_with_one_pending_member_keeps_no_record() -> None:
    """The rule keeps no memory per nacked member or entry: only the due keys of entries that wait."""
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    for entry in range(100):
        _nack(ledger, (7, entry, 0), size=2)
    _nack(ledger, (7, 5, 1), size=2)
    assert ledger.waiting_entries() == 0
    ledger.hand_off({T: [(T, 7, 5, 0)]}, hold_back)
    assert ledger.waiting_entries() == 1 and hold_back.held == []


def test_shared_an_entry_waits_while_the_application_holds_a_member_it_was_given() -> None:
    """A member nacked after its entry went back could reach another consumer first, and come early there."""
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=3)
    ledger.entries.note_read(*B)  # the application was given B, and works on it
    before = monotonic_ms()
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [], "an entry must not go back while the application holds a member of it"
    assert [key for key, _ in hold_back.held] == [(T, *A)] and hold_back.held[0][1] >= before + RECHECK_MS
    assert ledger.state_of(A) is MessageState.PENDING
    ledger.note_ack(*B, 3, made_up=False, topic=T)  # settled; C may still be queued behind it
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [] and len(hold_back.held) == 2, "an entry read from within COPY_DRAIN_MS waits"
    assert wait_until(lambda: not ledger.entries.busy(7, 1, COPY_DRAIN_MS, STALE_MS), 5), "the drain never ended"
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and ledger.state_of(A) is MessageState.HANDED_OFF
    ledger._check(0)


def test_shared_an_entry_every_member_of_which_is_settled_goes_at_once() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, size=3)
    ledger.entries.note_read(*B)
    ledger.note_ack(*B, 3, made_up=False, topic=T)
    ledger.note_ack(*C, 3, made_up=False, topic=T)  # the entry is complete: nothing of it can reach the application here
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and hold_back.held == []


def test_one_active_every_member_goes_at_its_own_time() -> None:
    ledger, hold_back = _ledger(Sharing.ONE_ACTIVE), HoldBack()
    _nack(ledger, A)
    _nack(ledger, B)
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and hold_back.held == []
    assert ledger.state_of(A) is MessageState.HANDED_OFF and ledger.state_of(B) is MessageState.PENDING


def test_shared_a_refused_hold_back_closing_hands_the_entry_off_now() -> None:
    ledger = _ledger(Sharing.SHARED)
    _nack(ledger, A)
    _nack(ledger, B)
    ids, _ = ledger.hand_off({T: [(T, *A)]}, HoldBack(closed=True))
    assert len(ids) == 1 and ledger.state_of(A) is MessageState.HANDED_OFF


@pytest.mark.parametrize(
    ("consumer_type", "rule"),
    [(None, Sharing.ONE_ACTIVE), (pulsar.ConsumerType.Exclusive, Sharing.ONE_ACTIVE),
     (pulsar.ConsumerType.Failover, Sharing.ONE_ACTIVE), (pulsar.ConsumerType.Shared, Sharing.SHARED),
     (pulsar.ConsumerType.KeyShared, Sharing.SHARED)],
)  # fmt: skip
def test_subscribe_takes_the_sharing_from_the_consumer_type(consumer_type: Any, rule: Sharing) -> None:
    kwargs = {} if consumer_type is None else {"consumer_type": consumer_type}  # None: pulsar's default, Exclusive
    settings = subscribe_settings(kwargs, negative_ack_redelivery_delay_ms=1_000, negative_ack_precision_bit_cnt=8,
                                  redelivery_backoff=None, never_early=False)  # fmt: skip
    assert settings.sharing is rule


def test_the_setting_defaults_to_shared_and_refuses_a_wrong_type() -> None:
    assert ConsumerSettings().sharing is Sharing.SHARED
    with pytest.raises(TypeError, match="sharing"):
        ConsumerSettings(sharing="shared")  # type: ignore[arg-type]
