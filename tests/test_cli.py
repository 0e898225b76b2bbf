"""The ``pulsar-nack`` command line as a user runs it: ``broker``, the command wiring, and
what ``demo`` does before it starts anything (missing JDK or Maven, nothing at
``--service-url`` or ``--master``), its progress counts and its result line.

``pulsar-nack demo`` runs in full in tests/test_spark.py (local) and
tests/test_spark_cluster.py (a standalone cluster, on Apache Pulsar).
"""

from __future__ import annotations

import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import pid_gone, wait_for
from pulsar_nack.cli import _prepare, main

REPO_ROOT = Path(__file__).resolve().parents[1]


def _spark_extra_installed() -> bool:
    """The demo's own check of its extra (it runs first): whether it passes here."""
    try:
        _prepare.check_extra("spark", "pulsar-nack demo")
    except _prepare.SetupError:
        return False
    return True


needs_spark_extra = pytest.mark.skipif(
    not _spark_extra_installed(), reason="the demo checks its spark extra first (pyspark, tqdm): not installed here"
)


def test_the_command_line_lists_its_commands_and_rejects_unknown_ones(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "broker", "bench"))
    with pytest.raises(SystemExit) as done:
        main(["broker", "--lite"])  # the one broker is Apache Pulsar
    assert done.value.code == 2


def test_demo_refuses_an_unknown_subscription_type_naming_the_option(capsys):
    with pytest.raises(SystemExit) as done:
        main(["demo", "--subscription", "Failover"])  # the demo's workers share the topic: Shared or KeyShared
    assert done.value.code == 2
    assert "--subscription: invalid choice: 'Failover'" in capsys.readouterr().err


@needs_spark_extra
def test_demo_refuses_a_retry_hold_without_durable_retries_or_below_zero(capsys):
    assert main(["demo", "--retry-hold-ms", "1000"]) == 2  # with the default --retries nack: nothing would hold
    assert "--retry-hold-ms needs --retries durable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["demo", "--retries", "durable", "--retry-hold-ms", "-1"])
    assert done.value.code == 2
    assert "--retry-hold-ms: must be >= 0" in capsys.readouterr().err


