"""What ``pulsar-nack demo`` and ``pulsar-nack broker`` check and fetch before they start.

Up front, before any JVM starts, each problem a user can fix is one line on stderr
(:class:`SetupError`), naming what to install or start and the ``--service-url``
alternative:

- :func:`check_extra`: the Python packages of an extra (the demo's: ``spark``) are installed;
- :func:`check_standalone`: a JDK that runs Apache Pulsar, and ``mvn`` when the
  distribution is not cached yet;
- :func:`check_service_url`: a Pulsar broker answers at ``--service-url``;
- :func:`check_master`: a ``spark://`` master accepts connections;
- :func:`check_spark_java`: the Java that Spark's driver will run on is there (17+).

:func:`fetch_standalone` then fetches the distribution on first use, saying so on
stderr: what is fetched and its size, the seconds (and megabytes) while Maven
downloads, and where it is cached and how to remove it afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlsplit

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..testing.distribution import PulsarRelease

__all__ = [
    "EXTRAS",
    "SERVICE_URL_HINT",
    "SetupError",
    "artifact_size",
    "check_extra",
    "check_master",
    "check_service_url",
    "check_spark_java",
    "check_standalone",
    "fetch_standalone",
]

SERVICE_URL_HINT = "or use a running Pulsar cluster instead: --service-url pulsar://HOST:6650"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
_CONNECT_TIMEOUT_S = 3.0
_PULSAR_CHECK_TIMEOUT_S = 8
_SIZE_TIMEOUT_S = 3.0
_URL_FIX = "start the broker, fix the URL, or leave --service-url out to run Apache Pulsar standalone here"


class SetupError(Exception):
    """Something the user must install, start or fix before the command can run (one line)."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


EXTRAS: dict[str, tuple[str, ...]] = {"spark": ("pyspark", "tqdm")}
"""The modules of each extra a command needs: the ``[project.optional-dependencies]`` of
pyproject.toml, by import name (tests/test_cli_edges.py checks that they agree)."""


def check_extra(extra: str, prog: str) -> None:
    """Check that every module of *extra* can be imported, importing none of them.

    Raises
    ------
    SetupError
        Naming the missing modules and the ``pip install "pulsar-nack[EXTRA]"`` that brings them.
    """
    missing = [name for name in EXTRAS[extra] if not _importable(name)]
    if missing:
        raise SetupError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, and {prog} needs "
            f'the {extra!r} extra: pip install "pulsar-nack[{extra}]"'
        )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that fails, or a module without a spec in sys.modules
        return False


# ---------------------------------------------------------------- Apache Pulsar standalone


def check_standalone(version: str | None = None) -> PulsarRelease:
    """The release :class:`~pulsar_nack.testing.PulsarStandalone` will run here (of *version*,
    else the newest), after checking that it can: a JDK that runs it, and ``mvn`` unless it is
    cached. Starts nothing.

    Raises
    ------
    SetupError
        No suitable JDK, or no ``mvn`` while the distribution still has to be fetched.
    """
    from ..errors import BrokerError
    from ..testing.distribution import cached, choose_release

    try:
        release, _java = choose_release(version=version)
    except BrokerError as error:
        raise SetupError(f"{_one_line(error).rstrip('.')}; {SERVICE_URL_HINT}") from None
    if cached(release) is None and shutil.which("mvn") is None:
        raise SetupError(
            f"the first run fetches Apache Pulsar {release.version} from Maven Central with Maven, and `mvn` "
            "is not on PATH: install Maven (e.g. `apt-get install maven`), or set PULSAR_NACK_PULSAR_HOME to an "
            f"unpacked Pulsar distribution; {SERVICE_URL_HINT}"
        )
    return release


def artifact_size(release: PulsarRelease, timeout_s: float = _SIZE_TIMEOUT_S) -> int | None:
    """Bytes of *release*'s tarball on Maven Central (an HTTP HEAD), or None when unknown.

    None for a release that is not one tarball, or when Maven Central does not answer
    within *timeout_s*.
    """
    parts = release.artifact.split(":")
    if len(parts) != 5:  # group:artifact:version:type:classifier
        return None
    group, artifact, version, kind, classifier = parts
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}-{classifier}.{kind}"
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


