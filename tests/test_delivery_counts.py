"""Unit tests of DeliveryCounts.age: the counts of a message no longer counted here age out.

A stand-in message (only ``redelivery_count()``) is used: which consumer of a Shared
subscription settles a message is the broker's choice, so no broker run can pick the
message whose counts must age (tests/test_chaos_findings.py covers the effect end to end).
"""

from __future__ import annotations

from pulsar_nack.consumer.delivery_counts import DeliveryCounts
from pulsar_nack.consumer.subscription import Sharing


class Copy:
    """A received copy with the broker's redelivery count."""

    def __init__(self, count: int) -> None:
        self.count = count

    def redelivery_count(self) -> int:
        return self.count


A, B, C = (1, 1, -1), (1, 2, -1), (1, 3, -1)


def test_counts_not_renewed_for_a_generation_are_forgotten_and_the_tally_restarts_from_the_broker() -> None:
    counts = DeliveryCounts(3)
    for item in (A, B):
        assert not counts.counted_over(Copy(0), item)
        counts.note_nack(item)
    counts.age()
    assert counts.seen(Copy(0), A) == 1, "one age keeps the counts"
    assert not counts.counted_over(Copy(1), B)  # B is counted again: it stays young
    counts.age()
    assert counts.seen(Copy(0), A) == 0, "A was not counted for a generation: its counts are gone"
    assert counts.seen(Copy(0), B) == 2, "B was counted since: its tally stays"
    assert counts.seen(Copy(2), A) == 2, "A forgotten: the broker's redelivery count is its tally again"
    counts._check()


def test_a_message_at_its_last_delivery_or_with_its_dead_letter_on_its_way_does_not_age() -> None:
    counts = DeliveryCounts(1)
    assert not counts.counted_over(Copy(1), A)  # its last delivery
    assert not counts.counted_over(Copy(1), B)
    counts.reject(B)  # its dead letter is on its way
    for _ in range(3):
        counts.age()
    assert counts.has_last() and counts.seen(Copy(0), A) == 2
    assert counts.is_sending(B) and counts.seen(Copy(0), B) == 2
    counts._check()


def test_a_failed_dead_letter_is_taken_again_by_its_next_copy_and_does_not_age() -> None:
    counts = DeliveryCounts(1)
    assert not counts.counted_over(Copy(1), A)  # its last delivery
    assert counts.take_last(A) is not None  # its dead letter is on its way
    counts.dead_letter_failed(A)
    assert not counts.is_sending(A)
    for _ in range(3):
        counts.age()
    counts._check()
    assert counts.take_failed(A), "the next copy of a failed dead letter is routed again"
    assert counts.is_sending(A) and not counts.take_failed(A)
    counts.dead_letter_failed(A)
    counts.forget(A)  # settled (acked by the application, say)
    assert not counts.take_failed(A) and not counts.keeps_counts()
    counts._check()


def test_a_settled_message_leaves_both_generations() -> None:
    counts = DeliveryCounts(3)
    counts.note_nack(A)
    counts.age()
    counts.note_swallowed(C)
    counts.forget(A)
    counts.forget(C)
    assert not counts.keeps_counts()
    counts._check()  # no generation holds a message without counts


def test_on_a_shared_subscription_the_brokers_count_less_the_swallowed_copies_is_the_floor() -> None:
    """Another consumer's deliveries raise the broker's count: they count; this consumer's swallowed copies do not."""
    counts = DeliveryCounts(3, Sharing.SHARED)
    assert not counts.counted_over(Copy(0), A)
    counts.note_nack(A)
    counts.note_swallowed(A)  # a copy of A swallowed here: the broker counted it
    assert counts.seen(Copy(2), A) == 1, "the swallowed copy does not count"
    assert counts.seen(Copy(3), A) == 2, "a delivery elsewhere counts"
    assert counts.counted_over(Copy(5), A), "the broker's 5 less 1 swallowed: 4 deliveries, over 3"
    counts._check()


def test_with_one_active_consumer_the_tally_alone_decides_after_the_first_delivery() -> None:
    counts = DeliveryCounts(3, Sharing.ONE_ACTIVE)
    assert not counts.counted_over(Copy(0), A)
    counts.note_nack(A)
    assert counts.seen(Copy(5), A) == 1, "a broker count that jumped does not raise the tally"
    counts._check()
