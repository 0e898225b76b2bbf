"""Shared helpers of the benchmarks: run metadata, result files, RSS, tables, stats.

Every result JSON carries :func:`metadata` beside the numbers: the machine (CPU model,
cores, RAM, OS; no host name), the Python and package versions, the git commit of the
repository with a dirty flag (and, since a dirty tree is common while developing, a
SHA-256 of each core module so a result can be tied to the exact code), a UTC time
stamp and the exact command line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata as _md
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "RESULTS",
    "core_fingerprint",
    "fmt_bytes",
    "fmt_rate",
    "metadata",
    "percentile",
    "print_table",
    "results_dir",
    "rss_anon_bytes",
    "rss_bytes",
    "start_context",
    "summarize",
    "trim_heap",
    "write_result",
]

REPO = Path(__file__).resolve().parent.parent
"""The repository root (the parent of ``bench/``)."""
RESULTS = REPO / "bench" / "results"
"""Where the full runs' result JSON files go (committed)."""
OUT_ENV = "PULSAR_NACK_BENCH_OUT"
"""Environment variable: a directory for every result file of this run (``pulsar-nack bench --out``)."""

_PACKAGES = ("pyroaring", "sortedcontainers", "pulsar-client", "pyspark", "tqdm", "numpy")
_CORE_MODULES = (
    "buckets.py",
    "_pages.py",
    "_accel.py",
    "_speedups.c",
    "tracker.py",
    "baseline.py",
    "_base.py",
    "_validate.py",
    "keys.py",
    "timer.py",
    "backoff.py",
)


# ---------------------------------------------------------------------- metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return _md.version(package)
    except _md.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _command_line() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)


def core_fingerprint() -> dict[str, str]:
    """Short SHA-256 of each core module as it is on disk now.

    Workers record it when they import the library, and runs record it when they start,
    so a result can show that the code did not change under a long run (the tree is
    shared with other people editing it).
    """
    core = REPO / "pulsar_nack"
    return {
        name: hashlib.sha256((core / name).read_bytes()).hexdigest()[:16]
        for name in _CORE_MODULES
        if (core / name).exists()
    }


def _speedups_built() -> bool:
    """Whether this process's ``NegativeAcksTracker.add`` can use the C hot path."""
    from pulsar_nack.core import accel as _accel

    return _accel.SPEEDUPS


def start_context() -> dict[str, Any]:
    """What to compare at the end of a run: the commit and the core fingerprint now."""
    return {"git_commit": _git("rev-parse", "HEAD"), "core_sha256": core_fingerprint()}


