"""Contenders measured in turns, and their ratio round by round.

This machine's speed drifts by a third within an hour, so two figures taken minutes apart
compare the hours as much as the contenders. Measured in alternating rounds, round i of each
ran in the same stretch of time, and the median of the rounds' ratios is the fair one.
"""

import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def alternate(rounds: int, contenders: Sequence[Callable[[], T]]) -> list[list[T]]:
    """`rounds` rounds of every contender, the order reversed every other round (A B, B A,
    A B, ...); each contender's results in round order."""
    out: list[list[T]] = [[] for _ in contenders]
    for r in range(rounds):
        order = range(len(contenders))
        for i in (order if r % 2 == 0 else reversed(order)):
            out[i].append(contenders[i]())
    return out


def paired_median(a: Sequence[float], b: Sequence[float]) -> float:
    """The median over rounds of a[i] / b[i]."""
    if not a or len(a) != len(b):
        raise ValueError(f"rounds do not pair: {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b, strict=True))
