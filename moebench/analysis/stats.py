"""Statistics over samples: pure functions, named, so a report can redo them from a file.

Statistics are taken over the samples the audit passed (`summary_samples`; files written
before that rule over every sample, as they say). A row is the median of one round's samples
of one arm at one shape. An arm's duration is
the median of its rows. A ratio is the median over rounds of ref-row / arm-row (> 1: the
arm is faster), with its range and the number of rounds the arm won.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Mapping, Sequence

from moebench.record.schema import AUDITED_SAMPLES, ArmSummary, RatioSummary, Sample
from moebench.timing.audit import audited, kernel_labels
from moebench.timing.schedule import copy_index


def summary_samples(result) -> list[Sample]:
    """The samples `result`'s statistics are taken over: those its audit passed (or, for a
    file written before that rule, every sample)."""
    if result.statistics_over == AUDITED_SAMPLES:
        return audited(result.samples, result.audit)
    return list(result.samples)


def rows_by_round(values: Iterable[tuple[int, float]]) -> dict[int, float]:
    """(round, value) pairs -> {round: median of that round's values}."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for r, v in values:
        per_round[r].append(v)
    return {r: float(median(vs)) for r, vs in sorted(per_round.items())}


def arm_median(rows: Mapping[int, float]) -> float:
    """An arm's duration: the median of its rows."""
    if not rows:
        raise ValueError("no rows")
    return float(median(rows.values()))


def bandwidth_bytes_per_s(nbytes: int, duration_ns: float) -> float:
    return nbytes / (duration_ns * 1e-9) if duration_ns > 0 else 0.0


def fraction_of(bandwidth: float | None, reference: float | None) -> float | None:
    return bandwidth / reference if reference and bandwidth is not None else None


def arm_summary(shape: str, arm: str, samples: Sequence[Sample], hbm_bytes: int | None,
                read_bandwidth_bytes_per_s: float | None = None,
                rows: Mapping[int, float] | None = None) -> ArmSummary:
    """Summary of one arm at one shape from its samples (value_ns: gpu_busy or events);
    `rows`, when the caller already has them, are that arm's rows_by_round."""
    if not samples:
        raise ValueError(f"no samples for {arm} at {shape}")
    if rows is None:
        rows = rows_by_round((s.round, s.value_ns) for s in samples)
    med = arm_median(rows)
    spans = [s.gpu_span_ns for s in samples if s.kernels]
    sums = rows_by_round((s.round, s.gpu_sum_ns) for s in samples if s.kernels)
    bw = bandwidth_bytes_per_s(hbm_bytes, med) if hbm_bytes else None  # no fixture: no floor bytes
    return ArmSummary(
        shape=shape, arm=arm, median_ns=med, row_medians_ns=tuple(rows.values()),
        min_ns=min(rows.values()), max_ns=max(rows.values()), samples=len(samples),
        span_median_ns=float(median(spans)) if spans else None,
        hbm_bandwidth_bytes_per_s=bw, fraction_of_read_bandwidth=fraction_of(bw, read_bandwidth_bytes_per_s),
        sum_median_ns=arm_median(sums) if sums else None,
    )


def ratio_summary(shape: str, ref: str, arm: str, ref_rows: Mapping[int, float],
                  arm_rows: Mapping[int, float]) -> RatioSummary:
    """ref-row / arm-row for each round both ran, median over rounds."""
    rounds = sorted(set(ref_rows) & set(arm_rows))
    if not rounds:
        raise ValueError(f"{arm} and {ref} at {shape} share no round")
    per_round = tuple(ref_rows[r] / arm_rows[r] for r in rounds)
    return RatioSummary(shape=shape, ref=ref, arm=arm, median=float(median(per_round)),
                        low=min(per_round), high=max(per_round), per_round=per_round,
                        rounds_won=sum(1 for x in per_round if x > 1.0), rounds=len(rounds))


def summarize(samples: Sequence[Sample], shapes: Sequence[str], arms: Sequence[str], ref: str,
              hbm_bytes: Mapping[str, int], read_bandwidth_bytes_per_s: float | None = None
              ) -> tuple[tuple[ArmSummary, ...], tuple[RatioSummary, ...]]:
    """Every arm's summary (shapes, then arms, in the given order) and every arm's ratio
    against `ref` (the ref itself left out)."""
    by_unit: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        by_unit[(s.shape, s.arm)].append(s)
    summaries, ratios = [], []
    for shape in shapes:
        rows = {}
        for arm in arms:
            unit = by_unit.get((shape, arm))
            if not unit:
                continue
            rows[arm] = rows_by_round((s.round, s.value_ns) for s in unit)
            summaries.append(arm_summary(shape, arm, unit, hbm_bytes.get(shape), read_bandwidth_bytes_per_s,
                                         rows=rows[arm]))
        if ref in rows:
            ratios.extend(ratio_summary(shape, ref, arm, rows[ref], rows[arm]) for arm in arms
                          if arm != ref and arm in rows)
    return tuple(summaries), tuple(ratios)


def with_ref(result, ref: str):
    """`result` (a RunResult) with every ratio taken against `ref`, another of its arms.
    Sound for any pair of a run's arms: every arm ran in the same interleaved rounds, so
    the rows pair by round. Summaries are unchanged; the ratios are recomputed from the
    stored samples exactly as the run computed its own."""
    from dataclasses import replace

    from moebench.errors import UserError
    if ref not in result.settings.arms:
        raise UserError(f"--ref {ref!r} is not an arm of this run (arms: {', '.join(result.settings.arms)})")
    if ref == result.settings.ref:
        return result
    _, ratios = summarize(summary_samples(result), result.settings.shapes, result.settings.arms, ref,
                          {f.name: f.floors.hbm_bytes for f in result.fixtures},
                          result.provenance.gpu.read_bandwidth_bytes_per_s)
    return replace(result, settings=replace(result.settings, ref=ref), ratios=ratios)


# ----------------------------------------------------------------------------------------------
# Placements: each prepared copy of a call, over the rounds that timed it.
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlacementSummary:
    """One arm at one shape under `--placements P`: per placement (the samples that timed that
    copy, moebench.timing.schedule.copy_index), the median of its rows, and of its ratio rows
    against the run's ref."""

    shape: str
    arm: str
    medians_ns: tuple[float, ...]  # placement 1, 2, ...
    ratios: tuple[float, ...] | None  # ref-row / arm-row, per placement; None for the ref itself

    @property
    def spread(self) -> float:
        """Slowest placement over fastest, less one: what moving the buffers cost this arm."""
        return max(self.medians_ns) / min(self.medians_ns) - 1.0


def placement_summaries(result) -> tuple[PlacementSummary, ...]:
    """Every (shape, arm)'s PlacementSummary, in the summaries' order; none for a shape of one
    placement. A placement's rows are the medians of its samples round by round (copy_index
    says which samples it timed); a placement with no audited sample is left out of its arm's."""
    settings = result.settings
    by_unit: dict[tuple[str, str], list[tuple[tuple[int, int], float]]] = defaultdict(list)
    for s in summary_samples(result):
        copy = copy_index(s.round, s.index, settings.placements_at(s.shape), settings.placement_mode)
        by_unit[(s.shape, s.arm)].append(((s.round, copy), s.value_ns))
    rows = {key: rows_by_round(values) for key, values in by_unit.items()}

    def by_placement(r: Mapping[tuple[int, int], float], n: int) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in range(n)]
        for (_, copy), v in r.items():
            out[copy].append(v)
        return [p for p in out if p]
    ref = settings.ref
    out = []
    for a in result.summaries:
        n, mine = settings.placements_at(a.shape), rows.get((a.shape, a.arm))
        if n < 2 or not mine:
            continue
        medians = tuple(float(median(p)) for p in by_placement(mine, n))
        ratios = None
        theirs = rows.get((a.shape, ref))
        if a.arm != ref and theirs:
            paired = {key: theirs[key] / mine[key] for key in mine if key in theirs}
            ratios = tuple(float(median(p)) for p in by_placement(paired, n))
        out.append(PlacementSummary(a.shape, a.arm, medians, ratios))
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# Per-kernel durations, and the stock arm against its referee.
# ----------------------------------------------------------------------------------------------

