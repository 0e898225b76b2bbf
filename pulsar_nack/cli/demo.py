"""``pulsar-nack demo``: a Spark pipeline that retries failed messages on schedule, end to end.

What it does:

1. starts Apache Pulsar standalone (:class:`pulsar_nack.testing.PulsarStandalone`,
   fetched once from Maven Central) -- unless ``--service-url`` names a running cluster;
2. creates the subscription, then produces a stream of events ``0 .. N-1`` with a
   batched producer, on a thread, while Spark starts;
3. runs ``--tasks`` consumer tasks per round on a SparkSession (``--master``, default
   ``local[2]``; a ``spark://`` standalone cluster works too) with
   :func:`pulsar_nack.spark.run_consumer_tasks`, until a round finds nothing left. The
   handler fails transiently for ``--failure-rate`` of the events -- chosen by a hash of
   the payload, and only on first delivery, so the retry succeeds -- and the tasks nack
   those with exponential backoff (500 ms, 1 s, ...) -- or, with ``--tracker builtin``,
   with pulsar-client's own nack at a fixed 500 ms, for a side-by-side;
4. stops Spark (its Python workers exit), then checks independently that nothing was
   lost: every produced event id is in the handler's record of acked events, and a
   fresh consumer finds the subscription empty;
5. prints a summary; ``--json`` prints it as one JSON object on the last stdout line.

Before anything starts, what the demo needs is checked, and a problem is one line on
stderr with exit code 2: the ``spark`` extra (pyspark and tqdm: ``pip install
"pulsar-nack[spark]"``), a JDK and (until Apache Pulsar is cached) Maven, a broker
answering at ``--service-url``, a ``spark://`` master accepting connections. The first
run fetches Apache Pulsar (about 250 MB) and says so on stderr.

Progress goes to stderr (a tqdm bar of the events acked at least once, on a terminal
only), fed by the executors over UDP on 127.0.0.1. That reaches the driver in local
mode only, so with any other master the bar is off (a status line says so).

Exit codes (the summary's result line says which): 0 OK, nothing lost and at most 1 %
duplicates; 1 an event was lost or left in the subscription; 3 nothing lost but more
than 1 % of the events reached the handler twice; 2 the demo could not start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
import zlib
from typing import Any

from ._prepare import (
    SetupError,
    check_extra,
    check_master,
    check_service_url,
    check_spark_java,
    check_standalone,
    fetch_standalone,
)

__all__ = ["SIZES", "SUBSCRIPTION_TYPES", "DemoHandler", "TransientError", "add_arguments", "result", "run"]

PROG = "pulsar-nack demo"

SIZES: dict[str, int] = {"small": 10_000, "default": 100_000, "large": 1_000_000}
"""Named sizes for ``--messages``. The default takes about 25 s on 2 cores."""

SUBSCRIPTION = "pulsar-nack-demo"
BATCH_SIZE = 10
"""Producer batch size. Larger batches produce faster but give more duplicates: when a
batched entry is redelivered to another worker, that worker sees all its messages."""
KEYS = 64
"""With ``--subscription KeyShared``: each event carries one of this many keys (``k<event % KEYS>``),
and the producer batches by key, since a Key_Shared subscription routes a batch by its key."""
SUBSCRIPTION_TYPES = ("Shared", "KeyShared")
"""The demo's subscription types: the workers share the topic in either."""
MIN_BACKOFF_MS = 500
MAX_BACKOFF_MS = 10_000


class TransientError(Exception):
    """What the demo handler raises for a message it 'cannot process yet'."""


class DemoHandler:
    """Fails on the first delivery of ``failure_rate`` of the events, by payload hash.

    Deterministic: the same payload always fails (first time) or never does. A
    redelivered message (``redelivery_count() > 0``) always succeeds.

    >>> class Message:
    ...     def __init__(self, data, count): self._d, self._c = data, count
    ...     def data(self): return self._d
    ...     def redelivery_count(self): return self._c
    >>> handler = DemoHandler(1.0)
    >>> handler(Message(b"7", 1)) is None
    True
    >>> handler(Message(b"7", 0))
    Traceback (most recent call last):
    ...
    pulsar_nack.cli.demo.TransientError: event b'7' failed (first attempt)
    """

    def __init__(self, failure_rate: float) -> None:
        self.threshold = int(failure_rate * 1_000_000)

    def fails(self, payload: bytes) -> bool:
        """True if *payload* fails on its first delivery. O(len(payload))."""
        return zlib.crc32(payload) % 1_000_000 < self.threshold

    def __call__(self, message: Any) -> None:
        if message.redelivery_count() == 0 and self.fails(message.data()):
            raise TransientError(f"event {message.data()!r} failed (first attempt)")


