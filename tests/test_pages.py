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
    [(key, page)] = _pages.pack(bodies)
    records = _pages.records(key, page)
    assert key == 1000 and [r[0] for r in records] == [d for d, _ in bodies]
    tail = _pages.tail(page, 1000, records[2][0], records[2][1])
    assert [r[0] for r in _pages.records(records[2][0], tail)] == [d for d, _ in bodies[2:]]
    [(grown_key, grown)] = _pages.pack([(2000, bodies[0][1])], records[2][0], tail)
    assert grown_key == records[2][0] and [r[0] for r in _pages.records(grown_key, grown)][-1] == 2000


@given(st.lists(st.integers(1, 300), min_size=1, max_size=400), st.booleans())
def test_pack_makes_the_pages_sealing_one_bucket_at_a_time_makes(sizes, grow):
    """The tail log's buckets (packed at once) and sealed buckets (one by one) get the same pages, in C and Python."""
    bodies = [(1000 + 3 * i, _pages.encode_body([(1, list(range(0, 2 * n, 2)))])) for i, n in enumerate(sizes)]
    start: list[tuple[int, bytes]] = _pages.pack(bodies[:1]) if grow else []
    rest = bodies[1:] if grow else bodies
    one_at_a_time = list(start)
    for deadline, body in rest:
        key, page = one_at_a_time[-1] if one_at_a_time else (-1, None)
        one_at_a_time[-1:] = _pages.pack([(deadline, body)], key, page)
    packed = start[:-1] + _pages.pack(rest, *(start[-1] if start else (-1, None)))
    assert packed == one_at_a_time == start[:-1] + _pages._pack_py(rest, *(start[-1] if start else (-1, None)), _pages.PAGE_BYTES)
    assert all(len(page) <= _pages.PAGE_BYTES or len(_pages.records(key, page)) == 1 for key, page in packed)
    assert [r[0] for key, page in packed for r in _pages.records(key, page)] == [d for d, _ in bodies]


@pytest.mark.skipif(not _accel.SPEEDUPS, reason="pulsar_nack.core._speedups is not built")
@given(st.lists(st.tuples(st.integers(0, 2**20), st.binary(max_size=300)), max_size=20))
def test_body_framing_is_the_same_in_c_and_python(streams):
    assert _accel.frame_body(streams) == _pages._frame_body_py(streams)


@pytest.mark.parametrize("framing", ["c", "python"])
def test_a_page_grows_to_exactly_page_bytes_and_no_further(framing):
    if framing == "c" and not _accel.SPEEDUPS:
        pytest.skip("pulsar_nack.core._speedups is not built")
    pack = _accel.pack if framing == "c" else _pages._pack_py
    first = b"a" * 2000  # record: uvarint(0), uvarint(2000) (2 bytes), body: 2,003 bytes after the page's 1-byte header
    fitting = b"b" * (_pages.PAGE_BYTES - 1 - 2003 - 3)  # uvarint(1), uvarint(len) (2 bytes), body
    [(key, page)] = pack([(0, first), (1, fitting)], -1, None, _pages.PAGE_BYTES)
    assert (key, len(page)) == (0, _pages.PAGE_BYTES)
    pages = pack([(0, first), (1, fitting + b"b")], -1, None, _pages.PAGE_BYTES)
    assert [key for key, _ in pages] == [0, 1] and len(pages[0][1]) == 2004
    assert pack([(1, fitting)], 0, pages[0][1], _pages.PAGE_BYTES) == [(0, page)]  # growing a given page: the same rule
