"""A RunResult as one long CSV table (pandas): one row per sample, one per summary cell.

Columns: kind (sample | summary | ratio | vs_best | parity), shape, arm, ref, round, index, metric, unit,
value, and for samples gpu_span_ns, kernels and external_id. A summary cell that holds
one value per round (row medians, per-round ratios) becomes one row per round. Each arm's
`floor_understated` row is 1 where it beat its floor (moebench.analysis.roofline.arm_floor: its
fraction_of_read_bandwidth and times_floor rows are then bounds that did not hold), else 0.
Where a run holds two of the stock and peer arms (moebench.analysis.stats.BEST_OF), `vs_best`
rows give every arm against its shape's fastest of them (`ref` names it), as the tables do.
`parity` rows are each oracle check (a run's, or `verify --out`'s, whose shape may name a case).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pandas as pd

from moebench.analysis.roofline import arm_floor, shape_floors
from moebench.record.index import ResultIndex
from moebench.record.metrics import timed_metric
from moebench.record.schema import ArmSummary, RatioSummary, RunResult

COLUMNS = ("kind", "shape", "arm", "ref", "round", "index", "metric", "unit", "value",
           "gpu_span_ns", "kernels", "external_id")
INTEGER_COLUMNS = ("round", "index", "gpu_span_ns", "kernels", "external_id")

# metric name -> (unit, value in an ArmSummary); None values are left out.
ARM_METRICS: dict[str, tuple[str, Callable[[ArmSummary], float | None]]] = {
    "median": ("ns", lambda s: s.median_ns),
    "row_min": ("ns", lambda s: s.min_ns),
    "row_max": ("ns", lambda s: s.max_ns),
    "span_median": ("ns", lambda s: s.span_median_ns),
    "samples": ("count", lambda s: s.samples),
    "hbm_floor_bandwidth": ("bytes/s", lambda s: s.hbm_bandwidth_bytes_per_s),
    "fraction_of_read_bandwidth": ("fraction", lambda s: s.fraction_of_read_bandwidth),
}
RATIO_METRICS: dict[str, tuple[str, Callable[[RatioSummary], float | None]]] = {
    "ratio_median": ("ref/arm", lambda r: r.median),
    "ratio_low": ("ref/arm", lambda r: r.low),
    "ratio_high": ("ref/arm", lambda r: r.high),
    "rounds_won": ("count", lambda r: r.rounds_won),
    "rounds": ("count", lambda r: r.rounds),
}


def result_frame(result: RunResult) -> pd.DataFrame:
    rows = (list(_sample_rows(result)) + list(_summary_rows(ResultIndex(result))) + list(_vs_best_rows(result))
            + list(_parity_rows(result)))
    frame = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    for col in INTEGER_COLUMNS:  # straight from the ints: through float64 an id past 2**53 would change
        frame[col] = pd.array([r[col] for r in rows], dtype="Int64")
    frame["value"] = frame["value"].astype("float64")
    return frame


def render_csv(result: RunResult) -> str:
    return result_frame(result).to_csv(index=False, lineterminator="\n")


def _row(**cells) -> dict:
    return {c: cells.get(c) for c in COLUMNS}


def _sample_rows(result: RunResult) -> Iterator[dict]:
    metric = timed_metric(result.settings.timer)
    for s in result.samples:
        yield _row(kind="sample", shape=s.shape, arm=s.arm, round=s.round, index=s.index,
                   metric=metric.name, unit=metric.unit, value=s.value_ns,
                   gpu_span_ns=s.gpu_span_ns if s.kernels else None,
                   kernels=len(s.kernels), external_id=s.external_id)


def _summary_rows(ix: ResultIndex) -> Iterator[dict]:
    floors = shape_floors(ix.result)
    for shape in ix.shapes:
        for arm in ix.arms_at(shape):
            s = ix.summary(shape, arm)
            for metric, (unit, get) in ARM_METRICS.items():
                if get(s) is not None:
                    yield _row(kind="summary", shape=shape, arm=arm, metric=metric, unit=unit, value=get(s))
            standing = arm_floor(s, floors.get(shape))
            if standing.multiple is not None:
                yield _row(kind="summary", shape=shape, arm=arm, metric="times_floor", unit="x", value=standing.multiple)
            yield _row(kind="summary", shape=shape, arm=arm, metric="floor_understated", unit="flag",
                       value=float(standing.understated))
            for rnd, v in enumerate(s.row_medians_ns, start=1):
                yield _row(kind="summary", shape=shape, arm=arm, round=rnd, metric="row_median",
                           unit="ns", value=v)
        for arm in ix.compared_arms(shape):
            r = ix.ratio(shape, arm)
            for metric, (unit, get) in RATIO_METRICS.items():
                yield _row(kind="ratio", shape=shape, arm=arm, ref=r.ref, metric=metric, unit=unit, value=get(r))
            for rnd, v in enumerate(r.per_round, start=1):
                yield _row(kind="ratio", shape=shape, arm=arm, ref=r.ref, round=rnd, metric="ratio_round",
                           unit="ref/arm", value=v)


def _vs_best_rows(result: RunResult) -> Iterator[dict]:
    from moebench.analysis.stats import best_ratios
    for b in best_ratios(result):
        if b.ratio is None:  # the best itself
            continue
        for metric, (unit, get) in RATIO_METRICS.items():
            yield _row(kind="vs_best", shape=b.shape, arm=b.arm, ref=b.best, metric=metric,
                       unit=unit.replace("ref", "best"), value=get(b.ratio))


PARITY_METRICS: dict[str, tuple[str, Callable]] = {
    "rel_l2": ("relative", lambda p: p.rel_l2),
    "rel_l2_exact": ("relative", lambda p: p.rel_l2_exact),
    "max_abs": ("abs", lambda p: p.max_abs),
    "threshold": ("relative", lambda p: p.threshold),
    "model_excess": ("x allowance", lambda p: p.model_excess),
    "passed": ("flag", lambda p: float(p.passed)),
}


def _parity_rows(result: RunResult) -> Iterator[dict]:
    for p in result.parity:
        for metric, (unit, get) in PARITY_METRICS.items():
            if get(p) is not None:
                yield _row(kind="parity", shape=p.shape, arm=p.arm, ref=p.oracle, metric=metric, unit=unit,
                           value=get(p))
