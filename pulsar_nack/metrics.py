"""OpenTelemetry metrics for a tracker or a consumer: what a dashboard needs.

:func:`instrument` registers instruments through the OpenTelemetry *API*
(``pip install pulsar-nack[otel]``); the application's SDK and exporter (OTLP,
Prometheus, ...) decide where they go. The core never imports OpenTelemetry, and
nothing is added to :meth:`~pulsar_nack.core.tracker.NegativeAcksTracker.add`: counters and
gauges are *observable* instruments that read ``stats()`` when the SDK collects, and
the lateness histogram is fed by a release listener on the timer thread, once per
release burst.

Instruments (attributes: ``pulsar.tenant``, ``pulsar.namespace``, ``pulsar.topic``,
``pulsar.partition`` for a partition, ``pulsar.subscription``, as the Java client's
PIP-342 metrics name them; each is set only when known):

======================================== ================ ============ ==========================================
name                                     kind             unit         meaning
======================================== ================ ============ ==========================================
``pulsar.client.consumer.message.nack``  counter          {message}    negatively acknowledged messages (as Java)
``pulsar_nack.message.redelivered``      counter          {message}    messages released for redelivery
``pulsar_nack.handoff.bursts``           counter          {burst}      handoff bursts to the client (consumer)
``pulsar_nack.message.swallowed``        counter          {message}    batch copies swallowed (consumer)
``pulsar_nack.redeliver.errors``         counter          {error}      failed ``redeliver`` calls (keys retried)
``pulsar_nack.pending.messages``         gauge            {message}    messages waiting for their delay
``pulsar_nack.pending.entries``          gauge            {entry}      distinct entries among them
``pulsar_nack.buckets``                  gauge            {bucket}     time buckets, open and sealed
``pulsar_nack.memory``                   gauge            By           tracker memory (``memory_bytes``)
``pulsar_nack.redelivery.lateness``      histogram        ms           release time − bucket due time, per burst
======================================== ================ ============ ==========================================

For a bare tracker the nack counter is ``redeliveries + pending + drained`` (every key
it was given); for a consumer it is the consumer's ``nacked`` count.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .core.base import BaseTracker
from .core.keys import PARTITION_SUFFIX, split_topic

__all__ = ["NACK_COUNTER", "Instrumentation", "RunStatsExporter", "instrument", "topic_attributes"]

NACK_COUNTER = "pulsar.client.consumer.message.nack"
"""The Java client's counter (PIP-342), same name and meaning."""

# name, unit, description, the stats reader: consumer stats -> value (None: tracker only)
_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("pulsar_nack.message.redelivered", "{message}", "Messages released for redelivery", "redeliveries"),
    ("pulsar_nack.redeliver.errors", "{error}", "Failed redeliver calls (their keys are retried)", "redeliver_errors"),
)
_CONSUMER_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("pulsar_nack.handoff.bursts", "{burst}", "Handoff bursts to the Pulsar client", "handoff_bursts"),
    ("pulsar_nack.message.swallowed", "{message}", "Copies of pending or returned nacks swallowed", "swallowed"),
    ("pulsar_nack.message.filtered", "{message}", "Copies of acked messages dropped (and acked again)", "filtered"),
)
_GAUGES: tuple[tuple[str, str, str, str], ...] = (
    ("pulsar_nack.pending.messages", "{message}", "Messages waiting for their redelivery delay", "pending_messages"),
    ("pulsar_nack.pending.entries", "{entry}", "Distinct entries among the pending messages", "pending_entries"),
    ("pulsar_nack.buckets", "{bucket}", "Time buckets holding pending messages, open and sealed", "buckets"),
    ("pulsar_nack.memory", "By", "Tracker memory in bytes", "memory_bytes"),
)
LATENESS_HISTOGRAM = "pulsar_nack.redelivery.lateness"
_LATENESS_BOUNDS = [0.0, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0]


def topic_attributes(topic: str | None, subscription: str | None = None) -> dict[str, str | int]:
    """The Java client's metric attributes for a topic and subscription.

    ``pulsar.topic`` is the partitioned topic's full name (without ``-partition-N``),
    ``pulsar.partition`` the index when the name has one. O(len(topic)).

    >>> topic_attributes("persistent://public/default/orders-partition-3", "billing")
    {'pulsar.tenant': 'public', 'pulsar.namespace': 'public/default', 'pulsar.topic': 'persistent://public/default/orders', 'pulsar.partition': 3, 'pulsar.subscription': 'billing'}
    >>> topic_attributes("orders")
    {'pulsar.tenant': 'public', 'pulsar.namespace': 'public/default', 'pulsar.topic': 'persistent://public/default/orders'}
    """
    attributes: dict[str, str | int] = {}
    if topic:
        try:
            domain, tenant, namespace, local = split_topic(topic)
        except ValueError:  # not a topic name the client would take: reported as given
            attributes["pulsar.topic"] = topic
        else:
            partition = PARTITION_SUFFIX.search(local)
            attributes["pulsar.tenant"] = tenant
            attributes["pulsar.namespace"] = f"{tenant}/{namespace}"
            attributes["pulsar.topic"] = f"{domain}://{tenant}/{namespace}/{PARTITION_SUFFIX.sub('', local)}"
            if partition:
                attributes["pulsar.partition"] = int(partition.group(1))
    if subscription:
        attributes["pulsar.subscription"] = subscription
    return attributes