def metadata(start: dict[str, Any] | None = None) -> dict[str, Any]:
    """Machine, versions, commit, time and command line of this run (no host name).

    With *start* (from :func:`start_context`), also records it and whether the commit
    or the core code changed between the start and now.
    """
    status = _git("status", "--porcelain")
    meta: dict[str, Any] = {
        "machine": {
            "cpu_model": _cpu_model(),
            "cores": os.cpu_count(),
            "ram_bytes": _ram_bytes(),
            "os": platform.platform(),  # kernel + libc; platform.node() is never recorded
            "arch": platform.machine(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "compiler": platform.python_compiler(),
            "switch_interval_s": sys.getswitchinterval(),
        },
        "packages": {name: _version(name) for name in _PACKAGES},
        "speedups_built": _speedups_built(),
        "git": {
            "commit": _git("rev-parse", "HEAD"),
            "dirty": bool(status) if status is not None else None,
            "dirty_files": status.splitlines() if status else [],
        },
        "core_sha256": core_fingerprint(),
        "utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": _command_line(),
        "cwd_relative_to_repo": os.path.relpath(os.getcwd(), REPO),
    }
    if start is not None:
        meta["at_start"] = start
        meta["code_changed_during_run"] = start["core_sha256"] != meta["core_sha256"]
        meta["commit_changed_during_run"] = start["git_commit"] != meta["git"]["commit"]
    return meta


def run_worker(
    module: str,
    *args: str,
    timeout_s: float = 1800,
    cwd: str | Path = REPO,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python -m module --worker *args`` in a fresh process; return its last stdout line as JSON."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--worker", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def broker_label(broker: Any) -> str:
    """What a result records as its broker, e.g. "Apache Pulsar 4.0.8 standalone"."""
    version = getattr(broker, "version", None)
    return f"Apache Pulsar {version} standalone" if version else "a Pulsar cluster (--service-url)"


def results_dir(name: str) -> Path:
    """Where :func:`write_result` puts ``<name>.json``.

    ``$PULSAR_NACK_BENCH_OUT`` when set; else a quick run's result (a name ending in
    ``-quick``) goes to the user's cache, ``$XDG_CACHE_HOME/pulsar-nack/bench`` or
    ``~/.cache/pulsar-nack/bench``, never into the tracked ``bench/results/``; else
    ``bench/results/``.
    """
    explicit = os.environ.get(OUT_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if name.endswith("-quick"):
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "pulsar-nack" / "bench"
    return RESULTS


def write_result(name: str, payload: dict[str, Any], start: dict[str, Any] | None = None) -> Path:
    """Write ``<name>.json`` into :func:`results_dir` (overwriting it), with :func:`metadata` added.

    File names are stable so that the full runs are committed and overwritten by the
    next run; ``--quick`` runs use a ``-quick`` suffix and a directory outside the
    checkout. Pass the run's :func:`start_context` as *start* to record whether the
    code changed during the run.
    """
    directory = results_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    document = {"benchmark": name, "meta": metadata(start), **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------- memory

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm() -> list[int]:
    with open("/proc/self/statm", encoding="ascii") as f:
        return [int(v) * _PAGE for v in f.read().split()]


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm`` (Linux)."""
    return _statm()[1]


def rss_anon_bytes() -> int:
    """Resident memory that is not file-backed: ``resident - shared`` from ``statm``.

    This leaves out the code pages of the interpreter and of extension modules, which
    become resident the first time the code runs (the first ``pyroaring`` bitmap
    faults in about 400 KiB of library text), so it is the heap-like part of the RSS.
    """
    values = _statm()
    return values[1] - values[2]


def _load_malloc_trim() -> Any:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_malloc_trim()


def trim_heap() -> bool:
    """Give freed heap memory back to the OS: glibc ``malloc_trim(0)``. False if unavailable.

    Why: an RSS delta is meant to show what the live structure holds. Building it leaves
    garbage behind (temporary key tuples and ints, the per-bucket bitmaps freed when a
    bucket is sealed, resized tables). CPython and pyroaring free that memory, but glibc
    keeps freed chunks inside the heap and its arenas instead of returning them, so
    without a trim the RSS would count build-time garbage as if the structure held it.
    ``malloc_trim(0)`` releases the free pages of every arena (glibc >= 2.8 also
    releases free pages in the middle of the heap). Memory still held by live objects,
    including pymalloc arenas kept alive by a single live object (fragmentation), stays
    counted: that is a real cost of the structure.
    """
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


# ---------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (pos - low))


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """``min``, ``median``, ``max`` and every sample of a list of repetitions."""
    data = list(values)
    return {
        "min": min(data),
        "median": statistics.median(data),
        "max": max(data),
        "samples": data,
    }


# ---------------------------------------------------------------------- output


def fmt_bytes(n: float | None) -> str:
    """Human-readable bytes (binary units)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def fmt_rate(per_s: float | None) -> str:
    """A rate per second, e.g. ``1.23 M/s``."""
    if per_s is None:
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> str:
    """Print (and return) a plain-text table; numbers are right-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(_looks_numeric(row[i]) for row in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(row) for row in cells[1:])
    text = "\n".join(out)
    print(text, flush=True)
    return text


def _looks_numeric(cell: str) -> bool:
    head = cell.split(" ", 1)[0].lstrip("+-≤≥<>x×").replace(",", "").replace("_", "")
    try:
        float(head)
    except ValueError:
        return cell in ("-", "nan")
    return True


def timed_pop_all(tracker: Any, n: int, end_of_time: int) -> float:
    """Seconds for ``tracker.pop_due(end_of_time)``; raises unless exactly *n* keys came out."""
    start = time.perf_counter()
    due = tracker.pop_due(end_of_time)
    elapsed = time.perf_counter() - start
    popped = sum(map(len, due.values()))
    if popped != n or len(tracker):
        raise AssertionError(f"popped {popped} of {n}; {len(tracker)} left")
    return elapsed
