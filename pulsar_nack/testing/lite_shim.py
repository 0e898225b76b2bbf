"""pulsar-lite's consumer-id gap, worked around for tests, examples and the demo only.

pulsar-lite keys consumers by ``(topic, subscription, consumer id)``, and the consumer
id is chosen by the client, starting at 0 in every client. Two processes that each open
one consumer on the same Shared subscription therefore collide: the second is refused
with ``Consumer 0 already exists`` (and its whole connection is closed). Apache Pulsar
keys consumers per connection and has no such problem.

:func:`apply_lite_consumer_id_shim` gives each client a distinct range of consumer ids,
and refuses to touch anything that is not a :class:`~pulsar_nack.testing.PulsarLite`
running on this machine. :func:`lite_client_factory` wraps it, with a subscribe retry,
as the ``client_factory`` of :class:`pulsar_nack.spark.ConsumerConfig`: the only way the
runtime modules ever meet it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._validate import check_int
from ..errors import BrokerError
from .client import quiet_client  # noqa: F401 - used by the doctests
from .lite import PulsarLite, _lookup_lite_broker, is_lite_broker_url  # noqa: F401 - PulsarLite: doctests

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

__all__ = [
    "apply_lite_consumer_id_shim",
    "claim_lite_consumer_slot",
    "lite_client_factory",
    "reserve_consumer_ids_for_lite",
]

_log = logging.getLogger(__name__)

_SLOTS_DIR_NAME = "consumer-id-slots"
_MAX_SLOTS = 4096
_DEFAULT_SCRATCH_TOPIC = "pulsar-nack-lite-consumer-id-shim"
_DEFAULT_CONSUMERS_PER_CLIENT = 16

# Slot leases held by this process: open files with an flock on them. The
# kernel drops the lock when the process exits, which frees the slot.
_SLOT_LEASES: list[IO[str]] = []
_SLOT_LEASES_LOCK = threading.Lock()
_SLOT_LEASES_REGISTERED = False


def _prune_slot_leases() -> None:
    """Close leases whose broker directory is gone. Caller holds the lock."""
    global _SLOT_LEASES_REGISTERED
    if not _SLOT_LEASES_REGISTERED:
        atexit.register(_close_slot_leases)
        _SLOT_LEASES_REGISTERED = True
    for lease in list(_SLOT_LEASES):
        if not os.path.exists(lease.name):
            _SLOT_LEASES.remove(lease)
            lease.close()


def _close_slot_leases() -> None:
    """atexit hook: release every lease this process holds."""
    with _SLOT_LEASES_LOCK:
        while _SLOT_LEASES:
            _SLOT_LEASES.pop().close()


_SLOT_ROTATION = 64
"""Claims start at a rotating offset among the first 64 slots: a slot freed by a killed
process (whose consumer pulsar-lite may still hold, see docs/spark.md) is not handed out
again at once, while slot numbers, and so the shim's throwaway consumers, stay small."""


