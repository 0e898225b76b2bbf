"""The docs match the committed benchmark JSON, and the README's commands are the ones CI runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import report  # noqa: E402


def test_generated_tables_match_the_committed_json():
    stale = report.stale_blocks()
    assert not stale, f"regenerate with `python -m bench.report --write`: {stale}"


def test_every_plot_the_docs_show_exists():
    for doc in (REPO / "docs").glob("*.md"):
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", doc.read_text()):
            assert (doc.parent / image).is_file(), f"{doc.name} shows missing {image}"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_line = next(line for line in readme.splitlines() if "python -m pytest" in line)
    assert test_line.rstrip().endswith("python -m pytest -q")
    assert re.search(r"^python -m pytest -q$", ci, re.M)
    extras = re.search(r'pip install -e "\.\[([^\]]+)\]" && python -m pytest', test_line).group(1)
    assert f'-e ".[{extras}]"' in ci


def test_every_test_the_consumer_docs_name_exists():
    """``tests/test_x.py::test_name`` in docs/consumer.md and docs/asyncio.md names a test that is there."""
    missing = []
    for doc in ("consumer.md", "asyncio.md"):
        for path, name in re.findall(r"(tests/test_\w+\.py)::(\w+)", (REPO / "docs" / doc).read_text()):
            if not re.search(rf"^(async )?def {name}\(", (REPO / path).read_text(), re.M):
                missing.append(f"{doc}: {path}::{name}")
    assert not missing, missing
