"""One model of the client's timing: every lead, margin, grace and poll of ``consumer/`` and ``spark/``.

Each value is derived from what pulsar-client and the broker document (the client's
minimum nack delay, its nack timer's tick, its ack grouping and send timeout, the broker's
delayed-delivery tick), with a one-line reason. No other module of ``consumer/`` or
``spark/`` defines a module-level time (a name ending ``_MS`` or ``_S``;
``tests/test_layout.py`` checks it), and the docs quote these values generated from here
(``bench/report.py``, checked by ``tests/test_docs.py``).

It imports nothing, so that ``pulsar_nack.spark`` reads it without importing pulsar.

>>> CLIENT_TICK_MS, handoff_lead_ms(HANDOFF_DELAY_MS), client_handoff_latency_ms(HANDOFF_DELAY_MS)
(33, 95, 132)
"""

from __future__ import annotations

__all__ = [
    "ACK_FLUSH_MS",
    "ACK_TIMEOUT_TICK_MS",
    "CLIENT_RECONNECT_MAX_MS",
    "COALESCE_MS",
    "CONNECTION_POLL_MS",
    "COPY_DRAIN_MS",
    "DEAD_LETTER_DRAIN_S",
    "DEAD_LETTER_RETRY_MS",
    "DURABLE_GRACE_S",
    "HANDOFF_DELAY_MS",
    "HANDOFF_MARGIN_MS",
    "HARVEST_TIMEOUT_S",
    "HELD_GRACE_S",
    "HOUSEKEEPING_S",
    "MEMORY_HOLD_MS",
    "RECONNECT_GRACE_S",
    "RECONNECT_POLL_S",
    "RESUBSCRIBE_WAIT_S",
    "RETRY_POLL_MS",
    "SEND_TIMEOUT_S",
    "SETTLED_MAX_AGE_MS",
    "STALE_MS",
    "client_handoff_latency_ms",
    "client_tick_ms",
    "handoff_lead_ms",
]

# ---------------------------------------------------------------- what the client and broker do

HANDOFF_DELAY_MS = 100
"""The C++ client's minimum nack delay: what the wrapped consumer is subscribed with."""
ACK_GROUPING_MS = 100
"""The client's ack grouping time (``ackGroupingTimeMs``): an ack goes on the wire up to this late."""
CLIENT_SEND_TIMEOUT_MS = 30_000
"""The client's default producer send timeout."""
CLIENT_OPERATION_TIMEOUT_S = 30
"""The client's default operation timeout (``operation_timeout_seconds``): a request unanswered this long fails."""
BROKER_DELAY_TICK_MS = 1_000
"""The broker's stock delayed-delivery tick (``delayedDeliveryTickTimeMillis``)."""


def client_tick_ms(handoff_delay_ms: int) -> int:
    """The C++ client's nack timer interval: ``delay // 3``, the delay at least ``HANDOFF_DELAY_MS``. O(1).

    >>> client_tick_ms(100), client_tick_ms(0), client_tick_ms(300)
    (33, 33, 100)
    """
    return max(handoff_delay_ms, HANDOFF_DELAY_MS) // 3


CLIENT_TICK_MS = client_tick_ms(HANDOFF_DELAY_MS)
"""The client's nack timer interval at the minimum delay (33 ms)."""


