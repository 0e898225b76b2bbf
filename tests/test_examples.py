"""The examples run as a user would run them (embedded broker by default)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.broker
@pytest.mark.parametrize("script", ["wrap_consumer.py", "asyncio_consumer.py"])
def test_consumer_example_retries_and_finishes(script):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--messages", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.count("failed") == 3
    assert result.stdout.count("succeeded on retry") == 3
    assert "'pending_messages': 0" in result.stdout
