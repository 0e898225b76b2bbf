"""Brokers for tests, examples, benchmarks and the demo; never imported by the runtime modules.

- :class:`PulsarStandalone`: Apache Pulsar's own standalone broker, fetched from Maven
  Central once. The integration tests and the benchmarks run on it.
- :class:`PulsarLite`: the light embedded broker (starts in well under a second), the
  default of the demo and the examples. A look-alike with gaps; its workarounds live in
  :mod:`pulsar_nack.testing.lite_shim`.

Both have the same surface: a context manager, ``url``, ``admin_url`` (None where there
is none), ``start()``, ``stop()``, ``restart()`` (keeps the data), ``pid``, ``log_path``
and ``create_partitioned_topic(topic, partitions)``.
"""

from __future__ import annotations

from ..errors import BrokerError
from .client import quiet_client
from .lite import PulsarLite
from .standalone import PulsarStandalone

__all__ = ["BROKERS", "BrokerError", "PulsarLite", "PulsarStandalone", "quiet_client", "start_broker"]

BROKERS = {"apache": PulsarStandalone, "lite": PulsarLite}
"""Broker classes by the names the CLI and the test option use."""


def start_broker(kind: str) -> PulsarStandalone | PulsarLite:
    """Start a broker by name, ``"apache"`` or ``"lite"``; the caller stops it."""
    if kind not in BROKERS:
        raise ValueError(f"broker must be one of {sorted(BROKERS)}, got {kind!r}")
    return BROKERS[kind]().start()
