"""Apache Pulsar for tests, examples, benchmarks and the demo; never imported by the runtime modules.

- :class:`PulsarStandalone`: Apache Pulsar's own standalone broker, fetched from Maven
  Central once. The integration tests, the benchmarks, the examples and
  ``pulsar-nack demo`` run on it.
- :class:`PulsarCluster`: the same Apache Pulsar as separate JVMs (ZooKeeper, one bookie,
  two brokers by default), for tests that kill, freeze, restart a broker or move topics
  between brokers. ``url`` names every broker; ``brokers[i]`` has each one's ``url``,
  ``admin_url`` and ``pid``.
- :func:`quiet_client`: a ``pulsar.Client`` that logs warnings and errors to standard error.
- :mod:`~pulsar_nack.testing.faults`: fault scenarios on a ``PulsarCluster`` (unloads, a
  restart, a SIGKILL failover, a SIGSTOP freeze) that log what reached the application, for
  ``tests/test_faults.py`` and ``bench/faults.py``.

A broker is a context manager with ``url``, ``admin_url``, ``start()``, ``stop()``,
``restart()`` (keeps the data), ``pid``, ``log_path`` and
``create_partitioned_topic(topic, partitions)``.
"""

from __future__ import annotations

from ..errors import BrokerError
from .client import quiet_client
from .cluster import PulsarCluster
from .standalone import PulsarStandalone

__all__ = ["BrokerError", "PulsarCluster", "PulsarStandalone", "quiet_client", "start_broker"]


def start_broker() -> PulsarStandalone:
    """Start Apache Pulsar standalone on loopback (the newest release an installed JDK runs,
    batch-index acknowledgement on); the caller stops it."""
    return PulsarStandalone(batch_index_ack=True).start()
