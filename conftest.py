"""Collection rules for every test path (tests/ and the doctests in pulsar_nack/)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

_BROKER_STARTERS = ("PulsarStandalone(", "PulsarCluster(")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Doc examples that start a broker are broker tests: marked ``broker``."""
    for item in items:
        test = getattr(item, "dtest", None)
        if isinstance(test, doctest.DocTest) and any(starts_broker(example) for example in test.examples):
            item.add_marker(pytest.mark.broker)


def starts_broker(example: doctest.Example) -> bool:
    """Whether a doc example starts a broker (one that expects an exception never gets that far)."""
    return example.exc_msg is None and any(starter in example.source for starter in _BROKER_STARTERS)


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """The source of a module that runs compiled (the ledger, by mypyc) is not collected for doctests.

    pytest would import the compiled module for its ``.py`` file and refuse the mismatch, and
    finds no examples in it anyway: ``tests/test_compiled_ledger.py`` runs them.
    """
    if collection_path.suffix != ".py" or collection_path.parent.name != "consumer":
        return None
    from pulsar_nack.consumer import admission
    from tools.build_release import COMPILED_LEDGER

    if admission.COMPILED and collection_path.stem in COMPILED_LEDGER:
        return True
    return None