def event_id(message: Any) -> int:
    """The event id carried by a demo message (its payload is the decimal id)."""
    return int(message.data())


# --------------------------------------------------------------------------- progress


_PROGRESS_SOCKETS: dict[int, socket.socket] = {}
_ACKED_SINCE_REPORT: dict[int, list[int]] = {}
"""Per worker pid: the event ids acked since its last progress report (executor side)."""
_IDS_PER_DATAGRAM = 4000  # about 30 kB of JSON: under a UDP datagram's 64 kB


def collect_event(message: Any) -> int:
    """The demo's ``collect`` (it runs on the executor after each ack): the event id,
    also remembered for the next progress report, so the bar counts events, not acks."""
    event = event_id(message)
    _ACKED_SINCE_REPORT.setdefault(os.getpid(), []).append(event)
    return event


class UdpProgress:
    """Executor side: send each progress delta, with the event ids acked since the last
    one, as JSON datagrams to the driver."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def __call__(self, delta: dict[str, int]) -> None:
        pid = os.getpid()
        sock = _PROGRESS_SOCKETS.get(pid)
        if sock is None:
            sock = _PROGRESS_SOCKETS[pid] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        events = _ACKED_SINCE_REPORT.pop(pid, [])
        counts = {k: delta.get(k, 0) for k in ("nacked", "redelivered")}
        for start in range(0, max(len(events), 1), _IDS_PER_DATAGRAM):
            datagram = {**counts, "events": events[start : start + _IDS_PER_DATAGRAM]}
            counts = {}
            with contextlib.suppress(OSError):
                sock.sendto(json.dumps(datagram, separators=(",", ":")).encode(), self.address)


class ProgressCounts:
    """Driver side: events acked at least once (each counted once), duplicates, nacks.

    >>> counts = ProgressCounts(3)
    >>> counts.apply({"events": [0, 1, 1, 7], "nacked": 10_000})
    2
    >>> counts.apply({"events": [2, 0]}), counts.done, counts.duplicates
    (1, 3, 2)
    >>> counts.postfix()
    {'nacked': '10,000', 'redelivered': '0', 'duplicates': '2'}
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.seen = bytearray(total)
        self.done = self.duplicates = self.nacked = self.redelivered = 0

    def apply(self, delta: dict[str, Any]) -> int:
        """Count one datagram; return how many events it acked for the first time."""
        self.nacked += int(delta.get("nacked", 0))
        self.redelivered += int(delta.get("redelivered", 0))
        new = 0
        for event in delta.get("events", ()):
            if not 0 <= event < self.total:
                continue  # not an event of this run
            if self.seen[event]:
                self.duplicates += 1
            else:
                self.seen[event] = 1
                new += 1
        self.done += new
        return new

    def postfix(self) -> dict[str, str]:
        """The bar's postfix: whole numbers with thousands separators (never ``1e+4``)."""
        return {name: f"{getattr(self, name):,}" for name in ("nacked", "redelivered", "duplicates")}


