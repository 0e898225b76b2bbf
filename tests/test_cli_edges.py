"""The command line's edges as an installed user meets them: the demo without its extra (in a
fresh venv), an unexpected error (one line, never a traceback), ``bench`` outside a
checkout, and ``broker --help`` with its options and exit codes."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pulsar_nack import cli
from pulsar_nack.cli import _prepare
from pulsar_nack.cli import broker as broker_command

REPO_ROOT = Path(__file__).resolve().parents[1]
SPARK_HINT = 'pip install "pulsar-nack[spark]"'


# ------------------------------------------------------------------ the demo needs the spark extra


def _source_tree(target: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) copied to *target*: what pip installs from."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True, timeout=60
    )
    if listed.returncode != 0:  # an unpacked sdist: no git
        shutil.copytree(REPO_ROOT, target, ignore=shutil.ignore_patterns(".ci", "build", "*.so", "__pycache__"))
        return target
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A fresh venv with pulsar-nack installed as a user installs it, without extras: no pyspark, no tqdm."""
    root = tmp_path_factory.mktemp("bare-venv")
    source = _source_tree(root / "src")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", str(source)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_demo_in_a_venv_without_pyspark_is_one_line_exit_2_and_starts_nothing(bare_venv, tmp_path) -> None:
    """The real case: ``pip install pulsar-nack`` (no extra), then ``pulsar-nack demo``."""
    python = bare_venv / "bin" / "python"
    for module in ("pyspark", "tqdm"):  # the venv really lacks them
        assert subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=60).returncode == 1
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PULSAR_NACK_PULSAR_HOME", "VIRTUAL_ENV")}
    env["PULSAR_NACK_CACHE"] = str(cache)  # empty: a broker start would have to fetch Apache Pulsar first
    started = time.monotonic()
    process = subprocess.Popen([str(bare_venv / "bin" / "pulsar-nack"), "demo"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[str] = set()
    watched = psutil.Process(process.pid)
    while process.poll() is None and time.monotonic() - started < 60:
        try:
            children.update(" ".join(c.cmdline()[:1]) for c in watched.children(recursive=True))
        except psutil.Error:
            pass
        time.sleep(0.01)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 2, (process.returncode, stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and stdout == ""
    assert lines[0].startswith("pulsar-nack demo: ") and "pyspark" in lines[0] and SPARK_HINT in lines[0], lines[0]
    assert not children, f"the demo started processes: {children}"
    assert not cache.exists(), "the demo began to fetch Apache Pulsar"


def test_the_demo_checks_every_module_of_the_spark_extra() -> None:
    """``EXTRAS["spark"]`` is pyproject.toml's spark extra (the installed metadata), by import name."""
    requirements = importlib.metadata.requires("pulsar-nack") or []
    spark = sorted(re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
                   for r in requirements if re.search(r"extra\s*==\s*['\"]spark['\"]", r))
    assert spark and sorted(_prepare.EXTRAS["spark"]) == spark


def test_the_demo_checks_its_extra_before_anything_else(monkeypatch, capsys) -> None:
    """A missing module of the extra is the one line, before the master or the broker is even looked at.

    (The extra's other module is one every Python has, so that only the missing one is named
    whether or not the spark extra is installed here.)"""
    monkeypatch.setitem(_prepare.EXTRAS, "spark", ("json", "no_such_module_for_the_demo"))
    assert cli.main(["demo", "--master", "spark://127.0.0.1:1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("pulsar-nack demo: no_such_module_for_the_demo is not installed") and SPARK_HINT in err


# ------------------------------------------------------------------ no traceback, ever


def _boom(_args: object) -> int:
    raise RuntimeError("something broke\nover two lines")


def test_an_unexpected_error_is_one_line_and_exit_70_unless_debugging(monkeypatch, capsys) -> None:
    monkeypatch.setattr(broker_command, "run", _boom)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["broker"]) == cli.UNEXPECTED == 70
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err == ("pulsar-nack: unexpected error: RuntimeError: something broke over two lines "
                   f"(set {cli.DEBUG_ENV}=1 to see the traceback)\n")
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(RuntimeError, match="something broke"):
        cli.main(["broker"])


def test_the_exit_codes_are_in_the_help(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{cli.UNEXPECTED} an unexpected error" in help_text and f"{cli.DEBUG_ENV}=1" in help_text
    assert f"{cli.INTERRUPTED} Ctrl-C" in help_text


def test_a_process_shows_no_traceback_for_a_bug(tmp_path) -> None:
    """In a real process (as ``python -m pulsar_nack.cli`` runs it): a command that raises gives one line and exit 70."""
    code = ("import sys; import pulsar_nack.cli.broker as b; b.run = lambda args: 1 / 0; "
            "from pulsar_nack.cli import main; sys.exit(main(['broker']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 70 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert "ZeroDivisionError" in done.stderr


# ------------------------------------------------------------------ bench only where it runs


def _listed_commands(help_text: str) -> list[str]:
    return re.findall(r"^    (\w+)\s", help_text, re.MULTILINE)


def test_bench_is_listed_only_in_a_checkout(tmp_path) -> None:
    """bench/ is not in the wheel: an installed CLI run elsewhere does not offer it."""
    script = Path(sys.executable).with_name("pulsar-nack")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    here = subprocess.run([str(script), "--help"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    there = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert _listed_commands(here.stdout) == ["demo", "broker", "bench"], here.stdout
    assert _listed_commands(there.stdout) == ["demo", "broker"], there.stdout


# ------------------------------------------------------------------ broker --help


def test_broker_help_lists_its_options_and_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["broker", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--pulsar-version VERSION", "--port PORT", "--http-port PORT",
                   "--batch-index-acks, --no-batch-index-acks"):
        assert option in text, option
    assert "(default: on)" in text
    assert "Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 the broker exited on its own" in text
    assert "2 it could not start" in text


def test_broker_options_reach_the_broker(monkeypatch) -> None:
    """What the options set, without starting a JVM: the PulsarStandalone the command builds."""
    built: list[dict[str, object]] = []

    class Stop(Exception):
        pass

    def standalone(**kwargs: object) -> object:
        built.append(kwargs)
        raise Stop

    monkeypatch.setattr("pulsar_nack.testing.PulsarStandalone", standalone)
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(Stop):
        cli.main(["broker", "--pulsar-version", "3.0", "--port", "16650", "--http-port", "18080",
                  "--no-batch-index-acks"])
    with pytest.raises(Stop):
        cli.main(["broker"])
    assert built == [
        {"version": "3.0", "batch_index_ack": False, "port": 16650, "http_port": 18080},
        {"version": None, "batch_index_ack": True, "port": None, "http_port": None},
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pulsar-version", "9.9"], "version '9.9' names no Apache Pulsar release"),
        (["--port", "TAKEN"], "is not free"),
    ],
)
def test_broker_that_cannot_start_says_why_in_one_line(argv, says, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        argv = [str(taken.getsockname()[1]) if a == "TAKEN" else a for a in argv]
        assert cli.main(["broker", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("pulsar-nack broker: ") and says in err, err


def test_broker_refuses_a_port_out_of_range(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["broker", "--port", "70000"])
    assert done.value.code == 2
    assert "expected a port number from 1 to 65535" in capsys.readouterr().err


# ------------------------------------------------------------------ bench --quick runs the quick subset


def test_bench_quick_runs_the_representative_subset_with_reduced_sizes(monkeypatch, tmp_path) -> None:
    """Which parts ``bench --quick`` runs, with which arguments (each part's main stands in: no benchmark runs)."""
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import cli as bench_cli

    calls: list[tuple[str, list[str]]] = []

    def fake_import(name: str) -> SimpleNamespace:
        return SimpleNamespace(main=lambda argv: calls.append((name, list(argv))) or 0)

    monkeypatch.setattr(bench_cli, "importlib", SimpleNamespace(import_module=fake_import))
    monkeypatch.delenv("PULSAR_NACK_BENCH_OUT", raising=False)
    monkeypatch.delenv(bench_cli.BROKER_ENV, raising=False)
    shared: list[str] = []

    @contextlib.contextmanager
    def fake_broker() -> Iterator[None]:
        shared.append("started")
        yield

    monkeypatch.setattr(bench_cli, "_shared_broker", fake_broker)
    parser = __import__("argparse").ArgumentParser()
    bench_cli.add_arguments(parser)
    assert bench_cli.run(parser.parse_args(["--quick", "--out", str(tmp_path)])) == 0
    assert [name for name, _ in calls] == ["bench.memory", "bench.core_perf", "bench.client", "bench.e2e"]
    assert all("--quick" in argv for _, argv in calls)
    assert shared == ["started"]  # one broker for client and e2e
    calls.clear()
    assert bench_cli.run(parser.parse_args(["--quick", "--only", "memory,core", "--out", str(tmp_path)])) == 0
    assert [name for name, _ in calls] == ["bench.memory", "bench.core_perf"] and shared == ["started"]  # no broker
    calls.clear()
    assert bench_cli.run(parser.parse_args(["--quick", "--only", "consumer", "--out", str(tmp_path)])) == 0
    assert calls == [("bench.consumer", ["--quick"])]
    calls.clear()
    assert bench_cli.run(parser.parse_args(["--out", str(tmp_path)])) == 0
    assert [name for name, _ in calls] == [module for module, _ in bench_cli.PARTS.values()]
    assert len(shared) == 2  # the full run: each part starts its own
