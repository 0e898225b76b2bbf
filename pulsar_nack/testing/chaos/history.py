"""The history of a chaos run: one append-only JSON-lines file per process, flushed per record.

Every process of a run (producers, consumers, the dead-letter reader, the nemesis) writes
its own file, ``<name>.<pid>.jsonl``, in the run's directory. A record is one line, written
and flushed as one ``write`` call, so a process killed with SIGKILL leaves at most its last
line incomplete, and :func:`read_history` skips such a line. Each record has ``ev`` (an
:class:`Ev`), ``t`` (``time.time()``, seconds: one clock for every process on the machine),
``proc`` (the process's name) and ``pid``; the rest depends on the event:

``produce``
    ``id``, ``topic`` (the topic's alias), ``mid`` (the stored message's id), ``batched``.
``deliver``
    ``id``, ``sub``, ``gen``, ``mid``, ``rc`` (``redelivery_count()``), ``copy`` (the
    ``chaos_token`` of a reconsumed copy, or None for an original).
``ack``, ``nack``, ``reconsume``
    ``id``, ``sub``, ``gen``, ``rc``; a nack has ``delay_ms`` and ``floor_ms`` (how early
    its bucket may fire it); a reconsume ``delay_ms`` and ``token``.
``dead_letter``
    ``id``, ``sub``, ``dlq_mid``, ``published`` (the dead letter's publish time, s).
``fault``
    ``kind`` (a :class:`~pulsar_nack.testing.chaos.nemesis.Fault`), ``target``, ``phase``
    (``begin`` or ``end``).
``leftover``
    ``id``, ``sub``, ``mid``, ``rc``: a message still unacknowledged in a subscription
    after the drain, read at the end by a plain consumer.
``start``, ``subscribe``, ``close``, ``stop``, ``error``, ``sample``
    Lifecycle, errors, and soak samples (``rss``, ``tracker_bytes``, ``pending``).
"""

from __future__ import annotations

import enum
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["Ev", "HistoryTail", "HistoryWriter", "read_history"]


class Ev(str, enum.Enum):
    """What a record says happened."""

    START = "start"
    STOP = "stop"
    PRODUCE = "produce"
    DELIVER = "deliver"
    ACK = "ack"
    NACK = "nack"
    RECONSUME = "reconsume"
    DEAD_LETTER = "dead_letter"
    SUBSCRIBE = "subscribe"
    CLOSE = "close"
    FAULT = "fault"
    ERROR = "error"
    SAMPLE = "sample"
    LEFTOVER = "leftover"


class HistoryWriter:
    """Append records of one process to ``<directory>/<name>.<pid>.jsonl``; thread-safe.

    Parameters
    ----------
    directory : path
        The run's history directory (created if absent).
    name : str
        The process's name in the run (``consumer-nack-0``, ``nemesis``...).
    """

    def __init__(self, directory: str | os.PathLike[str], name: str) -> None:
        self.name = name
        self.pid = os.getpid()
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{name}.{self.pid}.jsonl"
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        self._lock = threading.Lock()

    def write(self, ev: Ev, **fields: Any) -> float:
        """Append one record stamped now; return its time."""
        now = time.time()
        line = json.dumps({"ev": ev.value, "t": now, "proc": self.name, "pid": self.pid, **fields},
                          separators=(",", ":")) + "\n"  # fmt: skip
        with self._lock:
            self._file.write(line)
            self._file.flush()
        return now

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _records(path: Path, offset: int = 0) -> Iterator[tuple[dict[str, Any], int]]:
    """Complete records of *path* from byte *offset*, each with the offset after it."""
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # a line cut by a kill, or still being written
            offset += len(raw)
            try:
                yield json.loads(raw), offset
            except ValueError:
                continue  # a line cut by a kill and continued by the next incarnation's append


def read_history(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete record of every file in *directory*, in time order."""
    records = [record for path in sorted(Path(directory).glob("*.jsonl")) for record, _ in _records(path)]
    records.sort(key=lambda r: r["t"])
    return records


class HistoryTail:
    """Reads what was appended to a history directory since the last :meth:`poll`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        """The complete records appended since the last call (every file, not sorted)."""
        fresh: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            for record, after in _records(path, self._offsets.get(path, 0)):
                fresh.append(record)
                self._offsets[path] = after
        return fresh
