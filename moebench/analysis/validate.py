"""A RunResult checked against itself: what a file says of its samples must follow from them.

A file can be edited, truncated by hand or written by a bug; a report that trusted its stored
summaries would print whatever it holds. So on load every summary and ratio is recomputed
from the samples by the same named functions the run used, the samples are checked against
the settings (shapes, arms, rounds, indices) and against the kernels their arm declares, and
the audit's counts against the samples. A file of a run still going, or stopped, holds only
the rounds its status says are done, and its statistics are over those. The statistics are recomputed over the samples the
file says they were taken over (`statistics_over`: the audited ones, or every one in files
written before that rule). Each problem names the field.
"""

from __future__ import annotations

import dataclasses
import math

from moebench.analysis.stats import fraction_of, summarize, summary_samples
from moebench.analysis.validate_fields import field_problems, pattern_problems
from moebench.record.determinism import determinism_problems
from moebench.record.schema import STATISTICS_OVER, RunResult
from moebench.timing.audit import kernel_mismatch

REL_TOL = 1e-4  # below what any view prints: ratios to 0.001, times to 0.01 µs


def problems(result: RunResult, limit: int = 20) -> list[str]:
    """What in `result` does not follow from its samples (empty when consistent)."""
    out: list[str] = pattern_problems(result)
    if out:  # the audit below cannot run a pattern that does not compile
        return out[:limit]
    s = result.settings
    out += determinism_problems(result.determinism)
    # checks alone (`verify --out`): determinism verdicts or parity rows, no samples
    untimed = s.timer == "none" and not result.samples and bool(result.determinism or result.parity)
    if not untimed and (s.rounds < 1 or s.samples < 1):
        out.append(f"settings: rounds {s.rounds} and samples {s.samples} must be at least 1")
    unfinished = result.sharding is not None and bool(result.sharding.missing)  # may have no shape done
    if (not s.shapes and not unfinished) or not s.arms:
        out.append("settings: no shapes or no arms")
    if s.ref not in s.arms:
        out.append(f"settings.ref {s.ref!r} is not one of the arms")
    out += _status(result)
    out += _read_floor(result.provenance.gpu)
    rounds = max(0, min(result.rounds_done, s.rounds))
    for f in result.fixtures:
        if f.floors.hbm_bytes <= 0 or f.floors.flops <= 0:
            out.append(f"fixtures[{f.name}].floors: HBM bytes and FLOPs must be positive")
    # a run's timed shapes take their floors from their fixtures: a file that describes some
    # describes them all (`bench` and files written by scripts hold none; load shows their
    # bandwidths as unknown)
    described = {f.name for f in result.fixtures}
    out += [f"samples at {shape}: no fixture describes that shape"
            for shape in sorted({x.shape for x in result.samples} - described) if described]
    shapes, arms = set(s.shapes), set(s.arms)
    out += [f"determinism[{v.shape} {v.arm}]: shape or arm not in the settings" for v in result.determinism
            if v.shape not in shapes or v.arm not in arms]
    # a checks-only file's parity rows are of its fixtures ("A8", or `verify`'s case "A8 M=1") and
    # arms (a timed run keeps the rows of an arm --keep-going left out of its arms)
    out += [f"parity[{p.shape} {p.arm}]: shape or arm not in the settings" for p in result.parity
            if untimed and (p.shape.split(" ")[0] not in shapes or p.arm not in arms)]
    declared = {(a.shape, a.name): a.kernels for a in result.arms}
    failing = 0
    for i, x in enumerate(result.samples):
        where = f"samples[{i}] ({x.shape} {x.arm} round {x.round})"
        if x.shape not in shapes or x.arm not in arms:
            out.append(f"{where}: shape or arm not in the settings")
        if not 1 <= x.round <= rounds or not 0 <= x.index < s.samples:
            out.append(f"{where}: round or index outside the settings ({rounds} rounds x {s.samples} samples)")
        if x.events_ns is not None:
            bad = x.events_ns <= 0
        else:
            decl = declared.get((x.shape, x.arm))
            bad = (decl is None or kernel_mismatch([k.name for k in x.kernels], decl) is not None
                   or any(k.end_ns <= k.start_ns for k in x.kernels))
        failing += bad
        if len(out) >= limit:
            return out[:limit]
    a = result.audit
    if a.samples_total != len(result.samples):
        out.append(f"audit.samples_total {a.samples_total} != {len(result.samples)} samples")
    if a.samples_passed > len(result.samples) - failing:
        out.append(f"audit.samples_passed {a.samples_passed}, but {failing} samples do not hold their declared "
                   f"kernels with positive durations")
    out += _sharding(result)
    if result.statistics_over not in STATISTICS_OVER:
        out.append(f"statistics_over {result.statistics_over!r} is not one of {', '.join(STATISTICS_OVER)}")
        return (out + field_problems(result))[:limit]
    summarized = summary_samples(result)
    if summarized and result.summaries:
        out += _statistics(result, summarized)
    elif summarized and not result.summaries:
        out.append(f"summaries: none, for a run with {result.statistics_over}")
    elif result.summaries or result.ratios:  # nothing to derive them from: forged or trimmed
        out.append(f"summaries and ratios stored with no samples to derive them from (unaudited)")
    out += field_problems(result)  # after the samples' own checks: those name the first cause
    return out[:limit]


