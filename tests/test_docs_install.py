"""The docs and the README say what pyproject.toml says: how to install (the package and its
extras) and which pulsar-client and pyspark versions work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

# A version range said in prose or a requirement: ">= 3.9.0, < 4", ">=3.9.0,<4", ">= 4.0", "3.9.0 or later",
# "3.13+", "3.9 to 3.13"
_VERSION = r"\d+(?:\.\d+)*"
_RANGE = re.compile(
    rf"(?:>=\s*(?P<low>{_VERSION})(?:\s*,\s*<\s*(?P<high>{_VERSION}))?)"
    rf"|(?:(?P<from>{_VERSION})\s*(?:\+|or later|or newer|and later))"
    rf"|(?:(?P<a>{_VERSION}) to (?P<b>{_VERSION}))"
)


def _requirement(name: str, requirements: list[str]) -> tuple[str, str | None]:
    """(lower bound, upper bound or None) of *name* among pyproject requirements such as ``pulsar-client>=3.9.0,<4``."""
    for requirement in requirements:
        match = re.fullmatch(rf"{re.escape(name)}\s*>=\s*({_VERSION})\s*(?:,\s*<\s*({_VERSION}))?", requirement)
        if match:
            return match.group(1), match.group(2)
    raise AssertionError(f"{name} with a >= bound is not among {requirements}")


def _stated_ranges(name: str) -> list[tuple[str, str, re.Match[str]]]:
    """Every version range the pages state right after *name* (``**`` and a space allowed between)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for mention in re.finditer(rf"{re.escape(name)}[\s*`']*", text, re.IGNORECASE):
            match = _RANGE.match(text, mention.end())
            if match:
                line = text.count("\n", 0, mention.start()) + 1
                found.append((f"{page.relative_to(REPO_ROOT)}:{line}", text[mention.start():match.end()], match))
    return found


def _check_ranges(name: str, low: str, high: str | None) -> list[str]:
    wrong, stated = [], _stated_ranges(name)
    for where, said, match in stated:
        lower = match.group("low") or match.group("from") or match.group("a")
        upper = match.group("high")
        if match.group("a"):  # "3.9 to 3.13" states an upper bound pyproject does not have
            wrong.append(f"{where}: {said!r} (pyproject: >={low}{f',<{high}' if high else ''})")
            continue
        if lower != low or (upper is not None and upper != high):
            wrong.append(f"{where}: {said!r} (pyproject: >={low}{f',<{high}' if high else ''})")
    assert stated, f"no page states a version range of {name}"
    return wrong


def test_the_pulsar_client_range_the_docs_state_is_pyprojects() -> None:
    low, high = _requirement("pulsar-client", PROJECT["dependencies"])
    assert _check_ranges("pulsar-client", low, high) == []


def test_the_pyspark_range_the_docs_state_is_the_spark_extras() -> None:
    low, high = _requirement("pyspark", PROJECT["optional-dependencies"]["spark"])
    assert _check_ranges("pyspark", low, high) == []


def test_every_install_command_names_this_package_and_extras_it_has() -> None:
    """``pip install "pulsar-nack[a,b]"``, ``pip install -e ".[a]"`` and ``pip install pulsar-nack``."""
    extras = set(PROJECT["optional-dependencies"])
    commands = []
    for page in PAGES:
        for line in page.read_text().splitlines():
            for match in re.finditer(r"pip install (?:-e )?['\"]?(pulsar-nack|\.)(?:\[([\w,]+)\])?['\"]?", line):
                commands.append((page.name, match.group(0)))
                named = set(filter(None, (match.group(2) or "").split(",")))
                assert named <= extras, f"{page.name}: {match.group(0)!r} names extras pyproject lacks: {named - extras}"
    assert PROJECT["name"] == "pulsar-nack"
    assert any("spark" in command for _, command in commands), commands
