"""The package's layout: layers import downwards only, and the public API is what users call."""

from __future__ import annotations

import ast
from pathlib import Path

import pulsar_nack

PACKAGE = Path(pulsar_nack.__file__).parent

LAYERS = {
    # package (or root module) -> the first-party places it may import
    "core": {"core", "_validate", "errors"},
    "consumer": {"core", "consumer", "_validate", "errors"},
    "asyncio": {"consumer"},
    "metrics": {"core"},
    "spark": {"core", "consumer", "spark", "_validate", "errors"},
}


def _first_party_imports(path: Path) -> set[str]:
    """The top-level places of ``pulsar_nack`` that *path* imports (relative or absolute)."""
    package = path.relative_to(PACKAGE).parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                if parts:
                    found.add(parts[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("pulsar_nack."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("pulsar_nack."))
    return found


def test_the_root_holds_only_the_shared_modules_and_the_packages():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "_validate.py", "errors.py", "metrics.py"]
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert packages == ["asyncio", "cli", "consumer", "core", "spark", "testing"]


def test_no_import_runs_back_up_a_layer():
    bad = []
    for layer, allowed in LAYERS.items():
        paths = [PACKAGE / f"{layer}.py"] if (PACKAGE / f"{layer}.py").exists() else (PACKAGE / layer).rglob("*.py")
        for path in paths:
            for target in _first_party_imports(path) - allowed:
                bad.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not bad, bad


def test_runtime_modules_never_import_testing():
    bad = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ("testing", "cli") and "testing" in _first_party_imports(path)
    ]
    assert not bad, bad


def test_the_public_api_is_what_users_call():
    assert sorted(pulsar_nack.__all__) == sorted(
        [
            "MAX_DELAY_MS",
            "AsyncNackingConsumer",
            "ClosedError",
            "ConsumerClosedError",
            "FixedDelay",
            "MultiplierRedeliveryBackoff",
            "NackingConsumer",
            "NegativeAcksTracker",
            "PulsarNackError",
            "RedeliveryBackoff",
            "TrackerClosedError",
            "TrackerStats",
            "__version__",
            "subscribe",
        ]
    )
    for name in pulsar_nack.__all__:
        assert getattr(pulsar_nack, name) is not None, name


def test_the_asyncio_door_names_its_consumer():
    import pulsar_nack.asyncio

    assert pulsar_nack.asyncio.AsyncNackingConsumer is pulsar_nack.AsyncNackingConsumer
    assert pulsar_nack.asyncio.__all__ == ["AsyncNackingConsumer", "subscribe"]
