"""The sealed-page codec (pulsar_nack/core/pages.py): round trips, and C and Python agree byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64

from pulsar_nack.core import accel as _accel
from pulsar_nack.core import pages as _pages

values = st.one_of(
    st.sets(st.integers(0, 300), min_size=1, max_size=60),
    st.sets(st.integers(0, 2**32 - 1), min_size=1, max_size=60),
    st.sets(st.integers(0, 2**64 - 1), min_size=1, max_size=60),
    st.builds(
        lambda a, n, step: set(range(a, a + n * step, step)),
        st.integers(0, 2**20),
        st.integers(1, 3000),
        st.sampled_from([1, 2, 10, 127, 128, 200]),
    ),
)


def bitmap_of(vals: set[int]) -> BitMap | BitMap64:
    return (BitMap if max(vals) < 2**32 else BitMap64)(vals)


@given(values)
def test_every_codec_round_trips_and_the_smallest_is_chosen(vals):
    bitmap = bitmap_of(vals)
    codec, payload = _pages.encode_values(bitmap.copy())
    assert list(_pages.decode_values(codec, payload)) == sorted(vals)
    roaring = bitmap.copy()
    roaring.run_optimize()
    assert len(payload) <= len(roaring.serialize())


@given(values)
def test_gap_payloads_are_the_same_in_c_and_python(vals):
    array = bitmap_of(vals).to_array()
    python = _pages._encode_gaps_py(array)
    assert _pages._decode_gaps_py(python) == sorted(vals)
    if _accel.encode_gaps is not None:
        assert _accel.encode_gaps(array) == python
        assert _accel.decode_gaps(python) == sorted(vals)


@pytest.mark.skipif(_accel.decode_gaps is None, reason="pulsar_nack.core._speedups is not built")
@pytest.mark.parametrize("payload", [b"", b"\x80", b"\x05\xff", b"\xff" * 10 + b"\x01"])
def test_corrupt_gap_payloads_are_refused_in_c(payload):
    if payload == b"":
        assert _accel.decode_gaps(payload) == []
        return
    with pytest.raises(ValueError, match="corrupt"):
        _accel.decode_gaps(payload)


def test_a_page_tail_is_a_page_keyed_by_its_first_record():
    bodies = [(1000 + 7 * i, _pages.encode_body([(i, BitMap([i, i + 1]))])) for i in range(5)]
    page = _pages.build(1000, bodies)
    records = _pages.records(1000, page)
    assert [r[0] for r in records] == [d for d, _ in bodies]
    tail = _pages.tail(page, 1000, records[2][0], records[2][1])
    assert [r[0] for r in _pages.records(records[2][0], tail)] == [d for d, _ in bodies[2:]]
    grown = _pages.append(tail, records[2][0], 2000, bodies[0][1])
    assert [r[0] for r in _pages.records(records[2][0], grown)][-1] == 2000


@given(st.lists(st.integers(1, 300), min_size=1, max_size=400))
def test_pack_makes_the_pages_sealing_one_bucket_at_a_time_makes(sizes):
    """The tail log's buckets (packed at once) and sealed buckets (appended one by one) share one writer."""
    bodies = [(1000 + 3 * i, _pages.encode_body([(1, list(range(0, 2 * n, 2)))])) for i, n in enumerate(sizes)]
    one_at_a_time: list[tuple[int, bytes]] = []
    for deadline, body in bodies:
        joined = _pages.append(one_at_a_time[-1][1], one_at_a_time[-1][0], deadline, body) if one_at_a_time else None
        if joined is None:
            one_at_a_time.append((deadline, _pages.build(deadline, [(deadline, body)])))
        else:
            one_at_a_time[-1] = (one_at_a_time[-1][0], joined)
    packed = _pages.pack(bodies)
    assert packed == one_at_a_time
    assert all(len(page) <= _pages.PAGE_BYTES or len(_pages.records(key, page)) == 1 for key, page in packed)
    assert [r[0] for key, page in packed for r in _pages.records(key, page)] == [d for d, _ in bodies]
