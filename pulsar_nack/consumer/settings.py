"""The settings of a nacking consumer, written once for the blocking and the asyncio consumer.

:class:`ConsumerSettings` is a frozen dataclass validated when it is made: both
consumers, and both ``subscribe`` functions, take one, so they accept the same keywords
with the same checks and cannot drift apart. :func:`subscribe_settings` turns the
arguments of a ``subscribe`` call into one (both ``subscribe`` functions call it), and
:func:`seek_target` checks a ``seek`` argument as the plain client does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pulsar

from .._validate import check_bool, check_int, check_ms
from ..core.backoff import RedeliveryBackoff
from ..core.buckets import DEFAULT_PRECISION_BITS, MAX_PRECISION_BITS
from ..timing import COALESCE_MS, HANDOFF_DELAY_MS
from ._client import MESSAGE_ID_TYPES
from .subscription import Sharing, sharing_of

__all__ = [
    "ConsumerSettings",
    "SeekArgumentError",
    "seek_target",
    "subscribe_settings",
]

@dataclass(frozen=True)
class ConsumerSettings:
    """What a nacking consumer does with negative acknowledgements and dead letters.

    Validated on creation (``TypeError`` for a wrong type, ``ValueError`` for a bad
    value, naming the field); immutable. Make a changed copy with
    :func:`dataclasses.replace`.

    Parameters
    ----------
    negative_ack_redelivery_delay_ms : int
        Fixed delay when no per-call delay or backoff applies. Default 60 s, as in pulsar.
    negative_ack_precision_bit_cnt : int
        Deadlines are trimmed by this many bits (0-30; default 8: 256 ms buckets). A
        message may come back up to ``2**bits - 1`` ms early unless ``never_early``.
    redelivery_backoff : RedeliveryBackoff, optional
        Delay by the message's redelivery count.
    never_early : bool
        Round deadlines up instead of down.
    dead_letter_policy : pulsar.ConsumerDeadLetterPolicy, optional
        Dead letters as the plain client sends them (see
        :mod:`~pulsar_nack.consumer.dead_letter`).
    handoff_delay_ms : int
        The wrapped consumer's own ``negative_ack_redelivery_delay_ms``: handoffs are
        made that much early. Leave the default unless you subscribed it yourself.
    coalesce_ms : int
        Minimum gap between two handoff bursts.
    always_guard : bool
        Check every received message all the time, not only from the start, around
        nacks and for a while after (see ``docs/consumer.md``, "Reconnects"). An ack
        timeout needs no guarding: the consumer keeps it (``ack_timeout_ms``), and an
        expired message is redelivered as a nack, which guards as any nack does.
    retry_enable : bool
        Durable retries through a retry letter topic (``reconsume_later``), as the Java
        client's ``enableRetry`` (see :mod:`~pulsar_nack.consumer.retry`).
    retry_letter_topic : str, optional
        The retry letter topic (with ``retry_enable``); else named as the Java client names it.
    ack_timeout_ms : int
        The consumer's ``unacked_messages_timeout_ms`` (0: none), kept by the consumer
        instead of the client (:mod:`~pulsar_nack.consumer.ack_timeout`): a message not
        settled this long after its delivery (or its last ``in_progress``) is redelivered,
        or dead-lettered at its last delivery. ``subscribe`` sets it.
    retry_hold_ms : int
        With ``retry_enable``: a reconsume whose delay is at most this many ms is held by
        the consumers instead of the broker (default 0: none, every retry copy carries its
        delivery time, as Java's). Such copies go out batched and without a delivery
        time; the consumer that receives one holds it, unacked, until due (see
        :mod:`~pulsar_nack.consumer.retry`, "Held by the consumer"). Cheaper per retry;
        a Java consumer of the same retry topic would get them at once.
    sharing : Sharing
        Whether other consumers may receive this consumer's messages
        (:mod:`~pulsar_nack.consumer.subscription`): ``SHARED`` (default; Shared,
        Key_Shared) or ``ONE_ACTIVE`` (Exclusive, Failover). ``subscribe`` sets it from
        ``consumer_type``. On ``SHARED``, a batch entry with nacked members goes back when
        the last of them is due, and the broker's redelivery count is the floor of the
        delivery counts; on ``ONE_ACTIVE``, each member at its own time, and the
        consumer's own tally counts.

    >>> ConsumerSettings(negative_ack_redelivery_delay_ms=5_000).negative_ack_precision_bit_cnt
    8
    >>> ConsumerSettings(negative_ack_precision_bit_cnt=31)
    Traceback (most recent call last):
    ...
    ValueError: negative_ack_precision_bit_cnt must be <= 30, got 31
    """

    negative_ack_redelivery_delay_ms: int = 60_000
    negative_ack_precision_bit_cnt: int = DEFAULT_PRECISION_BITS
    redelivery_backoff: RedeliveryBackoff | None = None
    never_early: bool = False
    dead_letter_policy: pulsar.ConsumerDeadLetterPolicy | None = None
    handoff_delay_ms: int = HANDOFF_DELAY_MS
    coalesce_ms: int = COALESCE_MS
    always_guard: bool = False
    retry_enable: bool = False
    retry_letter_topic: str | None = None
    retry_hold_ms: int = 0
    ack_timeout_ms: int = 0
    sharing: Sharing = Sharing.SHARED

    def __post_init__(self) -> None:
        # The one validation of each setting: both consumers, both subscribe functions, the
        # retry letter, Spark's ConsumerConfig and the demo's options all come through here.
        check_ms("negative_ack_redelivery_delay_ms", self.negative_ack_redelivery_delay_ms)
        check_int("negative_ack_precision_bit_cnt", self.negative_ack_precision_bit_cnt, 0, MAX_PRECISION_BITS)
        backoff = self.redelivery_backoff
        if backoff is not None and not callable(getattr(backoff, "next_delay_ms", None)):
            raise TypeError(f"redelivery_backoff must be a RedeliveryBackoff or None, not {type(backoff).__name__}")
        check_bool("never_early", self.never_early)
        policy = self.dead_letter_policy
        if policy is not None and not isinstance(policy, pulsar.ConsumerDeadLetterPolicy):
            raise TypeError(f"dead_letter_policy must be a pulsar.ConsumerDeadLetterPolicy, not {type(policy).__name__}")
        check_ms("handoff_delay_ms", self.handoff_delay_ms)
        check_ms("coalesce_ms", self.coalesce_ms)
        check_bool("always_guard", self.always_guard)
        if not isinstance(self.sharing, Sharing):
            raise TypeError(f"sharing must be a Sharing, not {type(self.sharing).__name__}")
        self._check_retries()

    def _check_retries(self) -> None:
        """The retry letter topic's settings: each needs ``retry_enable``."""
        check_bool("retry_enable", self.retry_enable)
        topic = self.retry_letter_topic
        if topic is not None and not isinstance(topic, str):
            raise TypeError(f"retry_letter_topic must be a str or None, not {type(topic).__name__}")
        if topic == "":
            raise ValueError("retry_letter_topic must not be empty")
        if topic is not None and not self.retry_enable:
            raise ValueError("retry_letter_topic needs retry_enable=True")
        check_ms("retry_hold_ms", self.retry_hold_ms)
        check_ms("ack_timeout_ms", self.ack_timeout_ms)
        if self.retry_hold_ms and not self.retry_enable:
            raise ValueError("retry_hold_ms needs retry_enable=True")

    @property
    def max_redeliver_count(self) -> int | None:
        """The dead-letter policy's ``max_redeliver_count``, or None when dead letters are off."""
        policy = self.dead_letter_policy
        return None if policy is None else int(policy.max_redeliver_count)

    def replace(self, **changes: Any) -> ConsumerSettings:
        """A validated copy with *changes* (:func:`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)


def subscribe_settings(
    subscribe_kwargs: dict[str, Any],
    *,
    negative_ack_redelivery_delay_ms: int,
    negative_ack_precision_bit_cnt: int,
    redelivery_backoff: RedeliveryBackoff | None,
    never_early: bool,
    retry_enable: bool = False,
    retry_letter_topic: str | None = None,
    retry_hold_ms: int = 0,
) -> ConsumerSettings:
    """The settings of a ``subscribe`` call; adjusts the keywords passed on to the client.

    Takes ``dead_letter_policy`` out of *subscribe_kwargs* (the wrapper sends dead
    letters itself, counting deliveries to the application) and
    ``unacked_messages_timeout_ms`` (the consumer keeps the ack timeout itself; 0 means
    none, as in pulsar), takes the sharing from ``consumer_type``, and defaults
    ``batch_index_ack_enabled`` to True. Validates everything it
    reads before changing anything.
    """
    check_bool("batch_index_ack_enabled", subscribe_kwargs.get("batch_index_ack_enabled", True))
    settings = ConsumerSettings(
        negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        negative_ack_precision_bit_cnt=negative_ack_precision_bit_cnt,
        redelivery_backoff=redelivery_backoff,
        never_early=never_early,
        dead_letter_policy=subscribe_kwargs.get("dead_letter_policy"),
        ack_timeout_ms=check_ms("unacked_messages_timeout_ms", subscribe_kwargs.get("unacked_messages_timeout_ms") or 0),
        retry_enable=retry_enable,
        retry_letter_topic=retry_letter_topic,
        retry_hold_ms=retry_hold_ms,
        sharing=sharing_of(subscribe_kwargs.get("consumer_type", pulsar.ConsumerType.Exclusive)),
    )
    subscribe_kwargs.pop("dead_letter_policy", None)
    subscribe_kwargs.pop("unacked_messages_timeout_ms", None)  # kept by the consumer (ack_timeout_ms)
    subscribe_kwargs.setdefault("batch_index_ack_enabled", True)
    return settings


class SeekArgumentError(TypeError, ValueError):
    """A ``seek`` argument that is neither a message id nor an int timestamp.

    The plain client raises ``ValueError`` for it (``seek(1.0)``); this library raises
    ``TypeError`` for a wrong type. This error is both, so either ``except`` catches it.
    """


def seek_target(message_id: object) -> Any:
    """Check a ``seek`` argument as ``pulsar.Consumer.seek`` does; return it unchanged.

    A ``pulsar.MessageId``, a ``_pulsar.MessageId`` or an int (a publish timestamp in
    ms; a bool is an int, as in the client). Anything else raises
    :class:`SeekArgumentError`, a ``ValueError`` as the client raises, and a ``TypeError``.

    >>> seek_target(1_700_000_000_000)
    1700000000000
    >>> seek_target(1.0)
    Traceback (most recent call last):
    ...
    pulsar_nack.consumer.settings.SeekArgumentError: invalid seek_arg type <class 'float'>: seek takes a MessageId or a timestamp in ms (int)
    """
    if not isinstance(message_id, (int, *MESSAGE_ID_TYPES)):
        raise SeekArgumentError(
            f"invalid seek_arg type {type(message_id)}: seek takes a MessageId or a timestamp in ms (int)"
        )
    return message_id
