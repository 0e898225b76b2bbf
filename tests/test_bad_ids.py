"""Ids that cannot be a message's (``MessageId.earliest``, ``latest``, negative fields): ValueError, nothing changes.

``read_id`` (pulsar_nack/consumer/msgid.py) is the consumers' reader of an id given to
``acknowledge``, ``acknowledge_cumulative``, ``negative_acknowledge`` and ``reconsume_later``.
It parses with the C ``parse_id`` when built, else with the pure-Python ``py_parse_id``:
both paths are run here, the unit tests by passing the parser, the broker tests by
replacing the module's parser for the test.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack.asyncio
from helpers import produce, wait_for
from pulsar_nack import subscribe
from pulsar_nack.consumer import msgid as _msgid
from pulsar_nack.testing import quiet_client

PARSERS = [pytest.param(_msgid.py_parse_id, id="python")]
if _msgid.MSGID:
    PARSERS.append(pytest.param(_msgid.parse_id, id="c"))

INT64_MAX = 2**63 - 1
# (id, what the error names): _pulsar.MessageId takes (partition, ledger, entry, batch_index)
BAD_IDS = [
    pytest.param(pulsar.MessageId.earliest, "MessageId.earliest", id="earliest"),
    pytest.param(pulsar.MessageId.latest, "MessageId.latest", id="latest"),
    pytest.param(_pulsar.MessageId(-1, -1, -1, -1), "MessageId.earliest", id="earliest-made"),
    pytest.param(_pulsar.MessageId(0, -5, 3, -1), "ledger_id -5", id="negative-ledger"),
    pytest.param(_pulsar.MessageId(0, 5, -3, -1), "entry_id -3", id="negative-entry"),
    pytest.param(_pulsar.MessageId(-3, 5, 3, -1), "partition -3", id="partition-below-minus-1"),
    pytest.param(_pulsar.MessageId(0, 5, 3, -7), "batch_index -7", id="batch-index-below-minus-1"),
    pytest.param(pulsar.MessageId(0, 5, -3, -1), "entry_id -3", id="wrapper-negative-entry"),
    pytest.param(_pulsar.MessageId(0, -(2**63), 3, -1), "ledger_id -9223372036854775808", id="int64-min-ledger"),
]


def test_earliest_and_latest_are_what_the_reader_says() -> None:
    """The sentinels' fields, as the client reads them (what read_id's rules rest on)."""
    earliest, latest = pulsar.MessageId.earliest, pulsar.MessageId.latest
    assert (earliest.ledger_id(), earliest.entry_id(), earliest.partition(), earliest.batch_index()) == (-1, -1, -1, -1)
    assert (latest.ledger_id(), latest.entry_id(), latest.partition(), latest.batch_index()) == (
        INT64_MAX, INT64_MAX, -1, -1)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(("message_id", "what"), BAD_IDS)
def test_read_id_refuses_ids_of_no_message(parse, message_id, what) -> None:
    with pytest.raises(ValueError, match=rf"^message must be the id of a message, not .*{what}$"):
        _msgid.read_id(message_id, parse)


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    "fields",
    [(-1, 0, 0, -1), (3, 0, 0, 0), (-1, INT64_MAX, 0, -1), (-1, 0, INT64_MAX, 2**31 - 1), (2**31 - 1, 7, 8, 9)],
)
def test_read_id_reads_ids_that_can_be_a_message(parse, fields) -> None:
    """Edge values that a message may have (a single sentinel field is not the sentinel): read as the getters do."""
    message_id = _pulsar.MessageId(*fields)
    partition, ledger, entry, index = fields
    assert _msgid.read_id(message_id, parse)[:4] == (ledger, entry, partition, index)


@pytest.fixture(params=PARSERS)
def reader(request, monkeypatch) -> Any:
    """The consumers read ids through this parser for the test (C, or the pure-Python fallback)."""
    monkeypatch.setattr(_msgid, "parse_id", request.param)
    return request.param


def _timer_settled(consumer: Any) -> bool:
    """The timer thread woke for the pending nack (it now sleeps until it is due, about 60 s)."""
    return consumer.stats()["tracker"]["timer_wakeups"] >= 1


def _calls(consumer: Any) -> dict[str, Any]:
    return {
        "negative_acknowledge": consumer.negative_acknowledge,
        "acknowledge": consumer.acknowledge,
        "acknowledge_cumulative": consumer.acknowledge_cumulative,
        "reconsume_later": consumer.reconsume_later,
    }


@pytest.mark.broker
def test_blocking_consumer_refuses_ids_of_no_message_and_changes_nothing(apache_broker, topic, reader) -> None:
    client = quiet_client(apache_broker.url)
    try:
        consumer = subscribe(client, topic, "bad-ids", consumer_type=pulsar.ConsumerType.Shared,
                             retry_enable=True, negative_ack_redelivery_delay_ms=200)
        produce(client, topic, [b"a", b"b"])
        first = consumer.receive(10_000)
        consumer.negative_acknowledge(first, delay_ms=60_000)  # pending throughout: state for "nothing changes"
        assert wait_for(lambda: _timer_settled(consumer))
        before = consumer.stats()
        for param in BAD_IDS:
            message_id, what = param.values
            for name, call in _calls(consumer).items():
                with pytest.raises(ValueError, match=what):
                    call(message_id)
                assert consumer.stats() == before, f"{name}({param.id}) changed the consumer's stats"
        # It still works: the other message, nacked and back, then acked.
        second = consumer.receive(10_000)
        consumer.negative_acknowledge(second, delay_ms=100)
        again = consumer.receive(10_000)
        assert again.data() == second.data() == b"b"
        consumer.acknowledge(again)
        assert consumer.stats()["acked"] == 1 and consumer.stats()["nacked"] == 2
        consumer.close()
    finally:
        client.close()


@pytest.mark.broker
def test_asyncio_consumer_refuses_ids_of_no_message_and_changes_nothing(apache_broker, reader) -> None:
    topic = f"persistent://public/default/aio-bad-{uuid.uuid4().hex[:10]}"
    plain = quiet_client(apache_broker.url)

    async def scenario() -> None:
        client = pulsar.asyncio.Client(apache_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            consumer = await pulsar_nack.asyncio.subscribe(
                client, topic, "bad-ids", consumer_type=pulsar.ConsumerType.Shared, retry_enable=True,
                initial_position=pulsar.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=200)
            produce(plain, topic, [b"a", b"b"])
            first = await asyncio.wait_for(consumer.receive(), 10)
            await consumer.negative_acknowledge(first, delay_ms=60_000)
            assert wait_for(lambda: _timer_settled(consumer))
            before = consumer.stats()
            for param in BAD_IDS:
                message_id, what = param.values
                for name, call in _calls(consumer).items():
                    with pytest.raises(ValueError, match=what):
                        await call(message_id)
                    assert consumer.stats() == before, f"{name}({param.id}) changed the consumer's stats"
            second = await asyncio.wait_for(consumer.receive(), 10)
            await consumer.negative_acknowledge(second, delay_ms=100)
            again = await asyncio.wait_for(consumer.receive(), 10)
            assert again.data() == second.data() == b"b"
            await consumer.acknowledge(again)
            assert consumer.stats()["acked"] == 1 and consumer.stats()["nacked"] == 2
            await consumer.close()
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        plain.close()
