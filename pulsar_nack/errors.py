"""The library's own errors: one root, :class:`PulsarNackError`, to catch them all.

Bad arguments are not errors of this family: they raise the built-in ``TypeError``
(wrong type) or ``ValueError`` (bad value), as Python does.
"""

from __future__ import annotations

__all__ = ["BrokerError", "PulsarNackError"]


class PulsarNackError(Exception):
    """Root of every error pulsar-nack raises by itself."""


class BrokerError(PulsarNackError, RuntimeError):
    """A test broker (:mod:`pulsar_nack.testing`) could not be set up, started or used.

    The message says what is missing or what failed, with the tail of the broker's log
    where there is one.
    """
