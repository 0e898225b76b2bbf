"""Apache Pulsar's binary distribution from Maven Central, fetched once into a user cache.

The ``pulsar-server-distribution`` artifact (type ``tar.gz``, classifier ``bin``) is the
same tarball as Pulsar's download page: ``bin/pulsar``, ``conf/`` and ``lib/``. It is
fetched with ``mvn dependency:copy`` (Maven's own repository settings, proxies and
mirrors apply) and unpacked under the cache directory:

    $PULSAR_NACK_CACHE or ~/.cache/pulsar-nack/
        apache-pulsar-4.0.8/         bin/ conf/ lib/ ...
        .lock                        held while a process fetches

Which version runs depends on the JDKs installed: Pulsar 4.0 (the newest LTS) needs
Java 21 or newer, Pulsar 3.0 (the previous LTS) runs on Java 17.
:func:`choose_release` picks the newest that an installed JDK can run.

Set ``PULSAR_NACK_PULSAR_HOME`` to an unpacked distribution to skip the fetch (its
version is then read from ``lib/``), and ``PULSAR_NACK_JAVA_HOME`` to choose the JDK.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import BrokerError

__all__ = ["RELEASES", "PulsarRelease", "choose_release", "ensure_distribution", "find_jdks"]


@dataclasses.dataclass(frozen=True)
class PulsarRelease:
    """One Pulsar LTS line: the version we run and the oldest Java it supports."""

    version: str
    min_java: int

    @property
    def artifact(self) -> str:
        """The Maven coordinates of its binary tarball."""
        return f"org.apache.pulsar:pulsar-server-distribution:{self.version}:tar.gz:bin"


RELEASES: tuple[PulsarRelease, ...] = (
    PulsarRelease("4.0.8", 21),  # newest LTS on Maven Central (checked 2026-11-24)
    PulsarRelease("3.0.15", 17),  # previous LTS, for machines with Java 17 only
)
"""Newest first: the releases :func:`choose_release` picks from."""

_JVM_DIRS = (Path("/usr/lib/jvm"), Path("/usr/java"), Path("/opt/java"))
_MVN_TIMEOUT_S = 1800


def cache_dir() -> Path:
    """``$PULSAR_NACK_CACHE``, else ``$XDG_CACHE_HOME/pulsar-nack``, else ``~/.cache/pulsar-nack``."""
    explicit = os.environ.get("PULSAR_NACK_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pulsar-nack"


def java_major(java_home: Path) -> int | None:
    """The major version of the JDK at *java_home*, from its ``release`` file, or None."""
    try:
        text = (java_home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_jdks() -> dict[Path, int]:
    """Installed JDKs (home -> major version): ``PULSAR_NACK_JAVA_HOME``, ``JAVA_HOME``, the
    ``java`` on PATH, and the usual JVM directories."""
    candidates: list[Path] = []
    for variable in ("PULSAR_NACK_JAVA_HOME", "JAVA_HOME"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]))
    java = shutil.which("java")
    if java:
        candidates.append(Path(java).resolve().parent.parent)
    for directory in _JVM_DIRS:
        if directory.is_dir():
            candidates.extend(sorted(p for p in directory.iterdir() if p.is_dir()))
    found: dict[Path, int] = {}
    for home in candidates:
        home = home.resolve()
        major = java_major(home)
        if major is not None and (home / "bin" / "java").exists():
            found.setdefault(home, major)
    return found


def choose_release(jdks: dict[Path, int] | None = None) -> tuple[PulsarRelease, Path]:
    """The newest release some installed JDK runs, and that JDK (the newest that fits).

    ``PULSAR_NACK_JAVA_HOME``, when set, is the only JDK considered.

    Raises
    ------
    BrokerError
        When no JDK is found, or none is new enough for any release.
    """
    if jdks is None:
        forced = os.environ.get("PULSAR_NACK_JAVA_HOME")
        jdks = find_jdks()
        if forced:
            jdks = {home: major for home, major in jdks.items() if home == Path(forced).resolve()}
    if not jdks:
        raise BrokerError(
            "Apache Pulsar needs a Java runtime: no JDK found (looked at PULSAR_NACK_JAVA_HOME, "
            "JAVA_HOME, the java on PATH and /usr/lib/jvm). Install one, e.g. "
            "`apt-get install openjdk-17-jdk-headless`."
        )
    for release in RELEASES:
        fitting = [(major, home) for home, major in jdks.items() if major >= release.min_java]
        if fitting:
            return release, max(fitting)[1]
    have = ", ".join(f"{home} (Java {major})" for home, major in jdks.items())
    raise BrokerError(f"Apache Pulsar needs Java 17 or newer; found only {have}")


@contextlib.contextmanager
def _cache_lock(directory: Path) -> Iterator[None]:
    """One fetch at a time per cache directory, across processes (``flock``)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _is_distribution(home: Path) -> bool:
    return (home / "bin" / "pulsar").is_file() and (home / "conf" / "standalone.conf").is_file()


