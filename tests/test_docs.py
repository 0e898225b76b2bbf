"""The docs match the committed benchmark JSON, and the README's commands are the ones CI runs."""

from __future__ import annotations

import ast
import doctest
import re
import subprocess
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


def test_doctests_that_start_a_broker_run_as_broker_tests():
    """A doc example that starts a broker is a broker test: run with them, deselected with them, never skipped."""
    starting = []
    for path in sorted((REPO / "pulsar_nack").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                for example in doctest.DocTestParser().get_examples(ast.get_docstring(node, clean=True) or ""):
                    if example.exc_msg is None and ("PulsarStandalone(" in example.source or "PulsarCluster(" in example.source):
                        starting.append(path.relative_to(REPO).as_posix())
                        assert not example.options.get(doctest.SKIP), f"{path.name}: a skipped example never runs"
    assert starting, "the testing package shows how to start a broker"
    for marks, expected in (("broker", set(starting)), ("not broker", set())):
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marks, *sorted(set(starting))],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        ).stdout
        assert {line.split("::")[0] for line in listed.splitlines() if "::" in line} == expected, (marks, listed)


def test_design_names_the_constants_of_the_code_and_links_only_inside():
    """docs/design.md: its prose gives the code's numbers (the table of constants is generated), and no link leaves the repo."""
    import inspect

    from pulsar_nack.consumer import message_sets
    from pulsar_nack.core import accel
    from pulsar_nack.core.buckets import TimeBuckets

    design = (REPO / "docs" / "design.md").read_text()
    prose = re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", design, flags=re.S)
    max_open = inspect.signature(TimeBuckets).parameters["max_open_buckets"].default
    slot, bytes_obj, _, roaring, container, run = report.SPACE_MODEL
    expected = {
        r"at most (\d+) per deadline": [accel.LOG_GROUP],
        r"open buckets \(at most (\d+)\)": [max_open],
        r"`entry << (\d+) \| batch_index \+ 1`": [message_sets._BATCH_BITS],
        r"about (\d+) bytes\)": [slot],
        r"a (\d+)-byte `bytes` header": [bytes_obj],
        r"\((\d+) \+ (\d+) \+ 2 \+ (\d+) bytes\)": [roaring, container, run],
    }
    for pattern, values in expected.items():
        found = re.findall(pattern, prose)
        assert found, f"design.md no longer says {pattern!r}: update this test with it"
        for match in found:
            assert [int(v) for v in ([match] if isinstance(match, str) else match)] == values, (pattern, match)
    for target in re.findall(r"\]\(([^)\s]+)\)", design):
        if not target.startswith(("https://", "#")):
            path = (REPO / "docs" / target.split("#")[0]).resolve()
            assert path.exists() and REPO in path.parents, f"design.md links outside the repository: {target}"


def test_the_consumer_docs_give_the_handoff_numbers_of_the_code():
    """docs/consumer.md's handoff prose: the lead, its margin and where a message lands after its bucket."""
    from pulsar_nack.timing import CLIENT_TICK_MS, HANDOFF_DELAY_MS, HANDOFF_MARGIN_MS, handoff_lead_ms

    text = re.sub(r"\s+", " ", (REPO / "docs" / "consumer.md").read_text())
    lead = handoff_lead_ms(HANDOFF_DELAY_MS)
    tick = CLIENT_TICK_MS  # the C++ client's timer interval
    expected = {
        r"less a (\d+) ms margin, (\d+) ms, in every mode": [HANDOFF_MARGIN_MS, lead],
        r"arrives between (\d+) ms and about (\d+) ms after its bucket": [HANDOFF_DELAY_MS - lead, HANDOFF_DELAY_MS + tick - lead],
        r"the handoff plus the lead, (\d+) ms": [lead],
    }
    for pattern, values in expected.items():
        found = re.findall(pattern, text)
        assert found, f"consumer.md no longer says {pattern!r}: update this test with it"
        for match in found:
            assert [int(v) for v in ([match] if isinstance(match, str) else match)] == values, (pattern, match)


def test_the_consumer_docs_give_the_retry_hold_limits_of_the_code():
    """docs/consumer.md's ``retry_hold_ms`` prose: the in-memory cap and the largest payload held."""
    from pulsar_nack.consumer.retry import HELD_MAX_BYTES, MEMORY_HOLD_MAX

    text = re.sub(r"\s+", " ", (REPO / "docs" / "consumer.md").read_text())
    cap = re.findall(r"in memory until due \(up to ([\d,]+) copies", text)
    assert [int(v.replace(",", "")) for v in cap] == [MEMORY_HOLD_MAX], cap
    largest = re.findall(r"A payload above (\d+) KiB goes the broker's way", text)
    assert [int(v) * 1024 for v in largest] == [HELD_MAX_BYTES], largest


