"""Where the durable retries' extra time goes: CPU seconds per process and thread, per retry mode.

Runs ``pulsar-nack demo`` once per mode (the same options as ``bench.demo --retries``)
and samples ``/proc`` every 200 ms for every process the demo started: the demo's
own Python process (the producer thread, the Spark driver's Python side), the Spark
JVM, the Python workers (the consumer tasks) and the broker JVM (Apache Pulsar
standalone), each thread by name. A process's last sample before it exits is its CPU
time (Linux ``utime + stime``). The extra CPU of a mode over ``nack``, divided by its
retries, is the cost of one retry where it is spent. With ``--py-spy``, the Python
workers are also sampled by py-spy (``--subprocesses``, raw stacks) and the functions
with the most samples (self and total) are listed.

Run: ``python -m bench.profile_retries [--size default] [--modes nack,durable] [--py-spy]``;
the result goes to ``bench/results/demo-retries-profile[-SIZE].json``.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ._common import REPO, finish, parser, start_context
from .demo import RETRY_MODES

_TICK = os.sysconf("SC_CLK_TCK")
_DIGITS = re.compile(r"[-_ #]?\d+$")


def _stat(path: str) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds, thread or process name) from a /proc stat file, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, name


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kind(pid: int, root: int, cmdline: str) -> str:
    """Which part of the demo a process is."""
    if pid == root:
        return "demo driver (python: producer, Spark driver side)"
    program = cmdline.split(" ", 1)[0]
    if program.endswith("java"):
        return "Spark JVM" if "org.apache.spark" in cmdline else "broker JVM"
    if "python" in program and "pyspark" in cmdline:
        return "Python workers (consumer tasks)"
    return "other (launch scripts)"


class Sampler:
    """Every 200 ms: the CPU seconds of every process under *root* and of each of its threads."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.processes: dict[int, tuple[str, float]] = {}  # pid -> (kind, cpu s)
        self.threads: dict[tuple[int, int], tuple[str, str, float]] = {}  # (pid, tid) -> (kind, name, cpu s)
        self.kinds: dict[tuple[int, str], str] = {}  # (pid, process name) -> kind (a script may exec java)
        self.daemon: int | None = None  # the PySpark daemon (the workers' parent)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = collections.defaultdict(list)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _stat(f"/proc/{entry}/stat")
                if stat is not None:
                    children[stat[0]].append(int(entry))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        for pid in self._descendants():
            stat = _stat(f"/proc/{pid}/stat")
            if stat is None:
                continue
            if (pid, stat[2]) not in self.kinds:
                cmdline = _cmdline(pid)
                self.kinds[(pid, stat[2])] = _kind(pid, self.root, cmdline)
                if self.daemon is None and "pyspark.daemon" in cmdline:
                    self.daemon = pid
            kind = self.kinds[(pid, stat[2])]
            self.processes[pid] = (kind, stat[1])
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                tstat = _stat(f"/proc/{pid}/task/{tid}/stat")
                if tstat is not None:
                    name = _DIGITS.sub("", tstat[2]) or tstat[2]
                    if name == "python":  # pulsar-client's C++ threads keep the process's name
                        name = "python: main thread" if int(tid) == pid else "python: other threads (pulsar-client C++)"
                    self.threads[(pid, int(tid))] = (kind, name, tstat[1])

    def totals(self) -> dict[str, Any]:
        """CPU seconds per kind of process, and per thread name within each kind (top 12)."""
        per_kind: dict[str, float] = collections.defaultdict(float)
        for kind, cpu in self.processes.values():
            per_kind[kind] += cpu
        per_thread: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
        for kind, name, cpu in self.threads.values():
            per_thread[kind][name] += cpu
        return {
            "cpu_s": {k: round(v, 2) for k, v in sorted(per_kind.items())},
            "cpu_s_total": round(sum(per_kind.values()), 2),
            "threads_cpu_s": {
                kind: {n: round(c, 2) for n, c in sorted(names.items(), key=lambda kv: -kv[1])[:12]}
                for kind, names in sorted(per_thread.items())
            },
        }


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--subprocesses", *os.environ.get("PY_SPY_EXTRA", "").split(), "--format", "raw", "--rate", "50", "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _top_functions(raw: Path, top: int = 25) -> dict[str, Any]:
    """Samples per function from py-spy's raw (collapsed) stacks: self and total, the *top* of each."""
    self_counts: collections.Counter[str] = collections.Counter()
    total_counts: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [re.sub(r" \(.*?/(site-packages/|wt-[^/]+/)?", " (", f) for f in stack.split(";")[1:]]  # drop the process frame
        samples += count
        if frames:
            self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    return {"samples": samples, "self": dict(self_counts.most_common(top)), "total": dict(total_counts.most_common(top))}


