"""The statistics behind `compare`: intervals, the rank test, the verdict rules and their
parser, on synthetic distributions whose truth is known."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from moebench.analysis import significance as sig
from moebench.errors import UserError
from moebench.analysis.compare import compare_results
from moebench.analysis.verdicts import Rules, Threshold, Verdict, judge, parse_rules, threshold_for
from synthetic_runs import lognormal, run_of

ARM = "cuda-fused"


def verdict_counts(draw_a, draw_b, seeds: int, rules: Rules = Rules(), **kwargs) -> Counter:
    """The verdicts on B against A over `seeds` pairs of independent runs."""
    counts = Counter()
    for s in range(seeds):
        a = run_of({ARM: draw_a}, seed=2 * s, **kwargs)
        b = run_of({ARM: draw_b}, seed=2 * s + 1, **kwargs)
        counts[compare_results(a, b, rules).arms[0].verdict] += 1
    return counts


# --- verdicts on known distributions ----------------------------------------------------
# Typical H200 noise: about 1% per sample within a round, 0.2-0.3% from round to round.

def test_a_known_3_percent_slowdown_is_slower():
    counts = verdict_counts(lognormal(drift=0.002), lognormal(drift=0.002, shift=0.03), seeds=20)
    assert counts[Verdict.SLOWER] >= 19, counts
    assert counts[Verdict.FASTER] == counts[Verdict.SAME] == 0


def test_a_known_3_percent_speedup_is_faster():
    counts = verdict_counts(lognormal(drift=0.002), lognormal(drift=0.002, shift=-0.03), seeds=20)
    assert counts[Verdict.FASTER] >= 18, counts
    assert counts[Verdict.SLOWER] == counts[Verdict.SAME] == 0


def test_no_shift_is_same():
    counts = verdict_counts(lognormal(), lognormal(), seeds=20)
    assert counts[Verdict.SAME] >= 19, counts
    assert counts[Verdict.SLOWER] == counts[Verdict.FASTER] == 0


def test_heavy_tails_make_no_false_verdicts_beyond_the_stated_rate():
    # Lognormal jitter with 5% of samples 1.5-3x as long, and no true change: a false faster or
    # slower needs the interval to miss and the test to reject, so it is rarer than p = 5%.
    heavy = lognormal(sigma=0.02, outliers=0.05)
    counts = verdict_counts(heavy, heavy, seeds=100)
    false = counts[Verdict.SLOWER] + counts[Verdict.FASTER]
    assert false <= 5, counts
    assert counts[Verdict.SAME] >= 60, counts


def test_heavy_tails_still_show_a_3_percent_slowdown():
    counts = verdict_counts(lognormal(outliers=0.05, drift=0.002), lognormal(outliers=0.05, drift=0.002, shift=0.03),
                            seeds=20)
    assert counts[Verdict.SLOWER] >= 18, counts


def test_a_wide_spread_is_noisy():
    # Rounds that drift 5% apart: no interval fits the ±2% band, none lies beyond it.
    counts = verdict_counts(lognormal(drift=0.05), lognormal(drift=0.05, shift=0.01), seeds=10)
    assert counts[Verdict.NOISY] >= 9, counts
    a = run_of({ARM: lognormal(drift=0.05)}, seed=1)
    b = run_of({ARM: lognormal(drift=0.05, shift=0.01)}, seed=2)
    reason = compare_results(a, b).arms[0].reason
    assert "cannot tell" in reason and "rounds spread" in reason


def test_an_interval_straddling_the_threshold_is_ambiguous():
    counts = verdict_counts(lognormal(drift=0.002), lognormal(drift=0.002, shift=0.02), seeds=10)
    assert counts[Verdict.AMBIGUOUS] >= 9, counts
    a, b = run_of({ARM: lognormal(drift=0.002)}, seed=1), run_of({ARM: lognormal(drift=0.002, shift=0.02)}, seed=2)
    assert "straddles +2.0%" in compare_results(a, b).arms[0].reason


def test_a_wider_rule_turns_slower_into_same():
    a, b = run_of({ARM: lognormal(drift=0.002)}, seed=1), run_of({ARM: lognormal(drift=0.002, shift=0.03)}, seed=2)
    assert compare_results(a, b).arms[0].verdict is Verdict.SLOWER
    wide = compare_results(a, b, parse_rules(["median:5%"])).arms[0]
    assert wide.verdict is Verdict.SAME and "±5.0% (rule)" in wide.reason


def test_verdicts_are_reproducible_and_independent_of_the_other_arms():
    from dataclasses import replace
    draws = {"triton": lognormal(), ARM: lognormal(shift=0.01)}
    a, b = run_of(draws, seed=3), run_of(draws, seed=4)
    assert compare_results(a, b) == compare_results(a, b)
    without_triton = [replace(r, samples=tuple(s for s in r.samples if s.arm == ARM)) for r in (a, b)]
    both = next(x for x in compare_results(a, b).arms if x.arm == ARM)
    alone = compare_results(*without_triton).arms
    assert len(alone) == 1 and alone[0] == both


# --- intervals and the rank test ---------------------------------------------------------

def test_bootstrap_interval_holds_the_estimate_and_widens_with_drift():
    rng = np.random.default_rng(0)
    calm = [50_000 * rng.lognormal(0, 0.01, 30) for _ in range(5)]
    drifting = [v * f for v, f in zip(calm, (0.95, 1.0, 1.05, 0.97, 1.03))]
    for rounds in (calm, drifting):
        low, high = sig.interval(sig.bootstrap_median(rounds, sig.generator("t")), 0.95)
        assert low <= sig.rows_median(rounds) <= high
    width = [np.subtract(*sig.interval(sig.bootstrap_median(r, sig.generator("t")), 0.95)[::-1])
             for r in (calm, drifting)]
    assert width[1] > 5 * width[0]


def test_paired_ratio_bootstrap_cancels_a_drift_both_arms_share():
    rng = np.random.default_rng(1)
    drift = (0.95, 1.0, 1.05, 0.97, 1.03)
    ref = [50_000 * f * rng.lognormal(0, 0.005, 30) for f in drift]
    arm = [40_000 * f * rng.lognormal(0, 0.005, 30) for f in drift]
    low, high = sig.interval(sig.bootstrap_paired_ratio(ref, arm, sig.generator("r")), 0.95)
    assert low < sig.paired_ratio(ref, arm) < high
    assert 1.24 < low and high < 1.26  # 50/40, to within the jitter, though the rounds moved 10%


def test_rank_test_exact_and_approximate():
    assert sig.rank_test_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert sig.rank_test_p([1, 2, 3], [1, 2, 3]) == 1.0
    assert sig.rank_test_p([], [1.0]) == 1.0
    rng = np.random.default_rng(2)
    x, y = rng.normal(0, 1, 60), rng.normal(0.8, 1, 60)
    assert sig.rank_test_p(x, y) < 1e-3  # the normal approximation (C(120, 60) splits)
    assert sig.rank_test_p(x, y) == pytest.approx(sig.rank_test_p(y, x))


@pytest.mark.parametrize("n", [5, 40])
def test_rank_test_holds_its_level_under_no_difference(n):
    rng = np.random.default_rng(n)
    trials = 400
    rejected = sum(sig.rank_test_p(rng.lognormal(0, 1, n), rng.lognormal(0, 1, n)) < 0.05 for _ in range(trials))
    assert rejected / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_audited_samples_leave_out_findings_and_rounds_with_dropped_records():
    from dataclasses import replace

    from moebench.record.schema import Audit, AuditFinding
    r = run_of({ARM: lognormal()}, seed=0, rounds=3, samples=4)
    findings = (AuditFinding("A8", ARM, 1, 2, "2 kernels, expected 1"),
                AuditFinding("*", "*", 3, -1, "5 CUPTI records dropped in round 3"))
    kept = sig.audited_samples(replace(r, audit=Audit(12, 7, 5, findings)))
    assert {(s.round, s.index) for s in kept} == {(1, 0), (1, 1), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)}


# --- the rules ---------------------------------------------------------------------------

def test_parse_rules():
    assert parse_rules([]) == Rules()
    r = parse_rules(["median:1.5%", "ci:99,p:0.01", "floor:ignore", "test:samples"])
    assert (r.change, r.confidence, r.alpha, r.floor, r.test) == (0.015, 0.99, 0.01, "ignore", "samples")
    assert parse_rules(["median:0.03"]).change == 0.03
    assert parse_rules(["ci:99.9%"]).confidence == pytest.approx(0.999)
    assert r.describe() == "median:1.5% ci:99 p:0.01 floor:ignore test:samples throttled:auto"
    assert parse_rules([r.describe().replace(" ", ",")]) == r


@pytest.mark.parametrize("text, message", [
    ("median", "write KEY:VALUE"),
    ("median:", "write KEY:VALUE"),
    ("mean:2%", "unknown key 'mean'"),
    ("median:abc", "'abc' is not a percentage"),
    ("median:5", "ambiguous"),
    ("median:-1%", "more than 0% and less than 100%"),
    ("median:150%", "more than 0% and less than 100%"),
    ("ci:100", "below 100"),
    ("ci:20", "at least 50"),
    ("ci:high", "not a confidence"),
    ("p:0", "between 0 and 1"),
    ("p:x", "not a level"),
    ("floor:sometimes", "not one of measured, ignore, require"),
    ("test:means", "not one of rows, samples"),
])
def test_bad_rules_are_one_line_errors(text, message):
    with pytest.raises(UserError, match=message) as err:
        parse_rules([text])
    assert "\n" not in str(err.value) and repr(text.split(",")[0]) in str(err.value)


def test_judge_reads_the_interval_against_the_band():
    rules, t = Rules(change=0.02), Threshold(0.02, "rule")
    cases = [((0.025, 0.035), 0.01, Verdict.SLOWER), ((-0.035, -0.025), 0.01, Verdict.FASTER),
             ((0.025, 0.035), 0.2, Verdict.AMBIGUOUS), ((-0.01, 0.015), 0.5, Verdict.SAME),
             ((0.01, 0.03), 0.01, Verdict.AMBIGUOUS), ((-0.03, 0.03), 0.5, Verdict.NOISY)]
    for ci, p, expected in cases:
        verdict, why = judge(ci, p, t, rules)
        assert verdict is expected, (ci, p, why)
        assert "±2.0% (rule)" in why
    # A ratio ref / arm rises when the arm gets faster.
    assert judge((0.025, 0.035), 0.01, t, rules, rising_is_slower=False)[0] is Verdict.FASTER


def test_threshold_is_the_larger_of_rule_and_measured_floor():
    rules = Rules(change=0.02)
    assert threshold_for(rules, {"a": None, "b": None}, "x") == Threshold(0.02, "rule")
    t = threshold_for(rules, {"a": 0.013, "b": 0.031}, "x")
    assert t.value == 0.031 and "measured noise floor of b" in t.source
    t = threshold_for(rules, {"a": 0.013, "b": None}, "x")
    assert t.value == 0.02 and "measured floor 1.3% is below it" in t.source
    assert threshold_for(parse_rules(["floor:ignore", "median:2%"]), {"a": 0.05, "b": 0.05}, "x").value == 0.02
    with pytest.raises(UserError, match="b carries no measured noise floor for x"):
        threshold_for(parse_rules(["floor:require"]), {"a": 0.05, "b": None}, "x")


def test_by_default_the_runs_floors_decide_and_two_percent_stands_in_without_them():
    rules = Rules()
    assert rules.describe().startswith("median:floor ")
    t = threshold_for(rules, {"a": 0.003, "b": 0.004}, "x")
    assert t.value == pytest.approx(0.005) and t.source == "the runs' measured noise floors combined"
    assert threshold_for(rules, {"a": None, "b": None}, "x") == Threshold(0.02, "rule")
    t = threshold_for(rules, {"a": 0.003, "b": None}, "x")  # one run without a floor: as a 2% rule
    assert t.value == 0.02 and "measured floor 0.3% is below it" in t.source
    assert threshold_for(rules, {"a": 0.05, "b": None}, "x").value == 0.05
    assert threshold_for(parse_rules(["floor:ignore"]), {"a": 0.003, "b": 0.004}, "x").value == 0.02
    # a 2% change with a tight interval is slower against the runs' floors, same against the old 2%
    assert judge((0.017, 0.023), 0.01, t := threshold_for(rules, {"a": 0.003, "b": 0.004}, "x"), rules)[0] \
        is Verdict.SLOWER
