"""What a Spark consumer task consumes and how it retries: :class:`ConsumerConfig`, :class:`TaskBudget`.

Both are frozen, picklable dataclasses that Spark ships with every task. Validation
happens once, on the driver, when they are built: ``TypeError`` for a wrong type,
``ValueError`` for a bad value.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._validate import MAX_DELAY_MS, check_bool, check_ms, check_name, check_optional_int, check_topics
from ..core.backoff import RedeliveryBackoff, resolve_delay
from ..core.buckets import DEFAULT_PRECISION_BITS

__all__ = ["NON_RETRYABLE_ACTIONS", "RETRIES", "TRACKERS", "ConsumerConfig", "TaskBudget", "dead_letter_topic"]

NON_RETRYABLE_ACTIONS: tuple[str, ...] = ("ack", "dead_letter", "raise")
"""What :func:`~pulsar_nack.spark.consume_partition` does with a message whose handler raised a
non-retryable exception: ack it (drop), produce it to the dead-letter topic and ack it,
or re-raise (the task fails; the message returns to the subscription)."""

_CONSUMER_TYPES = ("Shared", "KeyShared", "Failover", "Exclusive")
_INITIAL_POSITIONS = ("Earliest", "Latest")
TRACKERS: tuple[str, ...] = ("ours", "builtin")
"""``ConsumerConfig.tracker``: pulsar-nack's tracker, or pulsar-client's built-in nack."""
RETRIES: tuple[str, ...] = ("nack", "durable")
"""``ConsumerConfig.retries``: nack (in the worker's memory), or reconsume (a retry letter topic)."""


_RENAMED = {
    "nack_delay_ms": "negative_ack_redelivery_delay_ms",
    "precision_bits": "negative_ack_precision_bit_cnt",
    "backoff": "redelivery_backoff",
}
"""ConsumerConfig's names of earlier releases -> the names of ``subscribe`` (deprecated, still accepted)."""


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """TypeError unless *value* is a str, ValueError unless it is one of *choices*."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _enum_name(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Accept ``"Shared"`` or ``pulsar.ConsumerType.Shared``; return the name."""
    text = getattr(value, "name", value)
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str or a pulsar enum, not {type(value).__name__}")
    if text == "Key_Shared":
        text = "KeyShared"
    if text not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return text


@dataclasses.dataclass(frozen=True)
class ConsumerConfig:
    """What a Spark task consumes and how it retries; picklable, shipped with each task.

    Every field must pickle (Spark ships the config to the executors): plain values,
    a :class:`~pulsar_nack.core.backoff.RedeliveryBackoff`, exception classes, and a
    module-level ``client_factory``.

    Parameters
    ----------
    service_url : str
        ``pulsar://host:6650``.
    topics : str or sequence of str
        One topic, or several (one multi-topic consumer). Stored as a tuple.
    subscription : str
        The subscription name; all workers join it.
    subscription_type : str or pulsar.ConsumerType
        ``"Shared"`` (default) spreads messages over the workers and redelivers single
        entries. ``"KeyShared"`` keeps keys on one worker. ``"Failover"`` and
        ``"Exclusive"`` allow one active consumer: the other workers wait, and a nack
        redelivers every unacked message of the consumer.
    negative_ack_redelivery_delay_ms : int
        Fixed retry delay when no ``redelivery_backoff`` is given. Default 60 s.
    negative_ack_precision_bit_cnt : int
        Retry deadlines are trimmed by this many bits (default 8: 256 ms buckets; a
        retry may come up to ``2**bits - 1`` ms early unless ``never_early``).
    redelivery_backoff : RedeliveryBackoff, optional
        Delay by redelivery count, e.g.
        :class:`~pulsar_nack.core.backoff.MultiplierRedeliveryBackoff`.
    never_early : bool
        Round deadlines up instead of down.

        These four are ``subscribe``'s keywords, validated by the consumers' one settings
        object (:class:`~pulsar_nack.consumer.settings.ConsumerSettings`). The names of
        earlier releases, ``nack_delay_ms``, ``precision_bits`` and ``backoff``, still work
        (as keywords and attributes) with a ``DeprecationWarning``.
    receive_timeout_ms : int
        How long one ``receive`` waits; the task checks its budget at least this often.
        Default 100.
    initial_position : str or pulsar.InitialPosition
        Where a *new* subscription starts. Default ``"Earliest"``: a Spark job usually
        starts after the data was produced and must not skip it (pulsar's own default
        is ``Latest``). No effect on an existing subscription.
    client_options : mapping
        Keywords for ``pulsar.Client`` (e.g. ``operation_timeout_seconds``,
        ``io_threads``); values must pickle.
    consumer_options : mapping
        Extra keywords for ``Client.subscribe`` (e.g. ``receiver_queue_size``,
        ``consumer_name``); not ``negative_ack_redelivery_delay_ms``.
    client_factory : callable, optional
        ``client_factory(service_url) -> pulsar.Client``, a module-level function, for
        what does not pickle (authentication objects, custom loggers). Replaces
        ``client_options``. It is also where a broker-specific client goes, e.g. the
        test brokers' factories in :mod:`pulsar_nack.testing`.
    log_level : str
        The C++ client's log level: ``"warn"`` (default; no INFO lines), ``"error"``,
        ``"info"``, ``"debug"``.
    retryable : tuple of exception classes
        Exceptions from the handler that mean "retry later" (nack with backoff).
        Default ``(Exception,)``: every exception retries.
    on_non_retryable : {"dead_letter", "ack", "raise"}
        For any other exception: produce the message to :attr:`dead_letter_topic` and
        ack it (default); ack it (drop it); or nack it, flush and re-raise, failing the
        task (Spark shows a ``PythonException`` with the worker traceback).
    max_redeliveries : int, optional
        A retryable failure of a message already redelivered this many times is
        handled as non-retryable (poison messages). None (default): retry forever.
    dead_letter_topic : str, optional
        Default ``<topic>-<subscription>-DLQ`` of the message's topic (per partition),
        as the client's dead-letter policy names it. Dead letters are built and sent by
        :class:`~pulsar_nack.consumer.dead_letter.DeadLetter`, as the consumers send
        theirs, with the handler's error in ``PULSAR_NACK_ERROR``. With
        ``retries="durable"`` they are the consumer's ``reject``: the dead letter a
        reconsume past the limit sends (Java's topic, one per subscription, and form:
        ``RECONSUMETIMES`` and the rest), to this topic if given.
    ack_flush_ms : int
        A task returns no sooner than this after its last ack, so the client's 100 ms
        ack grouping has sent it. Default 200; 0 disables (acks may then be lost with
        a worker that dies right after the task: they come back as duplicates).
    batch_index_ack : bool
        Subscribe with ``batch_index_ack_enabled=True`` (default): the consumer acks
        single messages of a batched entry, and a broker with
        ``acknowledgmentAtBatchIndexLevelEnabled=true`` redelivers such an entry with
        its ack set, so no worker hands acked siblings back to the handler. A broker
        without the setting ignores the ack sets (whole entries come back, as with
        False). ``consumer_options["batch_index_ack_enabled"]`` wins over this.
    tracker : {"ours", "builtin"}
        ``"ours"`` (default): a :class:`~pulsar_nack.consumer.NackingConsumer`.
        ``"builtin"``: a plain ``client.subscribe(...)`` consumer whose nacks use
        pulsar-client's own tracker with the fixed ``negative_ack_redelivery_delay_ms``, for
        comparison. It has no backoff (``redelivery_backoff`` must be None); ``negative_ack_precision_bit_cnt`` and
        ``never_early`` do not apply; its pending nacks and memory are not visible
        (reported as None), and ``TaskBudget.drain_pending`` cannot wait for them.
    retries : {"nack", "durable"}
        ``"nack"`` (default): a retry is a nack, kept in the worker's tracker: cheap,
        but lost with the worker (the broker then redelivers it at once). ``"durable"``:
        a retry is ``reconsume_later``: the message is republished to the
        subscription's retry letter topic with its delay and the original acked once the
        copy is stored, so a retry survives the worker, the job and the broker; the copy
        comes back to any worker, never before its time, as the original message
        (``topic_name()``, ``redelivery_count()`` = reconsumes). Needs ``tracker="ours"``
        and a Shared or KeyShared subscription, and delayed delivery on the broker (a
        100 ms ``delayedDeliveryTickTimeMillis`` keeps retries within about 0.1-0.3 s
        of their time; the stock 1 s tick makes them up to about 1 s late).
        ``max_redeliveries`` and ``on_non_retryable`` apply as with nacks.
    retry_hold_ms : int
        With ``retries="durable"``: retries of at most this delay are held by the
        workers' consumers instead of the broker (the consumer's ``retry_hold_ms``):
        batched copies, held unacked until due; cheaper per retry, but a Java consumer of
        the same retry topic would get them at once. Default 0: the broker holds every
        retry, as Java's.

    Examples
    --------
    >>> from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff
    >>> config = ConsumerConfig("pulsar://127.0.0.1:6650", "orders", "billing",
    ...     redelivery_backoff=MultiplierRedeliveryBackoff(1000, 60_000))
    >>> config.topics, config.subscription_type, config.key
    (('orders',), 'Shared', ('pulsar://127.0.0.1:6650', ('orders',), 'billing'))
    >>> import pickle; pickle.loads(pickle.dumps(config)).redelivery_backoff.next_delay_ms(2)
    4000
    """

    service_url: str
    topics: str | Sequence[str]  # stored as a tuple (see __post_init__)
    subscription: str
    subscription_type: str = "Shared"
    negative_ack_redelivery_delay_ms: int = 60_000
    negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS
    redelivery_backoff: RedeliveryBackoff | None = None
    never_early: bool = False
    receive_timeout_ms: int = 100
    initial_position: str = "Earliest"
    client_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    consumer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    client_factory: Callable[[str], Any] | None = None
    log_level: str = "warn"
    retryable: tuple[type[BaseException], ...] = (Exception,)
    on_non_retryable: str = "dead_letter"
    max_redeliveries: int | None = None
    dead_letter_topic: str | None = None
    ack_flush_ms: int = 200
    batch_index_ack: bool = True
    tracker: str = "ours"
    retries: str = "nack"
    retry_hold_ms: int = 0

    def __post_init__(self) -> None:
        self._check_target()
        self._check_modes()
        self._check_settings()
        self._check_task()
        self._check_client()

    def _check_target(self) -> None:
        """What the task reads: service URL, topics, subscription, its type and start."""
        set_ = object.__setattr__
        check_name("service_url", self.service_url)
        set_(self, "topics", tuple(check_topics("topics", self.topics)))
        check_name("subscription", self.subscription)
        set_(self, "subscription_type", _enum_name("subscription_type", self.subscription_type, _CONSUMER_TYPES))
        set_(self, "initial_position", _enum_name("initial_position", self.initial_position, _INITIAL_POSITIONS))

    def _check_modes(self) -> None:
        """``tracker`` and ``retries``, and what each needs of the other and of the subscription."""
        _choice("tracker", self.tracker, TRACKERS)
        if self.tracker == "builtin" and self.redelivery_backoff is not None:
            raise ValueError(
                "tracker='builtin' has no backoff: leave redelivery_backoff None and set negative_ack_redelivery_delay_ms"
            )
        _choice("retries", self.retries, RETRIES)
        if self.retries == "durable" and self.tracker != "ours":
            raise ValueError("retries='durable' needs tracker='ours'")
        if self.retries == "durable" and self.subscription_type not in ("Shared", "KeyShared"):
            raise ValueError(f"retries='durable' needs a Shared or KeyShared subscription, not {self.subscription_type}")

    def _check_settings(self) -> None:
        """The consumer's settings, by the consumers' own checks (in Spark's terms)."""
        from ..consumer.settings import ConsumerSettings  # imports pulsar: not at module import

        try:
            ConsumerSettings(
                negative_ack_redelivery_delay_ms=self.negative_ack_redelivery_delay_ms,
                negative_ack_precision_bit_cnt=self.negative_ack_precision_bit_cnt,
                redelivery_backoff=self.redelivery_backoff,
                never_early=self.never_early,
                retry_enable=self.retries == "durable",
                retry_hold_ms=self.retry_hold_ms,
            )
        except (TypeError, ValueError) as error:  # Spark's name of retry_enable=True
            raise type(error)(str(error).replace("retry_enable=True", "retries='durable'")) from None

    def _check_task(self) -> None:
        """What a task does: its receive timeout, ack flush, retry limits and dead letters."""
        check_ms("receive_timeout_ms", self.receive_timeout_ms, 1)
        check_ms("ack_flush_ms", self.ack_flush_ms)
        check_optional_int("max_redeliveries", self.max_redeliveries, 0)
        check_bool("batch_index_ack", self.batch_index_ack)
        retryable = (self.retryable,) if isinstance(self.retryable, type) else tuple(self.retryable)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retryable):
            raise TypeError("retryable must be a tuple of exception classes")
        object.__setattr__(self, "retryable", retryable)
        if self.on_non_retryable not in NON_RETRYABLE_ACTIONS:
            raise ValueError(f"on_non_retryable must be one of {NON_RETRYABLE_ACTIONS}, got {self.on_non_retryable!r}")
        if self.dead_letter_topic is not None and (not isinstance(self.dead_letter_topic, str) or not self.dead_letter_topic):
            raise TypeError("dead_letter_topic must be a non-empty str or None")

    def _check_client(self) -> None:
        """The client's and the subscription's options, the client factory and the log level."""
        for name in ("client_options", "consumer_options"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TypeError(f"{name} must be a mapping, not {type(value).__name__}")
            object.__setattr__(self, name, dict(value))
        if "negative_ack_redelivery_delay_ms" in self.consumer_options or "pattern" in self.consumer_options:
            raise ValueError("consumer_options must not set negative_ack_redelivery_delay_ms or pattern")
        if self.client_factory is not None and not callable(self.client_factory):
            raise TypeError("client_factory must be callable")
        from ..consumer.client_log import LEVELS  # imports pulsar: not at module import

        if not isinstance(self.log_level, str) or self.log_level.lower() not in LEVELS:
            raise ValueError(f"log_level must be one of {LEVELS}, got {self.log_level!r}")

    @property
    def nack_delay_ms(self) -> int:
        """Deprecated: :attr:`negative_ack_redelivery_delay_ms`."""
        return self._renamed("nack_delay_ms")

    @property
    def precision_bits(self) -> int:
        """Deprecated: :attr:`negative_ack_precision_bit_cnt`."""
        return self._renamed("precision_bits")

    @property
    def backoff(self) -> RedeliveryBackoff | None:
        """Deprecated: :attr:`redelivery_backoff`."""
        return self._renamed("backoff")

    def _renamed(self, old: str) -> Any:
        new = _RENAMED[old]
        warnings.warn(f"ConsumerConfig.{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)
        return getattr(self, new)

    @property
    def key(self) -> tuple[str, tuple[str, ...], str]:
        """The registry key: ``(service_url, topics, subscription)``."""
        return (self.service_url, self.topic_names, self.subscription)

    @property
    def topic_names(self) -> tuple[str, ...]:
        """:attr:`topics` as the tuple it is stored as (typed as such)."""
        return tuple(self.topics)

    def consumer_settings(self) -> tuple[Any, ...]:
        """What the worker's consumer was built with; a change rebuilds it."""
        return (
            self.subscription_type,
            self.negative_ack_redelivery_delay_ms,
            self.negative_ack_precision_bit_cnt,
            repr(self.redelivery_backoff),
            self.never_early,
            self.initial_position,
            sorted(self.client_options.items(), key=lambda kv: kv[0]),
            sorted(self.consumer_options.items(), key=lambda kv: kv[0]),
            self.client_factory,
            self.log_level.lower(),
            self.batch_index_ack,
            self.tracker,
            self.retries,
            self.retry_hold_ms,
        )

    def retry_delay_ms(self, redelivery_count: int) -> int:
        """The delay a nack of a message with this redelivery count asks for. O(1).

        >>> ConsumerConfig("pulsar://h:6650", "t", "s", negative_ack_redelivery_delay_ms=500).retry_delay_ms(3)
        500
        """
        return resolve_delay(None, self.redelivery_backoff, self.negative_ack_redelivery_delay_ms, max(redelivery_count, 0))


def _accepting_old_names(init: Callable[..., None]) -> Callable[..., None]:
    """``ConsumerConfig.__init__`` that takes the names of earlier releases too, with a DeprecationWarning."""

    @functools.wraps(init)
    def __init__(self: ConsumerConfig, *args: Any, **kwargs: Any) -> None:
        for old, new in _RENAMED.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"give {new} or its deprecated name {old}, not both")
                warnings.warn(f"ConsumerConfig({old}=...) is deprecated: use {new}", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    return __init__


ConsumerConfig.__init__ = _accepting_old_names(ConsumerConfig.__init__)  # type: ignore[method-assign]  # (old keyword names, deprecated)


@dataclasses.dataclass(frozen=True)
class TaskBudget:
    """When a consumer task stops receiving and returns.

    A task stops at the first of: ``max_messages`` handed to the handler;
    ``max_time_ms`` since it started; or ``idle_timeout_ms`` with nothing received
    while its consumer is connected (a broker failover is not idleness; after a
    reconnect the idle time starts at the consumer's first message, or the client's
    operation timeout later, since the broker sends nothing before it has answered the
    subscribe) and, with ``drain_pending``, nothing waiting in this worker's tracker. Pending
    retries left when a task stops stay in the worker's consumer and fire on time,
    to be handled by whichever task receives them next.

    Parameters
    ----------
    max_messages : int, optional
        None: no limit.
    max_time_ms : int, optional
        Default 60 s. None: no limit (then rely on the idle timeout).
    idle_timeout_ms : int
        Default 1 s. Keep it above ~300 ms with ``drain_pending``: a retry handed to
        the client comes back 100-133 ms later.
    drain_pending : bool
        Keep receiving while this worker has retries pending (default True), so a
        task that ends on its idle timeout leaves nothing scheduled behind it. With
        ``retries="durable"``: until each reconsumed retry's due time plus a 2 s grace
        for the broker's delivery (0.5 s for a retry the consumers hold,
        ``ConsumerConfig.retry_hold_ms``), the idle timeout running meanwhile.

    >>> TaskBudget(max_messages=10_000).idle_timeout_ms
    1000
    """

    max_messages: int | None = None
    max_time_ms: int | None = 60_000
    idle_timeout_ms: int = 1_000
    drain_pending: bool = True

    def __post_init__(self) -> None:
        check_optional_int("max_messages", self.max_messages, 1)
        check_optional_int("max_time_ms", self.max_time_ms, 0, MAX_DELAY_MS)
        check_ms("idle_timeout_ms", self.idle_timeout_ms)
        if not isinstance(self.drain_pending, bool):
            raise TypeError("drain_pending must be bool")
        if self.max_time_ms is None and self.idle_timeout_ms == 0 and self.max_messages is None:
            raise ValueError("a budget needs some limit")


def dead_letter_topic(topic: str, subscription: str) -> str:
    """``<topic>-<subscription>-DLQ`` of a message's topic, as the client names it.

    :func:`pulsar_nack.consumer.dead_letter.dead_letter_topic` (imported when called, so
    that this package imports no pulsar). A partition keeps its suffix: the C++ client
    has one dead-letter topic per partition.

    >>> dead_letter_topic("persistent://public/default/orders-partition-2", "billing")
    'persistent://public/default/orders-partition-2-billing-DLQ'
    """
    from ..consumer.dead_letter import dead_letter_topic as consumer_dead_letter_topic

    return consumer_dead_letter_topic(topic, subscription)
