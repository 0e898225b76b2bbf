"""Per-method tests of TimeBuckets: layout, trimming, sealing, compact forms, bad input."""

from __future__ import annotations

import pytest
from pyroaring import BitMap64

from pulsar_nack.core import pages as _pages
from pulsar_nack.core.buckets import TimeBuckets
from pulsar_nack.core.keys import MAX_BATCH_INDEX, MAX_ID

T = "persistent://public/default/a"
U = "persistent://public/default/b"


def flat(due: dict) -> list:
    return [key for keys in due.values() for key in keys]


def test_floor_trimming_is_early_never_late():
    b = TimeBuckets(precision_bits=8)
    assert b.add((T, 1, 1, -1), 1000) == 768
    assert b.add((T, 1, 2, -1), 1023) == 768
    assert b.add((T, 1, 3, -1), 1024) == 1024
    b._check()
    assert b.pop_due(767) == {}
    assert flat(b.pop_due(768)) == [(T, 1, 1, -1), (T, 1, 2, -1)]
    assert flat(b.pop_due(1024)) == [(T, 1, 3, -1)]
    assert len(b) == 0 and b.bucket_count == 0
    b._check()


def test_round_up_is_never_early():
    b = TimeBuckets(precision_bits=8, round_up=True)
    assert b.add((T, 1, 1, -1), 1000) == 1024
    assert b.add((T, 1, 2, -1), 1024) == 1024
    assert b.add((T, 1, 3, -1), 1025) == 1280
    assert b.pop_due(1023) == {}
    assert flat(b.pop_due(1024)) == [(T, 1, 1, -1), (T, 1, 2, -1)]
    b._check()


def test_precision_zero_is_exact():
    b = TimeBuckets(precision_bits=0)
    for deadline in (5, 6, 7):
        assert b.add((T, 1, deadline, -1), deadline) == deadline
    assert flat(b.pop_due(6)) == [(T, 1, 5, -1), (T, 1, 6, -1)]
    b._check()


def test_pop_groups_by_topic_in_deadline_order():
    b = TimeBuckets(precision_bits=0)
    b.add((T, 1, 9, -1), 30)
    b.add((U, 1, 9, -1), 20)
    b.add((T, 1, 3, -1), 10)
    b.add((U, 1, 1, -1), 30)
    due = b.pop_due(100)
    assert due == {T: [(T, 1, 3, -1), (T, 1, 9, -1)], U: [(U, 1, 9, -1), (U, 1, 1, -1)]}


def test_topics_never_collide_on_equal_ledgers():
    b = TimeBuckets()
    b.add((T, 7, 1, -1), 0)
    b.add((U, 7, 1, -1), 0)
    b.add((T + "-partition-1", 7, 1, -1), 0)
    assert len(b) == 3
    assert sorted(flat(b.pop_due(0))) == sorted([(T, 7, 1, -1), (U, 7, 1, -1), (T + "-partition-1", 7, 1, -1)])


def test_duplicate_in_same_bucket_is_coalesced_but_other_bucket_is_not():
    b = TimeBuckets(precision_bits=0)
    b.add((T, 1, 1, -1), 10)
    b.add((T, 1, 1, -1), 10)
    b.add((T, 1, 1, 2), 10)
    b.add((T, 1, 1, 2), 10)
    assert len(b) == 2 and b.entries == 2  # the batched entry counts once per bucket... and the plain once
    b.add((T, 1, 1, -1), 20)
    assert len(b) == 3
    b._check()
    assert flat(b.pop_due(10)) == [(T, 1, 1, -1), (T, 1, 1, 2)]
    assert flat(b.pop_due(20)) == [(T, 1, 1, -1)]


