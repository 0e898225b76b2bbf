"""Old import path of a test broker; use :mod:`pulsar_nack.testing` instead."""

from __future__ import annotations

from .errors import BrokerError as EmbeddedBrokerError
from .testing.client import quiet_client
from .testing.lite import PulsarLite as EmbeddedBroker

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError", "quiet_client"]