def test_the_consumer_docs_give_the_settled_entry_bounds_of_the_code():
    """docs/consumer.md: how many settled entries the guard remembers, and for how long."""
    from pulsar_nack.consumer.admission import SETTLED_CAPACITY
    from pulsar_nack.timing import SETTLED_MAX_AGE_MS

    text = re.sub(r"\s+", " ", (REPO / "docs" / "consumer.md").read_text())
    found = re.findall(r"the last ([\d,]+) settled entries and acked non-batched messages are remembered too, for (\d+) s", text)
    assert [(int(n.replace(",", "")), int(s) * 1000) for n, s in found] == [(SETTLED_CAPACITY, SETTLED_MAX_AGE_MS)], found


def test_the_consumer_docs_give_the_shared_handoff_waits_of_the_code():
    """docs/consumer.md's "Batches": how long an entry waits for a held member and after its last read."""
    from pulsar_nack.timing import COPY_DRAIN_MS, STALE_MS

    text = re.sub(r"\s+", " ", (REPO / "docs" / "consumer.md").read_text())
    held = re.findall(r"the member it was given last is unsettled \(for at most `STALE_MS`, (\d+) s\), and for (\d+) ms after", text)
    assert [(int(h) * 1000, int(d)) for h, d in held] == [(STALE_MS, COPY_DRAIN_MS)], held
    assert f"settles one of them more than {COPY_DRAIN_MS} ms after" in text
    changelog = re.sub(r"\s+", " ", (REPO / "CHANGELOG.md").read_text())
    assert f"within the last {COPY_DRAIN_MS} ms (`COPY_DRAIN_MS`)" in changelog


def test_the_consumer_docs_give_the_ack_timeout_numbers_of_the_code():
    """docs/consumer.md's ack-timeout prose: its buckets, its tick, and how many message objects it holds."""
    from pulsar_nack.consumer.ack_timeout import LOG_LIMIT, PRECISION_BITS
    from pulsar_nack.timing import ACK_TIMEOUT_TICK_MS

    text = re.sub(r"\s+", " ", (REPO / "docs" / "consumer.md").read_text())
    buckets = re.findall(r"a `NegativeAcksTracker` of its own \((\d+) ms buckets", text)
    assert [int(v) for v in buckets] == [2**PRECISION_BITS], buckets
    tick = re.findall(r"Every (\d+) ms a timer thread takes both logs", text)
    assert [int(v) for v in tick] == [ACK_TIMEOUT_TICK_MS], tick
    held = re.findall(r"and no more than (\d+) at a time", text)
    assert [int(v) for v in held] == [LOG_LIMIT], held


def test_every_test_the_consumer_docs_name_exists():
    """``tests/test_x.py::test_name`` in docs/consumer.md and docs/asyncio.md names a test that is there."""
    missing = []
    for doc in ("consumer.md", "asyncio.md"):
        for path, name in re.findall(r"(tests/test_\w+\.py)::(\w+)", (REPO / "docs" / doc).read_text()):
            if not re.search(rf"^(async )?def {name}\(", (REPO / path).read_text(), re.M):
                missing.append(f"{doc}: {path}::{name}")
    assert not missing, missing


def test_pulsar_lite_is_named_only_in_the_changelog():
    """Issue 20's grep: pulsar-lite left the project; only CHANGELOG.md says why (result metadata included)."""
    pattern = re.compile(r"pulsar.lite|pulsar_lite|PulsarLite", re.IGNORECASE)
    places = ["pulsar_nack", "tests", "examples", "bench", "docs"]
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    files += [p for place in places for p in (REPO / place).rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".json", ".toml", ".c", ".txt", ".cfg"}]
    found = [str(p.relative_to(REPO)) for p in files if p != Path(__file__).resolve() and pattern.search(p.read_text(errors="replace"))]
    assert not found, found


