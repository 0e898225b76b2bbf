"""The retry policy of a consumer task: what to do with a message whose handler raised.

A pure function of the exception, the message's redelivery count and the
:class:`~pulsar_nack.spark.ConsumerConfig`; no Spark, no broker. O(len(retryable)).
"""

from __future__ import annotations

from .config import ConsumerConfig

__all__ = ["ACTIONS", "retry_action"]

ACTIONS: tuple[str, ...] = ("retry", "ack", "dead_letter", "raise")
"""``retry``: nack with the backoff's delay; ``ack``: drop the message; ``dead_letter``:
produce it to the dead-letter topic, then ack it; ``raise``: nack it and let the
exception fail the task."""


def retry_action(config: ConsumerConfig, error: BaseException, redelivery_count: int) -> str:
    """One of :data:`ACTIONS` for a handler that raised *error* on a message.

    - An exception that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``)
      always propagates: ``"raise"``.
    - An instance of ``config.retryable`` is retried while ``redelivery_count`` is below
      ``config.max_redeliveries`` (always, when that is None).
    - Anything else, and a retryable failure past ``max_redeliveries`` (a poison
      message), gets ``config.on_non_retryable``.

    >>> config = ConsumerConfig("pulsar://h:6650", "t", "s", retryable=(OSError,), max_redeliveries=2)
    >>> [retry_action(config, OSError(), n) for n in (0, 1, 2)]
    ['retry', 'retry', 'dead_letter']
    >>> retry_action(config, KeyError(), 0), retry_action(config, KeyboardInterrupt(), 0)
    ('dead_letter', 'raise')
    """
    if not isinstance(error, Exception):
        return "raise"
    limit = config.max_redeliveries
    if isinstance(error, config.retryable) and (limit is None or redelivery_count < limit):
        return "retry"
    return config.on_non_retryable
