"""Paired rounds: which arm runs when. Pure.

Odd rounds run the arms in the given order, even rounds in reverse, so a slow drift
(clocks, temperature) lands on every arm alike and cancels in the per-round ratio.
Shapes are visited in the given order every round; the arms of one shape run back to
back, so the rows that a ratio pairs are close in time.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def round_order(arms: Sequence[T], round_: int) -> tuple[T, ...]:
    """The arms of round `round_` (1-based): forward if odd, reversed if even."""
    if round_ < 1:
        raise ValueError(f"rounds are 1-based, got {round_}")
    return tuple(arms) if round_ % 2 == 1 else tuple(reversed(arms))


def schedule(shapes: Sequence[str], arms: Sequence[str], rounds: int) -> list[tuple[int, str, str]]:
    """Every (round, shape, arm) visit in run order."""
    return [(r, shape, arm) for r in range(1, rounds + 1) for shape in shapes for arm in round_order(arms, r)]