def test_batch_indexes_of_one_entry_are_independent():
    b = TimeBuckets(precision_bits=0)
    b.add((T, 4, 100, 2), 300)
    b.add((T, 4, 100, 7), 1500)
    b.add((T, 4, 100, 3), 300)
    assert len(b) == 3 and b.entries == 2
    assert flat(b.pop_due(300)) == [(T, 4, 100, 2), (T, 4, 100, 3)]
    assert b.entries == 1
    assert flat(b.pop_due(1500)) == [(T, 4, 100, 7)]
    b._check()


@pytest.mark.parametrize(
    "key",
    [
        (T, MAX_ID, MAX_ID, -1),  # 64-bit plain entry
        (T, 0, 2**32, -1),  # just over 32 bits
        (T, 0, 2**32 - 1, -1),  # just under
        (T, 0, 2**22 - 1, 1023),  # largest packed batched value in 32 bits
        (T, 0, 2**22, 0),  # smallest packed batched value above 32 bits
        (T, 0, 2**53 - 1, 1023),  # largest packed batched value
        (T, 0, 2**53, 0),  # wide: entry too big to pack
        (T, 0, 5, 1024),  # wide: batch index too big to pack
        (T, 0, MAX_ID, MAX_BATCH_INDEX),  # both at the limit
        (T, 0, 65535, -1),
        (T, 0, 65536, -1),  # roaring container boundary
    ],
)
def test_full_id_range_round_trips_through_every_form(key):
    b = TimeBuckets(precision_bits=0, max_open_buckets=1)
    b.add(key, 5)
    b._check()
    b.add((U, 1, 1, -1), 6)  # seals the bucket at 5 (a one-value GAPS record in a page)
    b._check()
    b.add((U, 1, 1, -1), 5)  # unseals it
    b.add((U, 1, 2, -1), 7)  # seals it again, two streams in one record
    b._check()
    assert b.pop_due(5) == {T: [key], U: [(U, 1, 1, -1)]}
    b._check()


def test_bitmap_upgrades_to_64_bits_in_place():
    b = TimeBuckets(precision_bits=0)
    b.add((T, 1, 5, -1), 1)
    b.add((T, 1, 2**40, -1), 1)
    bucket = b._buckets[1]
    assert any(type(bm) is BitMap64 for bm in bucket.values())
    b._check()
    assert flat(b.pop_due(1)) == [(T, 1, 5, -1), (T, 1, 2**40, -1)]


def test_sealing_keeps_at_most_max_open_buckets_and_compacts_runs():
    b = TimeBuckets(precision_bits=0, max_open_buckets=2)
    for deadline in range(10):
        for entry in range(1000):
            b.add((T, 3, deadline * 1000 + entry, -1), deadline)
    b._check()
    assert len(b._open) == 2
    # The 8 sealed buckets share one page, in deadline order.
    pages = [(k, v) for k, v in b._buckets.items() if type(v) is bytes]
    assert len(pages) == 1 and [r[0] for r in _pages.records(*pages[0])] == list(range(8))
    # 1000 consecutive ids: one run, a few dozen bytes whatever the count.
    assert len(pages[0][1]) < 8 * 40
    # Adding to a sealed bucket unseals it (splitting its page) and seals the least recently written one.
    b.add((T, 3, 5_000_000, -1), 0)
    b._check()
    assert type(b._buckets[0]) is dict and len(b._open) == 2
    due = flat(b.pop_due(0))
    assert due[0] == (T, 3, 0, -1) and due[-1] == (T, 3, 5_000_000, -1) and len(due) == 1001
    assert len(flat(b.pop_due(9))) == 9000
    b._check()


def test_small_buckets_share_pages_at_a_few_bytes_each():
    b = TimeBuckets(precision_bits=0, max_open_buckets=1)
    for deadline in range(10_000):
        b.add((T, 1, deadline, -1), deadline)
    b.seal_all()
    b._check()
    assert all(type(v) is bytes for v in b._buckets.values())
    assert b.bucket_count == 10_000 and len(b._buckets) < 10_000 // 100  # pages, not one map slot per bucket
    # A page record: deadline delta, length, stream count, sid, payload length, the entry id.
    assert b.memory_bytes() / len(b) < 16
    # A pop in the middle of a page leaves the rest of it as a page keyed by its first deadline.
    assert flat(b.pop_due(4_999)) == [(T, 1, e, -1) for e in range(5_000)]
    b._check()
    assert b.peek_deadline() == 5_000 and len(b) == 5_000