class _ProgressListener:
    """Driver side: a UDP socket on 127.0.0.1 and a thread that updates a tqdm bar."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.counts = ProgressCounts(total)
        self.bar = tqdm(total=total, unit="event", desc="acked", file=sys.stderr, disable=None, smoothing=0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                delta = json.loads(data)
            except ValueError:
                continue
            self.bar.update(self.counts.apply(delta))
            self.bar.set_postfix(self.counts.postfix(), refresh=False)

    def close(self, acked_events: int | None = None) -> None:
        """Stop the thread; show *acked_events* (the run's own count) as the bar's last value."""
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
        if acked_events is not None and acked_events != self.bar.n:
            self.bar.update(min(acked_events, self.counts.total) - self.bar.n)
        self.bar.close()


# --------------------------------------------------------------------------- CLI


def _size(text: str) -> int:
    if text in SIZES:
        return SIZES[text]
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or one of {sorted(SIZES)}, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("--messages must be >= 1")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError("--failure-rate must be in [0, 1)")
    return value


def _positive(text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}")
    return value


def _non_negative(text: str) -> int:
    return _positive(text, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to *parser*."""
    sizes = ", ".join(f"{k}={v:,}" for k, v in SIZES.items())
    parser.add_argument(
        "--messages", type=_size, default=SIZES["default"], metavar="N|SIZE",
        help=f"events to produce: a number or a size name ({sizes}); default: default",
    )
    parser.add_argument(
        "--failure-rate", type=_rate, default=0.1, metavar="R",
        help="share of events whose first processing fails (default 0.1)",
    )
    parser.add_argument("--tasks", type=_positive, default=4, help="consumer tasks per round (default 4)")
    parser.add_argument(
        "--service-url", default=None, metavar="URL",
        help="use this Pulsar cluster instead of starting Apache Pulsar standalone",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--tracker", choices=("ours", "builtin"), default="ours",
        help="ours: pulsar-nack's tracker with backoff (default); builtin: pulsar-client's own nack "
        f"with a fixed delay of the first backoff ({MIN_BACKOFF_MS} ms), for comparison",
    )
    parser.add_argument(
        "--receiver-queue-size", type=_positive, default=None, metavar="N",
        help="the consumers' receiver_queue_size (default: pulsar-client's, 1000)",
    )
    parser.add_argument(
        "--subscription", choices=SUBSCRIPTION_TYPES, default="Shared",
        help="the workers' subscription type (default Shared). KeyShared: the events carry "
        f"{KEYS} keys and are batched by key; after a broker crash the acks it had not written "
        "come back to the worker that made them, which filters them (see docs/spark.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.epilog = (
        "exit codes: 0 OK (nothing lost, duplicates <= 1 %); 1 an event lost or left in the subscription; "
        "2 could not start (the line on stderr says what to install or fix); 3 nothing lost but duplicates > 1 %"
    )
    _add_retry_arguments(parser)


# --- durable retries (issue 25): --retries and the broker's delayed-delivery tick -------------

DURABLE_TICK_MS = 100
"""The demo broker's ``delayedDeliveryTickTimeMillis`` with ``--retries durable`` (stock: 1000)."""
DURABLE_HOLD_MS = 1_000
"""``--retries durable``: retries of at most this delay are held by the workers' consumers
(``ConsumerConfig.retry_hold_ms``); the demo's retries (its backoff's first delay) are."""


def _add_retry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retries", choices=("nack", "durable"), default="nack",
        help="nack: retries in the workers' trackers (default); durable: reconsume_later through a "
        "retry letter topic, which survives workers and brokers",
    )
    parser.add_argument(
        "--broker-tick-ms", type=_positive, default=None, metavar="MS",
        help="delayedDeliveryTickTimeMillis of the demo's broker (default: "
        f"{DURABLE_TICK_MS} with --retries durable, else the broker's 1000)",
    )
    parser.add_argument(
        "--retry-hold-ms", type=_non_negative, default=None, metavar="MS",
        help="with --retries durable: retries of at most MS are held by the workers' consumers, "
        f"batched, instead of by the broker (default {DURABLE_HOLD_MS}; 0: the broker holds every "
        "retry, as the Java client's)",
    )


def _retry_hold_ms(args: argparse.Namespace) -> int:
    """The workers' ``retry_hold_ms``: the option, else :data:`DURABLE_HOLD_MS` with durable retries (else 0)."""
    hold = getattr(args, "retry_hold_ms", None)
    if hold is not None:
        return int(hold)  # ConsumerConfig refuses it without durable retries
    return DURABLE_HOLD_MS if getattr(args, "retries", "nack") == "durable" else 0


def _broker_config(args: argparse.Namespace) -> dict[str, str]:
    """The demo broker's extra settings: the delayed-delivery tick durable retries come back on."""
    tick = args.broker_tick_ms
    if tick is None and getattr(args, "retries", "nack") == "durable":
        tick = DURABLE_TICK_MS
    return {} if tick is None else {"delayedDeliveryTickTimeMillis": str(tick)}