def _maven_download_dir(release: PulsarRelease) -> Path | None:
    """Where Maven puts *release*'s artifact in its local repository (the default one)."""
    group, artifact, version = release.artifact.split(":")[:3]
    repo = Path.home() / ".m2" / "repository"
    for variable in ("MAVEN_OPTS", "MAVEN_ARGS"):
        for word in os.environ.get(variable, "").split():
            if word.startswith("-Dmaven.repo.local="):
                repo = Path(word.partition("=")[2])
    return repo.joinpath(*group.split("."), artifact, version)


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _mb(size: float) -> str:
    return f"{size / 1e6:,.0f} MB"


class _Ticker:
    """Elapsed seconds (and MB in Maven's download directory) on *stream* while a fetch runs.

    On a terminal one line is rewritten every half second; otherwise a line every 10 s.
    """

    def __init__(self, stream: TextIO, watch: Path | None, total: int | None) -> None:
        self.stream, self.watch, self.total = stream, watch, total
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fetch-progress", daemon=True)

    def line(self) -> str:
        text = f"  fetching ... {time.monotonic() - self.started:.0f} s"
        if self.watch is not None and self.watch.is_dir():
            text += f", {_mb(_tree_bytes(self.watch))}" + (f" of {_mb(self.total)}" if self.total else "")
        return text

    def _run(self) -> None:
        interval = 0.5 if self.tty else 10.0
        while not self._stop.wait(interval):
            self.stream.write(f"\r{self.line()}\033[K" if self.tty else f"{self.line()}\n")
            self.stream.flush()

    def __enter__(self) -> _Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def fetch_standalone(release: PulsarRelease, prog: str, stream: TextIO | None = None) -> Path:
    """The local copy of *release*; fetched here, with status lines on *stream*, if not cached.

    Parameters
    ----------
    release : PulsarRelease
        From :func:`check_standalone`.
    prog : str
        The command, e.g. ``"pulsar-nack demo"``, that starts each status line.
    stream : text stream, optional
        Where the status lines go; default ``sys.stderr``.

    Raises
    ------
    BrokerError
        From :func:`~pulsar_nack.testing.distribution.ensure_distribution`.
    """
    from ..testing.distribution import cache_dir, cached, ensure_distribution

    stream = sys.stderr if stream is None else stream
    home = cached(release)
    if home is not None:
        return home
    size = artifact_size(release)
    what = f"about {_mb(size)}" if size else "about 250 MB for Pulsar 4.0; size unknown"
    print(
        f"{prog}: first run: fetching Apache Pulsar {release.version} ({what}) from Maven Central into "
        f"{cache_dir()}; later runs start from there",
        file=stream,
        flush=True,
    )
    maven_dir = _maven_download_dir(release)
    started = time.monotonic()
    with _Ticker(stream, maven_dir, size):
        home = ensure_distribution(release)
    maven_copy = ""
    if maven_dir is not None and maven_dir.is_dir():
        maven_copy = f" and Maven's copy with `rm -rf {maven_dir}`"
    print(
        f"{prog}: fetched in {time.monotonic() - started:.0f} s; Apache Pulsar {release.version} is cached in {home} "
        f"({_mb(_tree_bytes(home))}): remove it with `rm -rf {home}`{maven_copy}",
        file=stream,
        flush=True,
    )
    return home


# ---------------------------------------------------------------- what the demo connects to