def ensure_distribution(release: PulsarRelease, *, quiet: bool = True) -> Path:
    """The unpacked distribution of *release*, fetched from Maven Central on first use.

    ``PULSAR_NACK_PULSAR_HOME``, when set, is returned as is (after a check).

    Raises
    ------
    BrokerError
        When ``mvn`` is missing, the download fails (with Maven's last lines), or the
        archive is not a Pulsar distribution.
    """
    explicit = os.environ.get("PULSAR_NACK_PULSAR_HOME")
    if explicit:
        if not _is_distribution(Path(explicit)):
            raise BrokerError(f"PULSAR_NACK_PULSAR_HOME={explicit} holds no Pulsar distribution (bin/pulsar)")
        return Path(explicit)
    root = cache_dir()
    home = root / f"apache-pulsar-{release.version}"
    if _is_distribution(home):
        return home
    with _cache_lock(root):
        if _is_distribution(home):  # another process fetched it meanwhile
            return home
        archive = _download(release, root, quiet=quiet)
        try:
            _unpack(archive, root, home)
        finally:
            archive.unlink(missing_ok=True)
    return home


def _download(release: PulsarRelease, root: Path, *, quiet: bool) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "fetching Apache Pulsar from Maven Central needs Maven: `mvn` is not on PATH. "
            "Install it (`apt-get install maven`), or set PULSAR_NACK_PULSAR_HOME to an "
            "unpacked Pulsar distribution."
        )
    out = Path(tempfile.mkdtemp(prefix="download-", dir=root))
    argv = [mvn, "-B", "dependency:copy", f"-Dartifact={release.artifact}", f"-DoutputDirectory={out}"]
    if quiet:
        argv.insert(2, "-q")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, cwd=out)
    except subprocess.TimeoutExpired:
        shutil.rmtree(out, ignore_errors=True)
        raise BrokerError(f"`{' '.join(argv)}` did not finish within {_MVN_TIMEOUT_S} s") from None
    archives = list(out.glob("*.tar.gz"))
    if done.returncode != 0 or len(archives) != 1:
        shutil.rmtree(out, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise BrokerError(
            f"could not fetch Apache Pulsar {release.version} from Maven Central "
            f"(`{' '.join(argv)}` exited {done.returncode}):\n{tail}"
        )
    final = root / archives[0].name
    os.replace(archives[0], final)
    shutil.rmtree(out, ignore_errors=True)
    return final


def _unpack(archive: Path, root: Path, home: Path) -> None:
    """Unpack into a temporary directory, then move the one top-level folder into place."""
    scratch = Path(tempfile.mkdtemp(prefix="unpack-", dir=root))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(scratch, filter="tar")
        tops = [p for p in scratch.iterdir() if p.is_dir()]
        if len(tops) != 1 or not _is_distribution(tops[0]):
            raise BrokerError(f"{archive.name} is not a Pulsar distribution (no bin/pulsar)")
        os.replace(tops[0], home)
    except (OSError, tarfile.TarError) as exc:
        raise BrokerError(f"could not unpack {archive}: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cached(release: PulsarRelease) -> Path | None:
    """Where a complete local copy of *release* is, or None when the next start must fetch it.

    ``PULSAR_NACK_PULSAR_HOME``, when it is set and holds a distribution, counts as cached.
    Checks a few paths only: no download, no lock.
    """
    explicit = os.environ.get("PULSAR_NACK_PULSAR_HOME")
    if explicit:
        return Path(explicit) if (Path(explicit) / "bin" / "pulsar").is_file() else None
    home = cache_dir() / f"apache-pulsar-{release.version}"
    if not (home / "conf" / "standalone.conf").is_file():
        return None
    complete = (home / "bin" / "pulsar").is_file() or (home / "lib" / f"pulsar-broker-{release.version}.jar").is_file()
    return home if complete else None