REFEREES = {"triton": "sglang"}  # stock arm -> the engine arm that referees it
REFEREE_TOLERANCE = 0.03  # DESIGN: a stock arm is within 3% of its referee


@dataclass(frozen=True)
class KernelSummary:
    """One declared kernel of one arm at one shape: median over rounds of its round medians."""

    shape: str
    arm: str
    label: str
    median_ns: float
    rows_ns: tuple[float, ...]


def kernel_summaries(result) -> tuple[KernelSummary, ...]:
    """Every declared kernel's duration, from the samples whose kernels are exactly the declared
    ones (CUPTI runs; none for events runs)."""
    declared = {(a.shape, a.name): a.kernels for a in result.arms}
    per: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
    for s in summary_samples(result):
        decl = declared.get((s.shape, s.arm))
        if not decl or not s.kernels:
            continue
        ks = sorted(s.kernels, key=lambda k: k.start_ns)
        labels = kernel_labels([k.name for k in ks], decl)
        if None in labels or len(ks) != sum(d.count for d in decl):
            continue
        for k, label in zip(ks, labels):
            per[(s.shape, s.arm, label)].append((s.round, k.duration_ns))
    out = []
    for (shape, arm, label), values in per.items():
        rows = rows_by_round(values)
        out.append(KernelSummary(shape, arm, label, arm_median(rows), tuple(rows.values())))
    order = {(a.shape, a.name): i for i, a in enumerate(result.arms)}
    return tuple(sorted(out, key=lambda k: order.get((k.shape, k.arm), 0)))


