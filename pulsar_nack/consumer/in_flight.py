"""Reconsumes on their way: a message whose retry copy is being stored is not delivered again meanwhile.

``reconsume_later`` acknowledges a message only once its copy on the retry letter topic
(or its dead letter) is stored, a round trip later. If the consumer's connection drops in
between (a topic moves, a broker restarts), the broker sends the unacknowledged message
again, and the application would retry it twice: two copies on the retry topic, two
chains of retries, one of them delivered after the other was acknowledged. The Java and
C++ clients do that. :class:`ReconsumesInFlight` keeps the messages whose reconsume is on
its way; a copy of one that arrives meanwhile is kept here, unacknowledged (the
reconsume's acknowledgement settles it, as they have the same id), and if the reconsume
fails it is redelivered, so the application sees it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ReconsumesInFlight"]

_log = logging.getLogger(__name__)

Key = tuple[str, int, int, int]
"""``(topic, ledger, entry, batch_index)`` of a received message (``msgid.message_key``)."""


class ReconsumesInFlight:
    """The messages whose reconsume is on its way, and the copies of them that arrived meanwhile. Thread-safe.

    >>> flight, redelivered = ReconsumesInFlight(), []
    >>> flight.start(("t", 1, 2, -1)); flight.swallow(("t", 1, 2, -1), "copy", redelivered.append)
    True
    >>> flight.swallow(("t", 1, 3, -1), "other", redelivered.append), bool(flight)
    (False, True)
    >>> flight.end(("t", 1, 2, -1), stored=False); redelivered, bool(flight)
    (['copy'], False)
    """

    __slots__ = ("_lock", "_messages")

    _messages: dict[Key, list[Any]]
    """Key -> [reconsumes on their way, then (copy, redeliver) pairs of the copies kept]."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages = {}

    def __bool__(self) -> bool:
        """True if some reconsume is on its way (a hint, without the lock: the receive path's test)."""
        return bool(self._messages)

    def start(self, key: Key) -> None:
        """A reconsume of the message *key* is on its way. O(1)."""
        with self._lock:
            entry = self._messages.setdefault(key, [0])
            entry[0] += 1

    def swallow(self, key: Key, copy: Any, redeliver: Callable[[Any], None]) -> bool:
        """True, and *copy* kept, if a reconsume of *key* is on its way; *redeliver(copy)* if it fails. O(1)."""
        with self._lock:
            entry = self._messages.get(key)
            if entry is None:
                return False
            entry.append((copy, redeliver))
            return True

    def end(self, key: Key, *, stored: bool) -> None:
        """A reconsume of *key* is done: *stored* (the message is acknowledged), or not, and the copies
        kept meanwhile are redelivered (after the last reconsume of it on its way). O(copies kept)."""
        with self._lock:
            entry = self._messages.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] > 0:
                return
            del self._messages[key]
        if stored:
            return
        for copy, redeliver in entry[1:]:
            try:
                redeliver(copy)
            except Exception:  # closing: the broker redelivers it when the consumer reconnects or closes
                _log.warning("could not redeliver a copy kept while its reconsume was on its way", exc_info=True)
