"""The package's layout: layers import downwards only, and the public API is what users call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pulsar_nack

PACKAGE = Path(pulsar_nack.__file__).parent
REPO = Path(__file__).resolve().parents[1]
"""The checkout (or unpacked sdist) of these tests: its ``pulsar_nack`` may be a link to an installed package."""

LAYERS = {
    # package (or root module) -> the first-party places it may import
    "core": {"core", "_validate", "errors"},
    "consumer": {"core", "consumer", "_validate", "errors", "timing"},
    "asyncio": {"consumer"},
    "metrics": {"core"},
    "spark": {"core", "consumer", "spark", "_validate", "errors", "timing"},
    "timing": set(),
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
    assert modules == ["__init__.py", "_validate.py", "errors.py", "metrics.py", "timing.py"]
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


THIRD_PARTY_PRIVATE = {
    # pyspark keeps the active context and its gateway only in private class attributes;
    # session.py reads them to find (and forget) a context that was stopped under it.
    "SparkContext._active_spark_context",
    "SparkContext._gateway",
    "SparkContext._jvm",
    "os._exit",  # a documented function of the standard library, named with an underscore
}


def _private_reaches(path: Path) -> list[str]:
    """``owner._name`` not on ``self``/``cls``/``super()``, and ``from .x import _name``, in *path*."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found += [f"from {'.' * node.level}{node.module or ''} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]  # fmt: skip
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if text not in THIRD_PARTY_PRIVATE:
                found.append(text)
    return [f"{path.relative_to(PACKAGE.parent)}:{what}" for what in found]


def test_spark_does_not_reach_into_our_other_modules_private_names():
    """pulsar_nack/spark uses what the registry, its config and the consumers offer publicly
    (``registry.acquire``, ``ConsumerConfig.consumer_settings()``), never their ``_names``."""
    found = [hit for path in sorted((PACKAGE / "spark").rglob("*.py")) for hit in _private_reaches(path)]
    assert not found, "private names reached into from pulsar_nack/spark:\n" + "\n".join(found)


def _module_level_names(path: Path) -> list[str]:
    """The names *path* binds at module level (plain and annotated assignments)."""
    names = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def test_every_timing_constant_of_the_consumer_layer_and_spark_lives_in_the_timing_module():
    """One model of the client's timing: no module of consumer/ or spark/ defines a ``*_MS`` or ``*_S`` of its own."""
    stray = [
        f"{path.relative_to(PACKAGE)}:{name}"
        for package in ("consumer", "spark")
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in _module_level_names(path)
        if name.endswith(("_MS", "_S"))
    ]
    assert not stray, "timing constants outside pulsar_nack/timing.py: " + ", ".join(stray)
    import pulsar_nack.timing as timing

    assert {n for n in _module_level_names(PACKAGE / "timing.py") if n.endswith(("_MS", "_S"))} <= set(dir(timing))


def test_the_timing_model_keeps_its_derivations():
    """The values argued from the client's behaviour keep the relations their reasons state."""
    from pulsar_nack import timing

    assert timing.COALESCE_MS > timing.CLIENT_TICK_MS  # bursts further apart than the client's tick
    assert timing.ACK_FLUSH_MS > timing.ACK_GROUPING_MS  # the grouped acks are on the wire
    assert timing.HANDOFF_DELAY_MS - timing.handoff_lead_ms(timing.HANDOFF_DELAY_MS) == timing.HANDOFF_MARGIN_MS
    assert timing.DURABLE_GRACE_S * 1000 >= timing.BROKER_DELAY_TICK_MS + timing.MEMORY_HOLD_MS
    assert timing.client_handoff_latency_ms(timing.HANDOFF_DELAY_MS) <= timing.HELD_GRACE_S * 1000
    assert timing.HARVEST_TIMEOUT_S * 1000 > timing.CLIENT_SEND_TIMEOUT_MS


MAX_INSTANCE_ATTRIBUTES = 20


def _record_class(node: ast.ClassDef) -> bool:
    """A dataclass record, a TypedDict, a NamedTuple, an enum or a protocol: a declaration, not behaviour."""
    decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
    bases = {ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases}
    return "dataclass" in decorators or bool(bases & {"TypedDict", "NamedTuple", "Enum", "IntEnum", "Protocol"})


def _instance_attributes(node: ast.ClassDef) -> set[str]:
    """The names a class's own methods assign on ``self`` (``self.x = ...``, ``self.x, self.y = ...``, ``self.x += ...``)."""
    found = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(method):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                found.add(sub.attr)
    return found


def test_no_class_with_behaviour_owns_more_than_twenty_instance_attributes():
    """Classes own little state: split one that grows past 20 attributes by the state its parts own."""
    big = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not _record_class(node):
                count = len(_instance_attributes(node))
                if count > MAX_INSTANCE_ATTRIBUTES:
                    big[f"{path.relative_to(PACKAGE)}:{node.name}"] = count
    assert not big, f"classes with more than {MAX_INSTANCE_ATTRIBUTES} instance attributes: {big}"


def test_the_consumer_layer_and_spark_have_no_complexity_exemption():
    """ruff's mccabe check (C90, max-complexity 10) runs on consumer/ and spark/ with no per-file exemption."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    lint = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"] and lint["mccabe"]["max-complexity"] <= 10
    exempt = [path for path, rules in lint.get("per-file-ignores", {}).items()
              if path.startswith(("pulsar_nack/consumer", "pulsar_nack/spark")) and any(r.startswith("C90") for r in rules)]
    assert not exempt, exempt


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent if path.is_relative_to(PACKAGE) else REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path, modules: set[str], used: dict[str, set[str]]) -> None:
    """Add to *used* the names *path* takes from the modules of pulsar_nack (``from m import x``, ``m.x``)."""
    me = _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    tree, aliases = ast.parse(path.read_text()), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
                elif target in modules and target != me:
                    used[target].add(alias.name)
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner = aliases.get(ast.unparse(node.value))
            if owner is not None and owner != me:
                used[owner].add(node.attr)


def _imported_names() -> dict[str, set[str]]:
    """Per module of pulsar_nack: the names other files (the package, tests, bench, examples, tools) take from it."""
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    used: dict[str, set[str]] = {m: set() for m in modules}
    others = (path for top in ("tests", "bench", "examples", "tools") for path in (REPO / top).rglob("*.py"))
    for path in (*PACKAGE.rglob("*.py"), *others):
        _imports_of(path, modules, used)
    return used


def _all_and_definitions(path: Path) -> tuple[set[str] | None, set[str]]:
    listed, defined = None, set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__all__":
                listed = set(ast.literal_eval(node.value))
            elif isinstance(target, ast.Name):
                defined.add(target.id)
    return listed, defined


def test_each_consumer_module_lists_in_all_what_other_modules_import_from_it():
    """Tight surfaces: a module of consumer/ (its package door aside) lists in ``__all__`` exactly the
    names of its own that other modules import, so an internal name is not mistaken for an API."""
    used = _imported_names()
    wrong = {}
    for path in sorted((PACKAGE / "consumer").glob("*.py")):
        if path.name == "__init__.py":
            continue
        listed, defined = _all_and_definitions(path)
        name = _module_name(path)
        imported = {n for n in used[name] if not n.startswith("_")}
        unused = sorted((listed or set()) - used[name])
        unlisted = sorted((imported & defined) - (listed or set()))
        if unused or unlisted:
            wrong[path.name] = {"listed, imported nowhere": unused, "imported, not listed": unlisted}
    assert not wrong, wrong
