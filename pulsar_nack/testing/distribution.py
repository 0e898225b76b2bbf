"""Apache Pulsar from Maven Central, fetched once into a user cache.

Two kinds of release, because Maven Central does not serve every version the same way:

- ``"distribution"``: the ``pulsar-server-distribution`` artifact (type ``tar.gz``,
  classifier ``bin``), the same tarball as Pulsar's download page (``bin/pulsar``,
  ``conf/``, ``lib/``), fetched with ``mvn dependency:copy`` and unpacked. Maven Central
  serves it for 2.5.1, 2.6.0, 2.10.1, 3.3.5, 3.3.6, 4.0.4, 4.0.6 and 4.0.8 only.
- ``"classpath"``: Pulsar 3.0 LTS has no tarball there, but its ``pulsar-broker`` jar and
  everything it needs are. A generated ``pom.xml`` (importing the Pulsar parent pom for
  its pinned versions, plus log4j) is resolved with ``mvn dependency:copy-dependencies``
  into ``lib/``, and we write ``conf/standalone.conf`` (the standalone settings below,
  nothing about acknowledgement, so the version's own defaults hold) and
  ``conf/log4j2.properties``. The broker runs as ``java -cp 'conf:lib/*'
  org.apache.pulsar.PulsarStandaloneStarter``.

Maven's own repository settings, proxies and mirrors apply to both. The cache::

    $PULSAR_NACK_CACHE or ~/.cache/pulsar-nack/
        apache-pulsar-4.0.8/         bin/ conf/ lib/ ...      (distribution)
        apache-pulsar-3.0.7/         pom.xml conf/ lib/       (classpath)
        .lock                        held while a process fetches

Which version runs depends on the JDKs installed and on what the caller asks for:
:func:`choose_release` picks the newest release an installed JDK runs, or the newest one
matching ``version`` (``"4.0.8"``, ``"3.0"``, ``"3.x"``). Pulsar 4.0 (the newest LTS)
needs Java 21 or newer; Pulsar 3.0 (the previous LTS) runs on Java 17.

Set ``PULSAR_NACK_PULSAR_HOME`` to an unpacked distribution to skip the fetch of the
version it holds (read from ``lib/``), and ``PULSAR_NACK_JAVA_HOME`` to choose the JDK.
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
from typing import Literal

from ..errors import BrokerError

__all__ = [
    "CLASSPATH_JVM_FLAGS",
    "RELEASES",
    "PulsarRelease",
    "choose_release",
    "ensure_distribution",
    "find_jdks",
    "home_version",
    "matching_releases",
]

ReleaseKind = Literal["distribution", "classpath"]


@dataclasses.dataclass(frozen=True)
class PulsarRelease:
    """One Pulsar version we know how to run: how it is fetched and which Java runs it.

    Parameters
    ----------
    version : str
        The Pulsar version, e.g. ``"4.0.8"``.
    min_java, max_java : int, int or None
        The Java majors it supports; ``max_java=None`` means no upper bound.
    kind : {"distribution", "classpath"}
        ``"distribution"``: the server tarball, run with ``bin/pulsar standalone``.
        ``"classpath"``: the ``pulsar-broker`` jar and its dependencies, run with ``java -cp``.
    default_batch_index_ack : bool
        The broker's own default of ``acknowledgmentAtBatchIndexLevelEnabled`` (as its
        admin API reports it with the standalone settings and no override).
    """

    version: str
    min_java: int
    max_java: int | None = None
    kind: ReleaseKind = "distribution"
    default_batch_index_ack: bool = False

    @property
    def artifact(self) -> str:
        """The Maven coordinates of what is fetched: the binary tarball, or the broker jar."""
        if self.kind == "classpath":
            return f"org.apache.pulsar:pulsar-broker:{self.version}"
        return f"org.apache.pulsar:pulsar-server-distribution:{self.version}:tar.gz:bin"

    @property
    def java_range(self) -> str:
        """``"Java 21 or newer"``, ``"Java 17"`` or ``"Java 17 to 21"``."""
        if self.max_java is None:
            return f"Java {self.min_java} or newer"
        if self.max_java == self.min_java:
            return f"Java {self.min_java}"
        return f"Java {self.min_java} to {self.max_java}"

    def runs_on(self, java: int) -> bool:
        """Whether a JDK of major version *java* runs this release."""
        return self.min_java <= java and (self.max_java is None or java <= self.max_java)


RELEASES: tuple[PulsarRelease, ...] = (
    # Newest LTS on Maven Central (checked 2026-11-24). Batch-index acks are off by default
    # here too (ServiceConfiguration, and the admin API says false): PIP-391 is not in 4.0.
    PulsarRelease("4.0.8", 21),
    # Previous LTS. Maven Central has no 3.0 tarball and no pulsar-broker after 3.0.7
    # (3.0.8 to 3.0.15: 404, checked 2026-11-25), hence the classpath. Pulsar 3.0
    # supports Java 17; newer JDKs are untested with it.
    PulsarRelease("3.0.7", 17, max_java=17, kind="classpath"),
)
"""Newest first: the releases :func:`choose_release` picks from."""

CLASSPATH_JVM_FLAGS: tuple[str, ...] = (
    "-Djava.net.preferIPv4Stack=true",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dlog4j.configurationFile=log4j2.properties",
    "-Dlog4j2.is.webapp=false",
)
"""What ``bin/pulsar`` gives the JVM, for a ``"classpath"`` release (no ``bin/pulsar``)."""

STANDALONE_STARTER = "org.apache.pulsar.PulsarStandaloneStarter"

# A classpath release's conf/standalone.conf: what the distributions' standalone.conf
# changes from the broker's and the bookie's built-in defaults for one machine. Nothing
# about acknowledgement: the version's own defaults hold there.
_STANDALONE_SETTINGS = {
    "clusterName": "standalone",
    "managedLedgerDefaultEnsembleSize": "1",
    "managedLedgerDefaultWriteQuorum": "1",
    "managedLedgerDefaultAckQuorum": "1",
    "loadManagerClassName": "org.apache.pulsar.broker.loadbalance.NoopLoadManager",
    "loadBalancerEnabled": "false",
    "ledgerStorageClass": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
    "journalSyncData": "false",
    "journalMaxGroupWaitMSec": "1",
    "flushInterval": "60000",
    "dbStorage_rocksDB_writeBufferSizeMB": "4",
    "dbStorage_rocksDB_sstSizeInMB": "4",
    "dbStorage_rocksDB_blockSize": "4096",
    "diskUsageThreshold": "0.99",
    "diskUsageWarnThreshold": "0.99",
    "allowLoopback": "true",
}

_LOG4J2_PROPERTIES = """\
status = error
name = pulsar-nack
appender.console.type = Console
appender.console.name = Console
appender.console.target = SYSTEM_OUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} [%t] %-5level %logger{36} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = Console
"""

_CLASSPATH_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by pulsar_nack.testing.distribution: Apache Pulsar {version}'s broker and the
     logging jars its distribution adds, at the versions Pulsar's parent pom pins. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pulsar-nack.local</groupId>
  <artifactId>apache-pulsar-classpath</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.pulsar</groupId>
        <artifactId>pulsar</artifactId>
        <version>{version}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.pulsar</groupId>
      <artifactId>pulsar-broker</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-api</artifactId>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
    </dependency>
  </dependencies>
</project>
"""

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