def client_handoff_latency_ms(handoff_delay_ms: int) -> int:
    """How long the C++ client takes to redeliver an id nacked into an idle tracker.

    Its timer ticks every ``delay // 3`` ms (at least 100 ms delay) and redelivers the
    entries whose deadline is strictly past, so the id comes back on the first tick
    after ``delay``. O(1).

    >>> client_handoff_latency_ms(100)
    132
    >>> client_handoff_latency_ms(300)
    400
    """
    delay = max(handoff_delay_ms, HANDOFF_DELAY_MS)
    interval = client_tick_ms(delay)
    return (delay // interval + 1) * interval


# ---------------------------------------------------------------- our handoff to the client

HANDOFF_MARGIN_MS = 5
"""Buckets fire early by the client's delay less this margin (:func:`handoff_lead_ms`): it keeps a
clock read on either side from swallowing the handoff's own copy."""


def handoff_lead_ms(handoff_delay_ms: int) -> int:
    """How early buckets fire: the client's delay (``handoff_delay_ms``) less ``HANDOFF_MARGIN_MS``, in every mode.

    The client redelivers a handed-off entry no sooner than its delay after the handoff,
    so the copy comes at the bucket's time or after it (up to a client tick, 33 ms, later).
    A copy that comes sooner was brought by something else (a reconnect) and is swallowed
    until the handoff plus this lead, i.e. until the bucket's time: never before the bucket,
    whatever brings a copy. O(1).

    >>> handoff_lead_ms(HANDOFF_DELAY_MS), handoff_lead_ms(300), handoff_lead_ms(0)
    (95, 295, 0)
    """
    return max(handoff_delay_ms - HANDOFF_MARGIN_MS, 0)


COALESCE_MS = 50
"""Minimum gap between handoff bursts: above the client's tick (``CLIENT_TICK_MS``), since every
``negative_acknowledge`` re-arms that timer and closer bursts would starve it."""
COPY_DRAIN_MS = 100
"""On a shared subscription, a batch entry read from (or settled) more recently than this waits to be
handed off: the client queues a copy's members together and the application takes them one after
the other, so more of them may be behind the last it took; a member nacked after the handoff could
reach another consumer first and come early there. Far above the gap between an application's
acknowledgement and its next ``receive``."""
CLIENT_RECONNECT_MAX_MS = 60_000
"""The C++ consumer's reconnect backoff tops out here (100 ms doubling to 60 s)."""
SETTLED_MAX_AGE_MS = 5 * CLIENT_RECONNECT_MAX_MS
"""How long the guard remembers a settled entry at most: the messages of grouped acks the client
dropped with its connection come back when it reconnects. Without a bound in time a slow
consumer's table would keep growing for hours, until ``SETTLED_CAPACITY`` settlements."""
ACK_FLUSH_MS = ACK_GROUPING_MS + 50
"""Wait before ``redeliver_unacknowledged_messages``: the client's ack grouping plus a 50 ms margin."""
STALE_MS = 60_000
"""A handed-off message that has not come back, or a returned one the application has not
settled, is forgotten after 1 to 2 times this long (far above any redelivery the client makes)."""

# ---------------------------------------------------------------- dead letters

ACK_TIMEOUT_TICK_MS = 64
"""How often the consumer's own ack timeout gives the messages received and not settled since its
last tick their deadlines: one bucket of its tracker (64 ms), far below the client's own 1 s tick."""
DEAD_LETTER_RETRY_MS = 1_000
"""A message whose dead letter was not stored comes back (to be routed again) after this long:
far above a client tick, so a broker that refuses the send is not asked in a loop."""
SEND_TIMEOUT_S = (CLIENT_SEND_TIMEOUT_MS + 30_000) / 1000
"""How long a dead letter's send is waited for: the client's send timeout, plus 30 s to create the producer."""
DEAD_LETTER_DRAIN_S = 5.0
"""``close()`` waits this long for dead letters in flight, so their originals get acknowledged."""

# ---------------------------------------------------------------- retry letter topics

CONNECTION_POLL_MS = 20
"""While a consumer keeps retry copies in memory, it looks at its retry topic's consumer this often
(``is_connected``): the C++ client waits at least its reconnect backoff's first 100 ms before it
reconnects, so several looks fall in that gap, even on a busy machine."""

MEMORY_HOLD_MS = HANDOFF_DELAY_MS + COALESCE_MS
"""``NackingConsumer.receive`` keeps an early retry copy due within this many ms in memory (unacked)
and returns it when due: a nack (the other way to hold it) could not bring it back sooner than the
client's delay plus a burst gap. Measured: a broker on the stock 1 s tick delivers copies up to a
second early and, while no redelivery wakes its dispatcher, others up to a tick late; nacked holds
keep its dispatcher busy, and the tail was about 10x shorter than with every copy held in memory
(bench/retry_durable.py)."""
RETRY_POLL_MS = 10
"""With a retry letter topic, ``receive`` looks for due retry copies at least this often: a
fraction of the 16 ms buckets of the hold tracker, so a held copy is not returned a bucket late."""

# ---------------------------------------------------------------- Spark tasks

DURABLE_GRACE_S = 2 * BROKER_DELAY_TICK_MS / 1000
"""With ``retries="durable"``, a task drains a retry it scheduled until this long after its due time:
the broker delivers a delayed copy up to a tick late, and an early copy is held up to
``MEMORY_HOLD_MS`` more; two ticks cover both. The idle timeout runs during the grace (a nack's
drain restarts it instead: its message comes back at once after the handoff), so a task ends at
``max(last due + grace, last message + idle timeout)``."""
HELD_GRACE_S = 0.5
"""The same for a retry the consumers hold (see :func:`pulsar_nack.consumer.retry.is_held`): its copy
is back in a consumer's memory at once and handed over when due, no broker tick involved; the
grace covers a client handoff latency (132 ms) and a hold-tracker bucket, with room to spare."""
HOUSEKEEPING_S = 0.2
"""How often a task samples its tracker's size and memory, and harvests finished reconsumes."""
HARVEST_TIMEOUT_S = SEND_TIMEOUT_S
"""How long a task ending waits for one reconsume still in flight: a send's whole timeout."""
RECONNECT_POLL_S = 0.02
"""While its consumer is disconnected, a task takes no message and looks again this often."""
RESUBSCRIBE_WAIT_S = float(CLIENT_OPERATION_TIMEOUT_S)
"""After a reconnect, a task's idle time starts at its consumer's first message, or this long after the
reconnect at the latest: the C++ client reports a consumer connected as soon as it has the connection,
before the broker has answered its subscribe (after a failover the new owner loads the topic first), and
a subscribe unanswered for the operation timeout fails: the consumer is disconnected again, not idle."""
RECONNECT_GRACE_S = 2.0
"""A worker's consumer still disconnected this long at a task's start is replaced: the client's
reconnect backoff starts at 100 ms and doubles, so this covers its first four attempts (1.5 s)."""
