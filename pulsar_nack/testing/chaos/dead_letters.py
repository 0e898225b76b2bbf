"""The dead-letter reader of a chaos run: records every message of the run's dead-letter topics.

It reads them with a plain ``pulsar`` consumer on their initial subscription (created by
the consumers' dead-letter policy before the first dead letter), so no dead letter is
missed, and records each with its own message id and publish time; a copy the reader gets
twice (an ack lost with a broker) carries the same dead-letter id, a dead letter sent twice
a new one. SIGTERM ends it.
"""

from __future__ import annotations

import signal
import threading
import time

from .fate import decode
from .history import Ev, HistoryWriter
from .workload import DLQ_SUBSCRIPTION, WorkloadSpec

__all__ = ["run_dead_letter_reader"]


def run_dead_letter_reader(spec: WorkloadSpec, name: str) -> None:
    """Record the dead letters of every subscription of *spec* until SIGTERM."""
    import pulsar

    from ..client import quiet_client

    writer = HistoryWriter(spec.history, name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    topics = {sub.dead_letter_topic(spec): sub.name for sub in spec.subscriptions}
    writer.write(Ev.START, role="dead-letters", topics=sorted(topics))
    client = quiet_client(spec.url)
    consumer = client.subscribe(list(topics), DLQ_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
    while not stop.is_set():
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        except Exception as error:
            writer.write(Ev.ERROR, op="receive", error=repr(error)[:300])
            time.sleep(0.1)
            continue
        message_id, _ = decode(message.data())
        topic = message.topic_name()
        sub = next((name for dlq, name in topics.items() if topic.endswith(dlq.split("://", 1)[-1])), topic)
        writer.write(Ev.DEAD_LETTER, id=message_id, sub=sub, dlq_mid=str(message.message_id()),
                     published=message.publish_timestamp() / 1000)  # fmt: skip
        consumer.acknowledge(message)
    writer.write(Ev.STOP)
    consumer.close()
    client.close()
    writer.close()
