"""Terminal tables of a RunResult: the summary per arm and the ratios against the ref.

Renderers never compute: every number here is a field of the RunResult (ArmSummary,
RatioSummary, Audit, Settings); this module only formats it (ns shown as µs).
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from moebench.analysis.ratio_verdicts import ratio_verdicts
from moebench.analysis.roofline import arm_floor, shape_floors
from moebench.analysis.throttle import run_line
from moebench.analysis.verdicts import Verdict
from moebench.record.index import ResultIndex, placement_cells, us
from moebench.record.metrics import timed_metric
from moebench.record.schema import BuildParity, RunResult
from moebench.views.determinism_view import det_text, determinism_table, verdicts_by_unit
from moebench.views.roofline_view import FLOOR_HEADER, floor_cells, floor_note, share_text, sweep_floor_tables


def timer_label(result: RunResult) -> str:
    """How the times were taken, as the tables state it."""
    s = result.settings
    return f"timer: {timed_metric(s.timer).source} · flush: {s.flush} ({s.flush_bytes / 2**20:,.0f} MiB) · " \
           f"sampler: {SAMPLER_WORDS.get(s.sampler, s.sampler)} · " \
           f"{s.rounds} rounds × {s.samples} samples (+{s.warmup} warm-up)" + \
           (f" · {s.placements} placements in turn" if s.placements > 1 else "")


def throttle_lines(result: RunResult) -> list[str]:
    """One line per round whose clocks did not hold (ClockSample.throttled), with its clocks and
    power, then what compare will do with them (moebench.analysis.throttle)."""
    lines = [f"round {c.round} throttled: {c.throttled}{_clock_state(c)}" for c in result.clocks if c.throttled]
    policy = run_line(result)
    return lines + ([policy] if policy else [])


def _clock_state(c) -> str:
    parts = [f"SM {c.sm_mhz} MHz" if c.sm_mhz else "", f"memory {c.mem_mhz} MHz" if c.mem_mhz else "",
             (f"{c.power_w:.0f}" + (f"/{c.power_limit_w:.0f}" if c.power_limit_w else "") + " W") if c.power_w else ""]
    parts = [p for p in parts if p]
    return f" ({', '.join(parts)})" if parts else ""


SAMPLER_WORDS = {"eager": "eager launches", "graph": "CUDA graph replays"}


def noise_lines(result: RunResult) -> list[str]:
    """The noise floors the result carries, one line per shape."""
    return [f"noise floor (A/A) {shape}: " + ", ".join(f"{arm} ±{f:.2%}" for arm, f in arms.items())
            for shape, arms in result.noise.items()]


def audit_line(result: RunResult) -> str:
    a = result.audit
    if a.samples_total == 0:  # nothing was measured, so nothing was audited: never "passed 0/0"
        return "unaudited: the file holds no samples"
    state = "passed" if a.passed else "FAILED"
    drops = f", {a.dropped_records} dropped records" if a.dropped_records else ""
    return f"audit {state}: {a.samples_passed}/{a.samples_total} samples audited{drops}"


def incomplete_text(result: RunResult) -> str | None:
    """What a partial result is (None for a finished run): rounds done, why it stopped."""
    st = result.status
    if st.complete:
        return None
    return (f"{result.rounds_done} of {result.settings.rounds} rounds done, {st.reason or 'no reason given'}; "
            f"`moebench run --resume FILE` finishes it")


def build_parity_text(p: BuildParity | None, arm: str, result: RunResult) -> str:
    """A build's output against the base build's: 'bitwise equal' or the largest difference."""
    if p is None:
        return "base" if any(b.base == arm for b in result.build_parity) else "—"
    if p.bitwise_equal:
        return "bitwise equal"
    size = "not finite" if p.max_abs_diff < 0 else f"{p.max_abs_diff:.3g}"
    return f"max |Δ| {size} ({p.mismatched:,} differ)"


def build_parity_by_arm(result: RunResult) -> dict[tuple[str, str], BuildParity]:
    return {(p.shape, p.arm): p for p in result.build_parity}


# The summary's columns: (header, justify, shown by default). The default set fits 100 columns for
# every committed run; `--wide` adds the rest (the floors' parts and the sample count).
SUMMARY_COLUMNS = (
    ("shape", "left", True), ("arm", "left", True), ("median", "right", True), ("rows min–max", "right", True),
    ("span", "right", True), ("n", "right", False), ("floor TB/s", "right", False), ("% read BW", "right", True),
    ("HBM floor µs", "right", False), ("FP8 floor µs", "right", False), ("binding", "left", False),
    ("× floor", "right", True),
)


def summary_table(result: RunResult, wide: bool = False) -> Table:
    """One row per (shape, arm): median of round medians, their range, span, bandwidth, floors."""
    metric = timed_metric(result.settings.timer)
    note = "" if metric.reference else f" ({metric.plot_label})"
    floors = shape_floors(result)
    shown = [wide or default for _name, _justify, default in SUMMARY_COLUMNS]
    more = "" if wide else " · --wide: every column"
    t = Table(title="moebench run — durations in µs (median of round medians)" + note,
              title_justify="left",
              caption="\n".join(filter(None, (timer_label(result) + more, floor_note(ResultIndex(result))))),
              caption_justify="left")
    for (name, justify, _default), show in zip(SUMMARY_COLUMNS, shown):
        if show:
            # the two floor shares may carry "(floor understated)": they wrap rather than lose it
            t.add_column(name, justify=justify, no_wrap=name not in ("% read BW", "× floor"),
                         style="bold" if name in ("shape", "median") else None)
    det = verdicts_by_unit(result.determinism)
    if det:
        t.add_column("det")  # wraps: the other columns keep their numbers whole
    last_shape = None
    for s in result.summaries:
        if last_shape is not None and s.shape != last_shape:
            t.add_section()
        cells = [s.shape if s.shape != last_shape else "", s.arm, us(s.median_ns),
                 f"{us(s.min_ns)}–{us(s.max_ns)}", us(s.span_median_ns), str(s.samples),
                 "—" if s.hbm_bandwidth_bytes_per_s is None else f"{s.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
                 share_text(arm_floor(s, floors.get(s.shape))), *floor_cells(floors, s.shape, s.median_ns)]
        cells = [c for c, show in zip(cells, shown) if show]
        if det:
            cells.append(det_text(det.get((s.shape, s.arm))))
        t.add_row(*cells)
        last_shape = s.shape
    return t


VERDICT_STYLE = {Verdict.FASTER: "bold green", Verdict.SLOWER: "red", Verdict.SAME: "", Verdict.AMBIGUOUS: "yellow",
                 Verdict.NOISY: "yellow"}


def ratio_table(result: RunResult) -> Table | None:
    """ref-row / arm-row per round, median over rounds (> 1: the arm is faster), and its verdict
    against the run's noise floor (results/ratio_verdicts.py; bold only for a win)."""
    if not result.ratios:
        return None
    verdicts = ratio_verdicts(result)
    t = Table(title=f"ratios vs {result.settings.ref} (> 1 favours the arm)", title_justify="left")
    t.add_column("shape", style="bold", no_wrap=True)
    t.add_column("arm", no_wrap=True)
    t.add_column("ratio", justify="right", no_wrap=True)
    t.add_column("low–high", justify="right", no_wrap=True)
    t.add_column("rounds won", justify="right", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    builds = build_parity_by_arm(result)
    if builds:
        base = result.build_parity[0].base
        t.add_column(f"output vs {base}", justify="right")
    last_shape = None
    for r in result.ratios:
        if last_shape is not None and r.shape != last_shape:
            t.add_section()
        v = verdicts.get((r.shape, r.arm))  # none where the file's samples make none (read as stored)
        style = VERDICT_STYLE[v.verdict] if v else ""
        cells = [r.shape if r.shape != last_shape else "", r.arm, Text(f"{r.median:.3f}", style=style),
                 f"{r.low:.3f}–{r.high:.3f}", f"{r.rounds_won}/{r.rounds}", Text(v.verdict.value if v else "—", style=style)]
        if builds:
            cells.append(build_parity_text(builds.get((r.shape, r.arm)), r.arm, result))
        t.add_row(*cells)
        last_shape = r.shape
    return t


def best_cells(result: RunResult, b) -> tuple[str, str, str]:
    """(vs ref, vs best, rounds won against the best) of one BestRatio (moebench.analysis.stats)."""
    ref = result.settings.ref
    r = next((x for x in result.ratios if (x.shape, x.arm) == (b.shape, b.arm)), None)
    vs_ref = "ref" if b.arm == ref else ("—" if r is None else f"{r.median:.3f}")
    if b.ratio is None:
        return vs_ref, "best", "—"
    return vs_ref, f"{b.ratio.median:.3f}", f"{b.ratio.rounds_won}/{b.ratio.rounds}"


def best_table(result: RunResult, best) -> Table | None:
    """Each arm against its shape's best of the stock and peer arms (BestRatio records, from
    moebench.analysis.stats.best_ratios), beside its ratio against the run's ref."""
    if not best:
        return None
    from moebench.analysis.stats import BEST_OF
    t = Table(title=f"vs the best of {', '.join(BEST_OF)} present, per shape (> 1 favours the arm)",
              title_justify="left")
    t.add_column("shape", style="bold", no_wrap=True)
    t.add_column("arm", no_wrap=True)
    t.add_column(f"vs {result.settings.ref}", justify="right", no_wrap=True)
    t.add_column("vs best", justify="right", no_wrap=True)
    t.add_column("best", no_wrap=True)
    t.add_column("rounds won", justify="right", no_wrap=True)
    last = None
    for b in best:
        if last is not None and b.shape != last:
            t.add_section()
        vs_ref, vs_best, won = best_cells(result, b)
        t.add_row(b.shape if b.shape != last else "", b.arm, vs_ref, vs_best, b.best if b.shape != last else "", won)
        last = b.shape
    return t


def kernel_table(kernels) -> Table | None:
    """Each declared kernel's median (KernelSummary records, from moebench.analysis.stats)."""
    if not kernels:
        return None
    t = Table(title="per-kernel durations in µs (median of round medians)", title_justify="left")
    for col in ("shape", "arm", "kernel"):
        t.add_column(col, no_wrap=True)
    t.add_column("median", justify="right")
    t.add_column("rows min–max", justify="right")
    last = None
    for k in kernels:
        if last is not None and (k.shape, k.arm) != last:
            t.add_section()
        t.add_row(k.shape, k.arm, k.label, us(k.median_ns), f"{us(min(k.rows_ns))}–{us(max(k.rows_ns))}")
        last = (k.shape, k.arm)
    return t


def placement_table(placements, ref: str) -> Table | None:
    """Each arm's median per placement and their spread, and its ratio against `ref` per
    placement (PlacementSummary records, from moebench.analysis.stats)."""
    if not placements:
        return None
    t = Table(title="by placement: median of the rounds each prepared copy ran (µs), and the ratio "
                    f"vs {ref} in those rounds", title_justify="left")
    for col in ("shape", "arm"):
        t.add_column(col, no_wrap=True)
    t.add_column("median per placement", justify="right")
    t.add_column("spread", justify="right")
    t.add_column("ratio per placement", justify="right")
    last = None
    for p in placements:
        if last is not None and p.shape != last:
            t.add_section()
        t.add_row(p.shape, p.arm, *placement_cells(p))
        last = p.shape
    return t


def referee_table(checks) -> Table | None:
    """The stock arm against its referee (RefereeCheck records, from moebench.analysis.stats)."""
    if not checks:
        return None
    from moebench.analysis.stats import referee_labels
    labels = referee_labels(checks)
    t = Table(title=f"stock arm vs its referee: time ratio arm / referee (within ±{checks[0].tolerance:.0%} passes)",
              title_justify="left")
    for col in ("shape", "arm", "referee", "call"):
        t.add_column(col, no_wrap=True, justify="right" if col == "call" else "left")
    for lab in labels:
        t.add_column(lab, justify="right", overflow="fold")  # a long kernel label folds; its number never does
    t.add_column("check")
    for c in checks:
        t.add_row(c.shape, c.arm, c.referee, f"{c.call_ratio:.3f}",
                  *(f"{c.kernel_ratios[lab]:.3f}" if lab in c.kernel_ratios else "—" for lab in labels),
                  Text("within", style="green") if c.passed else Text("OUTSIDE", style="red"))
    return t


def findings_lines(result: RunResult, limit: int = 20) -> list[str]:
    """The audit's findings, one line each (the first `limit`)."""
    lines = [f"{f.shape} {f.arm} round {f.round} sample {f.index}: {f.reason}"
             for f in result.audit.findings[:limit]]
    more = len(result.audit.findings) - limit
    if more > 0:
        lines.append(f"... and {more} more findings")
    return lines


def print_tables(result: RunResult, console: Console | None = None, *, kernels: bool = False,
                 wide: bool = False) -> None:
    from moebench.analysis.stats import best_ratios, kernel_summaries, placement_summaries, referee_checks
    console = console or make_console()
    if result.determinism:
        console.print(determinism_table(result.determinism))
        if not result.samples:  # verdicts alone (`verify --determinism --out`)
            return
    from moebench.views.parity_view import parity_only, parity_table
    if parity_only(result):  # parity rows alone (`verify --out`)
        gpu = result.provenance.gpu
        console.print(parity_table(result.parity, gpu.name if gpu else "CPU", wide))
        return
    partial = incomplete_text(result)
    if partial:
        console.print(Text(f"INCOMPLETE: {partial}", style="bold yellow"))
    console.print(summary_table(result, wide))
    for table in sweep_floor_tables(ResultIndex(result), wide):
        console.print(table)
    for table in (ratio_table(result), best_table(result, best_ratios(result))):
        if table is not None:
            console.print(table)
    for table in (placement_table(placement_summaries(result), result.settings.ref),
                  kernel_table(kernel_summaries(result)) if kernels else None, referee_table(referee_checks(result))):
        if table is not None:
            console.print(table)
    for line in noise_lines(result):
        console.print(line, highlight=False)
    for line in throttle_lines(result):
        console.print(Text(line, style="yellow"))
    style = "green" if result.audit.passed and result.audit.samples_total else "bold red"
    console.print(Text(audit_line(result), style=style))
    for line in findings_lines(result):
        console.print(Text(f"  {line}", style="red"))


# Rich falls back to 80 columns off a terminal. The summary tables fit 100 and take no more; the
# determinism table's long cells wrap less at 160.
WIDTH_WHEN_PIPED = 160
WIDE_WHEN_PIPED = 200  # `--wide` tables, whatever the width


def make_console(file=None, wide: bool = False) -> Console:
    """A rich console that keeps its tables whole when written to a file or a pipe. COLUMNS, where
    set, is the width, as rich reads it; else the terminal's, else a fixed width. A `wide` console
    is never narrower than WIDE_WHEN_PIPED: every column was asked for, whole (a terminal wraps it)."""
    probe = Console(file=file, markup=False)
    if wide:
        return Console(file=file, width=max(probe.width, WIDE_WHEN_PIPED), markup=False)
    if probe.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return probe
    return Console(file=file, width=WIDTH_WHEN_PIPED, markup=False)
