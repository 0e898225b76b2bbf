"""The in-memory hold of early retry copies: due order, one copy per message, dropped across a reconnect.

Unit tests: the consumer's connection is a stand-in (a flag the test sets), since no broker
can be made to reconnect a consumer at an exact moment; ``tests/test_retry.py`` runs the same
rule on Apache Pulsar (``test_a_copy_held_in_memory_is_not_delivered_by_two_consumers_...``).
"""

from __future__ import annotations

import threading

from helpers import wait_for
from pulsar_nack.consumer.memory_hold import MemoryHold

KEY_A, KEY_B, KEY_C = ("t", 1, 1, 0), ("t", 1, 1, 1), ("t", 1, 2, -1)


class Link:
    """A stand-in for the retry topic's consumer's ``is_connected``, counting the looks."""

    def __init__(self) -> None:
        self.up = True
        self.looks = 0

    def __call__(self) -> bool:
        self.looks += 1
        return self.up


def hold(link: Link, now: list[int], hold_ms: int = 10_000) -> MemoryHold:
    return MemoryHold(lambda: now[0], link, hold_ms)


def test_copies_come_out_when_due_in_due_order_each_once() -> None:
    now, link = [1_000], Link()
    memory = hold(link, now)
    try:
        assert memory.keep(KEY_B, "b", 300) and memory.keep(KEY_A, "a", 200) and len(memory) == 2
        assert memory.take_due() == (None, 200) and memory.ms_to_next_due() == 200
        now[0] = 1_200
        assert memory.take_due() == ("a", 0) and memory.arrival("a") == 1_000 and memory.arrival("a") is None
        assert memory.take_due() == (None, 100)
        now[0] = 1_300
        assert memory.take_due() == ("b", 0) and memory.take_due() == (None, None) and len(memory) == 0
    finally:
        memory.close()


def test_a_second_copy_of_a_message_replaces_the_first_so_it_goes_out_once() -> None:
    now, link = [0], Link()
    memory = hold(link, now)
    try:
        assert memory.keep(KEY_A, "first", 100) and memory.keep(KEY_A, "again", 100) and len(memory) == 1
        now[0] = 100
        assert memory.take_due() == ("again", 0)
        assert memory.take_due() == (None, None)
    finally:
        memory.close()


def test_copies_kept_before_a_reconnect_are_dropped_and_those_of_the_new_connection_go_out() -> None:
    now, link = [0], Link()
    memory = hold(link, now)
    try:
        assert memory.keep(KEY_A, "a-old", 100) and memory.keep(KEY_B, "b-old", 100)
        link.up = False
        assert memory.keep(KEY_C, "c-while-down", 50) and len(memory) == 2  # dropped: from a connection that is gone
        link.up = True
        assert memory.keep(KEY_A, "a-new", 100)  # the broker's copy on the new connection
        now[0] = 100
        assert memory.take_due() == ("a-new", 0)
        assert memory.take_due() == (None, None), "b-old was kept before the reconnect and must be dropped"
    finally:
        memory.close()


def test_the_watcher_thread_sees_a_reconnect_that_begins_and_ends_between_keeping_and_taking() -> None:
    """The C++ client waits at least 100 ms before it reconnects: the watcher's looks fall in that gap."""
    now, link = [0], Link()
    memory = hold(link, now)
    try:
        assert memory.keep(KEY_A, "a", 5_000)
        looks = link.looks
        assert wait_for(lambda: link.looks > looks, 5), "the watcher thread does not look"
        link.up = False
        down_looks = link.looks
        assert wait_for(lambda: link.looks >= down_looks + 2, 0.1 + 5), "the watcher missed the gap"
        link.up = True
        now[0] = 5_000
        assert memory.take_due() == (None, None)
    finally:
        memory.close()


def test_close_drops_every_copy_and_stops_the_watcher() -> None:
    now, link = [0], Link()
    memory = hold(link, now)
    memory.keep(KEY_A, "a", 100)
    watchers = [t for t in threading.enumerate() if t.name == "pulsar-nack-hold-watch"]
    assert watchers
    memory.close()
    memory.close()
    assert len(memory) == 0 and memory.keep(KEY_B, "b", 10) and len(memory) == 0
    assert wait_for(lambda: not any(t.is_alive() for t in watchers), 5)


def test_a_copy_past_the_hold_does_not_fit_and_one_due_soon_always_does() -> None:
    now, link = [0], Link()
    memory = hold(link, now, hold_ms=1_000)
    try:
        assert not memory.keep(KEY_A, "a", 1_001)
        assert memory.keep(KEY_B, "b", 1_000) and len(memory) == 1
        unheld = hold(link, now, hold_ms=0)
        assert unheld.keep(KEY_C, "c", 100)  # within MEMORY_HOLD_MS, whatever the hold
        unheld.close()
    finally:
        memory.close()
