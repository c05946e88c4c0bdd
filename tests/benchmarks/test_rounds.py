"""Contenders measured in turns (benchmarks/rounds.py)."""

import pytest

from benchmarks import rounds


def test_alternate_reverses_the_order_every_other_round():
    calls = []

    def contender(name: str):
        def one_round() -> str:
            calls.append(name)
            return f"{name}{sum(1 for c in calls if c == name)}"
        return one_round

    out = rounds.alternate(3, [contender("a"), contender("b")])
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out == [["a1", "a2", "a3"], ["b1", "b2", "b3"]]  # each contender's rounds in order


def test_paired_median_pairs_round_with_round():
    # Round by round 2x, 1.5x and 4x; the medians of each side alone would give 1.0x.
    assert rounds.paired_median([4.0, 6.0, 16.0], [2.0, 4.0, 4.0]) == 2.0
    with pytest.raises(ValueError, match="pair"):
        rounds.paired_median([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="pair"):
        rounds.paired_median([], [])
