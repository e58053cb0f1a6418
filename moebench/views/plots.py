"""A RunResult as plots for a pull request, each written as PNG and SVG.

Per shape: each arm's samples by round with the round medians (rows) and the arm's
median; the paired ratios per round around 1. For the run: each arm's bandwidth against
the HBM floor. For a sweep (one family at several M): duration against M with the HBM and
FP8 floors beside it, and speedup against M, on a log2 axis. Figures are made without pyplot (no global state, no display needed) and
written with fixed metadata, so the same result gives the same files.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from moebench.analysis.roofline import FP8, UNDERSTATED, arm_floor, floor_series, shape_floors
from moebench.record.atomic import atomic_write
from moebench.record.index import ResultIndex

FORMATS = ("png", "svg")
STYLE = {
    "font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False, "svg.hashsalt": "moebench",
    "svg.fonttype": "path",
}
METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}


@dataclass(frozen=True)
class Plot:
    """One figure of a result: a name for its files and a title to show it by."""

    name: str
    title: str
    figure: Figure


def arm_colors(arms: tuple[str, ...]) -> dict[str, str]:
    palette = matplotlib.colormaps["tab10"].colors
    return {arm: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, arm in enumerate(arms)}


# --- per shape -------------------------------------------------------------------------

def samples_plot(ix: ResultIndex, shape: str) -> Plot:
    """One panel per arm (each on its own scale, so its spread shows): samples as dots,
    round medians as bars, the arm's median dashed."""
    colors = arm_colors(ix.arms)
    arms = ix.arms_at(shape)
    fig = Figure(figsize=(6.4, 0.6 + 1.5 * len(arms)), layout="constrained")
    axes = fig.subplots(len(arms), 1, sharex=True, squeeze=False)[:, 0]
    for ax, arm in zip(axes, arms):
        s = ix.summary(shape, arm)
        for rnd, row in zip(ix.rounds, s.row_medians_ns):
            values = [v.value_ns / 1e3 for v in ix.samples(shape, arm, rnd)]
            n = max(1, len(values) - 1)
            ax.scatter([rnd - 0.25 + 0.5 * k / n for k in range(len(values))], values, s=7,
                       color=colors[arm], alpha=0.5, linewidths=0)
            ax.hlines(row / 1e3, rnd - 0.3, rnd + 0.3, color=colors[arm], linewidth=2)
        ax.axhline(s.median_ns / 1e3, color="0.3", linestyle="--", linewidth=0.8)
        ax.set_title(f"{arm}: median {s.median_ns / 1e3:,.2f} µs", loc="left", fontsize=9)
        ax.set_ylabel("µs")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
    axes[-1].set_xticks(list(ix.rounds), [str(r) for r in ix.rounds])
    axes[-1].set_xlabel("round (dots: samples in order; bar: round median; dashed: median of rounds)")
    fig.suptitle(f"{shape}: samples by round — {ix.metric.plot_label}", fontsize=10)
    return Plot(f"{shape}-samples", f"{shape}: samples by round", fig)


def ratios_plot(ix: ResultIndex, shape: str) -> Plot | None:
    arms = ix.compared_arms(shape)
    if not arms:
        return None
    colors = arm_colors(ix.arms)
    fig = Figure(figsize=(6.4, 3.4 + 0.17 * len(arms)), layout="constrained")
    ax = fig.add_subplot()
    ax.axhline(1.0, color="0.4", linewidth=1)
    for arm in arms:
        r = ix.ratio(shape, arm)
        ax.plot(list(ix.rounds)[:len(r.per_round)], r.per_round, marker="o", color=colors[arm],
                label=f"{r.ref} / {arm}: {r.median:.3f}× ({r.rounds_won}/{r.rounds} rounds won)")
        ax.axhline(r.median, color=colors[arm], linestyle="--", linewidth=0.8)
    ax.set_xticks(list(ix.rounds), [str(r) for r in ix.rounds])
    ax.set_xlabel("round")
    ax.set_ylabel(f"{ix.ref} time / arm time")
    _legend_outside(fig, ax)
    _fit_title(fig, ax, f"{shape}: paired ratio per round (> 1: the arm is faster)")
    return Plot(f"{shape}-ratios", f"{shape}: paired ratio per round", fig)


# --- per run ---------------------------------------------------------------------------

