from __future__ import annotations

import pytest

from pulsar_nack.core.backoff import FixedDelay, MultiplierRedeliveryBackoff, RedeliveryBackoff


def test_multiplier_matches_java_semantics():
    b = MultiplierRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=60_000, multiplier=2)
    assert [b.next_delay_ms(n) for n in (-1, 0, 1, 2, 3, 5, 6, 7, 10_000)] == [
        1000, 1000, 2000, 4000, 8000, 32000, 60000, 60000, 60000,
    ]
    assert isinstance(b, RedeliveryBackoff)


def test_java_defaults_and_fractional_multiplier():
    b = MultiplierRedeliveryBackoff()
    assert (b.min_delay_ms, b.max_delay_ms, b.multiplier) == (10_000, 600_000, 2.0)
    assert MultiplierRedeliveryBackoff(100, 1000, 1.5).next_delay_ms(2) == 225


def test_fixed_delay():
    assert FixedDelay(250).next_delay_ms(9) == 250
    assert isinstance(FixedDelay(1), RedeliveryBackoff)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, 10, 2), ValueError),
        ((10, 5, 2), ValueError),
        ((10, 20, 0.5), ValueError),
        ((10, 20, float("inf")), ValueError),
        ((10.0, 20, 2), TypeError),
        ((10, 20, "2"), TypeError),
    ],
)
def test_bad_multiplier_arguments(args, error):
    with pytest.raises(error):
        MultiplierRedeliveryBackoff(*args)


def test_bad_fixed_and_count():
    with pytest.raises(ValueError):
        FixedDelay(-1)
    with pytest.raises(TypeError):
        FixedDelay("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        MultiplierRedeliveryBackoff().next_delay_ms(1.0)  # type: ignore[arg-type]
