#!/usr/bin/env python3
"""Run the consumer tests on several pulsar-client releases, each in its own venv, against one broker.

Usage (from a checkout, with a venv that has the project installed, e.g. ``.ci/venv``)::

    python tools/client_matrix.py                     # the oldest supported and the newest release
    python tools/client_matrix.py --all               # every supported release on the index
    python tools/client_matrix.py --versions 3.10.0,3.12.0
    python tools/client_matrix.py -- -x               # arguments after -- go to pytest
    python tools/client_matrix.py --out bench/results/client_matrix.json
    python tools/client_matrix.py --brokers 4.0.8:on,4.0.8:off,3.0.7:on,3.0.7:off --out bench/results/client_matrix.json

Each release gets ``.ci/client-matrix/pulsar-client-X/`` (kept for the next run; pip makes
it match again): the checkout installed editable with its ``test`` extra, and
``pulsar-client==X``. One Apache Pulsar standalone at a time, started here, serves every
client's run (``PULSAR_NACK_TEST_BROKER``; ``--broker "URL ADMIN_URL"`` uses a running one
instead): by default 4.0.8 with batch-index acks on (the tests' ``apache`` broker);
``--brokers VERSION:on|off,...`` names each broker and its
``acknowledgmentAtBatchIndexLevelEnabled``, run one after the other. What the tests
measured (``tests/helpers.py:record_figure``, e.g. how many acked siblings came back) is
kept per run in the JSON.
The tests: the consumer's (``CONSUMER_TESTS``, ``test_client_seam.py`` among them), and
``test_asyncio.py`` where ``pulsar_nack.asyncio`` is supported (every supported release
since the seam does on 3.9.0 what its ``pulsar.asyncio`` lacks). Tests that restart the
broker are left out (the broker is shared). Exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
CONSUMER_TESTS = [
    "tests/test_consumer.py",
    "tests/test_consumer_surface.py",
    "tests/test_consumer_fidelity.py",
    "tests/test_consumer_settings.py",
    "tests/test_dead_letters.py",
    "tests/test_apache_pulsar.py",
    "tests/test_admission.py",
    "tests/test_client_seam.py",
]
ASYNCIO_TESTS = ["tests/test_asyncio.py"]
DESELECT = [
    # Starts and restarts a broker of its own; the matrix shares one.
    "tests/test_consumer.py::test_broker_restart_with_pending_nacks_loses_nothing",
]
DEFAULT_BROKERS = "4.0.8:on"
"""The tests' own ``apache`` broker: Apache Pulsar 4.0.8 with batch-index acks on."""
NEWEST_KNOWN = "3.13.0"
"""The newest pulsar-client when this was written: the default's newest if the index cannot be asked."""


