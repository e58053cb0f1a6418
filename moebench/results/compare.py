"""Compare two saved runs: per shape and arm, is B faster, slower, the same, or too noisy
to say, than A?

Method. For each (shape, arm) in both runs, the change is B's arm median over A's, minus
one. A change beyond `Thresholds.change` is a verdict (faster or slower), unless the
rounds of either run spread more than `Thresholds.max_spread` (range of the row medians
over their median) and the change is no larger than that spread: then it is noisy. Two
separate runs are not paired: drift between them (clocks, temperature, neighbours) is
not cancelled, so the within-run ratios against the reference, which are paired, are
compared too when both runs have them, as supporting evidence.

A regression is an arm time that got slower; ratios alone never make one (a faster
reference lowers every ratio without any arm getting slower).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from moebench.errors import UserError
from moebench.results.index import ResultIndex
from moebench.results.schema import ArmSummary, RatioSummary, RunResult


class Verdict(str, enum.Enum):
    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    NOISY = "noisy"


@dataclass(frozen=True)
class Thresholds:
    change: float = 0.02  # |B/A - 1| beyond this is a change
    max_spread: float | None = None  # rounds may spread this much (None: same as `change`)

    def __post_init__(self):
        if not 0 < self.change < 1:
            raise UserError(f"threshold must be between 0% and 100%, got {self.change:.1%}")
        if self.max_spread is not None and not 0 < self.max_spread < 1:
            raise UserError(f"max spread must be between 0% and 100%, got {self.max_spread:.1%}")

    @property
    def spread_limit(self) -> float:
        return self.change if self.max_spread is None else self.max_spread


@dataclass(frozen=True)
class ArmComparison:
    """One arm at one shape: medians of A and B, and the verdict on B."""

    shape: str
    arm: str
    a_median_ns: float
    b_median_ns: float
    change: float  # B / A - 1; > 0: B is slower
    a_spread: float  # (max row - min row) / median, in A
    b_spread: float
    verdict: Verdict
    reason: str
    identity_changed: tuple[str, ...] = ()  # build-identity keys that differ between A and B


@dataclass(frozen=True)
class RatioComparison:
    """One paired ratio (ref / arm within a run) in A and in B; > 1: the arm is faster."""

    shape: str
    ref: str
    arm: str
    a_median: float
    b_median: float
    change: float  # B / A - 1; > 0: the arm gained on the reference
    a_spread: float  # (high - low) / median, in A
    b_spread: float
    verdict: Verdict  # for the arm, relative to the reference
    reason: str


@dataclass(frozen=True)
class Comparison:
    a_label: str
    b_label: str
    thresholds: Thresholds
    arms: tuple[ArmComparison, ...]
    ratios: tuple[RatioComparison, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def regressions(self) -> tuple[ArmComparison, ...]:
        return tuple(c for c in self.arms if c.verdict is Verdict.SLOWER)


def row_spread(s: ArmSummary) -> float:
    return (max(s.row_medians_ns) - min(s.row_medians_ns)) / s.median_ns if s.row_medians_ns else 0.0


def ratio_spread(r: RatioSummary) -> float:
    return (r.high - r.low) / r.median


def judge(slowdown: float, spread: float, t: Thresholds) -> tuple[Verdict, str]:
    """Verdict on a relative slowdown (> 0: slower) given the larger of the two runs'
    spreads, and why, in words that follow the change itself."""
    if spread > t.spread_limit and abs(slowdown) <= spread:
        return Verdict.NOISY, f"rounds spread {spread:.1%} (> {t.spread_limit:.1%}), the change is within it"
    if abs(slowdown) <= t.change:
        return Verdict.SAME, f"within ±{t.change:.1%}, rounds spread {spread:.1%}"
    why = f"beyond ±{t.change:.1%}"
    if spread > t.spread_limit:
        why += f" and the rounds' {spread:.1%} spread"
    return (Verdict.SLOWER if slowdown > 0 else Verdict.FASTER), why


def compare_results(a: RunResult, b: RunResult, thresholds: Thresholds = Thresholds(),
                    a_label: str = "A", b_label: str = "B") -> Comparison:
    """Compare B against A. Refuses (UserError) runs of different schema versions, runs
    that timed different fixtures under one shape name, and runs with nothing in common."""
    if a.schema_version != b.schema_version:
        raise UserError(f"{a_label} has schema_version {a.schema_version} and {b_label} "
                        f"{b.schema_version}: cannot compare across result formats")
    for label, r in ((a_label, a), (b_label, b)):
        if not r.status.complete:
            raise UserError(f"{label} is incomplete ({r.rounds_done} of {r.settings.rounds} rounds, "
                            f"{r.status.reason}): finish it with `moebench run --resume` before comparing")
    ia, ib = ResultIndex(a), ResultIndex(b)
    shapes = [s for s in ia.shapes if s in ib.shapes]
    for shape in shapes:
        fa, fb = ia.fixture(shape), ib.fixture(shape)
        if fa is not None and fb is not None and fa.fingerprint != fb.fingerprint:
            raise UserError(f"{a_label} and {b_label} timed different inputs at {shape}: fixture "
                            f"fingerprints {fa.fingerprint[:12]}… and {fb.fingerprint[:12]}… differ")

    arms, ratios = [], []
    for shape in shapes:
        for arm in ia.arms_at(shape):
            sa, sb = ia.summary(shape, arm), ib.summary(shape, arm)
            if sb is None:
                continue
            if not (sa.median_ns > 0 and sb.median_ns > 0):
                raise UserError(f"{arm} at {shape}: a median of {sa.median_ns:g} ns in {a_label} or "
                                f"{sb.median_ns:g} ns in {b_label} is not a time (is the file damaged?)")
            slowdown = sb.median_ns / sa.median_ns - 1
            spread_a, spread_b = row_spread(sa), row_spread(sb)
            verdict, why = judge(slowdown, max(spread_a, spread_b), thresholds)
            reason = f"{sa.median_ns / 1e3:,.2f} → {sb.median_ns / 1e3:,.2f} µs ({slowdown:+.1%}): {why}"
            arms.append(ArmComparison(shape, arm, sa.median_ns, sb.median_ns, slowdown, spread_a, spread_b,
                                      verdict, reason, _identity_changes(ia, ib, shape, arm)))
        for arm in ia.compared_arms(shape):
            ra, rb = ia.ratio(shape, arm), ib.ratio(shape, arm)
            if rb is None or ra.ref != rb.ref:
                continue
            if not (ra.median > 0 and rb.median > 0):
                raise UserError(f"{arm} / {ra.ref} at {shape}: a ratio of {ra.median:g} or {rb.median:g} is not "
                                f"a ratio (is the file damaged?)")
            gain = rb.median / ra.median - 1
            spread_a, spread_b = ratio_spread(ra), ratio_spread(rb)
            # A falling ratio is the arm slowing against the reference.
            verdict, why = judge(ra.median / rb.median - 1, max(spread_a, spread_b), thresholds)
            reason = f"{ra.median:.3f}× → {rb.median:.3f}× ({gain:+.1%}): {why}"
            ratios.append(RatioComparison(shape, ra.ref, arm, ra.median, rb.median, gain, spread_a,
                                          spread_b, verdict, reason))
    if not arms:
        raise UserError(f"{a_label} and {b_label} have no shape and arm in common "
                        f"({', '.join(ia.shapes)} vs {', '.join(ib.shapes)})")
    return Comparison(a_label, b_label, thresholds, tuple(arms), tuple(ratios),
                      _notes(ia, ib, a_label, b_label))


def _identity_changes(ia: ResultIndex, ib: ResultIndex, shape: str, arm: str) -> tuple[str, ...]:
    xa, xb = ia.arm_info(shape, arm), ib.arm_info(shape, arm)
    if xa is None or xb is None:
        return ()
    keys = sorted(set(xa.identity) | set(xb.identity))
    return tuple(k for k in keys if xa.identity.get(k) != xb.identity.get(k))


SETTINGS_TO_MATCH = ("timer", "flush", "flush_bytes", "rounds", "samples", "warmup", "balancedness", "ref")


def _notes(ia: ResultIndex, ib: ResultIndex, a_label: str, b_label: str) -> tuple[str, ...]:
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
    only_a = [f"{s}/{a}" for s in ia.shapes for a in ia.arms_at(s) if ib.summary(s, a) is None]
    only_b = [f"{s}/{a}" for s in ib.shapes for a in ib.arms_at(s) if ia.summary(s, a) is None]
    if only_a:
        notes.append(f"only in {a_label}: {', '.join(only_a)}")
    if only_b:
        notes.append(f"only in {b_label}: {', '.join(only_b)}")
    for name, result in ((a_label, ia.result), (b_label, ib.result)):
        if not result.audit.passed:
            notes.append(f"{name}: audit failed ({result.audit.samples_passed}/{result.audit.samples_total} samples passed)")
        failed = [f"{p.shape}/{p.arm}" for p in result.parity if not p.passed]
        if failed:
            notes.append(f"{name}: parity failed for {', '.join(failed)}")
    return tuple(notes)