def _next_slot_start(slots_dir: Path) -> int:
    """The next rotating start slot, from a counter file shared by every process (flock)."""
    import fcntl

    with open(slots_dir / "next-start", "a+", encoding="utf-8") as counter:
        fcntl.flock(counter.fileno(), fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        start = int(text) % _SLOT_ROTATION if text.isdigit() else 0
        counter.seek(0)
        counter.truncate(0)
        counter.write(f"{(start + 1) % _SLOT_ROTATION}\n")
        counter.flush()
    return start


def claim_lite_consumer_slot(service_url: str) -> int:
    """Claim a consumer-id slot number, unique among live processes.

    **pulsar-lite test shim.** Slots are lock files
    ``data_dir/consumer-id-slots/slot-<k>.lock`` of the broker behind
    ``service_url``. A claim takes the smallest ``k`` whose file it can
    ``flock`` exclusively and keeps the file open until this process exits;
    the kernel then drops the lock, so a crashed process frees its slot and
    numbers stay small. ``flock`` locks belong to an open file, so two
    claims conflict even inside one process (each client gets its own slot)
    and a forked child never shares its parent's slot. A PID modulo N
    would not be unique; a counter file would grow without bound.

    Runtime complexity: O(k) lock attempts for the returned slot ``k``.

    Parameters
    ----------
    service_url : str
        URL of an :class:`PulsarLite` running on this machine.

    Returns
    -------
    int
        The slot, ``0 <= slot < 4096``.

    Raises
    ------
    TypeError
        If ``service_url`` is not a str.
    ValueError
        If ``service_url`` is not an embedded broker on this machine.
    BrokerError
        If all slots are taken.

    Examples
    --------
    >>> with PulsarLite() as broker:
    ...     a = claim_lite_consumer_slot(broker.url)
    ...     b = claim_lite_consumer_slot(broker.url)
    ...     a != b
    True
    """
    import fcntl

    marker = _lookup_lite_broker(service_url)
    if marker is None:
        raise ValueError(f"{service_url!r} is not an PulsarLite running on this machine")
    slots_dir = marker.data_dir / _SLOTS_DIR_NAME
    slots_dir.mkdir(exist_ok=True)
    with _SLOT_LEASES_LOCK:
        _prune_slot_leases()
        start = _next_slot_start(slots_dir)
        for slot in [*range(start, _MAX_SLOTS), *range(start)]:
            lease = open(slots_dir / f"slot-{slot}.lock", "a+", encoding="utf-8")  # noqa: SIM115
            try:
                fcntl.flock(lease.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lease.close()
                continue
            except BaseException:
                lease.close()
                raise
            lease.truncate(0)
            lease.write(f"{os.getpid()}\n")
            lease.flush()
            _SLOT_LEASES.append(lease)
            return slot
    raise BrokerError(f"all {_MAX_SLOTS} consumer-id slots are taken in {slots_dir}")


def reserve_consumer_ids_for_lite(
    client: pulsar.Client,
    slot: int,
    *,
    service_url: str,
    consumers_per_client: int = _DEFAULT_CONSUMERS_PER_CLIENT,
    scratch_topic: str = _DEFAULT_SCRATCH_TOPIC,
) -> int:
    """Skip consumer ids so that this client's next consumers get unique ones.

    **pulsar-lite test shim.** pulsar-lite refuses a consumer whose
    client-chosen id already exists on the same topic and subscription, and
    every client numbers its consumers 0, 1, 2, ... So this creates and
    closes ``slot * consumers_per_client`` throwaway consumers on
    ``scratch_topic`` (a subscription name unique to this call), moving the
    client's counter to ``slot * consumers_per_client``. The client's next
    ``consumers_per_client`` consumers then have ids no other slot uses.

    Call it on a fresh client, before it creates any consumer. It refuses
    to run unless ``service_url`` is an :class:`PulsarLite` on this
    machine (see :func:`is_lite_broker_url`); it never runs against a
    real cluster, which needs no such thing.

    Runtime complexity: O(slot * consumers_per_client) subscribe round
    trips, well under 1 ms each on loopback.

    Parameters
    ----------
    client : pulsar.Client
        The client to advance, connected to ``service_url``.
    slot : int
        A slot from :func:`claim_lite_consumer_slot`, >= 0.
    service_url : str
        The URL ``client`` was created with.
    consumers_per_client : int, default 16
        Width of each slot's id range: how many consumers the client may
        create before its ids reach the next slot's range.
    scratch_topic : str
        Topic for the throwaway consumers; nothing is ever published to it.

    Returns
    -------
    int
        The consumer id the client's next consumer will get.

    Raises
    ------
    TypeError
        If an argument has the wrong type.
    ValueError
        If ``slot`` or ``consumers_per_client`` is out of range, or
        ``service_url`` is not an embedded broker on this machine.

    Examples
    --------
    >>> with PulsarLite() as broker:
    ...     client = quiet_client(broker.url)
    ...     first_id = reserve_consumer_ids_for_lite(
    ...         client, 2, service_url=broker.url, consumers_per_client=4)
    ...     client.close()
    >>> first_id
    8
    """
    import pulsar

    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
    check_int("slot", slot, 0, _MAX_SLOTS - 1)
    check_int("consumers_per_client", consumers_per_client, 1)
    if not isinstance(scratch_topic, str):
        raise TypeError(f"scratch_topic must be a str, got {type(scratch_topic).__name__}")
    if not scratch_topic:
        raise ValueError("scratch_topic must not be empty")
    if not is_lite_broker_url(service_url):
        raise ValueError(
            f"refusing the consumer-id shim: {service_url!r} is not an PulsarLite "
            "running on this machine"
        )
    count = slot * consumers_per_client
    subscription = f"consumer-id-shim-{os.getpid()}-{uuid.uuid4().hex}"
    for _ in range(count):
        consumer = client.subscribe(scratch_topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
        consumer.unsubscribe()
    return count


def apply_lite_consumer_id_shim(
    client: pulsar.Client,
    service_url: str,
    *,
    consumers_per_client: int = _DEFAULT_CONSUMERS_PER_CLIENT,
) -> int | None:
    """Apply the consumer-id shim if, and only if, the URL is an embedded broker.

    **Embedded-broker test shim**, the one call a per-process consumer
    factory (such as a Spark executor's) needs: against an
    :class:`PulsarLite` on this machine it claims a slot with
    :func:`claim_lite_consumer_slot` and advances ``client``
    with :func:`reserve_consumer_ids_for_lite`; against anything
    else it does nothing. Call it right after creating the client.

    Runtime complexity: O(slot * consumers_per_client).

    Parameters
    ----------
    client : pulsar.Client
        A fresh client created with ``service_url``.
    service_url : str
        The URL ``client`` was created with.
    consumers_per_client : int, default 16
        Width of each slot's consumer-id range.

    Returns
    -------
    int or None
        The claimed slot, or None if the shim did not apply.

    Raises
    ------
    TypeError
        If ``service_url`` is not a str or ``client`` not a pulsar.Client.

    Examples
    --------
    >>> with PulsarLite() as broker:
    ...     client = quiet_client(broker.url)
    ...     slot = apply_lite_consumer_id_shim(client, broker.url)
    ...     client.close()
    >>> slot is not None
    True
    """
    import pulsar

    if not isinstance(client, pulsar.Client):
        raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
    if not is_lite_broker_url(service_url):
        return None
    slot = claim_lite_consumer_slot(service_url)
    reserve_consumer_ids_for_lite(
        client, slot, service_url=service_url, consumers_per_client=consumers_per_client
    )
    return slot


_SUBSCRIBE_ATTEMPTS = 3
_LITE_CLIENT_CLASS: list[type] = []


def _lite_client_class() -> type:
    """The ``pulsar.Client`` subclass :func:`lite_client_factory` returns (built once)."""
    if _LITE_CLIENT_CLASS:
        return _LITE_CLIENT_CLASS[0]
    import pulsar

    class LiteClient(pulsar.Client):
        """A quiet client with the consumer-id shim, a subscribe retry, and no batch-index acks."""

        def __init__(self, service_url: str, **kwargs: Any) -> None:
            kwargs.setdefault("logger", pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
            self._lite_args = (service_url, kwargs)
            super().__init__(service_url, **kwargs)
            self.shim_slot = apply_lite_consumer_id_shim(self, service_url)

        def subscribe(self, topic: Any, subscription_name: str, *args: Any, **kwargs: Any) -> Any:
            """``Client.subscribe``, retried with a fresh connection and consumer-id slot.

            pulsar-lite 0.2.0 keeps the consumers of a connection that ended with a
            reset (a process killed while the broker sent to it) registered until it
            restarts, so a freed slot's consumer id may still be taken: the broker
            then drops the connection and the subscribe fails. pulsar-lite also loses
            messages with batch-index acks, so they are turned off here.
            """
            kwargs["batch_index_ack_enabled"] = False
            for attempt in range(1, _SUBSCRIBE_ATTEMPTS + 1):
                try:
                    return super().subscribe(topic, subscription_name, *args, **kwargs)
                except Exception:
                    if attempt == _SUBSCRIBE_ATTEMPTS:
                        raise
                    _log.warning("subscribing to %s failed; retrying with a new connection", topic, exc_info=True)
                    with contextlib.suppress(Exception):
                        self._client.close()
                    service_url, options = self._lite_args
                    pulsar.Client.__init__(self, service_url, **options)
                    self.shim_slot = apply_lite_consumer_id_shim(self, service_url)
            raise AssertionError("unreachable")  # pragma: no cover

    _LITE_CLIENT_CLASS.append(LiteClient)
    return LiteClient


def lite_client_factory(service_url: str) -> pulsar.Client:
    """A ``client_factory`` for :class:`pulsar_nack.spark.ConsumerConfig` on pulsar-lite.

    **pulsar-lite test shim**, module-level so that it pickles. The client it returns
    logs warnings only, has the consumer-id shim applied (its slot is ``shim_slot``),
    retries a failed subscribe up to 3 times with a fresh connection and slot, and
    subscribes without batch-index acks. Against a URL that is not a
    :class:`PulsarLite` on this machine the shim does nothing (``shim_slot`` is None).

    Runtime complexity: that of :func:`apply_lite_consumer_id_shim`.

    >>> with PulsarLite() as broker:
    ...     client = lite_client_factory(broker.url)
    ...     slot = client.shim_slot
    ...     client.close()
    >>> slot is not None
    True
    """
    if not isinstance(service_url, str):
        raise TypeError(f"service_url must be a str, got {type(service_url).__name__}")
    client: pulsar.Client = _lite_client_class()(service_url)
    return client
