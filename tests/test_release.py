"""What a release ships: the sdist holds every file git tracks (tests and their helpers, docs,
examples, bench, tools, the changelog, LICENSE and NOTICE) and nothing else, and the wheel
rebuilt from it holds both C extensions and the compiled ledger, LICENSE and NOTICE.

Both are built here as a packager would (``python -m build``: the sdist from the checkout,
then the wheel from the sdist, each in an isolated environment with the build requirements
from PyPI). ``tools/build_release.py`` builds the release itself and tests each wheel in a
fresh venv; ``docs/releasing.md`` says how.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import pulsar_nack
from tools.build_release import EXTENSIONS, MANYLINUX, copy_source, source_files

REPO = Path(__file__).resolve().parents[1]

# Files git tracks that the sdist leaves out on purpose, each with why.
EXCLUDED = {
    ".gitignore": "git's own; nothing in a build or a test reads it",
}
# Files the build writes into the sdist that git does not track.
GENERATED = {"PKG-INFO", "setup.cfg"}
GENERATED_DIRS = ("pulsar_nack.egg-info/",)
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


# One file a checkout may hold for each pattern of .gitignore: planted in the copy built from,
# none may reach the sdist.
JUNK = {
    "__pycache__/": "tests/__pycache__/helpers.cpython-311.pyc",
    "*.egg-info/": "pulsar_nack.egg-info/SOURCES.txt",
    ".ci/venv/": ".ci/venv/bin/python",
    ".venv/": ".venv/bin/python",
    "/build/": "build/lib/pulsar_nack/__init__.py",
    "/dist/": "dist/pulsar_nack-0.0.0.tar.gz",
    ".hypothesis/": "tests/.hypothesis/examples/x",
    ".pytest_cache/": ".pytest_cache/v/cache/lastfailed",
    "*.so": "pulsar_nack/core/_speedups.cpython-311-x86_64-linux-gnu.so",
    ".ci/pulsar-cache/": ".ci/pulsar-cache/apache-pulsar-4.0.8/bin/pulsar",
    ".ci/client-matrix/": ".ci/client-matrix/venv/bin/python",
    "/site/": "site/index.html",
}


def _need_a_checkout() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): no git list, no .gitignore")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist of a copy of this checkout's source files with junk planted beside them (a
    copy: setuptools would also take files from a stale ``*.egg-info/SOURCES.txt`` of the
    checkout), and the wheel built from that sdist."""
    _need_a_checkout()
    pytest.importorskip("build", reason="the test extra installs `build`")
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    copy_source(source, REPO)
    for name in JUNK.values():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text("junk\n")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_junk_is_planted_for_every_pattern_git_ignores() -> None:
    _need_a_checkout()
    ignored = [line for line in (REPO / ".gitignore").read_text().splitlines() if line and not line.startswith("#")]
    assert sorted(ignored) == sorted(JUNK)


def test_the_sdist_holds_every_source_file_and_nothing_stray(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as archive:
        root, names = f"pulsar_nack-{pulsar_nack.__version__}/", [m.name for m in archive.getmembers() if m.isfile()]
    assert all(name.startswith(root) for name in names), names
    shipped = {name[len(root):] for name in names}
    generated = {name for name in shipped if name in GENERATED or name.startswith(GENERATED_DIRS)}
    expected = set(source_files(REPO)) - set(EXCLUDED)
    assert not expected - shipped, f"missing from the sdist (MANIFEST.in): {sorted(expected - shipped)}"
    assert not shipped - generated - expected, f"stray in the sdist: {sorted(shipped - generated - expected)}"
    for needed in ("tests/conftest.py", "tests/helpers.py", "tests/spark_jobs.py", "LICENSE", "NOTICE", "CHANGELOG.md"):
        assert needed in shipped, needed


def test_the_sdist_metadata_has_the_packages_version_and_license(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as archive:
        member = archive.extractfile(f"pulsar_nack-{pulsar_nack.__version__}/PKG-INFO")
        assert member is not None
        metadata = HeaderParser().parsestr(member.read().decode())
    assert metadata["Version"] == pulsar_nack.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("License-File") or []) == ["LICENSE", "NOTICE"]
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)} <= set(metadata.get_all("Classifier") or [])


def test_the_wheel_rebuilt_from_the_sdist_holds_both_extensions_license_and_notice(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = archive.namelist()
        info = f"pulsar_nack-{pulsar_nack.__version__}.dist-info/"
        licenses = {name: archive.read(f"{info}licenses/{name}") for name in ("LICENSE", "NOTICE")}
    for extension in EXTENSIONS:
        assert any(name.startswith(extension) and name.endswith(".so") for name in names), (extension, names)
    assert licenses["LICENSE"] == (REPO / "LICENSE").read_bytes()
    assert licenses["NOTICE"] == (REPO / "NOTICE").read_bytes()
    assert not [name for name in names if not name.startswith(("pulsar_nack/", info))], names
    assert not [name for name in names if name.endswith(".c")], "the C sources belong in the sdist only"


def test_license_is_the_unmodified_apache_2_0_text_and_notice_names_the_project() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert text.lstrip().startswith(b"Apache License\n                           Version 2.0, January 2004")
    # The digest of apache.org's LICENSE-2.0.txt, byte for byte as pulsar-client's wheel ships it.
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    notice = (REPO / "NOTICE").read_text().splitlines()
    assert notice[:2] == ["pulsar-nack", "Copyright 2026 the pulsar-nack authors"]


def test_the_changelog_is_written_for_users_in_keep_a_changelog_form() -> None:
    """Versions with dates, newest first, under an Unreleased heading; no issue numbers or result paths."""
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[0] == "[Unreleased]", headings
    released = [re.fullmatch(r"\[(\d+)\.(\d+)\.(\d+)\] - \d{4}-\d{2}-\d{2}", heading) for heading in headings[1:]]
    assert released and all(released), headings
    versions = [tuple(int(part) for part in match.groups()) for match in released if match]
    assert versions == sorted(versions, reverse=True), versions
    assert not re.findall(r"issue \d+|#\d+|bench/results", text, re.I)


def _glibc_versions(library: Path) -> set[tuple[int, int]]:
    """The glibc symbol versions a shared library's dynamic strings name (``GLIBC_2.17`` -> (2, 17))."""
    return {(int(m[1]), int(m[2])) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)", library.read_bytes())}


def test_the_built_extensions_need_no_glibc_newer_than_the_wheels_promise() -> None:
    """Every extension built here binds no glibc symbol newer than :data:`MANYLINUX` allows, which is what
    auditwheel tags the wheel by (a ``dlopen`` bound to glibc 2.34's new version would make it manylinux_2_34)."""
    built = [path for path in Path(pulsar_nack.__file__).parent.rglob("*.so") if "__pycache__" not in path.parts]
    if not built:
        pytest.skip("no extension was built here (pure Python)")
    allowed = tuple(int(part) for part in MANYLINUX.removeprefix("manylinux_").split("_"))
    newer = {path.name: max(versions) for path in built if (versions := _glibc_versions(path)) and max(versions) > allowed}
    assert not newer, f"glibc symbol versions newer than {MANYLINUX}: {newer}"


def test_the_docs_name_the_manylinux_tag_the_release_tool_requires() -> None:
    for doc in ("docs/releasing.md", "CHANGELOG.md"):
        assert f"`{MANYLINUX}`" in (REPO / doc).read_text(), doc