@dataclass(frozen=True)
class RefereeCheck:
    """A stock arm against its referee at one shape: time ratios arm / referee (> 1: the stock
    arm is slower), paired by round for the call, of medians for each kernel both declare."""

    shape: str
    arm: str
    referee: str
    call_ratio: float
    kernel_ratios: dict[str, float]
    tolerance: float

    @property
    def passed(self) -> bool:
        """The call and each GEMM within the tolerance (the other kernels are the same code in both)."""
        gemms = [r for label, r in self.kernel_ratios.items() if label.startswith("gemm")]
        return all(abs(r - 1.0) <= self.tolerance for r in (self.call_ratio, *gemms))


def referee_labels(checks) -> list[str]:
    """The kernels the checks compare, GEMMs first: the columns of a referee table."""
    return sorted({lab for c in checks for lab in c.kernel_ratios}, key=lambda x: (not x.startswith("gemm"), x))


def referee_checks(result, tolerance: float = REFEREE_TOLERANCE) -> tuple[RefereeCheck, ...]:
    """Each stock arm of the run against its referee, where both ran at a shape."""
    by_unit: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for s in summary_samples(result):
        by_unit[(s.shape, s.arm)].append((s.round, s.value_ns))
    kernels = {(k.shape, k.arm, k.label): k.median_ns for k in kernel_summaries(result)}
    checks = []
    for shape in result.settings.shapes:
        for arm, referee in REFEREES.items():
            if not by_unit.get((shape, arm)) or not by_unit.get((shape, referee)):
                continue
            arm_rows, ref_rows = rows_by_round(by_unit[(shape, arm)]), rows_by_round(by_unit[(shape, referee)])
            rounds = sorted(set(arm_rows) & set(ref_rows))
            if not rounds:
                continue
            call = float(median(arm_rows[r] / ref_rows[r] for r in rounds))
            labels = [lab for (sh, a, lab) in kernels if sh == shape and a == arm and (shape, referee, lab) in kernels]
            checks.append(RefereeCheck(shape, arm, referee, call,
                                       {lab: kernels[(shape, arm, lab)] / kernels[(shape, referee, lab)]
                                        for lab in labels}, tolerance))
    return tuple(checks)


# ----------------------------------------------------------------------------------------------
# Against the best of the stock and peer arms: what a reviewer asks of every ratio.
# ----------------------------------------------------------------------------------------------

# The arms "best" is taken over: the stock path as shipped and tuned, the engine's own kernels,
# and the production non-Triton peer. The fastest of those present at a shape (lowest median) is
# that shape's best.
BEST_OF = ("triton", "triton-tuned", "sglang", "cublas")


@dataclass(frozen=True)
class BestRatio:
    """One arm at one shape against the shape's best of BEST_OF: best-row / arm-row per round,
    median over rounds (> 1: the arm beats the best); `ratio` is None for the best itself."""

    shape: str
    arm: str
    best: str
    ratio: RatioSummary | None


def _unit_rows(result) -> dict[tuple[str, str], dict[int, float]]:
    by_unit: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for s in summary_samples(result):
        by_unit[(s.shape, s.arm)].append((s.round, s.value_ns))
    return {unit: rows_by_round(values) for unit, values in by_unit.items()}


def best_arms(result, among: Sequence[str] = BEST_OF, rows=None) -> dict[str, str]:
    """shape -> the arm of `among` with the lowest median there (ties: the earlier in `among`),
    the medians taken from the stored samples as the run's summaries are."""
    rows = _unit_rows(result) if rows is None else rows
    out = {}
    for shape in result.settings.shapes:
        present = [a for a in among if rows.get((shape, a))]
        if present:
            out[shape] = min(present, key=lambda a: (arm_median(rows[(shape, a)]), among.index(a)))
    return out


def best_ratios(result, among: Sequence[str] = BEST_OF) -> tuple[BestRatio, ...]:
    """Every arm's ratio against its shape's best of `among`, from the stored samples exactly as
    the run's own ratios (rows paired by round). Empty unless the run holds two of `among`:
    with one, the best is that arm everywhere and the run's ratios against it say the rest."""
    if sum(a in result.settings.arms for a in among) < 2:
        return ()
    rows = _unit_rows(result)
    out = []
    for shape, best in best_arms(result, among, rows).items():
        for arm in result.settings.arms:
            if not rows.get((shape, arm)):
                continue
            ratio = None if arm == best else ratio_summary(shape, best, arm, rows[(shape, best)], rows[(shape, arm)])
            out.append(BestRatio(shape, arm, best, ratio))
    return tuple(out)