def _endpoints(url: str, schemes: dict[str, int]) -> list[tuple[str, int]]:
    """``host:port`` pairs of a URL such as ``pulsar://a:6650,b:6650`` (default ports by scheme).

    >>> _endpoints("pulsar://a:1,b", {"pulsar": 6650})
    [('a', 1), ('b', 6650)]
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in schemes:
        raise SetupError(f"expected a URL starting with {' or '.join(s + '://' for s in schemes)}, got {url!r}")
    hosts = rest.split("/", 1)[0]
    found = []
    for host in hosts.split(","):
        parsed = urlsplit(f"//{host}")
        try:
            port = parsed.port
        except ValueError:
            raise SetupError(f"bad port in {url!r}") from None
        if not parsed.hostname:
            raise SetupError(f"no host in {url!r}")
        found.append((parsed.hostname, port or schemes[scheme]))
    return found


def _first_listening(endpoints: list[tuple[str, int]], timeout_s: float) -> str | None:
    """None if one endpoint accepts a TCP connection, else why the last did not."""
    reason = "no endpoint"
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as error:
            reason = error.strerror or type(error).__name__
    return reason


def check_service_url(url: str) -> None:
    """Raise :class:`SetupError` unless a Pulsar broker answers at *url*, within about 11 s.

    First a TCP connection to its hosts, then a partition-metadata lookup through a
    client whose log is silenced (the one-line error says what failed).
    """
    import pulsar

    from ..testing import quiet_client

    why = _first_listening(_endpoints(url, {"pulsar": 6650, "pulsar+ssl": 6651}), _CONNECT_TIMEOUT_S)
    if why is not None:
        raise SetupError(f"nothing answers at --service-url {url} ({why.lower()}): {_URL_FIX}")
    silent = pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)  # the one-line error says it all
    client = quiet_client(url, logger=silent, operation_timeout_seconds=_PULSAR_CHECK_TIMEOUT_S)
    outcome: list[object] = []

    def lookup() -> None:  # the client's own timeouts run past its operation timeout: a deadline here
        try:
            outcome.append(client.get_topic_partitions("persistent://public/default/pulsar-nack-probe"))
        except pulsar.PulsarException as error:
            outcome.append(error)

    thread = threading.Thread(target=lookup, name="service-url-check", daemon=True)
    thread.start()
    thread.join(_PULSAR_CHECK_TIMEOUT_S)
    answered = list(outcome)  # before close(), which makes a waiting lookup return []
    client.close()
    if not answered or not answered[0]:
        raise SetupError(f"no Pulsar broker answered at --service-url {url} within {_PULSAR_CHECK_TIMEOUT_S} s: {_URL_FIX}")
    if isinstance(answered[0], Exception):
        raise SetupError(f"no Pulsar broker answered at --service-url {url} ({_one_line(answered[0])}): {_URL_FIX}")


def check_master(master: str) -> None:
    """Raise :class:`SetupError` unless a ``spark://`` *master* accepts connections (others pass)."""
    if not master.startswith("spark://"):
        return
    why = _first_listening(_endpoints(master, {"spark": 7077}), _CONNECT_TIMEOUT_S)
    if why is not None:
        raise SetupError(
            f"nothing answers at --master {master} ({why.lower()}): start the Spark master, or use --master local[2]"
        )


SPARK_MIN_JAVA = 17


def check_spark_java() -> None:
    """Raise :class:`SetupError` unless the ``java`` Spark's driver starts with is there and
    new enough: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH (the
    launcher's own rule). An unknown version passes (Spark itself says more)."""
    from ..testing.distribution import java_major

    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else (Path(found) if (found := shutil.which("java")) else None)
    if java is None or not java.exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no `java` on PATH"
        raise SetupError(
            f"Spark needs Java {SPARK_MIN_JAVA} or newer and {where}: install a JDK (e.g. `apt-get install "
            f"openjdk-17-jdk-headless`) or point JAVA_HOME at one"
        )
    major = java_major(java.resolve().parent.parent)
    if major is not None and major < SPARK_MIN_JAVA:
        raise SetupError(
            f"Spark needs Java {SPARK_MIN_JAVA} or newer; {java} is Java {major}: install a newer JDK "
            "(e.g. `apt-get install openjdk-17-jdk-headless`) or point JAVA_HOME at one"
        )
