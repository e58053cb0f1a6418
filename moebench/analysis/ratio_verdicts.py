"""Each ratio's verdict inside its own run: faster, slower or same, read against the run's floor.

A run's ratio (ref-row / arm-row, median over rounds) is judged the way `compare` judges a
change (moebench.analysis.verdicts.judge): its bootstrap interval (rounds drawn jointly for both
arms, samples within them: moebench.analysis.significance) against a band of ±t around 1, and the rank
test between the two arms' rows. The band is the run's noise floor at that shape: the A/A pair
the run timed (the reference arm and a second prepared copy of it, by default) shows how far
identical code reads from 1 here, so a ratio inside it is "same", never a win. A run that
measured no floor is read against the rules' threshold instead, and says so.

Computed from the stored samples every time a view asks, never stored: a file cannot carry a
verdict its samples do not make.
"""

from __future__ import annotations

from dataclasses import dataclass

from moebench.analysis.verdicts import DEFAULT_CHANGE, Rules, Threshold, Verdict, judge
from moebench.record.schema import RunResult

CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioVerdict:
    shape: str
    ref: str
    arm: str
    ratio: float  # median over rounds of ref-row / arm-row (> 1: the arm is faster)
    ci: tuple[float, float]  # its bootstrap interval
    band: float  # the half-width of the SAME band, a fraction
    band_source: str  # "A/A floor" or "rule (no floor measured)"
    verdict: Verdict
    why: str


def run_floor(result: RunResult, shape: str, *arms: str) -> float | None:
    """The noise floor that holds for `arms` at `shape`: their own A/A floors where the run (or a
    --noise-from file) measured them, else the largest floor measured at the shape (the run's A/A
    pair times identical code in the same rounds, placements and order as every other arm)."""
    floors = result.noise.get(shape, {})
    own = [floors[a] for a in arms if a in floors]
    if own:
        return max(own)
    return max(floors.values()) if floors else None


def ratio_verdicts(result: RunResult, rules: Rules = Rules()) -> dict[tuple[str, str], RatioVerdict]:
    """{(shape, arm): verdict} for every arm with rounds in common with the run's reference."""
    from moebench.analysis import significance as sig  # numpy: imported when a verdict is asked for, not by --help
    units = sig.rounds_of(sig.audited_samples(result))
    ref = result.settings.ref
    out: dict[tuple[str, str], RatioVerdict] = {}
    for shape in result.settings.shapes:
        mine = units.get((shape, ref))
        if not mine:
            continue
        for arm in result.settings.arms:
            theirs = units.get((shape, arm))
            if arm == ref or not theirs:
                continue
            shared = [r for r in mine if r in theirs]
            if not shared:
                continue
            out[(shape, arm)] = _verdict(result, shape, ref, arm, [mine[r] for r in shared],
                                         [theirs[r] for r in shared], rules)
    return out


def _verdict(result: RunResult, shape: str, ref: str, arm: str, ref_rounds, arm_rounds, rules: Rules) -> RatioVerdict:
    from moebench.analysis import significance as sig
    ratio = sig.paired_ratio(ref_rounds, arm_rounds)
    # The A/A pair's own ratio draws as its floor was drawn (moebench.run.noise), so it reads its floor.
    key = (shape, ref, "noise") if arm == f"{ref}#2" else (shape, ref, arm, "ratio")
    draws = sig.bootstrap_paired_ratio(ref_rounds, arm_rounds, sig.generator(*key))
    low, high = sig.interval(draws, CONFIDENCE)
    p = sig.rank_test_p(sig.rows(ref_rounds), sig.rows(arm_rounds))
    floor = run_floor(result, shape, ref, arm)
    threshold = (Threshold(floor, "A/A floor") if floor is not None and floor > 0
                 else Threshold(DEFAULT_CHANGE if rules.change is None else rules.change, "rule (no floor measured)"))
    verdict, why = read_ratio(ratio, (low, high), p, threshold, rules)
    return RatioVerdict(shape, ref, arm, ratio, (low, high), threshold.value, threshold.source, verdict, why)


def read_ratio(ratio: float, ci: tuple[float, float], p: float, threshold: Threshold,
               rules: Rules) -> tuple[Verdict, str]:
    """A ratio's verdict inside its run. FASTER or SLOWER as `compare` decides them (the whole
    interval beyond the band, the rank test significant); otherwise SAME when the ratio itself
    lies inside the band (the floor is one pair's interval, an estimate: an identical arm's
    interval may be as wide, and must not read as anything but same), else AMBIGUOUS."""
    verdict, why = judge((ci[0] - 1.0, ci[1] - 1.0), p, threshold, rules, rising_is_slower=False)
    if verdict in (Verdict.FASTER, Verdict.SLOWER, Verdict.SAME):
        return verdict, why
    if abs(ratio - 1.0) <= threshold.value:
        return Verdict.SAME, f"{ratio - 1.0:+.2%} within {threshold.describe()}"
    return Verdict.AMBIGUOUS, why
