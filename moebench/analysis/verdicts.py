"""Verdicts and the rules that make them, as data: `--rule median:2%` parses into `Rules`.

A change (B / A - 1, > 0: slower) comes with a bootstrap confidence interval and a rank-test
p-value (moebench.analysis.significance). The verdict reads the interval against the band ±t around
no change, where t is the rule's threshold or, where a run carries a measured noise floor
for the arm at the shape, the larger of the two:

  SLOWER / FASTER  the whole interval lies beyond +t / -t, and the test is significant
  SAME             the whole interval lies within ±t
  NOISY            the interval is wider than the band itself: these runs cannot tell
  AMBIGUOUS        the interval straddles +t or -t, or it lies beyond the band while the
                   test is not significant: a change near the threshold, or too few rows

A false FASTER or SLOWER needs both the interval to miss the truth and the test to reject,
so at no true change its rate is at most the smaller of the test's level `p` and (1 - ci) / 2.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Iterable

from moebench.analysis.throttle import POLICIES
from moebench.errors import UserError


class Verdict(str, enum.Enum):
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    NOISY = "noisy"
    AMBIGUOUS = "ambiguous"


DEFAULT_CHANGE = 0.02  # the band where no floor was measured
FLOOR_POLICIES = ("measured", "ignore", "require")
THROTTLE_POLICIES = POLICIES  # moebench.analysis.throttle says what each does
TEST_UNITS = ("rows", "samples")

RULES_HELP = (
    "Verdict rules, KEY:VALUE, repeat or comma-separate. "
    "median:2% (a change beyond this is faster or slower; also 0.02; default: the runs' measured noise "
    "floors combined, 2% for a run without one); "
    "ci:95 (confidence of the bootstrap intervals, percent); "
    "p:0.05 (level of the rank test a change must pass); "
    "floor:measured|ignore|require (a measured noise floor in a run widens the band "
    "to it; ignore it; or refuse runs without one); "
    "test:rows|samples (what the rank test ranks: round medians, or every audited sample); "
    "throttled:auto|drop|keep (rounds whose clocks moved or were capped: auto leaves them out when both "
    "runs keep unthrottled rounds, else judges every round and marks the verdicts; drop always leaves "
    "them out; keep judges them).")


@dataclass(frozen=True)
class Rules:
    # median: |B/A - 1| beyond this is a change. None (the default): the runs' measured noise
    # floors decide (threshold_for), DEFAULT_CHANGE where a run carries none.
    change: float | None = None
    confidence: float = 0.95  # ci: of every bootstrap interval
    alpha: float = 0.05  # p: a change must also pass the rank test at this level
    floor: str = "measured"  # floor: what a measured noise floor does
    test: str = "rows"  # test: the rank test's units
    throttled: str = "auto"  # throttled: rounds a run flagged as throttled (moebench.analysis.throttle)

    def __post_init__(self):
        if self.change is not None and not 0 < self.change < 1:
            raise UserError(f"rule median: the threshold must be between 0% and 100%, got {self.change:.1%}")
        if not 0.5 <= self.confidence < 1:
            raise UserError(f"rule ci: the confidence must be at least 50 and below 100, got {100 * self.confidence:g}")
        if not 0 < self.alpha < 1:
            raise UserError(f"rule p: the level must be between 0 and 1, got {self.alpha:g}")
        if self.floor not in FLOOR_POLICIES:
            raise UserError(f"rule floor: {self.floor!r} is not one of {', '.join(FLOOR_POLICIES)}")
        if self.test not in TEST_UNITS:
            raise UserError(f"rule test: {self.test!r} is not one of {', '.join(TEST_UNITS)}")
        if self.throttled not in THROTTLE_POLICIES:
            raise UserError(f"rule throttled: {self.throttled!r} is not one of {', '.join(THROTTLE_POLICIES)}")

    def describe(self) -> str:
        median = "floor" if self.change is None else f"{100 * self.change:g}%"
        return (f"median:{median} ci:{100 * self.confidence:g} p:{self.alpha:g} "
                f"floor:{self.floor} test:{self.test} throttled:{self.throttled}")

    @property
    def ci_name(self) -> str:
        return f"{100 * self.confidence:g}% CI"


def parse_fraction(text: str) -> float:
    """`2%` or `0.02` -> 0.02. A bare number of 1 or more is refused as ambiguous."""
    text = text.strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UserError(f"{text!r} is not a percentage like 2% or a fraction like 0.02") from None
    if not text.endswith("%") and number >= 1:
        raise UserError(f"{text!r} is ambiguous: write {text}% or {number / 100:g}")
    if not 0 < number < 1:  # NaN fails this too
        raise UserError(f"{text!r} must be more than 0% and less than 100%")
    return number


def _confidence(text: str) -> float:
    try:
        number = float(text.strip().rstrip("%"))
    except ValueError:
        raise UserError(f"{text!r} is not a confidence in percent like 95") from None
    return number / 100


def _level(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{text!r} is not a level like 0.05") from None


PARSERS = {
    "median": ("change", parse_fraction),
    "ci": ("confidence", _confidence),
    "p": ("alpha", _level),
    "floor": ("floor", str.strip),
    "test": ("test", str.strip),
    "throttled": ("throttled", str.strip),
}


def parse_rules(texts: Iterable[str], base: Rules = Rules()) -> Rules:
    """`base` with each `KEY:VALUE` rule applied in turn (each text may hold several, comma
    separated). Any bad rule is one UserError that quotes it."""
    rules, seen = base, set()
    for text in texts:
        for item in (t for t in text.split(",") if t.strip()):
            key, sep, value = item.strip().partition(":")
            if key in seen:  # two values for one rule: which one was meant cannot be guessed
                raise UserError(f"rule {key!r} given twice; give each rule once")
            seen.add(key)
            if not sep or not value.strip():
                raise UserError(f"rule {item.strip()!r}: write KEY:VALUE, e.g. median:2% "
                                f"(keys: {', '.join(PARSERS)})")
            if key not in PARSERS:
                raise UserError(f"rule {item.strip()!r}: unknown key {key!r} (keys: {', '.join(PARSERS)})")
            name, parse = PARSERS[key]
            try:
                rules = replace(rules, **{name: parse(value)})
            except UserError as err:
                raise UserError(f"rule {item.strip()!r}: {str(err).removeprefix(f'rule {key}: ')}") from None
    return rules


@dataclass(frozen=True)
class Threshold:
    """The half-width of the SAME band, and where it came from."""

    value: float
    source: str  # "rule", or whose measured noise floor

    def describe(self) -> str:
        return f"±{self.value:.1%} ({self.source})"


def threshold_for(rules: Rules, floors: dict[str, float | None], what: str) -> Threshold:
    """The band for one comparison (`floors`: run label -> its measured noise floor, None where
    the run has none). With a rule's threshold (`median:X`): X, or the largest measured floor
    when larger. By default (no `median:` rule): the runs' floors combined, sqrt(sum of squares)
    (each run's floor bounds its own error; the change carries both), where every run has one;
    otherwise as a rule of DEFAULT_CHANGE. Under `floor:require` a run without a floor is refused; `what`
    names the arm and shape."""
    change = DEFAULT_CHANGE if rules.change is None else rules.change
    if rules.floor == "ignore":
        return Threshold(change, "rule")
    missing = [label for label, f in floors.items() if f is None]
    if rules.floor == "require" and missing:
        raise UserError(f"rule floor:require: {missing[0]} carries no measured noise floor for {what} "
                        "(an A/A run of the arm records one)")
    measured = {label: f for label, f in floors.items() if f is not None}
    if rules.change is None and measured and not missing:
        combined = math.sqrt(sum(f * f for f in measured.values()))
        return Threshold(combined, "the runs' measured noise floors combined")
    if not measured:
        return Threshold(change, "rule")
    label, floor = max(measured.items(), key=lambda kv: kv[1])
    if floor <= change:
        return Threshold(change, f"rule; measured floor {floor:.1%} is below it")
    return Threshold(floor, f"measured noise floor of {label}; the rule's is {change:.1%}")


def judge(ci: tuple[float, float], p: float, threshold: Threshold, rules: Rules,
          spread: float | None = None, rising_is_slower: bool = True) -> tuple[Verdict, str]:
    """Verdict on a relative change with its interval and p-value, and why. A rising time is
    slower; a rising ratio ref / arm is faster (`rising_is_slower=False`). `spread`, the larger
    of the runs' round-to-round spreads, is named when the verdict is noisy (it is where a
    wide interval comes from)."""
    low, high = ci
    t = threshold.value
    band = threshold.describe()
    if low > t or high < -t:
        if p < rules.alpha:
            rising = {True: Verdict.SLOWER, False: Verdict.FASTER}
            verdict = rising[rising_is_slower] if low > t else rising[not rising_is_slower]
            return verdict, f"beyond {band}; p={p:.2g} < {rules.alpha:g}"
        return Verdict.AMBIGUOUS, f"beyond {band}, but p={p:.2g} ≥ {rules.alpha:g}: not significant"
    if -t <= low and high <= t:
        return Verdict.SAME, f"within {band}"
    if high - low > 2 * t:
        why = f"the {rules.ci_name} is wider than the band {band}"
        if spread is not None:
            why += f"; rounds spread {spread:.1%}"
        return Verdict.NOISY, why + ": these runs cannot tell"
    edge = f"+{t:.1%}" if high > t else f"-{t:.1%}"
    return Verdict.AMBIGUOUS, f"the {rules.ci_name} straddles {edge}, an edge of the band {band}"


def is_win(verdict: Verdict) -> bool:
    """What a view may print in bold: a verdict that the arm (or build B) is faster, nothing else."""
    return verdict is Verdict.FASTER
