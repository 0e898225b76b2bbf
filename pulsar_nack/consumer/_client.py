"""The one seam between pulsar-nack and pulsar-client's private surface.

Every use of a private name of ``pulsar`` or ``_pulsar`` lives here and nowhere else
(``tests/test_client_seam.py`` greps the package for it): the ``_pulsar`` extension
module and its types, the wrappers' inner objects (``pulsar.Message._message``,
``pulsar.MessageId._msg_id``, ``pulsar.Consumer._consumer``, ``._schema`` and
``._client``, ``pulsar.Client._client``, ``pulsar.asyncio.Consumer._consumer``) and the
body of ``pulsar.Consumer.receive``, which :func:`wrap_message` repeats. Methods called
on the raw objects (``_pulsar.Consumer.acknowledge_async``, ...) are checked here too,
by name (:data:`_RAW_NAMES`), though the callers call them.

Why reach in at all
    The consumers receive, acknowledge and hand off ids on the ``_pulsar.Consumer``
    directly (a wrapper call less per message, and the timer thread never enters
    ``pulsar.asyncio``); the handoff needs an entry-level id with its topic set
    (``_pulsar.MessageId(partition, ledger, entry, -1)`` and its ``topic_name(str)``
    setter), which the public API cannot build; and dead letters are built and sent on
    the C++ client's asynchronous calls (``create_producer_async``, ``send_async``,
    ``acknowledge_async``), which ``pulsar.Client`` does not offer, so that no thread
    waits on the network.

Supported clients
    :data:`SUPPORTED` (also ``pulsar-client`` in ``pyproject.toml``). Importing this
    module checks that the client has every name used here (:func:`missing_names`)
    and raises :class:`~pulsar_nack.errors.UnsupportedClientError` otherwise, naming
    the version found and the range. The oldest supported release is 3.9.0 (see
    :data:`MIN_VERSION`; 3.3.0 brought ``batch_index_ack_enabled``); :func:`load_asyncio`
    too (:data:`ASYNCIO_MIN_VERSION`). ``tools/client_matrix.py`` runs the consumer tests
    on the oldest and the newest.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import operator
import warnings
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeAlias

import pulsar

from ..errors import UnsupportedClientError

try:
    import _pulsar
except ImportError:  # pragma: no cover (every pulsar-client has it; check_client says what is missing)
    _pulsar = None

__all__ = [
    "MESSAGE_ID_TYPES",
    "MESSAGE_TYPE",
    "NEXT_MAJOR",
    "SUPPORTED",
    "RawClient",
    "RawMessage",
    "RawMessageId",
    "RawProducer",
    "async_get_last_message_id",
    "async_redeliver_unacknowledged",
    "build_message",
    "check_client",
    "client_version",
    "consumer_client",
    "consumer_schema",
    "earliest_subscription_configuration",
    "entry_id",
    "inner_message",
    "is_ok",
    "is_raw_message",
    "is_raw_message_id",
    "load_asyncio",
    "message_receiver",
    "missing_names",
    "native_probe",
    "plain_producer_configuration",
    "raw_client",
    "raw_consumer",
    "raw_id",
    "raw_message_id",
    "received",
    "retry_producer_configuration",
    "shared_listener_configuration",
    "unwrap_message",
    "wrap_message",
]

MIN_VERSION = (3, 9, 0)
"""The oldest pulsar-client the blocking consumer supports: the handoff id's topic setter
(``_pulsar.MessageId.topic_name(str)``, 3.8.0) and the dead-letter path's asynchronous calls
(``_pulsar.Consumer.acknowledge_async``, ``_pulsar.Client.subscribe_async``, 3.9.0)."""
ASYNCIO_MIN_VERSION = (3, 9, 0)
"""The oldest for :mod:`pulsar_nack.asyncio`: the first ``pulsar.asyncio.Consumer``. What it lacks
before 3.10.0 (``get_last_message_id``, ``redeliver_unacknowledged_messages``) is done on the
``_pulsar.Consumer`` inside (:func:`async_get_last_message_id`, :func:`async_redeliver_unacknowledged`)."""
NEXT_MAJOR = 4
"""The first major release not supported (not released when this was written)."""
SUPPORTED = f">={'.'.join(map(str, MIN_VERSION))},<{NEXT_MAJOR}"
"""The supported range, as in ``pyproject.toml``."""

# Names that must exist, per owner. Instance attributes (``_consumer``, ``_message``, ...)
# are set inside the client's methods, so they are looked for in those methods' code.
_RAW_NAMES = {
    "Message": (
        "message_id", "topic_name", "redelivery_count", "data", "properties", "partition_key", "ordering_key",
        "event_timestamp", "publish_timestamp",
    ),
    "MessageId": ("ledger_id", "entry_id", "batch_index", "partition", "serialize", "topic_name"),
    "Consumer": (
        "receive", "acknowledge", "acknowledge_async", "negative_acknowledge", "is_connected", "close_async",
        "redeliver_unacknowledged_messages", "get_last_message_id", "unsubscribe", "close",
        "pause_message_listener", "resume_message_listener",
    ),
    "Client": ("subscribe_async", "create_producer_async", "subscribe", "get_topic_partitions"),
    "Producer": ("send_async", "close_async", "close"),
    "MessageBuilder": ("content", "property", "partition_key", "ordering_key", "build", "event_timestamp", "deliver_after"),
    "ProducerConfiguration": ("batching_enabled", "block_if_queue_full", "schema", "chunking_enabled"),
    "ConsumerConfiguration": (
        "subscription_initial_position", "consumer_type", "negative_ack_redelivery_delay_ms", "message_listener",
        "receiver_queue_size", "consumer_name", "batch_index_ack_enabled",
    ),
    "ConsumerType": ("Shared",),
    "Result": ("Ok",),
    "InitialPosition": ("Earliest",),
}
_SUBSCRIBE_KEYWORDS = ("negative_ack_redelivery_delay_ms", "batch_index_ack_enabled", "message_listener")
_ASYNC_CONSUMER_METHODS = (
    "receive", "acknowledge", "acknowledge_cumulative", "seek", "unsubscribe", "close", "topic",
    "subscription_name", "consumer_name",
)  # fmt: skip


def client_version(module: ModuleType | None = None) -> str:
    """The installed pulsar-client's version, or *module*'s ``__version__`` (a stand-in's).

    >>> client_version().count(".") >= 2
    True
    """
    if module is not None:
        return str(getattr(module, "__version__", "unknown"))
    try:
        return importlib.metadata.version("pulsar-client")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(pulsar, "__version__", "unknown"))


def _version_tuple(version: str) -> tuple[int, ...]:
    """``(3, 13, 0)`` for ``"3.13.0"``; non-numeric parts end it (``"4.0.0rc1"`` -> ``(4, 0)``)."""
    parts: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _missing_attrs(owner: Any, label: str, names: Iterable[str]) -> list[str]:
    """``label.name`` for each of *names* that *owner* lacks; none for a missing owner (reported once, by its parent)."""
    return [] if owner is None else [f"{label}.{name}" for name in names if not hasattr(owner, name)]


def _member(owner: Any, name: str) -> Any:
    """``owner.name``, or None if *owner* is None or lacks it."""
    return None if owner is None else getattr(owner, name, None)


def _missing_in_code(function: Any, label: str, names: Iterable[str]) -> list[str]:
    """The instance attributes among *names* that *function*'s code does not use (none for a missing function)."""
    if function is None:
        return []
    code = getattr(function, "__code__", None)
    used = set(code.co_names) if code is not None else set()
    return [f"{label} using .{name}" for name in names if name not in used]


def _missing_keywords(function: Any, label: str, names: Iterable[str]) -> list[str]:
    if function is None:
        return []
    try:
        parameters: Iterable[str] = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = ()
    return [f"{label}({name}=...)" for name in names if name not in parameters]


def _missing_entry_id(raw_module: Any) -> list[str]:
    """Build an entry-level id with its topic set, as :func:`entry_id` does; what fails, if anything."""
    if not hasattr(getattr(raw_module, "MessageId", None), "topic_name"):
        return []  # reported as missing already
    try:
        message_id = raw_module.MessageId(-1, 0, 0, -1)
        message_id.topic_name("persistent://public/default/probe")
    except Exception:
        return ["_pulsar.MessageId(partition, ledger, entry, batch).topic_name(str)"]
    return []


def missing_names(pulsar_module: Any, raw_module: Any) -> list[str]:
    """What the blocking consumer uses and *pulsar_module* / *raw_module* lack; empty if none.

    Parameters
    ----------
    pulsar_module, raw_module : module or None
        ``pulsar`` and ``_pulsar`` (None if it cannot be imported), or the unit tests' stand-ins.
    """
    if raw_module is None:
        return ["_pulsar"]
    missing = _missing_attrs(raw_module, "_pulsar", _RAW_NAMES)
    for name, methods in _RAW_NAMES.items():
        missing += _missing_attrs(getattr(raw_module, name, None), f"_pulsar.{name}", methods)
    missing += _missing_attrs(pulsar_module, "pulsar", ("Client", "Consumer", "Message", "MessageId"))
    consumer = getattr(pulsar_module, "Consumer", None)
    missing += _missing_attrs(consumer, "pulsar.Consumer", ("receive",))
    missing += _missing_in_code(_member(consumer, "receive"), "pulsar.Consumer.receive", ("_consumer", "_message", "_schema"))
    message_id = getattr(pulsar_module, "MessageId", None)
    missing += _missing_in_code(_member(message_id, "__init__"), "pulsar.MessageId.__init__", ("_msg_id",))
    client = getattr(pulsar_module, "Client", None)
    missing += _missing_attrs(client, "pulsar.Client", ("subscribe",))
    missing += _missing_keywords(_member(client, "subscribe"), "pulsar.Client.subscribe", _SUBSCRIBE_KEYWORDS)
    missing += _missing_in_code(_member(client, "__init__"), "pulsar.Client.__init__", ("_client",))
    missing += _missing_in_code(_member(client, "subscribe"), "pulsar.Client.subscribe", ("_client",))
    return missing + _missing_entry_id(raw_module)


def missing_asyncio_names(asyncio_module: Any) -> list[str]:
    """What the asyncio consumer uses and *asyncio_module* (``pulsar.asyncio``) lacks; empty if none."""
    consumer = getattr(asyncio_module, "Consumer", None)
    client = getattr(asyncio_module, "Client", None)
    missing = _missing_attrs(asyncio_module, "pulsar.asyncio", ("Client", "Consumer"))
    missing += _missing_attrs(client, "pulsar.asyncio.Client", ("subscribe",))
    missing += _missing_attrs(consumer, "pulsar.asyncio.Consumer", _ASYNC_CONSUMER_METHODS)
    missing += _missing_in_code(_member(consumer, "__init__"), "pulsar.asyncio.Consumer.__init__", ("_consumer",))
    missing += _missing_in_code(_member(consumer, "receive"), "pulsar.asyncio.Consumer.receive", ("_message",))
    missing += _missing_in_code(_member(client, "__init__"), "pulsar.asyncio.Client.__init__", ("_client",))
    return missing


def _unsupported(version: str, missing: list[str], what: str, minimum: tuple[int, ...]) -> UnsupportedClientError:
    oldest = ".".join(map(str, minimum))
    return UnsupportedClientError(
        f"pulsar-client {version} is not supported by {what}: it needs pulsar-client >={oldest},<{NEXT_MAJOR} "
        f"(missing: {', '.join(missing)}). Install a supported one: pip install 'pulsar-client>={oldest},<{NEXT_MAJOR}'"
    )


def check_client(pulsar_module: Any, raw_module: Any, version: str) -> None:
    """Raise :class:`~pulsar_nack.errors.UnsupportedClientError` if the client lacks a name we use.

    A client with every name but outside :data:`SUPPORTED` (a new major release) gets a
    ``RuntimeWarning``: it was not tested.
    """
    missing = missing_names(pulsar_module, raw_module)
    if missing:
        raise _unsupported(version, missing, "pulsar_nack", MIN_VERSION)
    release = _version_tuple(version)
    if release and not MIN_VERSION <= release < (NEXT_MAJOR,):
        warnings.warn(
            f"pulsar-client {version} is outside the range pulsar-nack was tested with ({SUPPORTED})",
            RuntimeWarning,
            stacklevel=2,
        )


def load_asyncio(version: str | None = None, importer: Callable[[str], ModuleType] = importlib.import_module) -> ModuleType:
    """``pulsar.asyncio``, checked; :class:`~pulsar_nack.errors.UnsupportedClientError` if it lacks a name we use.

    *importer* and *version* are for tests with a stand-in module.
    """
    version = client_version() if version is None else version
    try:
        module = importer("pulsar.asyncio")
    except ImportError as exc:
        raise _unsupported(version, ["pulsar.asyncio"], "pulsar_nack.asyncio", ASYNCIO_MIN_VERSION) from exc
    missing = missing_asyncio_names(module)
    if missing:
        raise _unsupported(version, missing, "pulsar_nack.asyncio", ASYNCIO_MIN_VERSION)
    return module


check_client(pulsar, _pulsar, client_version())

# For annotations only (the client ships no type information): the C++ client's types.
RawMessage: TypeAlias = Any
"""A ``_pulsar.Message`` (what ``pulsar.Message`` wraps)."""
RawMessageId: TypeAlias = Any
"""A ``_pulsar.MessageId`` (what ``pulsar.Message.message_id()`` returns)."""
RawConsumer: TypeAlias = Any
"""A ``_pulsar.Consumer`` (what ``pulsar.Consumer`` wraps)."""
RawClient: TypeAlias = Any
"""A ``_pulsar.Client`` (what ``pulsar.Client`` and ``pulsar.asyncio.Client`` wrap)."""
RawProducer: TypeAlias = Any
"""A ``_pulsar.Producer`` (what ``create_producer_async`` hands to its callback)."""

RECEIVED_TYPES: tuple[type, ...] = (pulsar.Message, _pulsar.Message)
"""A received message, wrapped or raw: for ``isinstance``."""
MESSAGE_ID_TYPES: tuple[type, ...] = (pulsar.MessageId, _pulsar.MessageId)
"""A message id, wrapped or raw: for ``isinstance``."""

_Message = pulsar.Message
MESSAGE_TYPE: type[pulsar.Message] = pulsar.Message
"""``pulsar.Message``, for the exact type check of the consumers' common calls (a received message). O(1)."""

raw_message_id: Callable[[int, int, int, int], RawMessageId] = _pulsar.MessageId
"""``_pulsar.MessageId(partition, ledger, entry, batch_index)``: a raw id, no topic set (the benchmarks
nack made-up ids with it, as the built-in's cheapest call). O(1)."""

unwrap_message: Callable[[Any], Any] = operator.attrgetter("_message")
"""The ``_pulsar.Message`` inside a ``pulsar.Message`` (no checks: the caller knows the type). O(1)."""


def is_raw_message_id(obj: Any) -> bool:
    """Whether *obj* is a ``_pulsar.MessageId``. O(1)."""
    return isinstance(obj, _pulsar.MessageId)


def raw_id(obj: Any) -> RawMessageId:
    """The ``_pulsar.MessageId`` of a message or id, ``pulsar`` wrapper or raw. O(1).

    Raises TypeError for anything else. A stand-in message (unit tests: ``message_id()``
    and ``topic_name()``) gives its ``message_id()``.
    """
    if isinstance(obj, _pulsar.MessageId):
        return obj
    if isinstance(obj, _pulsar.Message):
        return obj.message_id()
    inner = getattr(obj, "_message", None)
    if isinstance(inner, _pulsar.Message):
        return inner.message_id()
    inner = getattr(obj, "_msg_id", None)
    if isinstance(inner, _pulsar.MessageId):
        return inner
    message_id = getattr(obj, "message_id", None)
    if callable(message_id) and callable(getattr(obj, "topic_name", None)):
        return raw_id(message_id())
    raise TypeError(f"expected a pulsar Message or MessageId, not {type(obj).__name__}")


def inner_message(obj: Any) -> Any:
    """The ``_pulsar.Message`` inside a ``pulsar.Message``, or None for anything else. O(1)."""
    inner = getattr(obj, "_message", None)
    return inner if isinstance(inner, _pulsar.Message) else None


def inner_message_id(obj: Any) -> Any:
    """The ``_pulsar.MessageId`` inside a ``pulsar.MessageId``, or None for anything else. O(1)."""
    inner = getattr(obj, "_msg_id", None)
    return inner if isinstance(inner, _pulsar.MessageId) else None


def received(message: Any) -> Any:
    """What the consumers' core records for a received message: the raw message inside a
    ``pulsar.Message``, else *message* itself (raw already, or a unit test's stand-in). O(1).
    """
    return getattr(message, "_message", message)


def message_receiver(raw_consumer: Any, schema: Any) -> Callable[..., pulsar.Message]:
    """``receive(timeout_millis=None)`` on *raw_consumer* (a ``_pulsar.Consumer``), returning
    the ``pulsar.Message`` that ``pulsar.Consumer.receive`` builds: the receive and the
    wrapping in one call, built once per consumer for its receive paths. O(1)."""
    receive = raw_consumer.receive

    def receive_message(timeout_millis: int | None = None) -> pulsar.Message:
        message = _Message()
        message._message = receive() if timeout_millis is None else receive(timeout_millis)
        message._schema = schema
        return message

    return receive_message


def wrap_message(raw: Any, schema: Any, cls: type[pulsar.Message] = pulsar.Message) -> pulsar.Message:
    """A ``pulsar.Message`` (or *cls*, a subclass) around a received ``_pulsar.Message``, as
    ``pulsar.Consumer.receive`` builds it. O(1)."""
    message = _Message() if cls is _Message else cls()
    message._message = raw
    message._schema = schema
    return message


def raw_consumer(consumer: pulsar.Consumer) -> Any:
    """The ``_pulsar.Consumer`` inside *consumer*; None for a subclass without one (a unit test's stand-in).

    Raises
    ------
    UnsupportedClientError
        For a ``pulsar.Consumer`` itself without one: the client builds its consumers differently.
    """
    raw = getattr(consumer, "_consumer", None)
    if isinstance(raw, _pulsar.Consumer):
        return raw
    if type(consumer) is pulsar.Consumer:
        raise _unsupported(client_version(), ["pulsar.Consumer._consumer"], "pulsar_nack", MIN_VERSION)
    return None


def consumer_schema(consumer: pulsar.Consumer) -> Any:
    """The schema *consumer* decodes values with (None for a stand-in). O(1)."""
    return getattr(consumer, "_schema", None)


def raw_async_consumer(consumer: Any) -> Any:
    """The ``_pulsar.Consumer`` inside a ``pulsar.asyncio.Consumer``.

    Raises
    ------
    UnsupportedClientError
        If it has none.
    """
    raw = getattr(consumer, "_consumer", None)
    if not isinstance(raw, _pulsar.Consumer):
        raise _unsupported(client_version(), ["pulsar.asyncio.Consumer._consumer"], "pulsar_nack.asyncio", ASYNCIO_MIN_VERSION)
    return raw


def async_redeliver_unacknowledged(consumer: Any) -> None:
    """``redeliver_unacknowledged_messages`` of a ``pulsar.asyncio.Consumer``, on the ``_pulsar.Consumer``
    inside, as pulsar.asyncio does from 3.10.0 (3.9.0 lacks the method). Does not block."""
    raw_async_consumer(consumer).redeliver_unacknowledged_messages()


async def async_get_last_message_id(consumer: Any) -> RawMessageId:
    """``await consumer.get_last_message_id()`` of a ``pulsar.asyncio.Consumer``; before 3.10.0, which
    lacks it, the ``_pulsar.Consumer``'s blocking call in the default executor."""
    method = getattr(consumer, "get_last_message_id", None)
    if method is not None:
        return await method()
    raw = raw_async_consumer(consumer)
    return await asyncio.get_running_loop().run_in_executor(None, raw.get_last_message_id)


def entry_id(partition: int, ledger_id: int, entry: int, topic: str) -> Any:
    """The entry-level ``_pulsar.MessageId`` the client redelivers, with its topic set (if any). O(1).

    The multi-topic C++ consumer routes ids by topic name and silently drops ids without one.

    >>> entry_id(2, 7, 9, "persistent://public/default/t-partition-2").ledger_id()
    7
    """
    message_id = _pulsar.MessageId(partition, ledger_id, entry, -1)
    if topic:
        message_id.topic_name(topic)
    return message_id


def consumer_client(consumer: Any) -> Any:
    """The ``pulsar.Client`` a ``pulsar.Consumer`` was subscribed by, or None (a stand-in). O(1)."""
    return getattr(consumer, "_client", None)


def raw_client(client: Any) -> Any:
    """The ``_pulsar.Client`` of a ``pulsar.Client`` or ``pulsar.asyncio.Client`` (or itself); None for anything else. O(1)."""
    if isinstance(client, _pulsar.Client):
        return client
    raw = getattr(client, "_client", None)
    return raw if isinstance(raw, _pulsar.Client) else None


def is_ok(result: Any) -> bool:
    """Whether a client callback's ``_pulsar.Result`` is ``Ok``. O(1)."""
    return bool(result == _pulsar.Result.Ok)


def build_message(
    data: bytes,
    properties: dict[str, str],
    partition_key: str | None,
    ordering_key: str | None,
    event_timestamp: int = 0,
    deliver_after_ms: int = 0,
) -> RawMessage:
    """A ``_pulsar.Message`` to send: payload, keys, *properties*, the event time when not 0, and a
    delivery delay when *deliver_after_ms* is above 0. A dead letter is the payload as received
    (no event time, as the C++ client sends it); a retry copy is built as the Java client builds
    it (consumer/retry.py). O(properties)."""
    builder = _pulsar.MessageBuilder()
    builder.content(data)
    for name, value in properties.items():
        builder.property(name, value)
    if partition_key:
        builder.partition_key(partition_key)
    if ordering_key:
        builder.ordering_key(ordering_key)
    if event_timestamp:
        builder.event_timestamp(event_timestamp)
    if deliver_after_ms > 0:
        builder.deliver_after(timedelta(milliseconds=deliver_after_ms))
    return builder.build()


def earliest_subscription_configuration() -> Any:
    """A ``_pulsar.ConsumerConfiguration`` that starts from the earliest message (an initial subscription)."""
    conf = _pulsar.ConsumerConfiguration()
    conf.subscription_initial_position(_pulsar.InitialPosition.Earliest)
    return conf


def plain_producer_configuration(schema_info: Any = None) -> Any:
    """A ``_pulsar.ProducerConfiguration`` without batching, chunking a payload above the broker's
    ``maxMessageSize`` (as Java's dead-letter producer), failing instead of blocking when full, with *schema_info*."""
    conf = _pulsar.ProducerConfiguration()
    conf.batching_enabled(False)
    conf.chunking_enabled(True)
    conf.block_if_queue_full(False)
    if schema_info is not None:
        conf.schema(schema_info)
    return conf


# ---------------------------------------------------------------------- retry letter topics (consumer/retry.py)


def is_raw_message(obj: Any) -> bool:
    """Whether *obj* is a ``_pulsar.Message`` (a received message, unwrapped). O(1)."""
    return isinstance(obj, _pulsar.Message)


def retry_producer_configuration(batched: bool = False) -> Any:
    """The Java client's retry producer: no batching, chunking on, never blocking on a full queue.

    *batched*: the producer of the copies the consumers hold (``retry_hold_ms``): batching on
    (the client's defaults), so chunking off."""
    conf = _pulsar.ProducerConfiguration()
    conf.batching_enabled(batched)
    conf.chunking_enabled(not batched)
    conf.block_if_queue_full(False)
    return conf


def shared_listener_configuration(
    listener: Callable[[Any, RawMessage], None],
    nack_delay_ms: int,
    receiver_queue_size: int | None = None,
    consumer_name: str | None = None,
    initial_position: Any = None,
    batch_index_ack: bool = True,
) -> Any:
    """A ``_pulsar.ConsumerConfiguration`` of a Shared subscription whose messages go to *listener*
    (``listener(raw_consumer, raw_message)`` on the client's listener thread): the retry topic's consumer."""
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(_pulsar.ConsumerType.Shared)
    conf.negative_ack_redelivery_delay_ms(nack_delay_ms)
    conf.message_listener(listener)
    if receiver_queue_size is not None:
        conf.receiver_queue_size(receiver_queue_size)
    if consumer_name:
        conf.consumer_name(consumer_name)
    if initial_position is not None:
        conf.subscription_initial_position(initial_position)
    conf.batch_index_ack_enabled(batch_index_ack)
    return conf


def native_probe() -> tuple[str, RawMessage]:
    """The ``_pulsar`` extension's file and a fresh ``_pulsar.Message``: what
    :func:`pulsar_nack.consumer.native_ids.bind` looks libpulsar's accessors up with and probes."""
    return _pulsar.__file__, _pulsar.Message()
