"""A RunResult's stored fields checked against their ranges and against the fields they depend
on: what cannot be re-derived from the samples (settings, floors, parity, clocks, the GPU)
must at least be possible, and what can be re-derived must at least be self-consistent before
it is compared (moebench.analysis.validate does the comparing).

Each check is a small function over the result that returns problem lines naming the field;
`field_problems` runs them all (a registry, so a new field gets a new entry, not a branch).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

from moebench.analysis.roofline import shape_floors
from moebench.choices import FLUSH_MODES
from moebench.record.schema import RunResult
from moebench.timing.schedule import PLACEMENT_MODES

FLUSH_NAMES = FLUSH_MODES
TIMER_NAMES = ("cupti", "events", "none")
SAMPLER_NAMES = ("eager", "graph")
# A time under this share of its physical floor (bytes at the measured read bandwidth, FLOPs at
# the board's dense peak) cannot have been measured: a real kernel lands above the floor, or a
# little under it where the measured read rate is below the board's best.
FLOOR_SHARE = 0.5


def pattern_problems(result: RunResult) -> list[str]:
    """What the statistics cannot even be re-derived by: declared kernel patterns that are not
    regular expressions (the audit cannot run them), a placement mode no schedule knows (which
    copy a sample took cannot be said). A file holding one is refused whatever the caller trusts."""
    out = []
    if result.settings.placement_mode not in PLACEMENT_MODES:
        out.append(f"settings.placement_mode {result.settings.placement_mode!r} is not one of "
                   f"{', '.join(PLACEMENT_MODES)}")
    for a in result.arms:
        for k in a.kernels:
            try:
                re.compile(k.pattern)
            except (re.error, RecursionError, OverflowError) as err:
                out.append(f"arms[{a.shape} {a.name}].kernels[{k.label}].pattern {k.pattern[:40]!r} is not a "
                           f"regular expression ({err})")
    return out


def _settings(r: RunResult) -> Iterable[str]:
    s = r.settings
    if s.warmup < 0:
        yield f"settings.warmup {s.warmup} is negative"
    if s.placements < 1:
        yield f"settings.placements {s.placements} must be at least 1"
    if s.flush_bytes < 0:
        yield f"settings.flush_bytes {s.flush_bytes} is negative"
    if s.flush not in FLUSH_NAMES:
        yield f"settings.flush {s.flush!r} is not one of {', '.join(FLUSH_NAMES)}"
    if s.timer not in TIMER_NAMES:
        yield f"settings.timer {s.timer!r} is not one of {', '.join(TIMER_NAMES)}"
    if s.sampler not in SAMPLER_NAMES:
        yield f"settings.sampler {s.sampler!r} is not one of {', '.join(SAMPLER_NAMES)}"
    if not 0 <= s.balancedness <= 1:
        yield f"settings.balancedness {s.balancedness} is outside 0-1"


def _fixtures(r: RunResult) -> Iterable[str]:
    named = {f.name for f in r.fixtures}
    lacking = [x.shape for x in r.summaries if named and x.shape not in named]
    if lacking:
        yield f"fixtures: none for {lacking[0]}, which has a summary (its floors and bandwidth would go unchecked)"
    for f in r.fixtures:
        where = f"fixtures[{f.name}]"
        if min(f.M, f.K, f.E, f.top_k, f.N) < 1 or f.top_k > f.E:
            yield f"{where}: M {f.M}, K {f.K}, E {f.E}, top_k {f.top_k}, N {f.N} are not a geometry"
        if not 0 <= f.balancedness <= 1:
            yield f"{where}.balancedness {f.balancedness} is outside 0-1"
        fl = f.floors
        parts = (fl.weight_bytes, fl.activation_bytes, fl.output_bytes)
        if min(parts) < 0 or not 0 <= fl.experts_routed <= f.E:
            yield f"{where}.floors: negative bytes or {fl.experts_routed} experts routed of {f.E}"
        elif fl.hbm_bytes != sum(parts):
            yield f"{where}.floors.hbm_bytes {fl.hbm_bytes} is not weights + activations + output ({sum(parts)})"


def _positive_or_none(where: str, values: dict[str, float | None]) -> Iterable[str]:
    for name, v in values.items():
        if v is not None and v <= 0:
            yield f"{where}.{name} {v} must be positive"


def _gpu(r: RunResult) -> Iterable[str]:
    g = r.provenance.gpu
    if g is not None:
        yield from _positive_or_none("provenance.gpu", {
            "sm_count": g.sm_count, "max_sm_clock_mhz": g.max_sm_clock_mhz, "max_mem_clock_mhz": g.max_mem_clock_mhz,
            "read_bandwidth_bytes_per_s": g.read_bandwidth_bytes_per_s})
        if g.l2_bytes < 0 or g.memory_bytes < 0:
            yield "provenance.gpu: negative L2 or memory size"
    for c in r.sharding.cells if r.sharding else ():
        yield from _positive_or_none(f"sharding.cells[{c.shape}]", {"read_bandwidth_bytes_per_s": c.read_bandwidth_bytes_per_s})


def _clocks(r: RunResult) -> Iterable[str]:
    cells = r.sharding.cells if r.sharding else ()
    for where, clocks in (("clocks", r.clocks), *((f"sharding.cells[{c.shape}].clocks", c.clocks) for c in cells)):
        for c in clocks:
            if not 1 <= c.round <= r.settings.rounds:
                yield f"{where}: round {c.round} is outside 1-{r.settings.rounds}"
            yield from _positive_or_none(f"{where}[round {c.round}]", {
                "sm_mhz": c.sm_mhz, "mem_mhz": c.mem_mhz, "sm_mhz_start": c.sm_mhz_start})
            if c.power_w is not None and c.power_w < 0:
                yield f"{where}[round {c.round}].power_w {c.power_w} is negative"


def _parity(r: RunResult) -> Iterable[str]:
    for p in r.parity:
        where = f"parity[{p.shape} {p.arm}]"
        values = (p.rel_l2, p.max_abs, p.nonfinite, p.rel_l2_exact or 0.0, p.ref_max_abs or 0.0)
        if min(values) < 0 or p.threshold <= 0:
            yield f"{where}: negative error, count or magnitude, or threshold {p.threshold} not positive"
        elif p.passed != (p.nonfinite == 0 and p.rel_l2 <= p.threshold):
            yield (f"{where}.passed {p.passed}, but rel L2 {p.rel_l2:.3g} against threshold {p.threshold:g} with "
                   f"{p.nonfinite} non-finite elements says {not p.passed}")
    for b in r.build_parity:
        where = f"build_parity[{b.shape} {b.arm}]"
        if b.mismatched < 0 or (b.max_abs_diff < 0 and b.max_abs_diff != -1):
            yield f"{where}: negative count or difference"
        elif b.bitwise_equal != (b.mismatched == 0):
            yield f"{where}.bitwise_equal {b.bitwise_equal} with {b.mismatched} differing elements"


def _samples(r: RunResult) -> Iterable[str]:
    for i, x in enumerate(r.samples):
        if x.external_id < 0 or any(k.start_ns < 0 for k in x.kernels):
            yield f"samples[{i}] ({x.shape} {x.arm} round {x.round}): a negative id or timestamp"
            return  # one line for a file of many
    a = r.audit
    if min(a.samples_total, a.samples_passed, a.dropped_records) < 0 or a.samples_passed > a.samples_total:
        yield f"audit: {a.samples_passed} passed of {a.samples_total}, {a.dropped_records} dropped"


def _summaries(r: RunResult) -> Iterable[str]:
    """Each summary and ratio possible on its own: what the loader then compares to the samples
    (and what a file without samples is shown with, as unaudited)."""
    for s in r.summaries:
        where = f"summaries[{s.shape} {s.arm}]"
        times = (s.median_ns, s.min_ns, s.max_ns, *s.row_medians_ns)
        if min(times) < 0 or s.samples < 1 or (s.hbm_bandwidth_bytes_per_s or 0.0) < 0 \
                or min(x for x in (s.span_median_ns, s.sum_median_ns, s.fraction_of_read_bandwidth, 0.0)
                       if x is not None) < 0:
            yield f"{where}: a negative time, bandwidth or fraction, or no samples"
        elif not s.min_ns <= s.median_ns <= s.max_ns or not s.row_medians_ns \
                or not all(s.min_ns <= x <= s.max_ns for x in s.row_medians_ns):
            yield f"{where}: rows min {s.min_ns:g}, median {s.median_ns:g}, max {s.max_ns:g} are out of order"
    for x in r.ratios:
        where = f"ratios[{x.shape} {x.arm}]"
        if x.arm == x.ref:
            yield f"{where}: the reference arm {x.ref!r} given a ratio against itself"
        elif x.ref != r.settings.ref:
            yield f"{where}: taken against {x.ref!r}, the run's reference is {r.settings.ref!r}"
        elif min(x.low, x.median, x.high, *x.per_round) <= 0 or not x.low <= x.median <= x.high:
            yield f"{where}: low {x.low:g}, median {x.median:g}, high {x.high:g} are not positive and in order"
        elif len(x.per_round) != x.rounds or not 0 <= x.rounds_won <= x.rounds \
                or x.rounds_won != sum(v > 1.0 for v in x.per_round):
            yield f"{where}: {x.rounds_won} rounds won of {x.rounds}, with {len(x.per_round)} per-round ratios"


def _physical(r: RunResult) -> Iterable[str]:
    """No time far under its floor: the HBM floor holds only for a cold L2 (not `--flush none`)."""
    floors = shape_floors(r)
    for s in r.summaries:
        f = floors.get(s.shape)
        if f is None:
            continue
        known = [x for x in (f.fp8_floor_ns, None if r.settings.flush == "none" else f.hbm_floor_ns) if x]
        if known and s.median_ns < FLOOR_SHARE * max(known):
            yield (f"summaries[{s.shape} {s.arm}].median_ns {s.median_ns:g} is {max(known) / max(s.median_ns, 1e-9):.1f}x "
                   f"under its physical floor ({max(known):.0f} ns): not a time a GPU can measure")


def _noise(r: RunResult) -> Iterable[str]:
    for shape, arms in r.noise.items():
        for arm, v in (arms.items() if isinstance(arms, dict) else ()):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                yield f"noise[{shape}][{arm}] {v!r} is not a non-negative fraction"
        if not isinstance(arms, dict):
            yield f"noise[{shape}] is not a table of arms"


FIELD_CHECKS: dict[str, Callable[[RunResult], Iterable[str]]] = {
    "settings": _settings, "fixtures": _fixtures, "gpu": _gpu, "clocks": _clocks, "parity": _parity,
    "samples": _samples, "summaries": _summaries, "physical floor": _physical, "noise": _noise,
}


def field_problems(result: RunResult) -> list[str]:
    """Every stored field out of its range or at odds with the fields it depends on."""
    return [line for check in FIELD_CHECKS.values() for line in check(result)]
