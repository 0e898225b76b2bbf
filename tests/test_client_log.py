"""The C++ client's log destination chosen by pulsar_nack.consumer.client_log (no broker needed)."""

from __future__ import annotations

import pulsar
import pytest

from pulsar_nack.consumer.client_log import LEVELS, stderr_logger


@pytest.mark.parametrize("level", LEVELS)
def test_every_level_gives_a_file_logger(level):
    assert isinstance(stderr_logger(level), pulsar.FileLogger)
    assert isinstance(stderr_logger(level.upper()), pulsar.FileLogger)


def test_bad_levels_are_refused_by_name():
    with pytest.raises(TypeError, match="level must be a str, got int"):
        stderr_logger(3)
    with pytest.raises(ValueError, match="level must be one of debug, info, warn, error, got 'loud'"):
        stderr_logger("loud")