_SPEC = re.compile(r"\d+(\.\d+)*(\.[xX*])?")


def matching_releases(version: str | None) -> tuple[PulsarRelease, ...]:
    """The releases in :data:`RELEASES` that *version* names, newest first.

    *version* is a full version (``"4.0.8"``) or a prefix of one (``"4.0"``, ``"3"``,
    with or without a trailing ``.x``: ``"3.x"``, ``"3.0.x"``); None names them all.

    Raises
    ------
    TypeError
        When *version* is not a str or None.
    ValueError
        When it is not a version, or names no release we know how to run.
    """
    if version is None:
        return RELEASES
    if not isinstance(version, str):
        raise TypeError(f"version must be a str such as '4.0.8' or '3.x', or None, got {type(version).__name__}")
    spec = version.strip()
    if not _SPEC.fullmatch(spec):
        raise ValueError(f"version must look like '4.0.8', '4.0' or '3.x', got {version!r}")
    wanted = [part for part in spec.split(".") if part.isdigit()]
    found = tuple(r for r in RELEASES if r.version.split(".")[: len(wanted)] == wanted)
    if not found:
        known = ", ".join(r.version for r in RELEASES)
        raise ValueError(f"version {version!r} names no Apache Pulsar release we can run; known: {known}")
    return found


