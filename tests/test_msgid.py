"""Reading a message id in one call: ``pulsar_nack.consumer._msgid`` (C) and its pure-Python stand-in.

``parse_id`` decodes ``MessageId.serialize()``; ``message_key`` is the consumer's nack fast
path. Both forms must agree with the client's own getters on every id, and refuse what is
not a serialized id. The C tests skip when the extension was not built (``.ci/run``
checks that it was).
"""

from __future__ import annotations

import _pulsar
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import _varint, produce
from pulsar_nack import subscribe
from pulsar_nack.consumer import msgid as _msgid
from pulsar_nack.testing import quiet_client

PARSERS = [pytest.param(_msgid.py_parse_id, id="python")]
if _msgid.MSGID:
    PARSERS.append(pytest.param(_msgid.parse_id, id="c"))

ids = st.tuples(
    st.integers(-1, 2**31 - 1),  # partition
    st.integers(0, 2**63 - 1),  # ledger
    st.integers(0, 2**63 - 1),  # entry
    st.integers(-1, 2**31 - 1),  # batch index
)


def getters(message_id: _pulsar.MessageId) -> tuple[int, int, int, int]:
    return message_id.ledger_id(), message_id.entry_id(), message_id.partition(), message_id.batch_index()


@pytest.mark.parametrize("parse", PARSERS)
@given(fields=ids)
def test_parse_id_agrees_with_the_clients_getters(parse, fields) -> None:
    message_id = _pulsar.MessageId(*fields)
    assert parse(message_id.serialize())[:4] == getters(message_id)


@pytest.mark.parametrize("parse", PARSERS)
@given(fields=ids, size=st.integers(1, 2**31 - 1), ack_set=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
def test_parse_id_reads_the_batch_size_and_skips_other_fields(parse, fields, size, ack_set) -> None:
    partition, ledger, entry, index = fields
    data = _message_id_data(
        [(1, ledger), (2, entry), (3, partition), (4, index)] + [(5, word) for word in ack_set] + [(6, size)]
    )
    chunk = _message_id_data([(1, 7), (2, 8)])
    data += _varint(7 << 3 | 2) + _varint(len(chunk)) + chunk  # first_chunk_message_id: skipped
    assert parse(data) == (ledger, entry, partition, index, size)


@pytest.mark.parametrize("parse", PARSERS)
def test_earliest_and_latest_parse_as_the_client_reads_them(parse) -> None:
    for message_id in (_pulsar.MessageId.earliest, _pulsar.MessageId.latest):
        assert parse(message_id.serialize())[:4] == getters(message_id)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    "data",
    [
        b"",  # no fields
        bytes.fromhex("0805"),  # no entry id
        bytes.fromhex("1007"),  # no ledger id
        bytes.fromhex("08"),  # truncated tag value
        bytes.fromhex("0805100780"),  # truncated varint
        bytes.fromhex("08" + "ff" * 10 + "01" + "1007"),  # varint longer than 10 bytes
        bytes.fromhex("0805100722"),  # length-delimited field without its length
        bytes.fromhex("080510072205aa"),  # length beyond the end
        bytes.fromhex("0805100729aabb"),  # 64-bit field cut short
        bytes.fromhex("080510073d"),  # 32-bit field cut short
        bytes.fromhex("0805100713"),  # a group (wire type 3): not in MessageIdData
    ],
)
def test_parse_id_refuses_what_is_not_a_serialized_id(parse, data) -> None:
    with pytest.raises(ValueError, match="not a serialized Pulsar message id"):
        parse(data)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("data", ["0805", bytearray(b"\x08\x05\x10\x07"), None, 5])
def test_parse_id_wants_bytes(parse, data) -> None:
    with pytest.raises(TypeError, match="data must be bytes"):
        parse(data)


