"""The batch handoff rule on the admission ledger alone (no broker): when an entry with nacked members goes back.

On a shared subscription (``Sharing.SHARED``) an entry waits for its last pending nacked
member, and while the application may still settle members of it (the member it was given
last is unsettled, or the entry was read from within ``COPY_DRAIN_MS``); with one active
consumer each member goes at its own time.

On a broker the rule's effect is tested end to end in tests/test_consumer.py
(``test_batch_siblings_retry_by_the_subscriptions_rule``) and tests/test_chaos_findings.py
(two consumers on one Shared subscription); these tests pin the ledger's steps: which keys
wait, until when, and that nothing is left behind.
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


def _nack(ledger: AdmissionLedger, item: tuple[int, int, int], in_ms: int, size: int = 10) -> int:
    """Nack *item* of an entry of *size* members; an entry whose every member is nacked here has no member left to settle."""
    assert ledger.note_nack(item, size, None)
    deadline = monotonic_ms() + in_ms
    ledger.note_deadline(item, deadline)
    return deadline


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


def test_shared_an_entry_waits_for_its_last_pending_member_then_goes_once() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, 300, size=2)
    last = _nack(ledger, B, 60_000, size=2)
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [], "an entry with a member pending for longer must not go back to the broker"
    assert hold_back.held == [((T, *A), last)], "the due member waits for the entry's last deadline"
    assert ledger.state_of(A) is MessageState.PENDING  # its copies are still swallowed meanwhile
    ids, _ = ledger.hand_off({T: [(T, *A), (T, *B)]}, hold_back)
    assert [(i.ledger_id(), i.entry_id()) for i in ids] == [(7, 1)]
    assert ledger.state_of(A) is ledger.state_of(B) is MessageState.HANDED_OFF
    ledger._check(0)


def test_shared_a_member_acked_meanwhile_leaves_the_wait_late_never_early_and_nothing_behind() -> None:
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, 300, size=3)
    _nack(ledger, B, 60_000, size=3)
    last = _nack(ledger, C, 90_000, size=3)
    ledger.note_ack(*C, 3, made_up=False, topic=T)  # the longest nack is acked: its deadline stays, late
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert ids == [] and hold_back.held == [((T, *A), last)]
    ledger.note_ack(*B, 3, made_up=False, topic=T)  # no member pending but the waiting one
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and ledger.state_of(A) is MessageState.HANDED_OFF
    hold_back.held.clear()
    _nack(ledger, A, 300, size=3)  # nacked again: the entry's record went with its last pending member
    again = _nack(ledger, B, 400, size=3)
    assert ledger.hand_off({T: [(T, *A)]}, hold_back)[0] == []
    # The first member's deadline is not kept: the entry waits for the latest deadline noted for any member (C's), late.
    assert hold_back.held == [((T, *A), last)] and last > again
    ledger._check(0)


def test_shared_an_entry_with_one_pending_member_keeps_no_record() -> None:
    """The rule's memory is for entries with several pending members only: one nacked member per entry adds nothing."""
    ledger = _ledger(Sharing.SHARED)
    for entry in range(100):
        _nack(ledger, (7, entry, 3), 300)
    assert ledger.waiting_entries() == 0
    _nack(ledger, (7, 5, 4), 600)
    assert ledger.waiting_entries() == 1


def test_shared_an_entry_waits_while_the_application_holds_a_member_it_was_given() -> None:
    """A member nacked after its entry went back could reach another consumer first, and come early there."""
    ledger, hold_back = _ledger(Sharing.SHARED), HoldBack()
    _nack(ledger, A, 0, size=3)
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
    _nack(ledger, A, 0, size=3)
    ledger.entries.note_read(*B)
    ledger.note_ack(*B, 3, made_up=False, topic=T)
    ledger.note_ack(*C, 3, made_up=False, topic=T)  # the entry is complete: nothing of it can reach the application here
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and hold_back.held == []


def test_one_active_every_member_goes_at_its_own_time() -> None:
    ledger, hold_back = _ledger(Sharing.ONE_ACTIVE), HoldBack()
    _nack(ledger, A, 300)
    _nack(ledger, B, 60_000)
    ids, _ = ledger.hand_off({T: [(T, *A)]}, hold_back)
    assert len(ids) == 1 and hold_back.held == []
    assert ledger.state_of(A) is MessageState.HANDED_OFF and ledger.state_of(B) is MessageState.PENDING


def test_shared_a_refused_hold_back_closing_hands_the_entry_off_now() -> None:
    ledger = _ledger(Sharing.SHARED)
    _nack(ledger, A, 300)
    _nack(ledger, B, 60_000)
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