def home_version(home: Path) -> str | None:
    """The Pulsar version in *home*, from its ``pulsar-broker`` jar in ``lib/``, or None."""
    try:
        names = [p.name for p in (home / "lib").iterdir()]
    except OSError:
        return None
    for name in names:
        match = re.fullmatch(r"(?:org\.apache\.pulsar-)?pulsar-broker-(\d[\w.-]*)\.jar", name)
        if match:
            return match.group(1)
    return None


def _installed_jdks() -> dict[Path, int]:
    jdks = find_jdks()
    forced = os.environ.get("PULSAR_NACK_JAVA_HOME")
    if forced:
        jdks = {home: major for home, major in jdks.items() if home == Path(forced).resolve()}
    return jdks


def _explicit_release() -> PulsarRelease | None:
    """The release ``PULSAR_NACK_PULSAR_HOME`` holds, when it is set and its version is readable."""
    explicit = os.environ.get("PULSAR_NACK_PULSAR_HOME")
    version = home_version(Path(explicit)) if explicit else None
    if version is None:
        return None
    for release in RELEASES:
        if release.version == version:
            return release
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    return PulsarRelease(version, 21 if numbers >= (3, 3) else 17)  # Pulsar 3.3 moved to Java 21


def choose_release(
    jdks: dict[Path, int] | None = None, *, version: str | None = None
) -> tuple[PulsarRelease, Path]:
    """The newest release that *version* names and some installed JDK runs, and that JDK.

    Parameters
    ----------
    jdks : dict, optional
        JDK home -> Java major. None: :func:`find_jdks`, restricted to
        ``PULSAR_NACK_JAVA_HOME`` when that is set.
    version : str, optional
        ``"4.0.8"``, ``"3.0"``, ``"3.x"``... (see :func:`matching_releases`). None: the
        newest release any JDK runs (or the one ``PULSAR_NACK_PULSAR_HOME`` holds).

    Returns
    -------
    (PulsarRelease, Path)
        The release and the newest JDK that runs it.

    Raises
    ------
    TypeError, ValueError
        From :func:`matching_releases`, for a *version* we do not know.
    BrokerError
        When no JDK is found, or none runs a release that *version* names.
    """
    releases = matching_releases(version)
    if version is None and jdks is None:
        explicit = _explicit_release()
        releases = releases if explicit is None else (explicit,)
    if jdks is None:
        jdks = _installed_jdks()
    if not jdks:
        raise BrokerError(
            "Apache Pulsar needs a Java runtime: no JDK found (looked at PULSAR_NACK_JAVA_HOME, "
            "JAVA_HOME, the java on PATH and /usr/lib/jvm). Install one, e.g. "
            "`apt-get install openjdk-17-jdk-headless`."
        )
    for release in releases:
        fitting = [(major, home) for home, major in jdks.items() if release.runs_on(major)]
        if fitting:
            return release, max(fitting)[1]
    have = ", ".join(f"{home} (Java {major})" for home, major in jdks.items())
    needs = "; ".join(f"{r.version} needs {r.java_range}" for r in releases)
    asked = "Apache Pulsar" if version is None else f"Apache Pulsar {version!r}"
    raise BrokerError(
        f"no installed JDK runs {asked} ({needs}); found only {have}. "
        "Install one, or point PULSAR_NACK_JAVA_HOME at it."
    )


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


def _is_ready(release: PulsarRelease, home: Path) -> bool:
    """Whether *home* holds a complete copy of *release* (each kind is moved into place whole)."""
    if not (home / "conf" / "standalone.conf").is_file():
        return False
    if release.kind == "classpath":
        return (home / "lib" / f"pulsar-broker-{release.version}.jar").is_file()
    return (home / "bin" / "pulsar").is_file()