@pytest.mark.broker
@pytest.mark.parametrize("batch_size", [0, 4])
def test_message_key_reads_received_messages_as_the_getters_do(apache_broker, topic, batch_size) -> None:
    """On Apache Pulsar: plain and batched messages of a partitioned topic, both readers."""
    topic = apache_broker.create_partitioned_topic(topic, 2)
    client = quiet_client(apache_broker.url)
    try:
        consumer = subscribe(client, topic, "keys")
        produce(client, topic, [b"m%d" % i for i in range(8)], batch_size=batch_size)
        for _ in range(8):
            inner = consumer.receive(10_000)._message
            message_id = inner.message_id()
            expected = (inner.topic_name(), message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
            assert expected[0].startswith(topic + "-partition-")
            assert (expected[3] >= 0) == bool(batch_size)
            assert _msgid.py_message_key(inner) == expected
            assert _msgid.message_key(inner) == expected
            consumer.acknowledge(inner)
        consumer.close()
    finally:
        client.close()


def _message_id_data(fields: list[tuple[int, int]]) -> bytes:
    return b"".join(_varint(number << 3) + _varint(value) for number, value in fields)


KEY_READERS = [pytest.param(_msgid.py_received_key, id="python")]
if _msgid.MSGID:
    KEY_READERS.append(pytest.param(_msgid.received_key, id="c"))


class _Received:
    """A received ``_pulsar.Message`` stand-in: an id and a topic."""

    def __init__(self, data: bytes) -> None:
        self._id = _pulsar.MessageId.deserialize(data)

    def message_id(self) -> _pulsar.MessageId:
        return self._id

    def topic_name(self) -> str:
        return "persistent://public/default/t"


class _Wrapper:
    """A ``pulsar.Message`` stand-in that keeps attributes."""


@pytest.mark.parametrize("received_key", KEY_READERS)
@pytest.mark.parametrize("kept", [False, True], ids=["read", "kept"])
def test_received_key_reads_the_first_chunk_from_the_same_bytes(received_key, kept) -> None:
    """A nack reads a message's id once: the key and, for a chunked message, its first chunk's entry."""
    first = _message_id_data([(1, 7), (2, 8)])
    chunked = _message_id_data([(1, 7), (2, 10)]) + _varint(7 << 3 | 2) + _varint(len(first)) + first
    plain = _message_id_data([(1, 7), (2, 11), (4, 2), (6, 5)])
    for data, expected in ((chunked, ("persistent://public/default/t", 7, 10, -1, 0, (7, 8))),
                           (plain, ("persistent://public/default/t", 7, 11, 2, 5, None))):
        wrapper = _Wrapper()
        if kept:
            vars(wrapper)[_msgid.STASH] = data
        assert received_key(_Received(data), wrapper) == expected


# ---------------------------------------------------------------- native id reads (native_ids, _native_id.h)

NATIVE = pytest.mark.skipif(not _msgid.NATIVE_IDS, reason="native id reads are off (test_native_reads_are_on_... says why)")


def _serialized_fields(inner: _pulsar.Message) -> tuple[int, int, int, int, int]:
    return _msgid.py_parse_id(inner.message_id().serialize())


@pytest.mark.skipif(not _msgid.MSGID, reason="the C reader was not built")
def test_native_reads_are_on_with_every_supported_client() -> None:
    """Every supported pulsar-client (3.9 and later) offers the conduit and the accessors: bound once
    at import; unbinding and binding again is allowed."""
    c = _msgid._c
    assert _msgid.NATIVE_IDS and c.native_bound(), "a check of pulsar_nack.consumer.native_ids.bind failed"
    _msgid.native_ids.unbind(c)
    try:
        assert not c.native_bound() and c.native_fields(_pulsar.Message()) is None
    finally:
        assert _msgid.native_ids.bind(c)
    assert c.native_fields(_pulsar.Message()) == _serialized_fields(_pulsar.Message())


@NATIVE
def test_native_reads_refuse_what_is_not_a_received_message() -> None:
    """Another type, a stand-in, a wrapper: None (the reader falls back to the bindings), never a crash."""
    c = _msgid._c
    for thing in (None, 5, b"x", _pulsar.MessageId(1, 2, 3, 4), _Received(_message_id_data([(1, 7), (2, 8)]))):
        assert c.native_fields(thing) is None


@NATIVE
@pytest.mark.broker
@pytest.mark.parametrize("partitions", [0, 2], ids=["topic", "partitioned"])
@pytest.mark.parametrize("batch_size", [0, 4], ids=["unbatched", "batched"])
def test_native_reads_agree_with_serialize_on_received_messages(apache_broker, topic, partitions, batch_size) -> None:
    """Every field of every received message (plain, batched, of a partition, through a multi-topic
    consumer) reads natively as ``serialize()`` says, and the C table's reads agree."""
    topics = [apache_broker.create_partitioned_topic(topic, partitions) if partitions else topic, topic + "-b"]
    client = quiet_client(apache_broker.url)
    try:
        consumer = client.subscribe(topics, "native")
        for name in topics:
            produce(client, name, [b"m%d" % i for i in range(8)], batch_size=batch_size)
        seen = []
        for _ in range(16):
            inner = consumer.receive(10_000)._message
            seen.append(_msgid._c.native_fields(inner))
            assert seen[-1] == _serialized_fields(inner)
            assert _msgid.message_key(inner) == _msgid.py_message_key(inner)
            assert _msgid.received_key(inner, _Wrapper()) == _msgid.py_received_key(inner, _Wrapper())
            consumer.acknowledge(inner)
        assert {fields[3] >= 0 for fields in seen} == {bool(batch_size)}
        assert bool(partitions) == any(fields[2] >= 0 for fields in seen)
        consumer.close()
    finally:
        client.close()