def test_the_spark_docs_durable_goal_figures_are_the_committed_runs():
    """docs/spark.md's prose on issue 25's goals: ratios and p99s of bench/results/demo-retries.json."""
    import json

    runs = json.loads((REPO / "bench" / "results" / "demo-retries.json").read_text())["runs"]
    by = {(r["mode"], r.get("repeat", 0)): r["summary"] for r in runs}
    repeats = sorted({r.get("repeat", 0) for r in runs})

    def ratio(mode: str, repeat: int) -> str:
        return f"{by[(mode, repeat)]['messages_per_s'] / by[('nack', repeat)]['messages_per_s']:.2f}"

    text = re.sub(r"\s+", " ", (REPO / "docs" / "spark.md").read_text())
    held = re.search(r"retry lateness p99 (\d+) and (\d+) ms \(goal 300 ms\); but ([\d.]+)× and ([\d.]+)× the nack", text)
    assert held, "spark.md no longer states the durable goal figures: update this test with it"
    assert [int(held[1]), int(held[2])] == [round(by[("durable", r)]["redelivery_lateness_ms"]["p99"]) for r in repeats]
    assert [held[3], held[4]] == [ratio("durable", r) for r in repeats]
    made = re.search(r"The durable mode made ([\d,]+) and ([\d,]+) messages/s, the nack mode ([\d,]+) and ([\d,]+)\.", text)
    assert made, "spark.md no longer states the durable and nack throughputs: update this test with it"
    for mode, figures in (("durable", made.groups()[:2]), ("nack", made.groups()[2:])):
        assert list(figures) == [f"{round(by[(mode, r)]['messages_per_s']):,}" for r in repeats]
    broker = re.search(r"\(`durable-broker`\), the same holds but throughput: ([\d.]+)× and ([\d.]+)×", text)
    assert broker and [broker[1], broker[2]] == [ratio("durable-broker", r) for r in repeats]
    assert all(by[("durable", r)]["lost"] == 0 and by[("durable", r)]["duplicates"] == 0 for r in repeats)
    assert all(by[("durable", r)]["redelivery_lateness_ms"]["min"] >= 0 for r in repeats)


# The API reference (mkdocs.yml): each page under docs/reference/ lists objects with
# mkdocstrings' `::: path` directives, and `mkdocs build --strict` (in .ci/run) fails on a
# directive whose object does not exist.
REFERENCED_MODULES = ("pulsar_nack", "pulsar_nack.asyncio", "pulsar_nack.spark", "pulsar_nack.metrics", "pulsar_nack.testing")


def test_the_api_reference_has_an_entry_for_every_public_name():
    """Every name in the `__all__` of the five public modules has its directive, and nothing else has one."""
    import importlib

    public = {f"{module}.{name}" for module in REFERENCED_MODULES for name in importlib.import_module(module).__all__}
    entries: list[str] = []
    for page in sorted((REPO / "docs" / "reference").glob("*.md")):
        entries += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M)
    assert len(entries) == len(set(entries)), f"an entry appears twice: {sorted(entries)}"
    assert not public - set(entries), f"public names without a reference entry in docs/reference/: {sorted(public - set(entries))}"
    assert not set(entries) - public, f"reference entries for names no __all__ lists: {sorted(set(entries) - public)}"
    nav = (REPO / "mkdocs.yml").read_text()
    for page in (REPO / "docs" / "reference").glob("*.md"):
        assert f"reference/{page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


_LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARNING", "error": "ERROR", "exception": "ERROR", "critical": "CRITICAL"}


def _records_in_code() -> set[tuple[str, str, str, str]]:
    """(logger, level, message, traceback yes/no) of every logging call in pulsar_nack, read from the source."""
    import ast

    records = set()
    for path in sorted((REPO / "pulsar_nack").rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        loggers = {}  # variable -> logger name
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "logging.getLogger":
                (arg,) = node.value.args
                name = module if ast.unparse(arg) == "__name__" else ast.literal_eval(arg)
                loggers.update({target.id: name for target in node.targets if isinstance(target, ast.Name)})
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LEVELS:
                owner = ast.unparse(node.func.value)
                assert owner != "logging", f"{path.name}: logs on the root logger, not on a pulsar_nack one"
                if owner in loggers:
                    message = node.args[0]
                    assert isinstance(message, ast.Constant), f"{path.name}:{node.lineno}: the message is not a literal"
                    traceback = node.func.attr == "exception" or any(
                        k.arg == "exc_info" and ast.unparse(k.value) == "True" for k in node.keywords
                    )
                    records.add((loggers[owner], _LEVELS[node.func.attr], message.value, "yes" if traceback else "no"))
    return records


def test_the_logging_docs_name_every_logger_and_record_of_the_code():
    """docs/logging.md's table is exactly the code's logging calls: loggers, levels, messages, tracebacks."""
    rows, logger = [], None
    for line in (REPO / "docs" / "logging.md").read_text().splitlines():
        heading = re.match(r"^### `(pulsar_nack[\w.]*)`$", line)
        logger = heading[1] if heading else logger
        row = re.match(r"^\| ([A-Z]+) \| `([^`]+)` \| (yes|no) \|", line)
        if row:
            assert logger is not None, f"a record before any logger's heading: {line}"
            rows.append((logger, *row.groups()))
    documented = set(rows)
    assert len(rows) == len(documented), "a record is listed twice"
    code = _records_in_code()
    assert {r[0] for r in documented} == {r[0] for r in code}, "the loggers differ: " + str(
        ({r[0] for r in code} - {r[0] for r in documented}, {r[0] for r in documented} - {r[0] for r in code})
    )
    assert documented == code, f"in the code, not in docs/logging.md: {sorted(code - documented)}; the reverse: {sorted(documented - code)}"