def ensure_distribution(release: PulsarRelease, *, quiet: bool = True) -> Path:
    """The local copy of *release*, fetched from Maven Central on first use.

    For a ``"distribution"`` release, the unpacked tarball; for a ``"classpath"`` one, a
    directory with ``lib/`` (every jar), ``conf/standalone.conf`` and
    ``conf/log4j2.properties``. ``PULSAR_NACK_PULSAR_HOME``, when set, is returned as is
    (after a check) for the release it holds; other releases come from the cache.

    Raises
    ------
    BrokerError
        When ``mvn`` is missing, the download fails (with Maven's last lines), or the
        archive is not a Pulsar distribution.
    """
    explicit = os.environ.get("PULSAR_NACK_PULSAR_HOME")
    if explicit:
        held = home_version(Path(explicit))
        if held is None or held == release.version:
            if not (Path(explicit) / "bin" / "pulsar").is_file():
                raise BrokerError(f"PULSAR_NACK_PULSAR_HOME={explicit} holds no Pulsar distribution (bin/pulsar)")
            return Path(explicit)
    root = cache_dir()
    home = root / f"apache-pulsar-{release.version}"
    if _is_ready(release, home):
        return home
    with _cache_lock(root):
        if _is_ready(release, home):  # another process fetched it meanwhile
            return home
        if release.kind == "classpath":
            _assemble_classpath(release, root, home, quiet=quiet)
        else:
            archive = _download(release, root, quiet=quiet)
            try:
                _unpack(archive, root, home)
            finally:
                archive.unlink(missing_ok=True)
    return home


def _mvn(release: PulsarRelease, goal_args: list[str], cwd: Path, *, quiet: bool) -> None:
    """Run Maven in *cwd*; raise BrokerError with its last lines when it fails."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "fetching Apache Pulsar from Maven Central needs Maven: `mvn` is not on PATH. "
            "Install it (`apt-get install maven`), or set PULSAR_NACK_PULSAR_HOME to an "
            "unpacked Pulsar distribution."
        )
    argv = [mvn, "-B", *(["-q"] if quiet else []), *goal_args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"`{' '.join(argv)}` did not finish within {_MVN_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise BrokerError(
            f"could not fetch Apache Pulsar {release.version} from Maven Central "
            f"(`{' '.join(argv)}` exited {done.returncode}):\n{tail}"
        )


def _download(release: PulsarRelease, root: Path, *, quiet: bool) -> Path:
    out = Path(tempfile.mkdtemp(prefix="download-", dir=root))
    try:
        _mvn(release, ["dependency:copy", f"-Dartifact={release.artifact}", f"-DoutputDirectory={out}"], out, quiet=quiet)
        archives = list(out.glob("*.tar.gz"))
        if len(archives) != 1:
            raise BrokerError(f"could not fetch Apache Pulsar {release.version}: Maven left {len(archives)} archives")
        final = root / archives[0].name
        os.replace(archives[0], final)
        return final
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _assemble_classpath(release: PulsarRelease, root: Path, home: Path, *, quiet: bool) -> None:
    """Resolve the broker's jars into ``lib/`` and write ``conf/``, in a scratch directory
    moved into place whole."""
    scratch = Path(tempfile.mkdtemp(prefix="classpath-", dir=root))
    try:
        (scratch / "pom.xml").write_text(_CLASSPATH_POM.format(version=release.version), encoding="utf-8")
        goal = ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={scratch / 'lib'}"]
        _mvn(release, goal, scratch, quiet=quiet)
        conf = scratch / "conf"
        conf.mkdir()
        settings = "".join(f"{key}={value}\n" for key, value in _STANDALONE_SETTINGS.items())
        header = f"# Apache Pulsar {release.version} standalone, written by pulsar_nack.testing.distribution;\n"
        header += "# every setting not here keeps the broker's and the bookie's built-in default.\n"
        (conf / "standalone.conf").write_text(header + settings, encoding="utf-8")
        (conf / "log4j2.properties").write_text(_LOG4J2_PROPERTIES, encoding="utf-8")
        if not _is_ready(release, scratch):
            raise BrokerError(f"Maven fetched no pulsar-broker-{release.version}.jar ({release.artifact})")
        os.replace(scratch, home)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _unpack(archive: Path, root: Path, home: Path) -> None:
    """Unpack into a temporary directory, then move the one top-level folder into place."""
    scratch = Path(tempfile.mkdtemp(prefix="unpack-", dir=root))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(scratch, filter="tar")
        tops = [p for p in scratch.iterdir() if p.is_dir()]
        if len(tops) != 1 or not (tops[0] / "bin" / "pulsar").is_file():
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