def _seam() -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """MIN_VERSION, ASYNCIO_MIN_VERSION and NEXT_MAJOR of the checkout's seam, read without importing it."""
    text = (ROOT / "pulsar_nack" / "consumer" / "_client.py").read_text()

    def value(name: str) -> str:
        match = re.search(rf"^{name} = (.+)$", text, re.MULTILINE)
        if match is None:
            raise SystemExit(f"client_matrix: {name} not found in pulsar_nack/consumer/_client.py")
        return match.group(1)

    def version(name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", value(name)))

    return version("MIN_VERSION"), version("ASYNCIO_MIN_VERSION"), int(value("NEXT_MAJOR"))


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _index_versions() -> list[str]:
    """The pulsar-client releases on the package index (``pip index versions``), oldest first."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pulsar-client"], capture_output=True, text=True, timeout=120
    )
    match = re.search(r"Available versions: (.+)", result.stdout)
    if result.returncode or match is None:
        return []
    return sorted((v.strip() for v in match.group(1).split(",")), key=_parse)


def choose_versions(args: argparse.Namespace) -> list[str]:
    """The releases to run: ``--versions``, ``--all`` supported ones, or the oldest and the newest."""
    oldest, _, next_major = _seam()
    if args.versions:
        return [v.strip() for v in args.versions.split(",") if v.strip()]
    supported = [v for v in _index_versions() if oldest <= _parse(v) < (next_major,)]
    if args.all:
        if not supported:
            raise SystemExit("client_matrix: could not list pulsar-client releases (pip index versions)")
        return supported
    newest = supported[-1] if supported else NEWEST_KNOWN
    return list(dict.fromkeys([".".join(map(str, oldest)), newest]))


def prepare_venv(venvs: Path, version: str, python: str) -> Path:
    """``venvs/pulsar-client-VERSION`` with the checkout (editable, ``test`` extra) and that client."""
    venv = venvs / f"pulsar-client-{version}"
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", f"{ROOT}[test]", f"pulsar-client=={version}"], check=True, cwd=ROOT)
    return venv


def failed_tests(junit: Path) -> list[str]:
    """The ids (``tests/file.py::name[param]``) of the tests that failed or errored in a JUnit XML report."""
    if not junit.exists():
        return []
    failed = []
    for case in ElementTree.parse(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").split(".")
            failed.append(f"tests/{module[1] if len(module) > 1 else module[0]}.py::{case.get('name')}")
    return failed


_OUTCOME = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def logged_failures(lines: list[str]) -> list[str]:
    """The tests pytest -v reported FAILED or ERROR (for a run whose process died before its JUnit report)."""
    return [m[1] for m in map(_OUTCOME.match, lines) if m and m[2] in ("FAILED", "ERROR")]


def _allow_core_dumps() -> None:
    """In the pytest child: no limit on core files, so a crash of the client can be read with gdb."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def run_tests(
    venv: Path, version: str, broker: str, pytest_args: list[str], core_dumps: bool = False
) -> tuple[int, str, float, dict[str, Any]]:
    """Run the tests for *version* in *venv*: pytest's exit code, its summary line, seconds, and
    ``{"failed": [...], "figures": [...]}`` (what failed, what the tests recorded)."""
    _, asyncio_min, _ = _seam()
    tests = CONSUMER_TESTS + (ASYNCIO_TESTS if _parse(version) >= asyncio_min else [])
    # -v: one line per test as it runs, so a run whose process dies still says what passed and where it died.
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-v", "-p", "no:cacheprovider", *tests]
    # One shared broker: no per-version brokers for the all_brokers tests (tests/conftest.py).
    command += ["--pulsar-versions=none", *(f"--deselect={test}" for test in DESELECT), *pytest_args]
    figures, junit = venv / "figures.jsonl", venv / "junit.xml"
    figures.unlink(missing_ok=True)
    junit.unlink(missing_ok=True)
    command.append(f"--junitxml={junit}")
    env = dict(
        os.environ, PULSAR_NACK_TEST_BROKER=broker, PYTHONFAULTHANDLER="1", PULSAR_NACK_TEST_FIGURES=str(figures)
    )
    env.pop("VIRTUAL_ENV", None)
    start = time.monotonic()
    log = venv / "pytest.log"
    with log.open("w") as out:
        code = subprocess.run(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_allow_core_dumps if core_dumps else None
        ).returncode
    lines = log.read_text().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "")
    if code:
        print("\n".join(lines[-60:]), flush=True)
    recorded = [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    found: dict[str, Any] = {"failed": failed_tests(junit) if junit.exists() else logged_failures(lines), "figures": recorded}
    if not junit.exists():  # the process died: what ran, from the -v lines
        outcomes = [m[2] for m in map(_OUTCOME.match, lines) if m]
        found["passed_before_dying"] = outcomes.count("PASSED")
        found["died_in"] = next((line.split(" ")[0] for line in reversed(lines) if line.startswith("tests/") and "::" in line), None)
    return code, summary or f"pytest exit code {code} (log: {log})", time.monotonic() - start, found


def parse_brokers(spec: str) -> list[tuple[str, bool]]:
    """``"4.0.8:on,3.0.7:off"`` -> ``[("4.0.8", True), ("3.0.7", False)]`` (version, batch-index acks).

    >>> parse_brokers("4.0.8:on, 3.0.7:off")
    [('4.0.8', True), ('3.0.7', False)]
    """
    brokers = []
    for part in (p.strip() for p in spec.split(",")):
        version, _, setting = part.partition(":")
        if not re.fullmatch(r"\d+\.\d+\.\d+", version) or setting not in ("on", "off"):
            raise SystemExit(f"client_matrix: --brokers wants VERSION:on|off, got {part!r}")
        brokers.append((version, setting == "on"))
    return brokers


def checkout_commit() -> str:
    """HEAD, and whether tracked files differ from it (read when the matrix starts: it tests that code)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    return commit + (" + uncommitted changes" if dirty.strip() else "")


def write_json(path: Path, commit: str, load: list[float], runs: list[dict[str, Any]], pytest_args: list[str]) -> None:
    """The matrix's results, with the commit and the machine, as ``bench/results`` keeps them."""
    document = {
        "tool": "tools/client_matrix.py",
        "command": "python tools/client_matrix.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "load_average_1_5_15_before": load,
        "tests": CONSUMER_TESTS + ASYNCIO_TESTS,
        "deselected": DESELECT,
        "pytest_args": pytest_args,
        "runs": runs,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


def run_on_broker(broker: str, label: dict[str, Any], versions: list[str], args: argparse.Namespace,
                  pytest_args: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Each client's tests against *broker* (``"URL ADMIN_URL"``); one result per client."""
    _, asyncio_min, _ = _seam()
    runs = []
    for version in versions:
        print(f"--- pulsar-client {version}: preparing {args.venvs / f'pulsar-client-{version}'}", flush=True)
        venv = prepare_venv(args.venvs, version, args.python)
        commit = checkout_commit()
        code, summary, seconds, found = run_tests(venv, version, broker, pytest_args, args.core_dumps)
        runs.append({
            **label, "pulsar_client": version, "asyncio": "yes" if _parse(version) >= asyncio_min else "refused (checked)",
            "commit": commit, "result": "ok" if code == 0 else "FAILED", "pytest": summary, "wall_s": round(seconds, 1), **found,
        })  # fmt: skip
        print(
            f"--- {label['broker']} / pulsar-client {version}: {runs[-1]['result']}, {summary} ({seconds:.0f} s)",
            flush=True,
        )
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--versions", help="comma-separated pulsar-client releases")
    choice.add_argument("--all", action="store_true", help="every supported release on the index")
    parser.add_argument("--venvs", type=Path, default=ROOT / ".ci" / "client-matrix", help="where the venvs live")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--broker", help='"pulsar://HOST:PORT http://HOST:PORT" of a running broker')
    where.add_argument("--brokers", default=DEFAULT_BROKERS, help="VERSION:on|off,... brokers to start, one at a time")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--merge", action="store_true", help="keep --out's runs of other broker/client pairs")
    parser.add_argument("--core-dumps", action="store_true", help="let a crashing test process dump core (in the checkout)")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    versions = choose_versions(args)
    commit, load = checkout_commit(), list(os.getloadavg())
    print(f"client matrix: pulsar-client {', '.join(versions)}", flush=True)
    runs: list[dict[str, Any]] = []
    if args.broker:
        runs += run_on_broker(
            args.broker, {"broker": "given by --broker", "batch_index_ack": None}, versions, args, pytest_args
        )
    else:
        from pulsar_nack.testing import PulsarStandalone

        for version, batch_index_ack in parse_brokers(args.brokers):
            standalone = PulsarStandalone(version=version, batch_index_ack=batch_index_ack).start()
            try:
                label = {"broker": f"Apache Pulsar {standalone.version}", "batch_index_ack": standalone.batch_index_ack}
                print(
                    f"broker: {label['broker']} standalone, batch-index acks {batch_index_ack} at {standalone.url}",
                    flush=True,
                )
                runs += run_on_broker(f"{standalone.url} {standalone.admin_url}", label, versions, args, pytest_args)
            finally:
                standalone.stop()
    print("\n| broker | batch-index acks | pulsar-client | pulsar_nack.asyncio | result | pytest | wall |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        print(f"| {run['broker']} | {run['batch_index_ack']} | {run['pulsar_client']} | {run['asyncio']} | {run['result']} "
              f"| {run['pytest']} | {run['wall_s']:.0f} s |")  # fmt: skip
    if args.out is not None:
        if args.merge and args.out.exists():
            done = {(r["broker"], r["batch_index_ack"], r["pulsar_client"]) for r in runs}
            kept = [r for r in json.loads(args.out.read_text())["runs"] if (r["broker"], r["batch_index_ack"], r["pulsar_client"]) not in done]
            runs = kept + runs
        write_json(args.out, commit, load, runs, pytest_args)
    return 0 if all(run["result"] == "ok" for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
