"""Collection rules for every test path (tests/ and the doctests in pulsar_nack/)."""

from __future__ import annotations

import doctest

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