def test_sparse_buckets_take_about_one_byte_per_message():
    b = TimeBuckets(precision_bits=10, max_open_buckets=1)
    entries = list(range(0, 1_000_000, 10))
    for i, entry in enumerate(entries):
        b.add((T, 1, entry, -1), i // 1000 * 1024)
    b.seal_all()
    b._check()
    assert b.memory_bytes() / len(b) < 1.2  # roaring array containers would take 2 B
    assert [k for _, k in b] == [(T, 1, e, -1) for e in entries]


def test_stream_ids_are_freed_and_reused():
    b = TimeBuckets(precision_bits=0)
    for ledger in range(50):
        b.add((T, ledger, 1, -1), ledger)
    assert len(b._stream_ids) == 50
    b.pop_due(49)
    assert not b._stream_ids and len(b._free_sids) == 50
    b.add((U, 99, 1, -1), 100)
    assert len(b._streams) == 50  # reused a freed id
    b._check()


def test_peek_iter_clear_and_memory():
    b = TimeBuckets(precision_bits=4)
    assert b.peek_deadline() is None and list(b) == [] and b.clear() == {}
    b.add((T, 1, 1, -1), 100)
    b.add((T, 1, 2, 5), 40)
    assert b.peek_deadline() == 32
    assert list(b) == [(32, (T, 1, 2, 5)), (96, (T, 1, 1, -1))]
    assert len(b) == 2  # iteration changes nothing
    assert b.memory_bytes() > 0
    assert flat(b.clear()) == [(T, 1, 2, 5), (T, 1, 1, -1)]
    assert len(b) == 0 and b.memory_bytes() < 2000
    b._check()


@pytest.mark.parametrize(
    ("key", "deadline", "error"),
    [
        ([T, 1, 2, -1], 0, TypeError),
        ((T, 1, 2), 0, TypeError),
        ((b"t", 1, 2, -1), 0, TypeError),
        ((T, 1.0, 2, -1), 0, TypeError),
        ((T, 1, "2", -1), 0, TypeError),
        ((T, True, 2, -1), 0, TypeError),
        ((T, 1, 2, None), 0, TypeError),
        ((T, -1, 2, -1), 0, ValueError),
        ((T, 1, -2, -1), 0, ValueError),
        ((T, 1, 2, -2), 0, ValueError),
        ((T, 2**63, 2, -1), 0, ValueError),
        ((T, 1, 2**63, -1), 0, ValueError),
        ((T, 1, 2, 2**31), 0, ValueError),
        ((T, 1, 2, -1), -5, ValueError),
        ((T, 1, 2, -1), 1.5, TypeError),
        ((T, 1, 2, -1), "5", TypeError),
    ],
)
def test_bad_input_raises_and_stores_nothing(key, deadline, error):
    b = TimeBuckets()
    b.add((T, 1, 1, -1), 0)
    before = list(b)
    with pytest.raises(error):
        b.add(key, deadline)
    assert list(b) == before
    b._check()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"precision_bits": -1}, ValueError),
        ({"precision_bits": 31}, ValueError),
        ({"precision_bits": 8.0}, TypeError),
        ({"precision_bits": True}, TypeError),
        ({"round_up": 1}, TypeError),
        ({"max_open_buckets": 0}, ValueError),
        ({"max_open_buckets": "4"}, TypeError),
    ],
)
def test_bad_configuration(kwargs, error):
    with pytest.raises(error):
        TimeBuckets(**kwargs)
