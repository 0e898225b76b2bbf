"""Sent messages freed on the thread that sends, so the C++ client's message pool stays small.

The C++ client inside pulsar-client (3.13: C++ 4.2, ``lib/MessageBuilder.cc`` and
``lib/ObjectPool.h``) takes the memory of every message a ``MessageBuilder`` builds from
an object pool with a free list per thread: a message freed on a thread goes to that
thread's list, and a list is handed to a pool shared by all threads only once it holds
10,000 blocks (up to 100,000 shared). A thread that builds takes from its own list, and
from the shared pool only when its list is empty.

The dead letters and retry copies this library sends are built on the application's
thread (or the event loop's), but the client frees each one on its I/O thread, after the
broker answers the send. So the I/O thread's list only grows, and the building thread
never sees those blocks until 10,000 have gathered: each send leaves one block behind
until the lists are full. A consumer that sends a few thousand dead letters or retries an
hour grows by that much for hours, which a soak reads as a leak (the RSS slopes of
``bench/results/soak.json``). The built-in client builds its own dead letters on its I/O
thread, where they are freed too.

:class:`KeepingProducer` wraps a producer: it keeps each message it sent until the broker
has answered it and the client has dropped its own copy, and frees it at the next send,
on the sending thread, where the next build takes the block back. Kept are the messages
answered since the last send (never more than were in flight) and the one answered last
before it; closing the producer frees them all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ._client import RawMessage, RawProducer

__all__ = ["KeepingProducer"]


class KeepingProducer:
    """A raw producer whose sent messages are freed on the thread of a later send.

    Parameters
    ----------
    producer : _pulsar.Producer
        What ``create_producer_async`` handed over.

    >>> class Producer:  # answers at once, as a broker would later
    ...     def send_async(self, message, callback):
    ...         callback("Ok", None)
    ...     def close(self):
    ...         pass
    >>> producer = KeepingProducer(Producer())
    >>> producer.send_async("first", lambda result, _id: None)
    >>> producer.send_async("second", lambda result, _id: None)
    >>> producer.kept()  # "second", and "first" (its send may not have dropped its copy yet)
    2
    >>> producer.close()
    >>> producer.kept()
    0
    """

    _producer: RawProducer
    _answered: deque[RawMessage]

    def __init__(self, producer: RawProducer) -> None:
        self._producer = producer
        self._answered = deque()

    def send_async(self, message: RawMessage, callback: Callable[[Any, Any], None]) -> None:
        """``send_async(message, callback)`` of the producer, after freeing here the messages answered before.

        *callback* runs as the client calls it (on its I/O thread); *message* is kept from
        then until a later send. Raises what the producer raises (the caller then frees
        the message, on its thread). O(messages answered since the last send).
        """
        self._free_answered()

        def answered(result: Any, message_id: Any) -> None:
            self._answered.append(message)  # the client drops its copy after this returns
            callback(result, message_id)

        self._producer.send_async(message, answered)

    def _free_answered(self) -> None:
        """Free all but the last answered message, on this thread (deque pops are atomic)."""
        answered = self._answered
        while len(answered) > 1:  # the last one's send may not have dropped its copy yet
            answered.popleft()

    def kept(self) -> int:
        """Messages kept: answered, and not freed yet. O(1)."""
        return len(self._answered)

    def close(self) -> None:
        """Close the producer (it waits for the sends in flight), then free every kept message."""
        try:
            self._producer.close()
        finally:
            self._answered.clear()
