#!/usr/bin/env python3
"""Run the consumer tests on several pulsar-client releases, each in its own venv, against one broker.

Usage (from a checkout, with a venv that has the project installed, e.g. ``.ci/venv``)::

    python tools/client_matrix.py                     # the oldest supported and the newest release
    python tools/client_matrix.py --all               # every supported release on the index
    python tools/client_matrix.py --versions 3.10.0,3.12.0
    python tools/client_matrix.py -- -x               # arguments after -- go to pytest
    python tools/client_matrix.py --out bench/results/client_matrix.json

Each release gets ``.ci/client-matrix/pulsar-client-X/`` (kept for the next run; pip makes
it match again): the checkout installed editable with its ``test`` extra, and
``pulsar-client==X``. One Apache Pulsar standalone, started here, serves every run
(``PULSAR_NACK_TEST_BROKER``; ``--broker "URL ADMIN_URL"`` uses a running one instead).
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

ROOT = Path(__file__).resolve().parent.parent
CONSUMER_TESTS = [
    "tests/test_consumer.py",
    "tests/test_consumer_surface.py",
    "tests/test_consumer_fidelity.py",
    "tests/test_consumer_settings.py",
    "tests/test_dead_letters.py",
    "tests/test_apache_pulsar.py",
    "tests/test_client_seam.py",
]
ASYNCIO_TESTS = ["tests/test_asyncio.py"]
DESELECT = [
    # Starts and restarts a broker of its own; the matrix shares one.
    "tests/test_consumer.py::test_broker_restart_with_pending_nacks_loses_nothing",
]
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


def run_tests(venv: Path, version: str, broker: str, pytest_args: list[str]) -> tuple[int, str, float]:
    """Run the tests for *version* in *venv*; return pytest's exit code, its summary line and seconds."""
    _, asyncio_min, _ = _seam()
    tests = CONSUMER_TESTS + (ASYNCIO_TESTS if _parse(version) >= asyncio_min else [])
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    # One shared broker: no per-version brokers for the all_brokers tests (tests/conftest.py).
    command += ["--pulsar-versions=none", *(f"--deselect={test}" for test in DESELECT), *pytest_args]
    env = dict(os.environ, PULSAR_NACK_TEST_BROKER=broker, PYTHONFAULTHANDLER="1")
    env.pop("VIRTUAL_ENV", None)
    start = time.monotonic()
    log = venv / "pytest.log"
    with log.open("w") as out:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    lines = log.read_text().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "")
    if code:
        print("\n".join(lines[-60:]), flush=True)
    return code, summary or f"pytest exit code {code} (log: {log})", time.monotonic() - start


def write_json(path: Path, rows: list[tuple[str, str, str, str, float]], broker: str, pytest_args: list[str]) -> None:
    """The matrix's results, with the commit and the machine, as ``bench/results`` keeps them."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout
    document = {
        "tool": "tools/client_matrix.py",
        "commit": commit + (" + uncommitted changes" if dirty.strip() else ""),
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "broker": broker,
        "tests": CONSUMER_TESTS + ASYNCIO_TESTS,
        "deselected": DESELECT,
        "pytest_args": pytest_args,
        "runs": [
            {"pulsar_client": v, "asyncio": door, "result": result, "pytest": summary, "wall_s": round(seconds, 1)}
            for v, door, result, summary, seconds in rows
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--versions", help="comma-separated pulsar-client releases")
    choice.add_argument("--all", action="store_true", help="every supported release on the index")
    parser.add_argument("--venvs", type=Path, default=ROOT / ".ci" / "client-matrix", help="where the venvs live")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    parser.add_argument("--broker", help='"pulsar://HOST:PORT http://HOST:PORT" of a running broker')
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    versions = choose_versions(args)
    _, asyncio_min, _ = _seam()
    print(f"client matrix: pulsar-client {', '.join(versions)}", flush=True)
    standalone = None
    broker_version = "given by --broker"
    if args.broker:
        broker = args.broker
    else:
        from pulsar_nack.testing import PulsarStandalone

        standalone = PulsarStandalone(batch_index_ack=True).start()  # as the tests' `apache` broker
        broker = f"{standalone.url} {standalone.admin_url}"
        broker_version = f"Apache Pulsar {standalone.version} standalone"
        print(f"broker: {broker_version} at {standalone.url}", flush=True)
    rows = []
    try:
        for version in versions:
            print(f"--- pulsar-client {version}: preparing {args.venvs / f'pulsar-client-{version}'}", flush=True)
            venv = prepare_venv(args.venvs, version, args.python)
            code, summary, seconds = run_tests(venv, version, broker, pytest_args)
            door = "yes" if _parse(version) >= asyncio_min else "refused (checked)"
            rows.append((version, door, "ok" if code == 0 else "FAILED", summary, seconds))
            print(f"--- pulsar-client {version}: {rows[-1][2]}, {summary} ({seconds:.0f} s)", flush=True)
    finally:
        if standalone is not None:
            standalone.stop()
    print("\n| pulsar-client | pulsar_nack.asyncio | result | pytest | wall |")
    print("|---|---|---|---|---|")
    for version, door, result, summary, seconds in rows:
        print(f"| {version} | {door} | {result} | {summary} | {seconds:.0f} s |")
    if args.out is not None:
        write_json(args.out, rows, broker_version, pytest_args)
    return 0 if all(row[2] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