def _status(text: str) -> None:
    """A phase line on stderr, on a terminal only (the demo is quiet otherwise)."""
    if sys.stderr.isatty():
        print(f"pulsar-nack demo: {text}", file=sys.stderr, flush=True)


class _Producer:
    """Produce events 0..n-1 on a thread; remember which sends the broker confirmed."""

    def __init__(self, client: Any, topic: str, n: int, keyed: bool = False) -> None:
        self.client, self.topic, self.n, self.keyed = client, topic, n, keyed
        self.confirmed: list[int] = []
        self.failed = 0
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)

    def _run(self) -> None:
        import pulsar

        start = time.monotonic()
        try:
            producer = self.client.create_producer(
                self.topic,
                batching_enabled=True,
                batching_max_messages=BATCH_SIZE,
                batching_max_publish_delay_ms=5,
                block_if_queue_full=True,
                batching_type=pulsar.BatchingType.KeyBased if self.keyed else pulsar.BatchingType.Default,
            )
            confirmed, lock = self.confirmed, threading.Lock()

            def done(event: int) -> Any:
                def callback(result: Any, _message_id: Any) -> None:
                    if result == pulsar.Result.Ok:
                        with lock:
                            confirmed.append(event)
                    else:
                        self.failed += 1

                return callback

            for event in range(self.n):
                if self.keyed:
                    producer.send_async(str(event).encode(), done(event), partition_key=f"k{event % KEYS}")
                else:
                    producer.send_async(str(event).encode(), done(event))
            producer.flush()
            producer.close()
        except BaseException as error:  # reported by run()
            self.error = error
        self.seconds = time.monotonic() - start


def _create_subscription(client: Any, topic: str, subscription_type: str) -> None:
    """Create the demo's subscription on *topic*, at its first message, and leave it."""
    import pulsar

    client.subscribe(
        topic,
        SUBSCRIPTION,
        consumer_type=getattr(pulsar.ConsumerType, subscription_type),
        initial_position=pulsar.InitialPosition.Earliest,
    ).close()


def _left_in_subscription(client: Any, topic: str, subscription_type: str) -> int:
    """Messages a fresh consumer (of the demo's subscription type) still gets from the subscription (should be 0)."""
    import pulsar

    consumer = client.subscribe(topic, SUBSCRIPTION, consumer_type=getattr(pulsar.ConsumerType, subscription_type))
    left = 0
    timeout_ms = 2000  # unacked messages return at once when the workers' connections close
    try:
        while True:
            consumer.receive(timeout_ms)
            left += 1
            timeout_ms = 500
    except pulsar.Timeout:
        pass
    finally:
        consumer.close()  # leaves them unacked
    return left


def _prepare(args: argparse.Namespace) -> Any:
    """Check up front what the demo needs, fetch Apache Pulsar on first use; the release to
    start, or None with ``--service-url``. Raises SetupError (one line) or BrokerError."""
    check_extra("spark", PROG)  # first: without pyspark nothing else is worth starting
    check_master(args.master)
    try:  # the options' rules are the consumer's settings' (ConsumerConfig checks them), in the options' names
        _consumer_config(args, "pulsar://127.0.0.1:6650", "persistent://public/default/demo")
    except ValueError as error:
        raise SetupError(_in_option_names(str(error))) from None
    if args.service_url:
        check_spark_java()
        check_service_url(args.service_url)
        return None
    release = check_standalone()
    check_spark_java()
    fetch_standalone(release, PROG)
    return release


def _start_broker(args: argparse.Namespace) -> tuple[Any, str]:
    """(the broker started here or None, the service URL)."""
    if args.service_url:
        return None, args.service_url
    from ..testing import PulsarStandalone, start_broker

    _status("starting Apache Pulsar standalone")
    config = _broker_config(args)  # durable retries: a 100 ms delayed-delivery tick
    broker = PulsarStandalone(batch_index_ack=True, config=config).start() if config else start_broker()
    return broker, broker.url


_OPTION_NAMES = {"retry_hold_ms": "--retry-hold-ms", "retries='durable'": "--retries durable"}
"""ConsumerConfig's names in its errors -> the demo's options."""