def _sharding(result: RunResult) -> list[str]:
    """A sharded sweep's cells: each shape of the settings finished in exactly one cell, on a
    rank of the world; a missing cell is not also a finished one."""
    sh = result.sharding
    if sh is None:
        return []
    out = []
    done = [c.shape for c in sh.cells]
    missing = {c.shape for c in sh.missing}
    if len(set(done)) != len(done):
        out.append("sharding.cells: a shape finished in two cells")
    if set(done) != set(result.settings.shapes):
        out.append(f"sharding.cells ({', '.join(done)}) are not the shapes of the settings "
                   f"({', '.join(result.settings.shapes)})")
    if missing & set(done):
        out.append(f"sharding.missing names finished cells: {', '.join(sorted(missing & set(done)))}")
    if any(not 0 <= c.rank < sh.world_size for c in (*sh.cells, *sh.missing)):
        out.append(f"sharding: a cell's rank is outside the world of {sh.world_size}")
    if sh.dry_run and result.samples:
        out.append("sharding: a dry run holds samples")
    return out


def _status(result: RunResult) -> list[str]:
    st, rounds = result.status, result.settings.rounds
    if st.rounds_done is not None and not 0 <= st.rounds_done <= rounds:
        return [f"status.rounds_done {st.rounds_done} is outside 0-{rounds}"]
    if st.complete and st.rounds_done not in (None, rounds):
        return [f"status: complete, but {st.rounds_done} of {rounds} rounds done"]
    if not st.complete and st.rounds_done is None:
        return ["status: incomplete, with no rounds_done"]
    return []


def _read_floor(gpu) -> list[str]:
    """The read floor is its winning layout's rate, the best of its layouts, and the GPU's bandwidth."""
    rf = gpu.read_floor if gpu else None
    if rf is None:
        return []
    if rf.config not in rf.configs or not math.isclose(rf.configs[rf.config], rf.bytes_per_s, rel_tol=REL_TOL):
        return [f"read_floor: {rf.bytes_per_s:g} B/s is not its layout {rf.config}'s rate"]
    if any(v > rf.bytes_per_s * (1 + REL_TOL) for v in rf.configs.values()):
        return [f"read_floor: layout {rf.config} is not the best of {', '.join(rf.configs)}"]
    if gpu.read_bandwidth_bytes_per_s is None or not math.isclose(gpu.read_bandwidth_bytes_per_s, rf.bytes_per_s,
                                                                  rel_tol=REL_TOL):
        return [f"gpu.read_bandwidth_bytes_per_s {gpu.read_bandwidth_bytes_per_s} is not the read floor's "
                f"{rf.bytes_per_s:g}"]
    return []


