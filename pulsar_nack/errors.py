"""The library's own errors: one root, :class:`PulsarNackError`, to catch them all.

::

    PulsarNackError
    ├── ClosedError (also a RuntimeError)
    │   ├── TrackerClosedError    a tracker used after close()
    │   └── ConsumerClosedError   a NackingConsumer used after close()
    ├── DeadLetterError (also a RuntimeError)   a dead letter was not stored
    ├── BrokerError (also a RuntimeError)   a test broker failed
    └── UnsupportedClientError (also an ImportError)   pulsar-client lacks what we use

The closed errors, :class:`DeadLetterError` and :class:`BrokerError` subclass ``RuntimeError`` too, as the bare
``RuntimeError`` they replace, so existing ``except RuntimeError`` clauses still work.
Bad arguments are not errors of this family: they raise the built-in ``TypeError``
(wrong type) or ``ValueError`` (bad value), as Python does.
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ClosedError",
    "ConsumerClosedError",
    "DeadLetterError",
    "PulsarNackError",
    "TrackerClosedError",
    "UnsupportedClientError",
]


class PulsarNackError(Exception):
    """Root of every error pulsar-nack raises by itself."""


class ClosedError(PulsarNackError, RuntimeError):
    """A call on an object that was closed."""


class TrackerClosedError(ClosedError):
    """Raised by ``add`` on a closed :class:`~pulsar_nack.core.tracker.NegativeAcksTracker` or baseline."""


class ConsumerClosedError(ClosedError):
    """Raised by calls on a closed :class:`~pulsar_nack.consumer.NackingConsumer`."""


class DeadLetterError(PulsarNackError, RuntimeError):
    """A dead letter could not be stored: its producer was not created or its send failed.

    The message names the dead-letter topic and the client's result. The original
    message stays unacknowledged.
    """


class BrokerError(PulsarNackError, RuntimeError):
    """A test broker (:mod:`pulsar_nack.testing`) could not be set up, started or used.

    The message says what is missing or what failed, with the tail of the broker's log
    where there is one.
    """


class UnsupportedClientError(PulsarNackError, ImportError):
    """The installed ``pulsar-client`` lacks a name the consumers use.

    Raised when :mod:`pulsar_nack.consumer` (or :mod:`pulsar_nack.asyncio`) is imported,
    or by ``subscribe`` for a consumer built differently than expected. The message
    names the pulsar-client version found, the range pulsar-nack supports and what is
    missing. An ``ImportError`` too: the failure is that of importing the consumer layer.
    """