def _in_option_names(message: str) -> str:
    """*message* with ConsumerConfig's names replaced by the demo's options."""
    for name, option in _OPTION_NAMES.items():
        message = message.replace(name, option)
    return message


def _consumer_config(args: argparse.Namespace, url: str, topic: str) -> Any:
    """The demo's ConsumerConfig (validated: TypeError, ValueError)."""
    from ..core.backoff import MultiplierRedeliveryBackoff
    from ..spark import ConsumerConfig

    backoff = MultiplierRedeliveryBackoff(MIN_BACKOFF_MS, MAX_BACKOFF_MS)
    builtin = args.tracker == "builtin"
    return ConsumerConfig(
        url,
        topic,
        SUBSCRIPTION,
        # The built-in nack has no backoff: its fixed delay is the first one. The demo's
        # events fail once only, so every retry asks for that delay with either tracker.
        negative_ack_redelivery_delay_ms=backoff.next_delay_ms(0) if builtin else 60_000,
        redelivery_backoff=None if builtin else backoff,
        retryable=(TransientError,),
        consumer_options={} if args.receiver_queue_size is None else {"receiver_queue_size": args.receiver_queue_size},
        tracker=args.tracker,
        retries=getattr(args, "retries", "nack"),
        retry_hold_ms=_retry_hold_ms(args),
        subscription_type=args.subscription,
    )


def _consume(args: argparse.Namespace, url: str, topic: str, spark: Any) -> Any:
    """Run the consumer tasks until the subscription is drained; the RunStats."""
    from ..spark import TaskBudget, run_consumer_tasks

    config = _consumer_config(args, url, topic)
    budget = TaskBudget(max_time_ms=300_000, idle_timeout_ms=1_000)
    progress = None
    if args.master.startswith("local"):
        progress = _ProgressListener(args.messages)
    else:
        _status(f"progress bar off: executors of {args.master} cannot reach the driver's UDP socket")
    stats = None
    try:
        stats = run_consumer_tasks(
            spark,
            config,
            DemoHandler(args.failure_rate),
            args.tasks,
            budget,
            until_drained=True,
            record_timings=True,
            collect=collect_event,
            progress=None if progress is None else UdpProgress(progress.address),
        )
        return stats
    finally:
        if progress is not None:
            progress.close(None if stats is None else len(set(stats["collected"])))


def run(args: argparse.Namespace) -> int:
    """Run the demo; return the exit code (see :func:`result`; 2 when it cannot start)."""
    from ..errors import BrokerError

    started, started_wall = time.monotonic(), time.time()  # a first run's fetch counts too
    try:
        _prepare(args)
        summary = _run(args, started, started_wall)
    except SetupError as error:
        print(f"{PROG}: {error}", file=sys.stderr, flush=True)
        return 2
    except BrokerError as error:
        print(f"{PROG}: {error}", file=sys.stderr, flush=True)
        return 2
    if args.json:
        print(json.dumps(summary, sort_keys=False))
    else:
        _print_summary(summary)
    return result(summary)[1]


def _run(args: argparse.Namespace, started: float, started_wall: float) -> dict[str, Any]:
    """Start what is needed, produce, consume, check, stop everything; the summary.

    *started* and *started_wall*: when the demo started (monotonic and wall clock).
    """
    from ..spark import launch_jvm, stop_session
    from ..testing import quiet_client

    broker = client = spark = None
    try:
        broker, url = _start_broker(args)
        broker_start_s = time.monotonic() - started
        _status(f"starting Spark ({args.master})")
        spark_started = time.monotonic()
        jvm = launch_jvm(args.master, "pulsar-nack demo")  # forks: before the client's and producer's threads exist
        client = quiet_client(url)
        topic = f"persistent://public/default/pulsar-nack-demo-{uuid.uuid4().hex[:12]}"
        # Before the first event: a topic with no subscription is deleted with its events
        # once idle for a minute (the broker's brokerDeleteInactiveTopics*), and Spark may
        # take that long to start.
        _create_subscription(client, topic, args.subscription)
        producer = _Producer(client, topic, args.messages, keyed=args.subscription == "KeyShared")
        producer.thread.start()  # the stream runs while Spark starts
        _status(f"producing {args.messages:,} events to {topic}")
        spark = jvm.session()
        spark_start_s = time.monotonic() - spark_started
        consume_started = time.monotonic()
        stats = _consume(args, url, topic, spark)
        consume_s = time.monotonic() - consume_started
        producer.thread.join()
        if producer.error is not None:
            raise producer.error
        _status("stopping Spark; checking the subscription")
        stop_session(spark)
        spark = None
        left = _left_in_subscription(client, topic, args.subscription)
    finally:
        stop_session(spark)  # also a JVM launched without a session; nothing if none is left
        if client is not None:
            client.close()
        if broker is not None:
            broker.stop()
    first_at_ms = [t["first_received_at_ms"] for t in stats["task_stats"] if t["first_received_at_ms"] is not None]
    times = {
        "broker_start_s": broker_start_s,
        "spark_start_s": spark_start_s,
        "first_message_s": min(first_at_ms) / 1000 - started_wall if first_at_ms else None,
        "consume_s": consume_s,
        "wall_s": time.monotonic() - started,
    }
    return _summarize(args, producer, stats, left, times, url if broker is None else "apache-standalone")


