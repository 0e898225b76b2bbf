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

from collections.abc import Callable
from typing import Any

from ..errors import BrokerError
from .client import quiet_client
from .lite import PulsarLite
from .standalone import PulsarStandalone

__all__ = [
    "BROKERS",
    "BROKER_HELP",
    "DEMO_BROKER",
    "BrokerError",
    "PulsarLite",
    "PulsarStandalone",
    "client_factory_for",
    "quiet_client",
    "start_broker",
]



def _apache_standalone() -> PulsarStandalone:
    return PulsarStandalone(batch_index_ack=True)


BROKERS: dict[str, Callable[[], PulsarStandalone | PulsarLite]] = {"apache": _apache_standalone, "lite": PulsarLite}
"""Broker factories by the names the CLI and the test option use.

``"apache"`` is ``PulsarStandalone(batch_index_ack=True)``: the newest release an installed
JDK runs, with batch-index acknowledgement on, the configuration the project's promises
are measured on (3.0.7 and 4.0.8 both default to off). ``"lite"`` is
``PulsarLite()``.
"""

BROKER_HELP = {
    "apache": "Apache Pulsar standalone (fetched once from Maven Central)",
    "lite": "pulsar-lite, a light look-alike that starts in a second",
}
"""One line per broker name, for the command line's help."""

DEMO_BROKER = "lite"
"""The broker ``pulsar-nack demo`` starts by default: the one that starts fastest."""


def client_factory_for(service_url: str) -> Callable[[str], Any] | None:
    """The ``ConsumerConfig.client_factory`` a broker at *service_url* needs, or None.

    :func:`~pulsar_nack.testing.lite_shim.lite_client_factory` for a
    :class:`PulsarLite` running on this machine (its workarounds), None for anything
    else (a plain ``pulsar.Client`` does). O(1) plus a look-up of the local broker.
    """
    from .lite import is_lite_broker_url

    if not is_lite_broker_url(service_url):
        return None
    from .lite_shim import lite_client_factory

    return lite_client_factory


def start_broker(kind: str) -> PulsarStandalone | PulsarLite:
    """Start a broker by name, ``"apache"`` or ``"lite"``; the caller stops it."""
    if kind not in BROKERS:
        raise ValueError(f"broker must be one of {sorted(BROKERS)}, got {kind!r}")
    return BROKERS[kind]().start()