def bandwidth_plot(ix: ResultIndex) -> Plot:
    """Floor bytes over median time per arm, as % of the measured read bandwidth when the
    run measured it, else in TB/s. The legend sits beside the bars, never over them."""
    colors = arm_colors(ix.arms)
    summaries = [s for shape in ix.shapes for s in (ix.summary(shape, a) for a in ix.arms_at(shape))]
    as_fraction = all(s.fraction_of_read_bandwidth is not None for s in summaries)
    fig = Figure(figsize=(max(4.0, 1.1 * len(ix.shapes) + 2.5) + 1.3, 3.6), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(ix.arms))
    floors = shape_floors(ix.result)
    for j, arm in enumerate(ix.arms):
        xs, ys, labels = [], [], []
        for i, shape in enumerate(ix.shapes):
            s = ix.summary(shape, arm)
            if s is None or s.hbm_bandwidth_bytes_per_s is None:  # no fixture: no floor bytes
                continue
            xs.append(i - 0.4 + (j + 0.5) * width)
            ys.append(100 * s.fraction_of_read_bandwidth if as_fraction else s.hbm_bandwidth_bytes_per_s / 1e12)
            # above 100% the bar beat a floor no kernel can beat: it says so, never a plain 107
            flag = f" {UNDERSTATED}" if arm_floor(s, floors.get(shape)).share_understated else ""
            labels.append((f"{ys[-1]:.0f}" if as_fraction else f"{ys[-1]:.2f}") + flag)
        bars = ax.bar(xs, ys, width=width * 0.9, color=colors[arm], label=arm)
        ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
    if as_fraction:
        ax.axhline(100, color="0.4", linewidth=1)
        ax.set_ylabel("% of measured read bandwidth")
        ax.set_ylim(0, max(100, *(100 * s.fraction_of_read_bandwidth for s in summaries)) * 1.08)
        read = ix.result.provenance.gpu.read_bandwidth_bytes_per_s if ix.result.provenance.gpu else None
        of = f" ({read / 1e12:.2f} TB/s)" if read else ""
        title = f"HBM floor bytes / median time, as % of the measured read bandwidth{of}"
    else:
        ax.set_ylabel("TB/s")
        title = "HBM floor bytes / median time, TB/s (no read bandwidth measured)"
    ax.set_xticks(range(len(ix.shapes)), list(ix.shapes))
    _legend_outside(fig, ax, "right")
    _fit_title(fig, ax, title)
    ax.grid(axis="x", visible=False)
    return Plot("bandwidth", "HBM-floor bandwidth per arm", fig)


def sweep_plots(ix: ResultIndex) -> Iterator[Plot]:
    colors = arm_colors(ix.arms)
    floors = shape_floors(ix.result)
    for family, fixtures in ix.sweeps().items():
        ms = [f.M for f in fixtures]
        fig = Figure(figsize=(7.6, 3.6), layout="constrained")
        ax = fig.add_subplot()
        for arm in ix.arms:
            pts = [(f.M, ix.summary(f.name, arm), f.name) for f in fixtures]
            beaten = [(m, s.median_ns / 1e3) for m, s, name in pts
                      if s is not None and arm_floor(s, floors.get(name)).understated]
            pts = [(m, s.median_ns / 1e3) for m, s, _ in pts if s is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=colors[arm], label=arm)
            if beaten:  # points under a floor: the floor there was understated
                ax.plot(*zip(*beaten), linestyle="none", marker="x", markersize=9, color="red",
                        label=f"{arm}: {UNDERSTATED}")
        for floor in floor_series(ix.result, fixtures):  # the crossover shows which limit binds at each M
            ax.plot(floor.ms, floor.us, color="0.35", linewidth=1.2, label=floor.label,
                    linestyle=":" if floor.kind == FP8 else "--")
        _log2_m_axis(ax, ms)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("median µs")
        _legend_outside(fig, ax, "right")
        _fit_title(fig, ax, f"family {family}: duration against M — {ix.metric.plot_label}")
        yield Plot(f"sweep-{family}-duration", f"family {family}: duration against M", fig)

        compared = [a for a in ix.arms if any(ix.ratio(f.name, a) for f in fixtures)]
        if not compared:
            continue
        fig = Figure(figsize=(7.6, 3.6), layout="constrained")
        ax = fig.add_subplot()
        ax.axhline(1.0, color="0.4", linewidth=1)
        for arm in compared:
            pts = [(f.M, ix.ratio(f.name, arm)) for f in fixtures]
            pts = [(m, r) for m, r in pts if r is not None]
            xs = [m for m, _ in pts]
            med = [r.median for _, r in pts]
            err = [[r.median - r.low for _, r in pts], [r.high - r.median for _, r in pts]]
            ax.errorbar(xs, med, yerr=err, marker="o", capsize=2, color=colors[arm], label=f"{ix.ref} / {arm}")
        _log2_m_axis(ax, ms)
        ax.set_ylabel(f"speedup over {ix.ref} (×)")
        _legend_outside(fig, ax, "right")
        _fit_title(fig, ax, f"family {family}: speedup against M (median; bars: range over rounds)")
        yield Plot(f"sweep-{family}-speedup", f"family {family}: speedup against M", fig)


