"""A run's own ratios read against its noise floor: same inside it, slower or faster beyond it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from moebench.run.noise import measured_floors
from moebench.analysis.ratio_verdicts import ratio_verdicts, run_floor
from moebench.record.schema import Audit, Sample
from moebench.analysis.verdicts import Verdict
from result_factory import make_result

BASE_NS = 24_000.0


def paired_run(arms: dict[str, float], seed: int, rounds: int = 5, samples: int = 30, jitter: float = 0.004,
               drift: float = 0.003, with_floor: bool = True):
    """One shape, arms timed in the same rounds: a drift each round shares (clocks), jitter per
    sample, and each arm's own slowdown (`arms`: label -> relative change; the first is the ref).
    With `with_floor`, the ref's A/A copy `REF#2` is timed too and the floor recorded as a run does."""
    ref = next(iter(arms))
    if with_floor:
        arms = {**arms, f"{ref}#2": arms[ref]}
    template = make_result(shapes=("Q8",), arms=tuple(arms), rounds=rounds, samples=samples, timer="events")
    rng = np.random.default_rng(seed)
    round_factor = 1 + rng.normal(0, drift, size=rounds)
    out = []
    for arm, slow in arms.items():
        values = BASE_NS * (1 + slow) * round_factor[:, None] * rng.lognormal(0, jitter, size=(rounds, samples))
        out += [Sample("Q8", arm, r + 1, i, 0, events_ns=int(values[r, i])) for r in range(rounds) for i in range(samples)]
    result = replace(template, samples=tuple(out),
                     audit=Audit(samples_total=len(out), samples_passed=len(out), dropped_records=0))
    if with_floor:
        result = replace(result, noise=measured_floors(result.samples, ("Q8",), ref))
    return result


@pytest.mark.parametrize("seed", range(40))
def test_identical_code_reads_same_and_the_aa_pair_reads_its_floor(seed):
    result = paired_run({"ref": 0.0, "copy-b": 0.0, "copy-c": 0.0}, seed)
    verdicts = ratio_verdicts(result)
    assert {k[1] for k in verdicts} == {"copy-b", "copy-c", "ref#2"}
    floor = run_floor(result, "Q8", "ref", "copy-b")
    assert floor == result.noise["Q8"]["ref"] and 0 < floor < 0.02
    for v in verdicts.values():
        assert v.verdict in (Verdict.SAME, Verdict.AMBIGUOUS), v  # never a win or a loss
        assert v.band == floor and v.band_source == "A/A floor"
    assert verdicts[("Q8", "ref#2")].verdict is Verdict.SAME  # its interval is the floor itself


@pytest.mark.parametrize("seed", range(6))
def test_a_two_percent_slowdown_is_slower_and_a_speedup_faster(seed):
    verdicts = ratio_verdicts(paired_run({"ref": 0.0, "slow": 0.02, "fast": -0.02}, seed))
    slow, fast = verdicts[("Q8", "slow")], verdicts[("Q8", "fast")]
    assert slow.verdict is Verdict.SLOWER and slow.ratio < 0.99 and slow.ci[1] < 1 - slow.band
    assert fast.verdict is Verdict.FASTER and fast.ratio > 1.01 and fast.ci[0] > 1 + fast.band


def test_a_change_inside_a_wide_floor_is_same_not_a_win():
    result = paired_run({"ref": 0.0, "fast": -0.01}, seed=3)
    wide = replace(result, noise={"Q8": {"ref": 0.03, "ref#2": 0.03}})
    assert ratio_verdicts(result)[("Q8", "fast")].verdict is Verdict.FASTER
    v = ratio_verdicts(wide)[("Q8", "fast")]
    assert v.verdict is Verdict.SAME and v.band == 0.03 and "±3.0%" in v.why


def test_without_a_floor_the_rule_is_the_band_and_says_so():
    v = ratio_verdicts(paired_run({"ref": 0.0, "slow": 0.05}, seed=1, with_floor=False))[("Q8", "slow")]
    assert v.band_source == "rule (no floor measured)" and v.band == 0.02 and v.verdict is Verdict.SLOWER


def test_an_arm_s_own_floor_wins_over_the_shape_s():
    result = replace(make_result(shapes=("Q8",), arms=("ref", "x")),
                     noise={"Q8": {"ref": 0.004, "ref#2": 0.004, "x": 0.01}})
    assert run_floor(result, "Q8", "ref", "x") == 0.01
    assert run_floor(result, "Q8", "ref", "y") == 0.004
    assert run_floor(result, "A8", "ref", "x") is None
