"""Who else may receive a subscription's messages: what the batch handoff and the delivery counts depend on.

On a Shared or Key_Shared subscription the broker may dispatch a redelivered message to
any of its consumers, and nothing but the broker links them: a consumer's own knowledge
(its pending nacks, its tally of deliveries) does not cover what the others did. With one
active consumer (Exclusive, Failover) it does. Two rules follow from it, each written once
where it applies:

* when a batch entry with nacked members goes back to the broker
  (:mod:`~pulsar_nack.consumer.entry_handoff`);
* how often the application saw a message, for a dead letter
  (:meth:`~pulsar_nack.consumer.delivery_counts.DeliveryCounts.seen`).
"""

from __future__ import annotations

import enum

import pulsar

__all__ = ["Sharing", "sharing_of"]


class Sharing(enum.Enum):
    """Whether other consumers may receive this consumer's messages (``ConsumerSettings.sharing``)."""

    SHARED = "shared"
    """They may (Shared, Key_Shared; the default, the safe assumption for a consumer subscribed elsewhere)."""
    ONE_ACTIVE = "one active"
    """They may not: one active consumer (Exclusive, Failover)."""


def sharing_of(consumer_type: object) -> Sharing:
    """The sharing of a subscription of *consumer_type* (a ``pulsar.ConsumerType``).

    >>> sharing_of(pulsar.ConsumerType.Failover), sharing_of(pulsar.ConsumerType.KeyShared)
    (<Sharing.ONE_ACTIVE: 'one active'>, <Sharing.SHARED: 'shared'>)
    """
    one_active = (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)
    return Sharing.ONE_ACTIVE if consumer_type in one_active else Sharing.SHARED