class Instrumentation:
    """The instruments :func:`instrument` registered; :meth:`close` detaches them.

    OpenTelemetry's API cannot unregister an observable instrument, so after
    :meth:`close` its callbacks report nothing and the histogram is no longer fed.
    """

    attributes: dict[str, str | int]
    instruments: dict[str, Any]
    _tracker: BaseTracker
    _stats: Callable[[], dict[str, Any]] | None
    _lock: threading.Lock

    def __init__(self, tracker: BaseTracker, stats: Callable[[], dict[str, Any]], attributes: dict[str, str | int]):
        self._tracker = tracker
        self._stats = stats
        self.attributes = attributes
        self.instruments = {}
        self._lock = threading.Lock()
        self._histogram: Any = None

    def _observe(self, read: Callable[[dict[str, Any]], int]) -> Callable[[Any], Iterable[Any]]:
        """An observable callback reporting ``read(stats())`` with our attributes."""
        from opentelemetry.metrics import Observation

        def callback(_options: Any) -> Iterable[Any]:
            stats = self._stats
            if stats is None:
                return []
            return [Observation(read(stats()), self.attributes)]

        return callback

    def _on_release(self, released: int, lateness_ms: int) -> None:
        """Release listener (timer thread): one lateness observation per burst."""
        histogram = self._histogram
        if histogram is not None:
            histogram.record(lateness_ms, self.attributes)

    def close(self) -> None:
        """Stop reporting. Idempotent. O(1)."""
        with self._lock:
            if self._stats is None:
                return
            self._stats = None
            self._histogram = None
        self._tracker.remove_release_listener(self._on_release)


def _resolve(target: Any) -> tuple[BaseTracker, Callable[[], dict[str, Any]], bool]:
    """``(tracker, flat stats reader, is_consumer)`` for a tracker or a consumer."""
    if isinstance(target, BaseTracker):
        return target, target.stats, False  # type: ignore[return-value]  # (TrackerStats is a TypedDict, read here as a plain dict)
    tracker = getattr(target, "tracker", None)
    stats = getattr(target, "stats", None)
    if isinstance(tracker, BaseTracker) and callable(stats):

        def flat() -> dict[str, Any]:
            snapshot = dict(stats())
            snapshot.update(snapshot.pop("tracker"))
            return snapshot

        return tracker, flat, True
    raise TypeError(f"instrument() takes a tracker or a pulsar_nack consumer, not {type(target).__name__}")


def _name_of(target: Any, method: str) -> str | None:
    getter = getattr(target, method, None)
    try:
        value = getter() if callable(getter) else None
    except Exception:
        return None
    return value if isinstance(value, str) and value else None


