"""What the Spark kill tests run on the executors, and the checks they make afterwards.

The handler records every call in a file of its own process (``calls-<pid>.txt``: id,
redelivery count, wall-clock ms, outcome, pid), so the record survives a killed worker
or executor. The checks read those files:

- every produced id was handled successfully at least once;
- every retry came no earlier than its backoff minus ``2**bits`` ms, except the retries
  nacked by a process that was killed (the broker returns what a dead consumer held at
  once: documented as "early" in docs/spark.md), which are counted apart.

Run as a script it is a Spark driver (``python tests/spark_jobs.py ARGS_JSON``) for the
tests that need one in a process of its own (a standalone cluster). It registers itself
with cloudpickle, so the executors need not import it.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

BITS = 8  # the default precision: deadlines may be up to 2**8 - 1 ms early
SLACK_MS = 25  # wall-clock reads in two processes
MIN_BACKOFF_MS, MAX_BACKOFF_MS = 1_000, 4_000  # wide enough that a retry handed back at once (100-133 ms) fails the check


class Transient(Exception):
    pass


def fails_first_time(payload: bytes) -> bool:
    """Deterministic 10 %: the same events fail (once) in every run."""
    return zlib.crc32(payload) % 10 == 0


def backoff_ms(redelivery_count: int) -> int:
    """The backoff the kill tests configure: 1 s doubling, up to 4 s."""
    return min(MIN_BACKOFF_MS * 2**redelivery_count, MAX_BACKOFF_MS)


def claim(marker: Path) -> bool:
    """Create *marker* atomically; True for the one caller that created it."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class RecordingHandler:
    """Fail 10 % of the events on first delivery; record every call; optionally die.

    With *kill_after*, the first process to reach that many calls SIGKILLs itself in
    the middle of the call (after recording it, before returning): the message being
    handled is not acked, and the acks of the last ~100 ms are still grouped in the
    client, unsent.
    """

    def __init__(self, record_dir: str, kill_after: int | None = None, delay_ms: float = 0.0) -> None:
        self.record_dir, self.kill_after, self.delay_ms = record_dir, kill_after, delay_ms
        self.calls = 0
        self._file: Any = None
        self._pid = -1

    def __call__(self, message: Any) -> None:
        if self._pid != os.getpid():  # a forked worker writes its own file
            self._pid, self.calls = os.getpid(), 0
            self._file = open(os.path.join(self.record_dir, f"calls-{self._pid}.txt"), "a")  # noqa: SIM115
        data, count = message.data(), message.redelivery_count()
        fail = count == 0 and fails_first_time(data)
        self._file.write(f"{int(data)} {count} {time.time() * 1000:.1f} {'F' if fail else 'OK'} {self._pid}\n")
        self._file.flush()
        self.calls += 1
        if self.kill_after is not None and self.calls == self.kill_after:
            marker = Path(self.record_dir) / "killed"
            if claim(marker):
                marker.write_text(str(self._pid))
                os.kill(self._pid, signal.SIGKILL)
        if self.delay_ms:
            time.sleep(self.delay_ms / 1000)  # a handler doing work: keeps tasks busy for the kill
        if fail:
            raise Transient(data)


def read_calls(record_dir: Path) -> dict[int, list[tuple[float, int, str, int]]]:
    """id -> [(time ms, redelivery count, outcome, pid)], sorted by time."""
    calls: dict[int, list[tuple[float, int, str, int]]] = defaultdict(list)
    for path in record_dir.glob("calls-*.txt"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:  # a line cut by a kill has fewer fields
                calls[int(parts[0])].append((float(parts[2]), int(parts[1]), parts[3], int(parts[4])))
    for events in calls.values():
        events.sort()
    return calls


def check_calls(record_dir: Path, n: int, killed_pids: set[int]) -> dict[str, Any]:
    """The kill tests' guarantees, from the handler's records; raises AssertionError.

    Returns counts for the report: retries checked, early retries of killed processes.
    """
    calls = read_calls(record_dir)
    never_ok = sorted(i for i in range(n) if not any(outcome == "OK" for _, _, outcome, _ in calls.get(i, ())))
    assert not never_ok, f"{len(never_ok)} ids never handled successfully, e.g. {never_ok[:10]}"
    checked = exempt = 0
    too_early = []
    for event_id, events in calls.items():
        for (nacked_at, count, outcome, pid), (arrived_at, *_rest) in itertools.pairwise(events):
            if outcome != "F":
                continue
            if pid in killed_pids:
                exempt += 1
                continue
            checked += 1
            if arrived_at - nacked_at < backoff_ms(count) - 2**BITS - SLACK_MS:
                too_early.append((event_id, count, round(arrived_at - nacked_at, 1)))
    assert not too_early, f"{len(too_early)} retries earlier than their backoff, e.g. {too_early[:5]}"
    assert checked > 0, "no retry was checked"
    return {"retries_checked": checked, "early_from_killed": exempt}


def _main(args: dict[str, Any]) -> int:
    """Driver: produce nothing; consume args['topic'] until drained on args['master']."""
    import pyspark.cloudpickle

    from pulsar_nack.core.backoff import MultiplierRedeliveryBackoff
    from pulsar_nack.spark import ConsumerConfig, TaskBudget, local_session, run_consumer_tasks, stop_session

    pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = local_session(args["master"], "pulsar-nack kill test", conf=args.get("conf", {}))
    try:
        config = ConsumerConfig(
            args["url"],
            args["topic"],
            args["subscription"],
            redelivery_backoff=MultiplierRedeliveryBackoff(MIN_BACKOFF_MS, MAX_BACKOFF_MS),
            retryable=(Transient,),
        )
        handler = RecordingHandler(args["record_dir"], delay_ms=args.get("delay_ms", 0.0))
        budget = TaskBudget(max_time_ms=120_000, idle_timeout_ms=1_500)
        stats = run_consumer_tasks(spark, config, handler, args["tasks"], budget, until_drained=True)
    finally:
        stop_session(spark)
    pids = sorted({t["worker_pid"] for t in stats["task_stats"]})
    print(json.dumps({"driver_pid": os.getpid(), "worker_pids": pids, "rounds": stats["rounds"],
                      "acked": stats["acked"], "attempts": [t["attempt"] for t in stats["task_stats"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(json.loads(sys.argv[1])))