def test_help_texts_show_no_rst_backticks(capsys):
    outputs = {}
    for argv in (["--help"], ["demo", "--help"], ["broker", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        outputs[argv[0]] = out = capsys.readouterr().out
        assert "``" not in out, (argv, out)
    assert "pulsar-nack: the command line (demo, broker, and bench in a source checkout)" in " ".join(outputs["--help"].split())


def test_the_installed_script_runs_bench_from_a_checkout_root_only(tmp_path):
    """``pulsar-nack bench`` as installed: its script's directory, not the working
    directory, is on sys.path, so bench/ (not in the wheel) is loaded from the checkout."""
    script = Path(sys.executable).with_name("pulsar-nack")
    assert script.is_file(), f"no installed script next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [str(script), "bench", "--help"]
    here = subprocess.run(run, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert here.returncode == 0 and "--only" in here.stdout, here.stderr
    for argv in (run[:2], [*run[:2], "--quick"], [*run[:2], "--only", "memory", "--quick"]):
        elsewhere = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert elsewhere.returncode == 2, elsewhere.stderr
        assert "needs a source checkout" in elsewhere.stderr and "run it from the root of a checkout" in elsewhere.stderr
        assert "unrecognized arguments" not in elsewhere.stderr


def _lines(stream) -> queue.Queue:
    """Read *stream* line by line on a thread; the lines arrive in the queue."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for_urls(lines: queue.Queue, timeout_s: float) -> dict[str, str]:
    """Collect ``name: value`` lines until the broker pid is printed, within a deadline."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while "broker pid" not in found:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"no broker pid printed within {timeout_s} s; got {found}")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail(f"the command exited before printing its URLs; got {found}")
        match = re.match(r"^(service URL|admin URL|broker pid):\s+(\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


@pytest.mark.broker
def test_broker_command_fetches_on_first_run_saying_so_then_serves_until_ctrl_c(tmp_path):
    """A fresh cache: the first run says what it fetches and its size, then where it is
    cached and how to remove it; the broker serves until Ctrl-C and stops."""
    from pulsar_nack.testing import quiet_client

    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "PULSAR_NACK_PULSAR_HOME"}
    env["PULSAR_NACK_CACHE"] = str(cache)
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
        env=env,
    )
    try:
        found = _wait_for_urls(_lines(process.stdout), 180)
        assert found["service URL"].startswith("pulsar://127.0.0.1:")
        assert found["admin URL"].startswith("http://127.0.0.1:")
        jvm = int(found["broker pid"])
        client = quiet_client(found["service URL"])
        try:
            producer = client.create_producer(f"persistent://public/default/cli-{os.getpid()}")
            producer.send(b"hello")  # the broker answers
            producer.close()
        finally:
            client.close()
        assert process.poll() is None, "the command must keep running until Ctrl-C"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read()[-2000:]
        assert wait_for(lambda: pid_gone(jvm), 15), f"broker process {jvm} still running"
        stderr = process.stderr.read()
        first = stderr.splitlines()[0]
        assert re.match(r"pulsar-nack broker: first run: fetching Apache Pulsar [\d.]+ \((about [\d,]+ MB|.*size unknown)\) "
                        rf"from Maven Central into {re.escape(str(cache))}", first), stderr
        home = next(cache.glob("apache-pulsar-*"))
        assert f"is cached in {home}" in stderr and f"remove it with `rm -rf {home}`" in stderr, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ------------------------------------------------------------------ the demo before it starts


def _demo(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """``pulsar-nack demo ARGS`` in a fresh process: (the result, its wall time in s)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=str(REPO_ROOT), env=env,
    )
    return done, time.monotonic() - started


def _bare_env(tmp_path: Path, java_home: str) -> dict[str, str]:
    """A PATH with neither java nor mvn, JAVA_HOME unset, an empty cache."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PULSAR_NACK_PULSAR_HOME", "PYTHONPATH")}
    env.update(PATH=str(tmp_path / "bin"), PULSAR_NACK_JAVA_HOME=java_home, PULSAR_NACK_CACHE=str(tmp_path / "cache"))
    return env


def _one_line_error(done: subprocess.CompletedProcess, seconds: float, limit_s: float) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pulsar-nack demo: "), done.stderr
    assert seconds < limit_s, f"{seconds:.1f} s"
    return lines[0]


@needs_spark_extra
def test_demo_without_a_jdk_says_what_to_install_in_one_line_within_5_s(tmp_path):
    empty = tmp_path / "no-jdk"
    empty.mkdir()
    line = _one_line_error(*_demo(env=_bare_env(tmp_path, str(empty))), limit_s=5)
    assert "no JDK found" in line and "apt-get install openjdk" in line and "--service-url" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing fetched


@needs_spark_extra
def test_demo_without_maven_and_nothing_cached_says_what_to_install_in_one_line_within_5_s(tmp_path):
    from pulsar_nack.testing.distribution import choose_release

    _release, jdk = choose_release()  # a JDK that runs Apache Pulsar: only Maven is missing
    line = _one_line_error(*_demo(env=_bare_env(tmp_path, str(jdk))), limit_s=5)
    assert "`mvn` is not on PATH" in line and "apt-get install maven" in line and "--service-url" in line


@needs_spark_extra
def test_demo_on_a_service_url_without_java_for_spark_says_so_in_one_line_within_5_s(tmp_path):
    env = _bare_env(tmp_path, str(tmp_path))
    line = _one_line_error(*_demo("--service-url", "pulsar://127.0.0.1:1", env=env), limit_s=5)
    assert "Spark needs Java 17 or newer and no `java` on PATH" in line and "apt-get install openjdk" in line


@needs_spark_extra
def test_demo_with_nothing_at_the_service_url_is_one_line_within_15_s():
    line = _one_line_error(*_demo("--service-url", "pulsar://127.0.0.1:1", "--json"), limit_s=15)
    assert "nothing answers at --service-url pulsar://127.0.0.1:1" in line


@needs_spark_extra
def test_demo_with_a_silent_server_at_the_service_url_is_one_line_within_15_s():
    """A port that accepts connections but speaks no Pulsar: the lookup's own deadline."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"pulsar://127.0.0.1:{server.getsockname()[1]}"
        line = _one_line_error(*_demo("--service-url", url, "--json"), limit_s=15)
    assert f"no Pulsar broker answered at --service-url {url}" in line


@needs_spark_extra
def test_demo_with_nothing_at_the_spark_master_is_one_line_within_15_s():
    line = _one_line_error(*_demo("--master", "spark://127.0.0.1:1", "--json"), limit_s=15)
    assert "nothing answers at --master spark://127.0.0.1:1" in line and "local[2]" in line


def test_progress_counts_each_event_once_and_never_pass_the_total():
    tqdm = pytest.importorskip("tqdm", reason="the demo's progress bar: the spark extra installs tqdm").tqdm

    from pulsar_nack.cli.demo import ProgressCounts

    counts = ProgressCounts(10_000)
    assert counts.apply({"events": list(range(6_000)), "nacked": 10_000, "redelivered": 3}) == 6_000
    assert counts.apply({"events": list(range(5_000, 12_000))}) == 4_000  # 1,000 seen again, 2,000 not events
    assert (counts.done, counts.duplicates) == (10_000, 1_000)
    bar = tqdm(total=counts.total, file=io.StringIO(), disable=False)
    bar.update(6_000)
    bar.update(4_000)
    bar.set_postfix(counts.postfix())
    shown = str(bar)
    assert bar.n == bar.total and "100%" in shown
    assert "nacked=10,000" in shown and "duplicates=1,000" in shown and "e+" not in shown, shown


def _summary(**changes: int | float) -> dict:
    return {"lost": 0, "left_in_subscription": 0, "duplicates": 0, "duplicates_pct": 0.0, **changes}


def test_demo_result_line_is_ok_only_without_losses_and_with_at_most_1_percent_duplicates():
    from pulsar_nack.cli.demo import result

    assert result(_summary(duplicates=1_000, duplicates_pct=1.0)) == ("OK: nothing lost, 1,000 duplicates (1.00 %)", 0)
    line, code = result(_summary(duplicates=1_001, duplicates_pct=1.001))
    assert code == 3 and line.startswith("DUPLICATES: nothing lost") and "1,001 duplicates" in line and "1 %" in line
    line, code = result(_summary(lost=1))
    assert code == 1 and line.startswith("FAILED: 1 events lost")
    line, code = result(_summary(left_in_subscription=5, duplicates=54_951, duplicates_pct=54.951))
    assert code == 1 and "5 left in the subscription" in line and "54,951 duplicates (54.95 %)" in line
    assert all("OK" not in result(_summary(**bad))[0] for bad in ({"lost": 1}, {"duplicates_pct": 1.5}))


def test_quick_bench_results_go_to_a_user_directory_never_into_the_checkout(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import _common

    monkeypatch.delenv(_common.OUT_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _common.results_dir("memory") == _common.RESULTS
    quick = _common.write_result("memory-quick", {"cases": []})
    assert quick == tmp_path / "cache" / "pulsar-nack" / "bench" / "memory-quick.json" and quick.is_file()
    monkeypatch.setenv(_common.OUT_ENV, str(tmp_path / "out"))
    for name in ("memory", "memory-quick"):
        assert _common.write_result(name, {"cases": []}) == tmp_path / "out" / f"{name}.json"
    assert not list(_common.RESULTS.glob("*-quick.json"))


_QUIET_CLIENT_SCRIPT = (
    "import sys, pulsar\n"
    "from pulsar_nack.testing import quiet_client\n"
    "print('before', file=sys.stderr, flush=True)\n"
    "client = quiet_client('pulsar://127.0.0.1:1', operation_timeout_seconds=1)\n"
    "try:\n"
    "    client.create_producer('persistent://public/default/x')\n"
    "except pulsar.PulsarException:\n"
    "    pass\n"
    "print('after', file=sys.stderr, flush=True)\n"
    "client.close()\n"
)


def test_quiet_client_logs_go_to_stderr_not_stdout_and_exit_cleanly():
    """pulsar.ConsoleLogger writes to stdout, where it broke ``demo --json``; quiet_client's do not.

    Five runs: with a Python logging.Logger, pulsar-client 3.13.0 aborted at interpreter exit
    (status 134) in about half of them.
    """
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", _QUIET_CLIENT_SCRIPT], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "", done.stdout[:2000]
        assert "Connection refused" in done.stderr or "Failed to establish connection" in done.stderr, done.stderr[:2000]


def test_quiet_client_logs_keep_a_redirected_stderr_file_whole(tmp_path):
    """``2> file`` opens the file without O_APPEND; the client's writes and Python's must not overwrite each other."""
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", _QUIET_CLIENT_SCRIPT], stdout=subprocess.PIPE, stderr=stderr, timeout=60)
    assert done.returncode == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "before" and "after" in lines, lines[:5]
    client_lines = [line for line in lines if line not in ("before", "after")]
    assert client_lines and all(line.startswith("20") for line in client_lines), client_lines[:5]


def test_version_prints_the_installed_distributions_version_which_the_package_defines():
    """``pulsar-nack --version`` as installed: the distribution's version, read by the build from
    ``pulsar_nack.__version__`` (its one definition)."""
    import importlib.metadata

    import pulsar_nack

    script = Path(sys.executable).with_name("pulsar-nack")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = importlib.metadata.version("pulsar-nack")
    assert installed == pulsar_nack.__version__, "the installed metadata is stale: reinstall the package"
    assert done.stdout == f"pulsar-nack {pulsar_nack.__version__}\n"


_LAUNCH_ORDER = """
import argparse, threading, time
import pyspark.java_gateway
import pulsar_nack.testing
from pulsar_nack.cli import demo

events = []

class Stop(Exception):
    pass

def fake_launch(*args, **kwargs):
    events.append("fork with threads: " + ",".join(sorted(t.name for t in threading.enumerate() if t.name.startswith("demo"))))
    raise Stop

def fake_client(url):
    events.append("client")
    raise Stop

pyspark.java_gateway.launch_gateway = fake_launch
pulsar_nack.testing.quiet_client = fake_client
args = argparse.Namespace(service_url="pulsar://127.0.0.1:1", master="local[1]", messages=10, subscription="Shared")
try:
    demo._run(args, time.monotonic(), time.time())
except Stop:
    pass
print(events)
"""


@needs_spark_extra
def test_demo_launches_the_spark_jvm_before_it_starts_any_thread():
    """PySpark forks the driver to start the JVM and runs Python in the child (a ``preexec_fn``): with
    the client's and the producer's threads running, the child can deadlock on a lock one of them held
    (a clean-clone CI run hung on such a child). So the demo launches the JVM before it makes them.

    Stand-ins (a unit test: no broker deadlocks a fork on cue): the JVM launch records the threads
    alive at the fork, the client records that it was made, and the launch ends the run. In a fresh
    interpreter: with a SparkContext running, the demo launches nothing (it uses that one)."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    done = subprocess.run([sys.executable, "-c", _LAUNCH_ORDER], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "['fork with threads: ']", done.stdout
