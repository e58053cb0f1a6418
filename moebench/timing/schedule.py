"""Paired rounds: which arm runs when, and which prepared copy each sample uses. Pure.

Order. Without a seed, odd rounds run the arms in the given order and even rounds in reverse,
so a slow drift (clocks, temperature) lands on every arm alike and cancels in the per-round
ratio. With a seed (the default protocol records one), each odd round draws its own order
from the seed and the round after it runs that order reversed: drift still cancels pair by
pair, and no arm keeps one position (first after the shape's set-up, or always in the middle
of three) in every round. Shapes are visited in the given order every round; the arms of one
shape run back to back, so the rows that a ratio pairs are close in time.

Placement. An arm prepared P times has P copies of its buffers (and of the fixture's), each
at addresses of its own. `rounds` mode times copy (r - 1) mod P in round r; `samples` mode
turns through the copies sample by sample, starting one further on every round, so every row
holds every copy and no round is one placement's.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")

PLACEMENT_MODES = ("rounds", "samples")


def round_order(arms: Sequence[T], round_: int, seed: int | None = None) -> tuple[T, ...]:
    """The arms of round `round_` (1-based): forward if odd, reversed if even; with `seed`, odd
    round 2k-1 a permutation drawn from (seed, k) and round 2k its reverse."""
    if round_ < 1:
        raise ValueError(f"rounds are 1-based, got {round_}")
    order = list(arms)
    if seed is not None:
        random.Random(f"moebench-order:{seed}:{(round_ + 1) // 2}").shuffle(order)
    return tuple(order) if round_ % 2 == 1 else tuple(reversed(order))


def schedule(shapes: Sequence[str], arms: Sequence[str], rounds: int,
             seed: int | None = None) -> list[tuple[int, str, str]]:
    """Every (round, shape, arm) visit in run order."""
    return [(r, shape, arm) for r in range(1, rounds + 1) for shape in shapes
            for arm in round_order(arms, r, seed)]


def copy_index(round_: int, sample: int, placements: int, mode: str = "rounds") -> int:
    """Which prepared copy (0-based) sample `sample` (0-based; warm-ups count from -warmup) of
    round `round_` (1-based) uses."""
    if placements < 1:
        raise ValueError(f"placements must be at least 1, got {placements}")
    if mode == "rounds":
        return (round_ - 1) % placements
    if mode == "samples":
        return (round_ - 1 + sample) % placements
    raise ValueError(f"unknown placement mode {mode!r} (known: {', '.join(PLACEMENT_MODES)})")
