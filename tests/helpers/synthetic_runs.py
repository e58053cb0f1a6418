"""RunResults whose samples are drawn from chosen distributions, for the statistics' tests.

A template from result_factory gives the provenance, fixtures and arms; the samples are
replaced by events samples whose values come from `draw(rng, rounds, samples)`, an array of
rounds x samples in ns. Summaries are left as the template's: compare reads samples only.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from moebench.record.schema import Audit, RunResult, Sample
from result_factory import make_result

BASE_NS = 50_000.0


def lognormal(sigma: float = 0.01, drift: float = 0.003, outliers: float = 0.0, shift: float = 0.0):
    """A draw: per-round drift (normal, relative), per-sample lognormal jitter, and a fraction
    `outliers` of samples taken 1.5x to 3x as long (a preempted or throttled call)."""
    def draw(rng: np.random.Generator, rounds: int, samples: int) -> np.ndarray:
        round_factor = 1.0 + rng.normal(0.0, drift, size=(rounds, 1))
        values = BASE_NS * (1 + shift) * round_factor * rng.lognormal(0.0, sigma, size=(rounds, samples))
        hit = rng.random((rounds, samples)) < outliers
        return np.where(hit, values * rng.uniform(1.5, 3.0, size=(rounds, samples)), values)
    return draw


def run_of(draws: dict[str, object], seed: int, rounds: int = 5, samples: int = 30,
           shape: str = "A8", noise: dict | None = None) -> RunResult:
    """One shape; an arm per key of `draws` (the first is the reference), samples from its draw."""
    arms = tuple(draws)
    template = make_result(shapes=(shape,), arms=arms, rounds=rounds, samples=samples, timer="events")
    rng = np.random.default_rng(seed)
    out = []
    for arm, draw in draws.items():
        values = draw(rng, rounds, samples)
        out += [Sample(shape, arm, r + 1, i, 0, events_ns=max(1, round(float(values[r, i]))))
                for r in range(rounds) for i in range(samples)]
    return replace(template, samples=tuple(out), noise=noise or {},
                   audit=Audit(samples_total=len(out), samples_passed=len(out), dropped_records=0))
