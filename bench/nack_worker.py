"""The worker of ``bench/nack_instructions.py``, run as a script under Callgrind: receive, then nack with instrumentation on.

``python bench/nack_worker.py SYSTEM URL TOPIC COUNT NACKS``: subscribes ``SYSTEM``
(``plain`` or ``pulsar-nack``, the ``pulsar_nack`` on ``PYTHONPATH``) to *TOPIC*,
receives *COUNT* messages, turns Callgrind's instrumentation on, nacks the first *NACKS*
of them (one hour's delay), turns it off and exits. It imports nothing of ``bench``, so
an older commit's code can be counted with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

HOUR_MS = 3_600_000


def worker(system: str, url: str, topic: str, count: int, nacks: int) -> None:
    """In the process valgrind runs: receive *count* messages, then nack the first *nacks* with instrumentation on."""
    import pulsar

    import pulsar_nack

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    kwargs: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared, "initial_position": pulsar.InitialPosition.Earliest,
        "batch_index_ack_enabled": True, "negative_ack_redelivery_delay_ms": HOUR_MS, "receiver_queue_size": count,
    }  # fmt: skip
    subscription = f"instructions-{uuid.uuid4().hex[:8]}"
    if system == "plain":
        consumer = client.subscribe(topic, subscription, **kwargs)
    else:
        consumer = pulsar_nack.subscribe(client, topic, subscription, **kwargs)
    messages = [consumer.receive(60_000) for _ in range(count)]
    nack = consumer.negative_acknowledge
    toggle = ["callgrind_control", "--instr=on", str(os.getpid())]
    subprocess.run(toggle, check=True, capture_output=True)
    for message in messages[:nacks]:
        nack(message)
    toggle[1] = "--instr=off"
    subprocess.run(toggle, check=True, capture_output=True)
    os._exit(0)  # the counts are written at exit; closing would only add the client's shutdown


if __name__ == "__main__":
    system, url, topic, count, nacks = sys.argv[1:6]
    worker(system, url, topic, int(count), int(nacks))