def profile_mode(mode: str, size: str, py_spy: bool, work: Path) -> dict[str, Any]:
    """One demo process in *mode*, sampled; its summary's key numbers and the CPU breakdown."""
    command = [sys.executable, "-m", "pulsar_nack.cli", "demo", *RETRY_MODES[mode], "--messages", size, "--json"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    sampler = Sampler(process.pid)
    sampler.thread.start()
    spy: subprocess.Popen[bytes] | None = None
    raw = work / f"py-spy-{mode}.txt"
    while py_spy and spy is None and process.poll() is None:
        if sampler.daemon is not None:
            spy = _py_spy(sampler.daemon, raw)
            break
        time.sleep(0.1)
    stdout, _ = process.communicate()
    sampler.stop.set()
    sampler.thread.join()
    if spy is not None:
        spy.wait(timeout=60)
    s = json.loads(stdout.decode().strip().splitlines()[-1])
    result: dict[str, Any] = {
        "mode": mode, "size": size, "exit_code": process.returncode, "process_wall_s": round(time.monotonic() - start, 2),
        "summary": {k: s.get(k) for k in ("messages", "nacked", "redelivered", "lost", "duplicates", "produce_s", "consume_s",
                                           "messages_per_s", "redelivery_lateness_ms", "retry_stages_ms")},
        **sampler.totals(),
    }
    if spy is not None and raw.exists():
        result["py_spy"] = _top_functions(raw)
    return result


def _extra_per_retry(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode other than nack: CPU over nack's per process kind, in µs per retry."""
    base = next((r for r in runs if r["mode"] == "nack"), None)
    if base is None:
        return {}
    out: dict[str, Any] = {}
    for run in runs:
        if run["mode"] == "nack":
            continue
        retries = run["summary"]["nacked"] or 1
        kinds = set(run["cpu_s"]) | set(base["cpu_s"])
        out[run["mode"]] = {
            k: round((run["cpu_s"].get(k, 0.0) - base["cpu_s"].get(k, 0.0)) / retries * 1e6, 1) for k in sorted(kinds)
        }
        out[run["mode"]]["total"] = round((run["cpu_s_total"] - base["cpu_s_total"]) / retries * 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_parser = parser(__doc__, "bench.profile_retries", "the small size")
    args_parser.add_argument("--size", default="default", help="demo --messages (default: default)")
    args_parser.add_argument("--modes", default="nack,durable", help="comma-separated modes of bench.demo --retries")
    args_parser.add_argument("--py-spy", action="store_true", help="also sample the Python workers with py-spy")
    args = args_parser.parse_args(argv)
    size = "small" if args.quick else args.size
    start, runs = start_context(), []
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "pulsar-nack-profile"
    work.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):
        run = profile_mode(mode, size, args.py_spy, work)
        runs.append(run)
        print(mode, run["summary"]["messages_per_s"], run["cpu_s"], flush=True)
    data = {"runs": runs, "extra_cpu_us_per_retry_vs_nack": _extra_per_retry(runs)}
    name = "demo-retries-profile" if size == "default" else f"demo-retries-profile-{size}"
    finish(args, name, data, start)
    return data


if __name__ == "__main__":
    main()
