"""Statistics for verdicts: bootstrap intervals and a rank test over raw audited samples. Pure.

A run's samples of one arm at one shape have two levels: rounds, and samples within a round.
Everything a round shares (clocks, temperature, a neighbour's load) moves all its samples
together, so samples are not independent draws of the arm's time; rounds are closer to it.
The statistics here respect that:

* a duration is the median of the round medians (rows), as the run itself defines it;
* its interval comes from a two-level bootstrap: draw rounds with replacement, then samples
  with replacement within each drawn round, and take the median of the new rows;
* a paired ratio (ref-row / arm-row within one run) draws rounds jointly for both arms, so
  each draw keeps a round's ref and arm together, as the schedule paired them;
* two separate runs are independent: each is bootstrapped on its own and the change is the
  quotient of the two draws;
* the significance test is Mann-Whitney's rank test, two-sided, on rows by default (exact
  over all splits when there are few, the normal approximation with a tie correction
  otherwise); it assumes no distribution, so long tails and outliers do not fool it.

Every bootstrap draws from a generator seeded by `SEED` and the name of what it resamples, so
a verdict is the same on every machine and does not depend on which other arms were compared.
Only samples the audit passed enter (`audited_samples`).
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from itertools import combinations
from typing import Sequence

import numpy as np

from moebench.record.schema import RunResult, Sample

SEED = 22_2026
RESAMPLES = 2000
EXACT_SPLITS = 20_000  # the rank test enumerates every split up to this many


def audited_samples(result: RunResult) -> tuple[Sample, ...]:
    """The samples the audit passed: not named by a finding, and not in a round whose CUPTI
    records were dropped (such a finding names the round with shape and arm '*')."""
    rejected = {(f.shape, f.arm, f.round, f.index) for f in result.audit.findings if f.arm != "*"}
    lost_rounds = {f.round for f in result.audit.findings if f.arm == "*"}
    return tuple(s for s in result.samples
                 if s.round not in lost_rounds and (s.shape, s.arm, s.round, s.index) not in rejected)


def rounds_of(samples: Sequence[Sample]) -> dict[tuple[str, str], dict[int, np.ndarray]]:
    """(shape, arm) -> {round: its samples' timed values, ns}, rounds in increasing order."""
    per: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        per[(s.shape, s.arm)][s.round].append(float(s.value_ns))
    return {unit: {r: np.asarray(v) for r, v in sorted(by_round.items())} for unit, by_round in per.items()}


def rows(rounds: Sequence[np.ndarray]) -> np.ndarray:
    """Each round's median."""
    return np.array([np.median(v) for v in rounds])


def rows_median(rounds: Sequence[np.ndarray]) -> float:
    """A duration: the median of the rows."""
    return float(np.median(rows(rounds)))


def paired_ratio(ref_rounds: Sequence[np.ndarray], arm_rounds: Sequence[np.ndarray]) -> float:
    """The median over rounds of ref-row / arm-row (> 1: the arm is faster)."""
    return float(np.median(rows(ref_rounds) / rows(arm_rounds)))


def generator(*key: str) -> np.random.Generator:
    """A generator fixed by `SEED` and `key` (what it resamples)."""
    return np.random.default_rng([SEED, zlib.crc32("/".join(key).encode())])


def _resampled_rows(rounds: Sequence[np.ndarray], pick: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each slot of `pick` (resamples x rounds, each entry a round's index), the median of
    that round's samples drawn again with replacement."""
    out = np.empty(pick.shape)
    for r, values in enumerate(rounds):
        slots = pick == r
        k = int(slots.sum())
        if k:
            draws = values[rng.integers(0, len(values), size=(k, len(values)))]
            out[slots] = np.median(draws, axis=1)
    return out


def bootstrap_median(rounds: Sequence[np.ndarray], rng: np.random.Generator,
                     resamples: int = RESAMPLES) -> np.ndarray:
    """`resamples` draws of the median of rows, resampling rounds and then samples in them."""
    if not rounds or any(len(v) == 0 for v in rounds):
        raise ValueError("a bootstrap needs at least one round, and samples in every round")
    pick = rng.integers(0, len(rounds), size=(resamples, len(rounds)))
    return np.median(_resampled_rows(rounds, pick, rng), axis=1)


def bootstrap_paired_ratio(ref_rounds: Sequence[np.ndarray], arm_rounds: Sequence[np.ndarray],
                           rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """Draws of the paired ratio: rounds drawn once for both arms (the pairing), samples drawn
    within each round for each arm apart."""
    if len(ref_rounds) != len(arm_rounds) or not ref_rounds:
        raise ValueError("a paired ratio needs the same rounds of both arms")
    pick = rng.integers(0, len(ref_rounds), size=(resamples, len(ref_rounds)))
    ref = _resampled_rows(ref_rounds, pick, rng)
    arm = _resampled_rows(arm_rounds, pick, rng)
    return np.median(ref / arm, axis=1)


def interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` percentile interval of bootstrap draws."""
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_test_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Mann-Whitney's U for `x` against `y`: the chance, were both drawn
    from one distribution, of ranks at least this far apart. Exact (every split of the pooled
    ranks) when there are at most `EXACT_SPLITS` splits, else the normal approximation with
    ties corrected and a continuity correction."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    ranks = _average_ranks(np.concatenate([x, y]))
    centre = n * (n + m + 1) / 2  # the expected rank sum of x
    distance = abs(ranks[:n].sum() - centre)
    if math.comb(n + m, n) <= EXACT_SPLITS:
        splits = np.array(list(combinations(range(n + m), n)))
        sums = ranks[splits].sum(axis=1)
        return float(np.mean(np.abs(sums - centre) >= distance - 1e-9))
    total = n + m
    _, counts = np.unique(ranks, return_counts=True)
    variance = n * m / 12 * ((total + 1) - float((counts ** 3 - counts).sum()) / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    z = max(distance - 0.5, 0.0) / math.sqrt(variance)
    return min(1.0, math.erfc(z / math.sqrt(2)))


def noise_floor(ref_rounds: Sequence[np.ndarray], arm_rounds: Sequence[np.ndarray], rng: np.random.Generator,
                confidence: float = 0.95, resamples: int = RESAMPLES) -> float:
    """The A/A noise floor of two copies of one arm paired by round: the largest distance from 1
    that the paired ratio's bootstrap interval admits, max(|low - 1|, |high - 1|). It holds a
    systematic offset between the copies and the scatter of their ratio alike."""
    low, high = interval(bootstrap_paired_ratio(ref_rounds, arm_rounds, rng, resamples), confidence)
    return float(max(abs(low - 1.0), abs(high - 1.0)))
