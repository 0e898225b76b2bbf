"""``bench.consumer._turns``: the systems of a case timed side by side, in turns (stand-in loops, no broker)."""

from __future__ import annotations

from bench.consumer import BLOCK, Blocks, _turns


def test_every_system_handles_each_message_once_in_turns_whose_order_reverses() -> None:
    calls: list[tuple[str, int, int]] = []

    def recorder(name: str) -> Blocks:
        return lambda start, stop: calls.append((name, start, stop))

    loops = {name: recorder(name) for name in ("a", "b", "c")}
    count = 2 * BLOCK + 7
    costs = _turns(loops, count)

    assert set(costs) == {"a", "b", "c"}
    for name in loops:
        ranges = [(start, stop) for who, start, stop in calls if who == name]
        assert ranges == [(0, BLOCK), (BLOCK, 2 * BLOCK), (2 * BLOCK, count)]
    assert [who for who, _, _ in calls] == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in costs.values())
