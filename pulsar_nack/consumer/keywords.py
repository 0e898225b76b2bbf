"""pulsar-client's subscribe keywords, declared for type checkers and IDEs.

:func:`pulsar_nack.subscribe` and :func:`pulsar_nack.asyncio.subscribe` pass these on to
``pulsar.Client.subscribe`` / ``pulsar.asyncio.Client.subscribe`` exactly as given, so
the defaults stay pulsar-client's (and ``batch_index_ack_enabled`` ours: True). Declared
as ``**subscribe_kwargs: Unpack[SubscribeKeywords]``: a misspelled keyword or a value of
the wrong type is a type checker's error, and the function still receives only what the
caller gave. The keys are those of pulsar-client 3.13 (``tests/test_subscribe_types.py``
checks them against the installed client); an older client refuses the keywords it does
not have, at run time, before anything is subscribed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar
    from pulsar.schema import Schema

__all__ = ["AsyncSubscribeKeywords", "SubscribeKeywords"]


class _CommonKeywords(TypedDict, total=False):
    """The keywords both clients' ``subscribe`` take, but those our subscribe functions name themselves."""

    consumer_type: pulsar.ConsumerType
    schema: Schema
    receiver_queue_size: int
    max_total_receiver_queue_size_across_partitions: int
    consumer_name: str | None
    unacked_messages_timeout_ms: int | None
    broker_consumer_stats_cache_time_ms: int
    is_read_compacted: bool
    properties: dict[str, str] | None
    initial_position: pulsar.InitialPosition
    crypto_key_reader: pulsar.CryptoKeyReader | None
    replicate_subscription_state_enabled: bool
    max_pending_chunked_message: int
    auto_ack_oldest_chunked_message_on_queue_full: bool
    start_message_id_inclusive: bool
    batch_receive_policy: pulsar.ConsumerBatchReceivePolicy | None
    key_shared_policy: pulsar.ConsumerKeySharedPolicy | None
    batch_index_ack_enabled: bool
    regex_subscription_mode: pulsar.RegexSubscriptionMode
    dead_letter_policy: pulsar.ConsumerDeadLetterPolicy | None
    crypto_failure_action: pulsar.ConsumerCryptoFailureAction


class SubscribeKeywords(_CommonKeywords, total=False):
    """The keywords :func:`pulsar_nack.subscribe` passes to ``pulsar.Client.subscribe``."""

    pattern_auto_discovery_period: int


class AsyncSubscribeKeywords(_CommonKeywords, total=False):
    """The keywords :func:`pulsar_nack.asyncio.subscribe` passes to ``pulsar.asyncio.Client.subscribe``."""

    is_pattern_topic: bool