def instrument(
    consumer_or_tracker: Any,
    meter: Any = None,
    *,
    topic: str | None = None,
    subscription: str | None = None,
) -> Instrumentation:
    """Register OpenTelemetry instruments reading *consumer_or_tracker*'s counters.

    Parameters
    ----------
    consumer_or_tracker : NackingConsumer, async consumer, NegativeAcksTracker or baseline
        What to observe. A consumer adds the handoff and swallowed-copy counters and
        gives the topic and subscription attributes.
    meter : opentelemetry.metrics.Meter, optional
        Default: ``opentelemetry.metrics.get_meter("pulsar_nack")`` from the global
        meter provider.
    topic, subscription : str, optional
        Attribute values; by default the consumer's ``topic()`` and
        ``subscription_name()``, or a tracker's ``default_topic``.

    Returns
    -------
    Instrumentation
        Holds the instruments; :meth:`Instrumentation.close` detaches them.

    Raises
    ------
    ImportError
        Without ``opentelemetry-api`` (``pip install pulsar-nack[otel]``).
    TypeError
        For something that is neither a tracker nor a consumer, or a non-str topic or
        subscription.

    Registering is O(1); each collection calls ``stats()`` once per observable
    instrument (O(open buckets) each). ``add`` is untouched.
    """
    tracker, stats, is_consumer = _resolve(consumer_or_tracker)
    for name, value in (("topic", topic), ("subscription", subscription)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be str or None, not {type(value).__name__}")
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("pulsar_nack.metrics needs opentelemetry-api: pip install 'pulsar-nack[otel]'") from error
    if meter is None:
        meter = otel_metrics.get_meter("pulsar_nack")
    if topic is None:
        topic = _name_of(consumer_or_tracker, "topic") if is_consumer else tracker.default_topic or None
    if subscription is None and is_consumer:
        subscription = _name_of(consumer_or_tracker, "subscription_name")
    handle = Instrumentation(tracker, stats, topic_attributes(topic, subscription))
    _register(handle, meter, is_consumer)
    tracker.add_release_listener(handle._on_release)
    return handle


def _register(handle: Instrumentation, meter: Any, is_consumer: bool) -> None:
    """Create every instrument on *meter* into ``handle.instruments``."""
    if is_consumer:
        nacks: Callable[[dict[str, Any]], int] = lambda s: s["nacked"]  # noqa: E731
    else:
        nacks = lambda s: s["redeliveries"] + s["pending_messages"] + s["drained"]  # noqa: E731
    made = handle.instruments
    made[NACK_COUNTER] = meter.create_observable_counter(
        NACK_COUNTER, [handle._observe(nacks)], unit="{message}", description="The number of negatively acknowledged messages"
    )
    for name, unit, description, field in _COUNTERS + (_CONSUMER_COUNTERS if is_consumer else ()):
        made[name] = meter.create_observable_counter(
            name, [handle._observe(operator.itemgetter(field))], unit=unit, description=description
        )
    for name, unit, description, field in _GAUGES:
        made[name] = meter.create_observable_gauge(
            name, [handle._observe(operator.itemgetter(field))], unit=unit, description=description
        )
    description = "How late the timer released a due bucket (release time minus due time), one value per burst"
    try:
        histogram = meter.create_histogram(
            LATENESS_HISTOGRAM, unit="ms", description=description, explicit_bucket_boundaries_advisory=_LATENESS_BOUNDS
        )
    except TypeError:  # opentelemetry-api before 1.23 has no advisory boundaries
        histogram = meter.create_histogram(LATENESS_HISTOGRAM, unit="ms", description=description)
    handle._histogram = made[LATENESS_HISTOGRAM] = histogram


# name, unit, description, RunStats field: the driver-side counters of a Spark run
_RUN_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    (NACK_COUNTER, "{message}", "The number of negatively acknowledged messages", "nacked"),
    ("pulsar_nack.message.received", "{message}", "Messages handed to the handler", "received"),
    ("pulsar_nack.message.acked", "{message}", "Acknowledged messages", "acked"),
    ("pulsar_nack.message.redelivered", "{message}", "Messages received again after a nack", "redelivered"),
    ("pulsar_nack.message.swallowed", "{message}", "Redelivered batch copies swallowed", "swallowed"),
    ("pulsar_nack.message.dead_lettered", "{message}", "Messages sent to a dead-letter topic", "dead_lettered"),
)


class RunStatsExporter:
    """Export Spark runs' aggregated stats from the driver, through OpenTelemetry.

    Create it once per driver process; call :meth:`record` with each
    :class:`~pulsar_nack.spark.RunStats` (from ``aggregate_task_stats`` or
    ``run_consumer_tasks``). Counters add the run's totals, so a dashboard sees the same
    instrument names as :func:`instrument` gives a consumer; the lateness histogram gets
    one value per retry (``arrived_at - requested_at``, needs ``record_timings=True``);
    OpenTelemetry histograms take no negative values, so an early retry is recorded as 0
    and counted in ``pulsar_nack.redelivery.early``.

    >>> RunStatsExporter(object())
    Traceback (most recent call last):
    ...
    TypeError: meter must be an OpenTelemetry Meter, not object
    """

    attributes: dict[str, str | int]

    def __init__(self, meter: Any = None, *, topic: str | None = None, subscription: str | None = None) -> None:
        for name, value in (("topic", topic), ("subscription", subscription)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be str or None, not {type(value).__name__}")
        if meter is None:
            from opentelemetry import metrics as otel_metrics

            meter = otel_metrics.get_meter("pulsar_nack")
        if not callable(getattr(meter, "create_counter", None)):
            raise TypeError(f"meter must be an OpenTelemetry Meter, not {type(meter).__name__}")
        self.attributes = topic_attributes(topic, subscription)
        self._counters = [
            (meter.create_counter(name, unit=unit, description=description), field)
            for name, unit, description, field in _RUN_COUNTERS
        ]
        self._lateness = meter.create_histogram(
            LATENESS_HISTOGRAM, unit="ms", description="Retry lateness: arrival minus requested time, 0 when early"
        )
        self._early = meter.create_counter(
            "pulsar_nack.redelivery.early", unit="{message}", description="Retries that arrived before their requested time"
        )

    def record(self, run: dict[str, Any]) -> None:
        """Add one run's totals and retry lateness. O(counters + retries)."""
        if not isinstance(run, dict):
            raise TypeError(f"run must be a RunStats dict, not {type(run).__name__}")
        missing = [field for _, field in self._counters if field not in run]
        if missing:
            raise ValueError(f"run lacks {missing}: pass what aggregate_task_stats returns")
        for counter, field in self._counters:
            counter.add(run[field], self.attributes)
        early = 0
        for _key, _nacked_at, requested_at, arrived_at in run.get("retries", ()):
            # OpenTelemetry histograms take no negative values: an early retry counts as 0
            # here and once in the early counter.
            early += arrived_at < requested_at
            self._lateness.record(max(arrived_at - requested_at, 0), self.attributes)
        self._early.add(early, self.attributes)
