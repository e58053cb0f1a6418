"""The compute floor beside the HBM floor: the datasheet peak table, the two floors of a
shape, which one binds, and how the tables and the sweep plot show them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from moebench.record.device_peaks import FP8_DENSE_PEAKS, fp8_dense_peak
from moebench.record.index import ResultIndex
from moebench.views.markdown import render_markdown
from moebench.views.plots import make_plots
from moebench.analysis.roofline import FP8, HBM, floor_series, shape_floors, times_floor
from moebench.views.roofline_view import FLOOR_HEADER, sweep_floor_rows
from moebench.record.schema import CellInfo, Sharding
from moebench.analysis.load import load
from result_factory import make_result, sweep_result

SWEEP_A = Path(__file__).resolve().parents[2] / "results" / "h200" / "sweep-A.json.gz"


# --- the peak table ----------------------------------------------------------------------

@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H200", 1979), ("NVIDIA H100 80GB HBM3", 1979), ("NVIDIA H100 PCIe", 1513),
])
def test_known_boards_have_their_dense_datasheet_peak(name, tflops):
    peak = fp8_dense_peak(name)
    assert peak is not None and peak.fp8_dense_flops_per_s == tflops * 1e12
    assert "datasheet" in peak.source and f"{2 * tflops:,}" in peak.source  # the sparse figure it halves


@pytest.mark.parametrize("name", ["NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB", "H200", "", None])
def test_a_board_not_in_the_table_has_no_peak(name):
    assert fp8_dense_peak(name) is None


def test_every_peak_is_keyed_by_its_own_name():
    assert all(p.gpu_name == name for name, p in FP8_DENSE_PEAKS.items())


# --- the floors of a committed H200 sweep ------------------------------------------------

@pytest.fixture(scope="module")
def sweep_a():
    return load(SWEEP_A)


def test_floors_of_a_committed_result(sweep_a):
    floors = shape_floors(sweep_a)
    bw = sweep_a.provenance.gpu.read_bandwidth_bytes_per_s
    assert set(floors) == {f.name for f in sweep_a.fixtures}
    for fx in sweep_a.fixtures:
        f = floors[fx.name]
        assert f.fp8_floor_ns == pytest.approx(fx.floors.flops / 1979e12 * 1e9, rel=1e-12)
        assert f.hbm_floor_ns == pytest.approx(fx.floors.hbm_bytes / bw * 1e9, rel=1e-12)
        # the run's own summary reaches the same HBM floor another way: median × fraction of read BW
        s = next(s for s in sweep_a.summaries if s.shape == fx.name)
        assert f.hbm_floor_ns == pytest.approx(s.median_ns * s.fraction_of_read_bandwidth, rel=1e-9)
        assert f.binding == HBM  # these are decode shapes: bytes bind at every M up to 256
        assert times_floor(s.median_ns, f) == pytest.approx(s.median_ns / f.hbm_floor_ns)
    # the FP8 floor grows with M as the FLOPs do: 256x from A1 to A256
    assert floors["A256"].fp8_floor_ns / floors["A1"].fp8_floor_ns == pytest.approx(256)


def test_the_fp8_floor_binds_when_flops_outweigh_bytes(sweep_a):
    fx = sweep_a.fixtures[0]
    heavy = replace(fx, floors=replace(fx.floors, flops=fx.floors.hbm_bytes * 10_000))
    result = replace(sweep_a, fixtures=(heavy,) + sweep_a.fixtures[1:])
    f = shape_floors(result)[fx.name]
    assert f.fp8_floor_ns > f.hbm_floor_ns and f.binding == FP8
    assert times_floor(1e6, f) == pytest.approx(1e6 / f.fp8_floor_ns)


def test_unknown_gpu_has_no_fp8_floor_and_no_binding():
    r = make_result(rounds=2, samples=2)
    r = replace(r, provenance=replace(r.provenance, gpu=replace(r.provenance.gpu, name="NVIDIA A100-SXM4-80GB")))
    for f in shape_floors(r).values():
        assert f.fp8_floor_ns is None and f.hbm_floor_ns is not None and f.binding is None
        assert f.floor_ns == f.hbm_floor_ns  # a bound all the same


def test_no_measured_bandwidth_has_no_hbm_floor():
    for f in shape_floors(make_result(rounds=2, samples=2, read_bandwidth=None)).values():
        assert f.hbm_floor_ns is None and f.fp8_floor_ns is not None and f.binding is None


def test_a_sharded_cell_takes_its_own_device(sweep_a):
    r = make_result(shapes=("A8", "Q128"), rounds=2, samples=2)
    cell = CellInfo(shape="Q128", rank=1, host="h", device="cuda:1", gpu_name="NVIDIA H100 PCIe", gpu_uuid=None,
                    read_bandwidth_bytes_per_s=2.0e12, cost_estimate=1.0, started_at="", finished_at="")
    r = replace(r, sharding=Sharding(world_size=2, dist_backend="gloo", dry_run=False, request={}, cells=(cell,)))
    floors = shape_floors(r)
    q = next(f for f in r.fixtures if f.name == "Q128")
    assert floors["Q128"].fp8_floor_ns == pytest.approx(q.floors.flops / 1513e12 * 1e9)
    assert floors["Q128"].hbm_floor_ns == pytest.approx(q.floors.hbm_bytes / 2.0e12 * 1e9)
    assert floors["A8"].peak.gpu_name == "NVIDIA H200"  # not in a cell: the run's GPU


# --- the views ---------------------------------------------------------------------------

def _summary_rows(md: str) -> list[dict[str, str]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("| shape | arm | median µs")]
    start = md.splitlines().index(lines[0])
    table = []
    for ln in md.splitlines()[start:]:
        if not ln.startswith("|"):
            break
        table.append([c.strip() for c in ln.strip("|").split(" | ")])
    header, rows = table[0], table[2:]
    return [dict(zip(header, row)) for row in rows]


def test_markdown_summary_has_both_floors_and_the_binding_column(sweep_a):
    floors = shape_floors(sweep_a)
    rows = _summary_rows(render_markdown(sweep_a))
    assert len(rows) == len(sweep_a.summaries)
    for row, s in zip(rows, sweep_a.summaries):
        f = floors[s.shape]
        assert row["HBM floor µs"] == f"{f.hbm_floor_ns / 1e3:,.2f}"
        assert row["FP8 floor µs"] == f"{f.fp8_floor_ns / 1e3:,.2f}"
        assert row["binding"] == "HBM"
        assert row["× floor"] == f"{s.median_ns / f.hbm_floor_ns:,.2f}×"

    fx = sweep_a.fixtures[0]
    heavy = replace(fx, floors=replace(fx.floors, flops=fx.floors.hbm_bytes * 10_000))
    rows = _summary_rows(render_markdown(replace(sweep_a, fixtures=(heavy,) + sweep_a.fixtures[1:])))
    assert {r["binding"] for r in rows if r["shape"] == fx.name} == {FP8}
    assert {r["binding"] for r in rows if r["shape"] != fx.name} == {HBM}


def test_unknown_gpu_shows_dashes_never_a_peak():
    r = make_result(rounds=2, samples=2)
    r = replace(r, provenance=replace(r.provenance, gpu=replace(r.provenance.gpu, name="NVIDIA H200 NVL")))
    md = render_markdown(r)
    for row in _summary_rows(md):
        assert row["FP8 floor µs"] == "—" and row["binding"] == "—" and row["HBM floor µs"] != "—"
    assert "no datasheet peak for this GPU" in md and "TFLOP/s" not in md


def test_the_sweep_table_has_a_row_per_m_and_each_arm_over_the_floor():
    result = sweep_result(ms=(1, 4, 16, 64), arms=("triton", "cuda-fused"), rounds=3, samples=3)
    ((family, header, rows),) = sweep_floor_rows(ResultIndex(result))
    assert family == "A" and header[:5] == ["M", "shape", *FLOOR_HEADER[:3]]
    assert header[5:] == ["triton × floor", "cuda-fused × floor"]
    floors = shape_floors(result)
    assert [r[0] for r in rows] == ["1", "4", "16", "64"]
    for row in rows:
        f = floors[row[1]]
        assert row[4] == f.binding
        for arm, cell in zip(("triton", "cuda-fused"), row[5:]):
            s = next(s for s in result.summaries if (s.shape, s.arm) == (row[1], arm))
            assert cell == f"{s.median_ns / f.floor_ns:,.2f}×"
    md = render_markdown(result)
    assert "| M | shape | HBM floor µs | FP8 floor µs | binding | triton × floor | cuda-fused × floor |" in md
    assert not sweep_floor_rows(ResultIndex(make_result(rounds=2, samples=2)))  # two shapes are not a sweep


def test_the_sweep_duration_plot_draws_both_floors(sweep_a):
    plot = next(p for p in make_plots(ResultIndex(sweep_a)) if p.name == "sweep-A-duration")
    (ax,) = plot.figure.axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    hbm = next(ln for label, ln in lines.items() if label.startswith("HBM floor"))
    fp8 = next(ln for label, ln in lines.items() if label.startswith("FP8 floor"))
    assert "1,979 TFLOP/s" in fp8.get_label() and "4.16 TB/s" in hbm.get_label()
    floors = shape_floors(sweep_a)
    fixtures = sorted(sweep_a.fixtures, key=lambda f: f.M)
    assert list(hbm.get_xdata()) == list(fp8.get_xdata()) == [f.M for f in fixtures]
    assert list(fp8.get_ydata()) == pytest.approx([floors[f.name].fp8_floor_ns / 1e3 for f in fixtures])
    assert list(hbm.get_ydata()) == pytest.approx([floors[f.name].hbm_floor_ns / 1e3 for f in fixtures])
    legend = [t.get_text() for t in plot.figure.legends[0].get_texts()]
    assert hbm.get_label() in legend and fp8.get_label() in legend


def test_the_sweep_plot_leaves_out_a_floor_it_cannot_draw():
    result = sweep_result(ms=(1, 4, 16), rounds=2, samples=2)
    result = replace(result, provenance=replace(result.provenance,
                                                gpu=replace(result.provenance.gpu, name="NVIDIA B200")))
    plot = next(p for p in make_plots(ResultIndex(result)) if p.name == "sweep-A-duration")
    labels = [ln.get_label() for ln in plot.figure.axes[0].get_lines()]
    assert any(lab.startswith("HBM floor") for lab in labels)
    assert not any(lab.startswith("FP8 floor") for lab in labels)
    assert [s.kind for s in floor_series(result, result.fixtures)] == [HBM]