MAX_DUPLICATES_PCT = 1.0
"""Above this share of duplicates (of the events produced) the result is not OK."""


def result(summary: dict[str, Any]) -> tuple[str, int]:
    """The summary's result line and the exit code.

    - 1, ``FAILED``: an event was lost or left in the subscription;
    - 3, ``DUPLICATES``: nothing lost, but the handler saw more than
      :data:`MAX_DUPLICATES_PCT` % of the events twice (at-least-once still held);
    - 0, ``OK``: nothing lost, duplicates within the bound.

    >>> result({"lost": 0, "left_in_subscription": 0, "duplicates": 10, "duplicates_pct": 0.1})
    ('OK: nothing lost, 10 duplicates (0.10 %)', 0)
    >>> result({"lost": 2, "left_in_subscription": 0, "duplicates": 0, "duplicates_pct": 0.0})[1]
    1
    """
    lost, left, dups, pct = (summary[k] for k in ("lost", "left_in_subscription", "duplicates", "duplicates_pct"))
    duplicates = f"{dups:,} duplicates ({pct:.2f} %)"
    if lost or left:
        return f"FAILED: {lost:,} events lost, {left:,} left in the subscription; {duplicates}", 1
    if pct > MAX_DUPLICATES_PCT:
        return f"DUPLICATES: nothing lost, but {duplicates}, over the {MAX_DUPLICATES_PCT:g} % bound", 3
    return f"OK: nothing lost, {duplicates}", 0


