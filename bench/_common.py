"""What the benchmarks and the report share: run metadata, result files, RSS, statistics, tables.

Every result JSON carries :func:`metadata` beside the numbers: the machine (CPU model,
cores, RAM, OS; no host name), the Python and package versions, the git commit of the
repository with a dirty flag (and a SHA-256 of each core module, so a result can be
tied to the exact code), a UTC time stamp and the exact command line.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import metadata as _md
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
"""The repository root (the parent of ``bench/``)."""
RESULTS = REPO / "bench" / "results"
"""Where the full runs' result JSON files go (committed)."""
OUT_ENV = "PULSAR_NACK_BENCH_OUT"
"""Environment variable: a directory for every result file of this run (``pulsar-nack bench --out``)."""

_PACKAGES = ("pyroaring", "sortedcontainers", "pulsar-client", "pyspark", "tqdm", "numpy")
_CORE = REPO / "pulsar_nack" / "core"

# ---------------------------------------------------------------------- metadata


def _proc_field(path: str, prefix: str) -> str | None:
    """The rest of the first line of *path* starting with *prefix* (Linux /proc), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(prefix)), None)
    except OSError:
        return None


def _version(package: str) -> str | None:
    try:
        return _md.version(package)
    except _md.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def core_fingerprint() -> dict[str, str]:
    """Short SHA-256 of each core module (``pulsar_nack/core/`` and ``_validate.py``) as it is on disk now.

    Workers record it when they import the library, and runs when they start, so a result
    can show that the code did not change under a long run.
    """
    paths = sorted([*_CORE.glob("*.py"), *_CORE.glob("*.c"), REPO / "pulsar_nack" / "_validate.py"])
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in paths}


def start_context() -> dict[str, Any]:
    """What to compare at the end of a run: the commit and the core fingerprint now."""
    return {"git_commit": _git("rev-parse", "HEAD"), "core_sha256": core_fingerprint()}


def metadata(start: dict[str, Any] | None = None) -> dict[str, Any]:
    """Machine, versions, commit, time and command line of this run (no host name).

    With *start* (from :func:`start_context`), also records it and whether the commit
    or the core code changed between the start and now.
    """
    from pulsar_nack.consumer import admission
    from pulsar_nack.core import accel

    status = _git("status", "--porcelain")
    ram = _proc_field("/proc/meminfo", "MemTotal:")
    meta: dict[str, Any] = {
        "machine": {
            "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "ram_bytes": int(ram.split()[0]) * 1024 if ram else None,
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
        "speedups_built": accel.SPEEDUPS,
        "ledger_compiled": admission.COMPILED,
        "git": {
            "commit": _git("rev-parse", "HEAD"),
            "dirty": bool(status) if status is not None else None,
            "dirty_files": status.splitlines() if status else [],
        },
        "core_sha256": core_fingerprint(),
        "utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": shlex.join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]),
        "cwd_relative_to_repo": os.path.relpath(os.getcwd(), REPO),
    }
    if start is not None:
        meta["at_start"] = start
        meta["code_changed_during_run"] = start["core_sha256"] != meta["core_sha256"]
        meta["commit_changed_during_run"] = start["git_commit"] != meta["git"]["commit"]
    return meta


def run_worker(
    module: str, *args: str, timeout_s: float = 1800, cwd: str | Path = REPO, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m module --worker *args`` in a fresh process; return its last stdout line as JSON."""
    if env is None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    out = subprocess.run(
        [sys.executable, "-m", module, "--worker", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True,
        check=True, timeout=timeout_s,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


BROKER_ENV = "PULSAR_NACK_BENCH_BROKER"
"""``"SERVICE_URL ADMIN_URL"`` of a running broker (batch-index acks on) that :func:`standalone`
gives instead of starting one: ``pulsar-nack bench --quick`` starts one for all its parts."""


class _SharedBroker:
    """A broker that :func:`standalone` did not start (:data:`BROKER_ENV`): its URLs and admin API."""

    def __init__(self, url: str, admin_url: str) -> None:
        from pulsar_nack.testing.admin import PulsarAdmin

        self.url, self.admin_url = url, admin_url
        self.admin = PulsarAdmin(admin_url)

    @property
    def version(self) -> str:
        return self.admin.broker_version()


@contextlib.contextmanager
def standalone() -> Iterator[Any]:
    """Apache Pulsar standalone with batch-index acks, started and stopped here, or the running
    one :data:`BROKER_ENV` names (left running)."""
    shared = os.environ.get(BROKER_ENV)
    if shared:
        url, admin_url = shared.split()
        yield _SharedBroker(url, admin_url)
        return
    from pulsar_nack.testing import PulsarStandalone

    with PulsarStandalone(batch_index_ack=True) as broker:
        yield broker


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
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pulsar-nack" / "bench"
    return RESULTS


def write_result(name: str, payload: dict[str, Any], start: dict[str, Any] | None = None) -> Path:
    """Write ``<name>.json`` into :func:`results_dir` (overwriting it), with :func:`metadata` added.

    Full runs are committed and overwritten by the next run; ``--quick`` runs use a
    ``-quick`` suffix and a directory outside the checkout. Pass the run's
    :func:`start_context` as *start* to record whether the code changed during the run.
    """
    path = results_dir(name) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"benchmark": name, "meta": metadata(start), **payload}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load(name: str) -> dict[str, Any]:
    """``bench/results/<name>.json``."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def parser(doc: str, module: str, quick: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of a benchmark: its docstring's first paragraph, ``--quick`` and ``--out``."""
    made = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    if quick is not None:
        made.add_argument("--quick", action="store_true", help=quick)
    made.add_argument("--out", default=None, help="result name (default: the benchmark's, -quick with --quick)")
    return made


def finish(
    args: argparse.Namespace,
    name: str,
    payload: dict[str, Any],
    start: dict[str, Any] | None = None,
    table: Callable[[dict[str, Any]], str] | None = None,
) -> Path:
    """Write the run's result (``args.out``, or *name* with ``-quick`` for a quick run) and say where.

    With *table* (one of bench/report.py's), print ``table(payload)`` first and keep it in the result.
    """
    if table is not None:
        payload["table"] = table(payload)
        print(payload["table"], flush=True)
    path = write_result(args.out or (f"{name}-quick" if getattr(args, "quick", False) else name), payload, start)
    print(f"wrote {path}", flush=True)
    if start is not None and core_fingerprint() != start["core_sha256"]:
        print("WARNING: the core code changed during the run. Rerun.", flush=True)
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
    """Resident memory that is not file-backed (``resident - shared``): the heap-like part of the RSS.

    It leaves out the code pages of the interpreter and of extension modules, which become
    resident the first time the code runs (the first bitmap faults in about 400 KiB).
    """
    values = _statm()
    return values[1] - values[2]


def _load_malloc_trim() -> Any:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_malloc_trim = _load_malloc_trim()


def trim_heap() -> bool:
    """Give freed heap memory back to the OS: glibc ``malloc_trim(0)``. False if unavailable.

    An RSS delta is meant to show what the live structure holds. Building it leaves
    garbage behind that CPython and pyroaring free but glibc keeps inside its arenas;
    without a trim the RSS would count that as if the structure held it. Memory held by
    live objects (fragmentation included) stays counted: a real cost of the structure.
    """
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def settled_rss() -> int:
    """The RSS after ``gc.collect()`` and :func:`trim_heap`."""
    import gc

    gc.collect()
    trim_heap()
    return rss_bytes()


# ---------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (pos - low))


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """``min``, ``median``, ``max`` and every sample of a list of repetitions."""
    data = list(values)
    return {"min": min(data), "median": statistics.median(data), "max": max(data), "samples": data}


def dist(values: Sequence[float], samples: bool = False) -> dict[str, Any]:
    """``n``, ``min``, ``p50``, ``p99``, ``max`` of a distribution (and every value, rounded, with *samples*)."""
    out: dict[str, Any] = {"n": len(values)}
    if values:
        out.update(min=min(values), p50=percentile(values, 50), p99=percentile(values, 99), max=max(values))
        if samples:
            out["samples"] = [round(v, 2) for v in values]
    return out


def interleave(
    systems: Sequence[str], reps: int, measure: Callable[[str], Any], warmup: int = 1, progress: str | None = None
) -> dict[str, list[Any]]:
    """``{system: [sample, ...]}``: ``measure(system)`` for every system, *warmup* + *reps* times,
    the order alternating between repetitions so that drift on the machine falls on all of them."""
    samples: dict[str, list[Any]] = {name: [] for name in systems}
    for rep in range(warmup + reps):
        for name in systems if rep % 2 == 0 else systems[::-1]:
            value = measure(name)
            if rep >= warmup:
                samples[name].append(value)
            if progress:
                print(f"  {progress} {rep - warmup:3d} {name:40} {value}", file=sys.stderr, flush=True)
    return samples


def timed(loop: Callable[[], Any]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds)`` of ``loop()``, after a ``gc.collect()``.

    The CPU time of this process (all its threads) is what other processes on a shared
    machine do not inflate; targets on costs are judged on it, wall time is kept beside it.
    """
    import gc

    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    loop()
    return time.perf_counter() - wall, time.process_time() - cpu


def timed_pop_all(tracker: Any, n: int, end_of_time: int, left: int = 0) -> float:
    """Seconds for ``tracker.pop_due(end_of_time)``; raises unless exactly *n* keys came out and *left* stay."""
    start = time.perf_counter()
    due = tracker.pop_due(end_of_time)
    elapsed = time.perf_counter() - start
    popped = sum(map(len, due.values()))
    if popped != n or len(tracker) != left:
        raise AssertionError(f"popped {popped} of {n}; {len(tracker)} left, not {left}")
    return elapsed


# ---------------------------------------------------------------------- output


def fmt_bytes(n: float | None) -> str:
    """Human-readable bytes (binary units)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def fmt_rate(per_s: float | None) -> str:
    """A rate per second, e.g. ``1.23 M/s``."""
    if per_s is None:
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    return f"{per_s / 1e3:.1f} k/s" if per_s >= 1e3 else f"{per_s:.0f} /s"


def varint(value: int) -> bytes:
    """*value* as a protobuf varint (a negative one as its 64-bit two's complement, as protobuf encodes an int32 -1).

    >>> varint(1), varint(300), len(varint(-1))
    (b'\\x01', b'\\xac\\x02', 10)
    """
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table; *align* gives each column ``l`` (default) or ``r``."""
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---:" if align[i : i + 1] == "r" else "---" for i in range(len(headers))) + "|")
    lines += ["| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


MISSED = "missed (informational: quick sizes)"
"""A quick run's verdict where the full run would say FAIL: its goals are defined for the full sizes."""


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> str:
    """Print (and return) a markdown table, under *title*."""
    text = (f"{title}\n\n" if title else "") + md_table(headers, rows)
    print(text + "\n", flush=True)
    return text
