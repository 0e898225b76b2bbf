"""The admission ledger compiled by mypyc (``setup.py``) is the code its source says.

pytest's doctest collection finds no examples in a compiled module (its functions and
methods are not Python functions), so here the examples of the ledger's modules are read
from their source files and run against the modules as imported: compiled where the build
compiled them (CI checks that it did), pure Python otherwise.
"""

from __future__ import annotations

import ast
import doctest
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import pulsar_nack.consumer
from pulsar_nack.consumer import admission, entry_handoff, message_sets
from tools.build_release import COMPILED_LEDGER, EXTENSIONS

LEDGER = (admission, entry_handoff, message_sets)
REPO = Path(__file__).resolve().parents[1]


def _source_module(module: ModuleType) -> ModuleType:
    """*module* loaded from its ``.py`` source under another name, for its docstrings only."""
    short = module.__name__.rsplit(".", 1)[1]
    # (the package's folder: a compiled module's __file__ may name another place for it)
    path = Path(pulsar_nack.consumer.__file__).with_name(f"{short}.py")
    spec = importlib.util.spec_from_file_location(f"pulsar_nack.consumer._source_of_{short}", path)
    assert spec is not None and spec.loader is not None, path
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    return source


def test_setup_py_compiles_the_modules_the_tests_and_the_release_expect() -> None:
    """setup.py's ``LEDGER`` is the list the doctest rule (conftest.py) and the wheel check use."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (listed,) = [node.value for node in tree.body if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "LEDGER"]
    paths = ast.literal_eval(listed)
    assert [Path(path).stem for path in paths] == list(COMPILED_LEDGER) == [m.__name__.rsplit(".", 1)[1] for m in LEDGER]
    assert {path.removesuffix(".py") for path in paths} <= set(EXTENSIONS)


def test_the_ledger_modules_are_compiled_all_or_none() -> None:
    """One shared library holds the three: a build compiles all of them or none."""
    assert {not module.__file__.endswith(".py") for module in LEDGER if module.__file__} == {admission.COMPILED}


@pytest.mark.parametrize("module", LEDGER, ids=lambda module: module.__name__.rsplit(".", 1)[1])
def test_the_source_examples_hold_for_the_module_as_imported(module: ModuleType) -> None:
    tests = [test for test in doctest.DocTestFinder().find(_source_module(module)) if test.examples]
    assert tests, f"{module.__name__}: no examples found in its source"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        test.globs = dict(vars(module))  # the names as imported: the compiled classes where compiled
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{module.__name__}: {results.failed} of {results.attempted} examples failed"
