"""Compare two saved runs: per shape and arm, is B faster, slower, the same, too noisy to say,
or too close to the threshold to say, than A?

Method. Everything is computed again from the raw samples each file holds, and only from
those the audit passed; the stored medians are not read. For each (shape, arm) in both runs
the change is B's duration over A's, minus one, where a duration is the median of the round
medians. Its interval is the quotient of two independent two-level bootstraps (the runs are
separate: their samples are independent), and its p-value is a rank test between the runs'
rows. The verdict reads both against the rules (moebench.analysis.verdicts): the rule's
threshold, widened to a measured noise floor where a run carries one.

Separate runs are not paired: drift between them (clocks, temperature, neighbours) is not
cancelled. The within-run ratios against the reference are paired by round, so they are
compared too when both runs have them, with intervals from a bootstrap that keeps each
round's two arms together.

A regression is an arm time that got slower; ratios alone never make one (a faster
reference lowers every ratio without any arm getting slower). A run with audit failures
cannot pass the regression gate, whatever its verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moebench.analysis import significance as sig
from moebench.analysis.ratio_verdicts import run_floor
from moebench.analysis.roofline import understated_arms
from moebench.analysis.throttle import ThrottlePlan, plan, run_throttle
from moebench.analysis.verdicts import DEFAULT_CHANGE, Rules, Threshold, Verdict, judge, threshold_for
from moebench.errors import UserError
from moebench.record.index import ResultIndex
from moebench.record.schema import READABLE_VERSIONS, RunResult

__all__ = ["ArmComparison", "Comparison", "RatioComparison", "Rules", "Verdict", "compare_results", "gate"]


@dataclass(frozen=True)
class ArmComparison:
    """One arm at one shape: A's and B's durations with their intervals, and the verdict on B."""

    shape: str
    arm: str
    a_median_ns: float
    b_median_ns: float
    a_ci_ns: tuple[float, float]
    b_ci_ns: tuple[float, float]
    change: float  # B / A - 1; > 0: B is slower
    change_ci: tuple[float, float]
    p_value: float
    a_spread: float  # (max row - min row) / median, in A
    b_spread: float
    a_samples: int  # audited samples that entered
    b_samples: int
    threshold: float  # the SAME band's half-width used
    threshold_source: str
    verdict: Verdict
    reason: str
    identity_changed: tuple[str, ...] = ()  # build-identity keys that differ between A and B
    mark: str = ""  # e.g. "judged on throttled rounds of B" (moebench.analysis.throttle)


@dataclass(frozen=True)
class RatioComparison:
    """One paired ratio (ref / arm within a run) in A and in B; > 1: the arm is faster."""

    shape: str
    ref: str
    arm: str
    a_median: float
    b_median: float
    a_ci: tuple[float, float]
    b_ci: tuple[float, float]
    change: float  # B / A - 1; > 0: the arm gained on the reference
    change_ci: tuple[float, float]
    p_value: float
    threshold: float
    threshold_source: str
    verdict: Verdict  # for the arm, relative to the reference
    reason: str
    mark: str = ""


@dataclass(frozen=True)
class Comparison:
    a_label: str
    b_label: str
    rules: Rules
    arms: tuple[ArmComparison, ...]
    ratios: tuple[RatioComparison, ...]
    notes: tuple[str, ...] = field(default=())
    audit_failures: tuple[str, ...] = ()  # one line per run whose audit failed

    @property
    def regressions(self) -> tuple[ArmComparison, ...]:
        return tuple(c for c in self.arms if c.verdict is Verdict.SLOWER)


def gate(c: Comparison) -> str | None:
    """Why the regression gate fails, in one line, or None when it passes. Audit failures
    close it before any verdict is read: a verdict on untrusted samples proves nothing."""
    if c.audit_failures:
        return f"regression gate closed: {'; '.join(c.audit_failures)}; a run with audit failures cannot pass"
    if c.regressions:
        return "regression: " + ", ".join(f"{r.shape}/{r.arm} {r.change:+.1%}" for r in c.regressions)
    return None


def _spread(row_values: np.ndarray) -> float:
    return float((row_values.max() - row_values.min()) / np.median(row_values))


def _floor(result: RunResult, shape: str, *arms: str) -> float | None:
    for v in result.noise.get(shape, {}).values():
        if not 0 <= v < 1:
            raise UserError(f"a noise floor of {v:g} at {shape} is not a fraction (is the file damaged?)")
    return run_floor(result, shape, *arms)


def _range(low: float, high: float, fmt: str) -> str:
    return f"{low:{fmt}} … {high:{fmt}}"


def compare_results(a: RunResult, b: RunResult, rules: Rules = Rules(),
                    a_label: str = "A", b_label: str = "B") -> Comparison:
    """Compare B against A. Refuses (UserError) runs of different schema versions, runs
    that timed different fixtures under one shape name, and runs with nothing in common."""
    for label, r in ((a_label, a), (b_label, b)):
        if r.schema_version not in READABLE_VERSIONS:
            raise UserError(f"{label} has schema_version {r.schema_version}, this moebench reads "
                            f"{', '.join(map(str, READABLE_VERSIONS))}: cannot compare across result formats")
    for label, r in ((a_label, a), (b_label, b)):
        if not r.status.complete:
            raise UserError(f"{label} is incomplete ({r.rounds_done} of {r.settings.rounds} rounds, "
                            f"{r.status.reason}): finish it with `moebench run --resume` before comparing")
    ia, ib = ResultIndex(a), ResultIndex(b)
    shapes = [s for s in a.settings.shapes if s in b.settings.shapes]
    for shape in shapes:
        fa, fb = ia.fixture(shape), ib.fixture(shape)
        if fa is not None and fb is not None and fa.fingerprint != fb.fingerprint:
            raise UserError(f"{a_label} and {b_label} timed different inputs at {shape}: fixture "
                            f"fingerprints {fa.fingerprint[:12]}… and {fb.fingerprint[:12]}… differ (another seed, "
                            f"shape or fixture builder: rerun both with one moebench to compare them)")
    throttle = plan(rules.throttled, run_throttle(a, a_label), run_throttle(b, b_label))
    ua, ub = _units(a, a_label, throttle), _units(b, b_label, throttle)
    arms, ratios = [], []
    for shape in shapes:
        for arm in a.settings.arms:
            if (shape, arm) in ua and (shape, arm) in ub:
                arms.append(_compare_arm(ia, ib, ua, ub, shape, arm, rules, a_label, b_label, throttle.mark))
        ref = a.settings.ref
        if ref != b.settings.ref:
            continue
        for arm in a.settings.arms:
            if arm != ref:
                r = _compare_ratio(a, b, ua, ub, shape, ref, arm, rules, a_label, b_label, throttle.mark)
                if r is not None:
                    ratios.append(r)
    if not arms:
        raise UserError(f"{a_label} and {b_label} have no shape and arm in common with audited samples "
                        f"({', '.join(a.settings.shapes)} vs {', '.join(b.settings.shapes)})")
    failures = tuple(f"{name} failed its audit ({r.audit.samples_passed}/{r.audit.samples_total} samples "
                     f"passed, {r.audit.dropped_records} records dropped)"
                     for name, r in ((a_label, a), (b_label, b)) if not r.audit.passed)
    return Comparison(a_label, b_label, rules, tuple(arms), tuple(ratios),
                      _notes(ia, ib, ua, ub, rules, a_label, b_label, throttle), failures)


Units = dict[tuple[str, str], dict[int, np.ndarray]]


def _units(result: RunResult, label: str, throttle: ThrottlePlan) -> Units:
    dropped = throttle.dropped[label]
    samples = [s for s in sig.audited_samples(result) if s.round not in dropped]
    units = sig.rounds_of(samples)
    for (shape, arm), by_round in units.items():
        if any((v <= 0).any() for v in by_round.values()):
            raise UserError(f"{arm} at {shape} in {label}: a sample of 0 ns or less is not a time "
                            "(is the file damaged?)")
    return units


def _marked(why: str, mark: str) -> str:
    return f"{why}; {mark}" if mark else why


def _compare_arm(ia: ResultIndex, ib: ResultIndex, ua: Units, ub: Units, shape: str, arm: str,
                 rules: Rules, a_label: str, b_label: str, mark: str = "") -> ArmComparison:
    ra, rb = list(ua[(shape, arm)].values()), list(ub[(shape, arm)].values())
    ma, mb = sig.rows_median(ra), sig.rows_median(rb)
    boot_a = sig.bootstrap_median(ra, sig.generator(shape, arm, "A"))
    boot_b = sig.bootstrap_median(rb, sig.generator(shape, arm, "B"))
    change = mb / ma - 1
    change_ci = sig.interval(boot_b / boot_a - 1, rules.confidence)
    xa, xb = (sig.rows(ra), sig.rows(rb)) if rules.test == "rows" else (np.concatenate(ra), np.concatenate(rb))
    p = sig.rank_test_p(xa, xb)
    spread_a, spread_b = _spread(sig.rows(ra)), _spread(sig.rows(rb))
    threshold = threshold_for(rules, {a_label: _floor(ia.result, shape, arm), b_label: _floor(ib.result, shape, arm)},
                              f"{arm} at {shape}")
    verdict, why = judge(change_ci, p, threshold, rules, max(spread_a, spread_b))
    reason = (f"{ma / 1e3:,.2f} → {mb / 1e3:,.2f} µs ({change:+.1%}, {rules.ci_name} "
              f"{_range(*change_ci, '+.1%')}, p={p:.2g}): {_marked(why, mark)}")
    return ArmComparison(shape, arm, ma, mb, sig.interval(boot_a, rules.confidence),
                         sig.interval(boot_b, rules.confidence), change, change_ci, p, spread_a, spread_b,
                         sum(len(v) for v in ra), sum(len(v) for v in rb), threshold.value, threshold.source,
                         verdict, reason, _identity_changes(ia, ib, shape, arm), mark)


def _paired(units: Units, shape: str, ref: str, arm: str) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    if (shape, ref) not in units or (shape, arm) not in units:
        return None
    ref_rounds, arm_rounds = units[(shape, ref)], units[(shape, arm)]
    shared = [r for r in ref_rounds if r in arm_rounds]
    if not shared:
        return None
    return [ref_rounds[r] for r in shared], [arm_rounds[r] for r in shared]


def _compare_ratio(a: RunResult, b: RunResult, ua: Units, ub: Units, shape: str, ref: str, arm: str,
                   rules: Rules, a_label: str, b_label: str, mark: str = "") -> RatioComparison | None:
    pa, pb = _paired(ua, shape, ref, arm), _paired(ub, shape, ref, arm)
    if pa is None or pb is None:
        return None
    ma, mb = sig.paired_ratio(*pa), sig.paired_ratio(*pb)
    boot_a = sig.bootstrap_paired_ratio(*pa, sig.generator(shape, ref, arm, "A"))
    boot_b = sig.bootstrap_paired_ratio(*pb, sig.generator(shape, ref, arm, "B"))
    gain = mb / ma - 1
    gain_ci = sig.interval(boot_b / boot_a - 1, rules.confidence)
    per_round_a, per_round_b = sig.rows(pa[0]) / sig.rows(pa[1]), sig.rows(pb[0]) / sig.rows(pb[1])
    p = sig.rank_test_p(per_round_a, per_round_b)
    threshold = threshold_for(rules, {a_label: _floor(a, shape, ref, arm), b_label: _floor(b, shape, ref, arm)},
                              f"{arm} / {ref} at {shape}")
    spread = max(_spread(per_round_a), _spread(per_round_b))
    # A falling ratio is the arm slowing against the reference.
    verdict, why = judge(gain_ci, p, threshold, rules, spread, rising_is_slower=False)
    reason = (f"{ma:.3f}× → {mb:.3f}× ({gain:+.1%}, {rules.ci_name} {_range(*gain_ci, '+.1%')}, "
              f"p={p:.2g}): {_marked(why, mark)}")
    return RatioComparison(shape, ref, arm, ma, mb, sig.interval(boot_a, rules.confidence),
                           sig.interval(boot_b, rules.confidence), gain, gain_ci, p, threshold.value,
                           threshold.source, verdict, reason, mark)


def _identity_changes(ia: ResultIndex, ib: ResultIndex, shape: str, arm: str) -> tuple[str, ...]:
    xa, xb = ia.arm_info(shape, arm), ib.arm_info(shape, arm)
    if xa is None or xb is None:
        return ()
    keys = sorted(set(xa.identity) | set(xb.identity))
    return tuple(k for k in keys if xa.identity.get(k) != xb.identity.get(k))


SETTINGS_TO_MATCH = ("timer", "sampler", "placements", "flush", "flush_bytes", "rounds", "samples", "warmup",
                     "balancedness", "ref")


def _notes(ia: ResultIndex, ib: ResultIndex, ua: Units, ub: Units, rules: Rules,
           a_label: str, b_label: str, throttle: ThrottlePlan) -> tuple[str, ...]:
    notes = [f"{a_label} and {b_label} are separate runs: their rounds are not paired, so drift "
             "between the runs is not cancelled in the times; the ratios are paired within each run."]
    for name in SETTINGS_TO_MATCH:
        va, vb = getattr(ia.settings, name), getattr(ib.settings, name)
        if va != vb:
            notes.append(f"settings differ: {name} {va} vs {vb}")
    ga, gb = ia.result.provenance.gpu, ib.result.provenance.gpu
    for name in ("name", "driver", "cuda_runtime"):
        va, vb = (getattr(ga, name) if ga else None), (getattr(gb, name) if gb else None)
        if va != vb:
            notes.append(f"GPU differs: {name} {va} vs {vb}")
    ca, cb = ia.result.provenance.git_commit, ib.result.provenance.git_commit
    if ca != cb:
        notes.append(f"commits: {(ca or 'unknown')[:12]} vs {(cb or 'unknown')[:12]}")
    only_a = [f"{s}/{a}" for s in ia.settings.shapes for a in ia.settings.arms if (s, a) in ua and (s, a) not in ub]
    only_b = [f"{s}/{a}" for s in ib.settings.shapes for a in ib.settings.arms if (s, a) in ub and (s, a) not in ua]
    if only_a:
        notes.append(f"only in {a_label}: {', '.join(only_a)}")
    if only_b:
        notes.append(f"only in {b_label}: {', '.join(only_b)}")
    if rules.floor == "measured" and not ia.result.noise and not ib.result.noise:
        change = DEFAULT_CHANGE if rules.change is None else rules.change
        notes.append(f"neither run carries a measured noise floor: the SAME band is the rule's ±{change:.1%}")
    notes += throttle.notes
    for name, result in ((a_label, ia.result), (b_label, ib.result)):
        if result.schema_version < 2:
            notes.append(f"{name} is a schema {result.schema_version} file: its read bandwidth is a torch.sum read, "
                         "which kernels can beat, not the read floor of later files")
        beaten = understated_arms(result)
        if beaten:
            named = ", ".join(f"{arm} at {shape} ({100 * f.read_share:.0f}% of its read bandwidth)"
                              if f.read_share is not None else f"{arm} at {shape}" for shape, arm, f in beaten)
            notes.append(f"{name}: floor understated: {named} beat the floor no kernel can beat")
        if not result.audit.passed:
            rejected = result.audit.samples_total - result.audit.samples_passed
            notes.append(f"{name}: audit failed ({result.audit.samples_passed}/{result.audit.samples_total} "
                         f"samples passed); the {rejected} it rejected are left out of every statistic here")
        failed = [f"{p.shape}/{p.arm}" for p in result.parity if not p.passed]
        if failed:
            notes.append(f"{name}: parity failed for {', '.join(failed)}")
    return tuple(notes)
