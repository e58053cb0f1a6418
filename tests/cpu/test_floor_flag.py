"""An arm above 100% of its measured read bandwidth is flagged "floor understated" in every
view (terminal table, Markdown, CSV, compare, plots), never shown as a plain 107%, and every
view takes the numbers through one function (roofline.arm_floor)."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from result_factory import READ_BANDWIDTH, make_result, sweep_result

from moebench.analysis.compare import compare_results
from moebench.views.csv_view import result_frame
from moebench.record.index import ResultIndex
from moebench.views.markdown import render_markdown
from moebench.views.plots import bandwidth_plot, make_plots
from moebench.analysis.roofline import UNDERSTATED, arm_floor, shape_floors, understated_arms
from moebench.views.roofline_view import read_floor_text, sweep_floor_rows
from moebench.record.schema import ReadFloor
from moebench.views.tables import make_console, print_tables


def beaten(**kwargs):
    """A run whose read probe read 10% under the fastest arm's floor rate: that arm beats it."""
    top = max(s.fraction_of_read_bandwidth for s in make_result(**kwargs).summaries)
    return make_result(read_bandwidth=READ_BANDWIDTH * top / 1.10, **kwargs)


def test_the_flag_follows_the_numbers():
    r = beaten()
    floors = shape_floors(r)
    flagged = understated_arms(r)
    assert flagged
    for s in r.summaries:
        f = arm_floor(s, floors[s.shape])
        assert f.read_share == s.fraction_of_read_bandwidth
        assert f.share_understated == (s.fraction_of_read_bandwidth > 1)
        assert f.multiple == pytest.approx(s.median_ns / floors[s.shape].floor_ns)
        assert f.understated == ((s.shape, s.arm) in {(a, b) for a, b, _ in flagged})
    assert not understated_arms(make_result())  # the factory's arms sit under the floor
    assert not arm_floor(None, None).understated


def test_every_view_flags_an_arm_above_its_floor():
    r = beaten()
    shape, arm, f = understated_arms(r)[0]
    pct = f"{100 * f.read_share:.0f}%"
    out = io.StringIO()
    print_tables(r, make_console(out))
    text = out.getvalue()
    # the cell wraps in a narrow terminal: "110% (floor" over "understated)"
    assert f"{pct} (floor" in text and "understated)" in text and f"{UNDERSTATED}: {arm} at {shape}" in text
    assert text.count(f"{pct}") == text.count(f"{pct} (floor")  # never a plain 110%
    md = render_markdown(r)
    assert f"{100 * f.read_share:.1f}% ({UNDERSTATED})" in md and f"**{UNDERSTATED[0].upper()}" in md
    frame = result_frame(r)
    flags = frame[(frame.metric == "floor_understated")]
    got = {(row.shape, row.arm): row.value for row in flags.itertuples()}
    assert got[(shape, arm)] == 1.0 and sorted(set(got.values())) == [0.0, 1.0]
    assert len(got) == len(r.summaries)
    c = compare_results(make_result(), r)
    assert any(n.startswith(f"B: {UNDERSTATED}: {arm} at {shape} ({pct} of its read bandwidth)") for n in c.notes)
    plot = bandwidth_plot(ResultIndex(r))
    labels = [t.get_text() for t in plot.figure.axes[0].texts]
    assert any(t.endswith(UNDERSTATED) and t.startswith(f"{100 * f.read_share:.0f}") for t in labels)
    assert all(UNDERSTATED not in t for t in labels if float(t.split()[0]) <= 100)


def test_sweep_views_flag_the_points_under_a_floor():
    r = beaten(shapes=("A1", "A4", "A16"))
    r = replace(r, fixtures=r.fixtures)  # a sweep of family A
    ((_, header, rows),) = sweep_floor_rows(ResultIndex(r))
    cells = [c for row in rows for c in row[5:]]
    assert any(c.endswith(f"× ({UNDERSTATED})") for c in cells)
    plot = next(p for p in make_plots(ResultIndex(r)) if p.name == "sweep-A-duration")
    marks = [ln for ln in plot.figure.axes[0].get_lines() if ln.get_label().endswith(UNDERSTATED)]
    assert marks and all(ln.get_marker() == "x" for ln in marks)
    assert not [ln for ln in next(p for p in make_plots(ResultIndex(sweep_result(ms=(1, 4, 16))))
                                  if p.name == "sweep-A-duration").figure.axes[0].get_lines()
                if ln.get_label().endswith(UNDERSTATED)]


def test_the_read_floor_is_described_with_its_layout_and_datasheet():
    r = make_result()
    gpu = r.provenance.gpu
    assert "a torch.sum read, as files of schema 1 measured it" in read_floor_text(gpu)
    rf = ReadFloor(4.3e12, "8x256x4", "m", 2**30, 20, {"8x256x4": 4.3e12, "2x512x8": 4.1e12}, 4.8e12, "sheet")
    text = read_floor_text(replace(gpu, read_floor=rf))
    assert text == "4.30 TB/s (read kernel, best of 2 layouts: 8x256x4; datasheet 4.80 TB/s, measured 90% of it)"
    assert "measured read bandwidth | 4.30 TB/s (read kernel" in render_markdown(
        replace(r, provenance=replace(r.provenance, gpu=replace(gpu, read_floor=rf))))