def _retry_wait(retries: list[tuple[Any, float, float, float]]) -> dict[str, float | None]:
    """Min / p50 / max of arrival - nack time: the delay a retry really waited. O(n log n).

    Unlike the lateness it does not depend on the delay the config asked for.

    >>> _retry_wait([("k", 0.0, 500.0, 620.0), ("j", 10.0, 510.0, 530.0)])
    {'min': 520.0, 'p50': 520.0, 'max': 620.0}
    >>> _retry_wait([])
    {'min': None, 'p50': None, 'max': None}
    """
    waits = sorted(arrived - nacked for _key, nacked, _requested, arrived in retries)
    if not waits:
        return {"min": None, "p50": None, "max": None}
    return {"min": round(waits[0], 1), "p50": round(waits[(len(waits) - 1) // 2], 1), "max": round(waits[-1], 1)}


def _summarize(
    args: argparse.Namespace, producer: _Producer, stats: Any, left: int, times: dict[str, Any], broker: str
) -> dict[str, Any]:
    """The demo's summary: what was produced, handled, lost, duplicated, and how late."""
    consume_s = times["consume_s"]
    produced = set(producer.confirmed)
    acked_ids = stats["collected"]
    seen = set(acked_ids)
    lost = len(produced - seen)
    summary: dict[str, Any] = {
        "messages": args.messages,
        "produced": len(produced),
        "produce_failed": producer.failed,
        "processed": stats["received"],
        "acked": stats["acked"],
        "nacked": stats["nacked"],
        "redelivered": stats["redelivered"],
        "lost": lost,
        "left_in_subscription": left,
        "duplicates": len(acked_ids) - len(seen),
        "duplicates_pct": round(100 * (len(acked_ids) - len(seen)) / max(len(produced), 1), 3),
        "swallowed_batch_duplicates": stats["swallowed"],
        "handler_errors": stats["handler_errors"],
        "failure_rate": args.failure_rate,
        "redelivery_lateness_ms": {k: stats["lateness_ms"][k] for k in ("count", "min", "p50", "p99", "max")},
        "retry_wait_ms": _retry_wait(stats["retries"]),
        "retry_stages_ms": stats["retry_stages_ms"],
        "peak_pending_nacks": stats["peak_pending_nacks"],
        "peak_tracker_memory_bytes": stats["peak_tracker_memory_bytes"],
        "tasks": stats["tasks"],
        "rounds": stats["rounds"],
        "workers": stats["workers"],
        "consumers": stats["consumers"],
        "max_tasks_per_consumer": stats["max_tasks_per_consumer"],
        "broker_start_s": round(times["broker_start_s"], 2),
        "spark_start_s": round(times["spark_start_s"], 2),
        # From the start of the demo (after the interpreter's start and imports) to the
        # first message handed to a handler on any worker.
        "first_message_s": None if times["first_message_s"] is None else round(times["first_message_s"], 2),
        "produce_s": round(producer.seconds, 2),
        "consume_s": round(consume_s, 2),
        "wall_s": round(times["wall_s"], 2),
        "messages_per_s": round(len(produced) / consume_s, 1) if consume_s > 0 else 0.0,
        "master": args.master,
        "broker": broker,
        "tracker": args.tracker,
        "retries": getattr(args, "retries", "nack"),
        "retry_hold_ms": _retry_hold_ms(args),
        "subscription": args.subscription,
        "broker_config": _broker_config(args) if broker == "apache-standalone" else None,
        "receiver_queue_size": args.receiver_queue_size,
        "driver_pid": os.getpid(),
        "worker_pids": sorted({t["worker_pid"] for t in stats["task_stats"]}),
        "ok": lost == 0 and left == 0,  # nothing lost; "result" also holds the duplicates to their bound
    }
    summary["result"] = result(summary)[0]
    return summary


def _print_summary(s: dict[str, Any]) -> None:
    late = s["redelivery_lateness_ms"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f} ms"

    def known(value: int | None, unit: str = "") -> str:
        return "not available (built-in tracker)" if value is None else f"{value:,}{unit}"

    rows = [
        ("produced", f"{s['produced']:,}"),
        ("processed (handler calls)", f"{s['processed']:,}"),
        ("acked", f"{s['acked']:,}"),
        ("nacked (transient failures)", f"{s['nacked']:,}"),
        ("redelivered", f"{s['redelivered']:,}"),
        ("duplicates seen by the handler", f"{s['duplicates']:,}"),
        ("batch copies swallowed", f"{s['swallowed_batch_duplicates']:,}"),
        ("lost", f"{s['lost']:,}" + ("" if s["lost"] else "  (every produced event was acked)")),
        ("left in the subscription", f"{s['left_in_subscription']:,}"),
        ("retry lateness p50 / p99 / max", f"{ms(late['p50'])} / {ms(late['p99'])} / {ms(late['max'])}"),
        ("peak pending nacks (one worker)", known(s["peak_pending_nacks"])),
        ("peak tracker memory (one worker)", known(s["peak_tracker_memory_bytes"], " bytes")),
        ("tasks / rounds / workers", f"{s['tasks']} / {s['rounds']} / {s['workers']}"),
        ("Spark start / consume / total", f"{s['spark_start_s']:.1f} s / {s['consume_s']:.1f} s / {s['wall_s']:.1f} s"),
        ("throughput", f"{s['messages_per_s']:,.0f} messages/s"),
        ("result", result(s)[0]),
    ]
    width = max(len(name) for name, _ in rows)
    print(
        f"pulsar-nack demo: {s['messages']:,} events, {s['failure_rate']:.0%} failing once, "
        f"{s['master']}, {s['broker']}, tracker {s['tracker']}, retries {s.get('retries', 'nack')}, "
        f"subscription {s.get('subscription', 'Shared')}"
    )
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
