"""``ConsumerConfig(tracker="builtin")``: a plain pulsar consumer, nacked by pulsar-client itself.

For side-by-side runs (``pulsar-nack demo --tracker builtin``): the task loop stays one
code path, and this wrapper gives a raw ``pulsar.Consumer`` the few members the loop
and the registry use from a :class:`~pulsar_nack.consumer.NackingConsumer`. Its nacks
go to the client's own tracker (``negative_ack_redelivery_delay_ms``, fixed delay, no
backoff), whose pending count and memory are not visible: ``tracker`` is None.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BuiltinNackConsumer"]


class BuiltinNackConsumer:
    """A raw ``pulsar.Consumer`` with the surface the Spark task loop needs. Every call O(1).

    >>> class Raw:
    ...     def is_connected(self): return True
    ...     def close(self): print("closed")
    >>> consumer = BuiltinNackConsumer(Raw())
    >>> consumer.tracker is None, consumer.stats(), consumer.is_connected()
    (True, {'swallowed': 0}, True)
    >>> consumer.close(); consumer.close(); consumer.closed
    closed
    True
    """

    tracker = None
    """The built-in tracker lives in the C++ client: nothing to inspect."""

    def __init__(self, consumer: Any) -> None:
        self._plain = consumer
        self._closed = False

    def receive(self, timeout_millis: int | None = None) -> Any:
        return self._plain.receive(timeout_millis)

    def acknowledge(self, message: Any) -> None:
        self._plain.acknowledge(message)

    def negative_acknowledge(self, message: Any) -> None:
        self._plain.negative_acknowledge(message)

    def get_last_message_id(self) -> Any:
        """A request/response round trip to the broker (the task loop's ack flush uses it)."""
        return self._plain.get_last_message_id()

    def is_connected(self) -> bool:
        return not self._closed and bool(self._plain.is_connected())

    def stats(self) -> dict[str, int]:
        """Only what the task loop reads: no batch copies are swallowed here."""
        return {"swallowed": 0}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, redeliver_pending: bool = True) -> None:
        """Close the consumer; its unacked and nacked messages return to the subscription.

        *redeliver_pending* has no effect: the client's pending nacks are unacked
        messages, and the broker redelivers them when this consumer is gone.
        """
        if self._closed:
            return
        self._closed = True
        self._plain.close()