def _legend_outside(fig: Figure, ax, where: str = "below") -> None:
    """The axes' legend outside them (right of them, or below), so it covers no data."""
    handles, labels = ax.get_legend_handles_labels()
    if where == "right":
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    else:
        fig.legend(handles, labels, loc="outside lower center", fontsize=8)


def _fit_title(fig: Figure, ax, text: str) -> None:
    """The axes' title, broken into lines at spaces until it is no wider than the axes: centred
    over them, it then stays inside the figure and clear of a legend beside them. Widths are read
    from a layout pass (the figure's renderer), as drawn."""
    ax.set_title(text)
    for _ in range(4):
        fig.draw_without_rendering()
        title, box = ax.title.get_window_extent(), ax.get_window_extent()
        if title.width <= box.width:
            return
        longest = max(len(line) for line in ax.get_title().splitlines())
        width = max(12, int(longest * box.width / title.width) - 1)
        ax.set_title(textwrap.fill(text, width))


def _log2_m_axis(ax, ms: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ms))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_xlabel("M (tokens), log2")


# --- registry and writing --------------------------------------------------------------

PER_SHAPE: dict[str, Callable[[ResultIndex, str], Plot | None]] = {
    "samples": samples_plot,
    "ratios": ratios_plot,
}
PER_RUN: dict[str, Callable[[ResultIndex], Iterator[Plot]]] = {
    "bandwidth": lambda ix: iter([bandwidth_plot(ix)]),
    "sweep": sweep_plots,
}


def make_plots(ix: ResultIndex) -> list[Plot]:
    """Every plot of a timed result; none of one without timings (`verify --determinism`'s)."""
    plots: list[Plot] = []
    if not ix.result.summaries:
        return plots
    with matplotlib.rc_context(STYLE):
        for shape in ix.shapes:
            for make in PER_SHAPE.values():
                plot = make(ix, shape)
                if plot is not None:
                    plots.append(plot)
        for make in PER_RUN.values():
            plots.extend(make(ix))
    return plots


@dataclass(frozen=True)
class WrittenPlot:
    title: str
    paths: tuple[Path, ...]  # one per format, PNG first


def plot_filename(prefix: str, name: str, fmt: str) -> str:
    """`stock-A8-samples.png`: a prefix is kept apart from the plot's name by a `-`, unless it
    ends in a separator of its own (`run-`, `run_`, `run.`)."""
    if prefix and not prefix.endswith(("-", "_", ".")):
        prefix += "-"
    # a model shape's name has slashes (`deepseek-v3/ep8/M8-samples`): one file, not folders
    return f"{prefix}{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.{fmt}"


def write_plots(ix: ResultIndex, out_dir: str | Path, prefix: str = "") -> list[WrittenPlot]:
    """Every plot of the result into `out_dir` as `plot_filename(prefix, name, fmt)`, PNG and SVG,
    each written whole or not at all (rendered in memory, then an atomic rename): a report killed
    midway leaves no part of an image. Only the last level of `out_dir` is made."""
    out_dir = Path(out_dir)
    out_dir.mkdir(exist_ok=True)
    written = []
    with matplotlib.rc_context(STYLE):
        for plot in make_plots(ix):
            paths = []
            for fmt in FORMATS:
                path = out_dir / plot_filename(prefix, plot.name, fmt)
                image = io.BytesIO()
                plot.figure.savefig(image, format=fmt, dpi=150, metadata=METADATA[fmt])
                atomic_write(path, image.getvalue())
                paths.append(path)
            written.append(WrittenPlot(plot.title, tuple(paths)))
    return written