def _statistics(result: RunResult, samples) -> list[str]:
    s = result.settings
    hbm = {f.name: f.floors.hbm_bytes for f in result.fixtures}
    bw = result.provenance.gpu.read_bandwidth_bytes_per_s if result.provenance.gpu else None
    try:
        summaries, ratios = summarize(samples, s.shapes, s.arms, s.ref, hbm, bw)
    except (ValueError, ZeroDivisionError) as err:
        return [f"summaries: cannot be recomputed from the samples ({err})"]
    # A sharded sweep's shares are of each cell's own measured bandwidth.
    cells = {c.shape: c.read_bandwidth_bytes_per_s for c in result.sharding.cells} if result.sharding else {}
    summaries = tuple(dataclasses.replace(x, fraction_of_read_bandwidth=fraction_of(x.hbm_bandwidth_bytes_per_s,
                                                                                    cells[x.shape]))
                      if x.shape in cells else x for x in summaries)
    out = []
    stored = {(x.shape, x.arm): x for x in result.summaries}
    for x in summaries:
        y = stored.get((x.shape, x.arm))
        if y is None:
            out.append(f"summaries: {x.arm} at {x.shape} is missing")
        else:
            out += _differences(f"summaries[{x.shape} {x.arm}]", y, x,
                                skip=() if x.shape in hbm else NO_FLOORS)
    if len(result.summaries) != len(summaries):  # the list's length: a repeated row counts
        out.append(f"summaries: {len(result.summaries)} stored, the samples give {len(summaries)}")
    stored_r = {(r.shape, r.ref, r.arm): r for r in result.ratios}
    for r in ratios:
        y = stored_r.get((r.shape, r.ref, r.arm))
        if y is None:
            out.append(f"ratios: {r.arm} / {r.ref} at {r.shape} is missing")
        else:
            out += _differences(f"ratios[{r.shape} {r.arm}]", y, r)
    if len(result.ratios) != len(ratios):
        out.append(f"ratios: {len(result.ratios)} stored, the samples give {len(ratios)}")
    return out


# Optional fields a file may leave empty (older files have no gpu_sum; a view shows "—"), never
# fill with a number of their own.
OPTIONAL = ("span_median_ns", "sum_median_ns", "fraction_of_read_bandwidth")


def _same(stored, derived) -> bool:
    if isinstance(derived, tuple):
        return isinstance(stored, tuple) and len(stored) == len(derived) \
            and all(_same(a, b) for a, b in zip(stored, derived))
    if isinstance(derived, float) and isinstance(stored, (int, float)):
        return math.isclose(stored, derived, rel_tol=REL_TOL, abs_tol=1e-9)
    return stored == derived


# Bandwidths need the fixture's floor bytes. Files written by scripts hold no fixtures; their
# bandwidth cannot be redone, so it is not compared here and load reads it as unknown.
NO_FLOORS = ("hbm_bandwidth_bytes_per_s", "fraction_of_read_bandwidth")


def _differences(where: str, stored, derived, skip: tuple[str, ...] = ()) -> list[str]:
    """Each field of a stored summary or ratio that the samples do not give (every field a
    view shows: rows, their range, n, span, bandwidth, ratio range, per-round ratios, wins)."""
    out = []
    for f in dataclasses.fields(derived):
        mine, theirs = getattr(stored, f.name), getattr(derived, f.name)
        if (mine is None and f.name in OPTIONAL) or f.name in skip:
            continue
        if not _same(mine, theirs):
            out.append(f"{where}.{f.name} {_show(mine)}, the samples give {_show(theirs)}")
    return out


def _show(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
    return f"{value:g}" if isinstance(value, float) else repr(value)
