"""`moebench report`: every format and plot from a saved RunResult, on the CPU.

Runs on synthetic results (tests/helpers/result_factory.py) and, when there are any, on the
committed H200 runs under results/h200/.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from moebench.views.csv_view import render_csv, result_frame
from moebench.views.formats import FORMATS
from moebench.record.index import ResultIndex
from moebench.views.markdown import Image, method_sentence, render_markdown
from moebench.views.plots import make_plots, write_plots
from moebench.analysis.load import load, loads
from moebench.record.store import save
from result_factory import make_result, run_cli, sweep_result

ROOT = Path(__file__).resolve().parents[2]
# Timed runs; a `verify --determinism` file holds verdicts and no samples (its own test below).
H200_RESULTS = sorted(p for p in (ROOT / "results" / "h200").glob("*.json") if not p.name.startswith("determinism-"))
H200_VERDICT_FILES = sorted((ROOT / "results" / "h200").glob("determinism-*.json"))


def _h200_params():
    if not H200_RESULTS:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no committed H200 results under results/h200/ yet"))]
    return [pytest.param(p, id=p.name) for p in H200_RESULTS]


@pytest.fixture(scope="module")
def synthetic():
    return make_result(shapes=("A8", "Q128"), arms=("triton", "cuda-swapab", "cuda-fused"), rounds=4, samples=6)


@pytest.fixture(scope="module", params=["synthetic", "events"] + [str(p) for p in H200_RESULTS])
def any_result(request):
    """Every result the views must handle: synthetic CUPTI, synthetic events, committed runs."""
    if request.param == "synthetic":
        return make_result(rounds=3, samples=4)
    if request.param == "events":
        return make_result(rounds=3, samples=4, timer="events", read_bandwidth=None)
    return load(request.param)


# --- Markdown --------------------------------------------------------------------------

def test_markdown_has_every_part(synthetic):
    md = render_markdown(synthetic)
    assert md.startswith("### moebench: A8, Q128 on NVIDIA H200")
    assert "| shape | arm | median µs |" in md
    assert "Per round" in md and "| round 1 | round 2 | round 3 | round 4 |" in md
    assert "L2 flushed cold and clean" in md and "CUPTI" in md and "4 rounds × 6 samples" in md
    assert "<details><summary>Provenance</summary>" in md
    for fx in synthetic.fixtures:
        assert fx.fingerprint in md
    for arm in synthetic.arms:
        assert arm.identity["source_sha256"] in md
    assert "driver 580.159" in md and synthetic.provenance.git_commit in md
    assert "```sh\nmoebench run --shape A8,Q128 --arms triton,cuda-swapab,cuda-fused" in md


def test_markdown_numbers_come_from_the_result(synthetic):
    """The summary shows the stored statistics, formatted: medians in µs, ratios with range and rounds won."""
    md = render_markdown(synthetic)
    ix = ResultIndex(synthetic)
    for s in synthetic.summaries:
        assert f"{s.median_ns / 1e3:,.2f}" in md
        for row in s.row_medians_ns:
            assert f"{row / 1e3:,.2f}" in md
    for r in synthetic.ratios:
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {r.shape} | `{r.arm}` |"))
        assert f"**{r.median:.3f}×**" in line
        assert f"{r.low:.3f}×–{r.high:.3f}×" in line
        assert f"{r.rounds_won}/{r.rounds}" in line
    ref_line = next(ln for ln in md.splitlines() if ln.startswith(f"| A8 | `{ix.ref}` (ref) |"))
    assert "| — | — | — |" in ref_line


def test_markdown_tables_are_rectangular(synthetic):
    for block in render_markdown(synthetic).split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if rows:
            widths = {ln.replace("\\|", "").count("|") for ln in rows}
            assert len(widths) == 1, block


def test_markdown_warns_on_failed_audit_and_events_timer():
    from dataclasses import replace

    from moebench.record.schema import Audit
    r = make_result(rounds=2, samples=2, timer="events")
    r = replace(r, audit=Audit(samples_total=8, samples_passed=7, dropped_records=1))
    md = render_markdown(r)
    assert "**Audit failed:** 7/8 samples passed, 1 dropped records" in md
    assert "Timer: **events**" in md
    assert "CUDA events" in method_sentence(r.settings)


def test_markdown_embeds_images():
    md = render_markdown(make_result(rounds=2, samples=2), [Image("A8: samples", "img/A8-samples.png")])
    assert "![A8: samples](img/A8-samples.png)" in md


# --- CSV -------------------------------------------------------------------------------

def test_csv_one_row_per_sample_and_per_summary_cell(synthetic):
    frame = pd.read_csv(io.StringIO(render_csv(synthetic)))
    samples = frame[frame.kind == "sample"]
    assert len(samples) == len(synthetic.samples)
    assert list(samples.value) == [s.value_ns for s in synthetic.samples]
    assert list(samples.kernels) == [len(s.kernels) for s in synthetic.samples]

    summary = frame[frame.kind == "summary"]
    for s in synthetic.summaries:
        mine = summary[(summary["shape"] == s.shape) & (summary["arm"] == s.arm)]
        assert mine[mine.metric == "median"].value.item() == pytest.approx(s.median_ns)
        rows = mine[mine.metric == "row_median"].sort_values("round")
        assert list(rows["round"]) == list(range(1, synthetic.settings.rounds + 1))
        assert list(rows.value) == pytest.approx(list(s.row_medians_ns))
        assert mine[mine.metric == "fraction_of_read_bandwidth"].unit.item() == "fraction"

    ratios = frame[frame.kind == "ratio"]
    for r in synthetic.ratios:
        mine = ratios[(ratios["shape"] == r.shape) & (ratios["arm"] == r.arm)]
        assert set(mine.ref) == {r.ref}
        assert mine[mine.metric == "ratio_median"].value.item() == pytest.approx(r.median)
        assert mine[mine.metric == "rounds_won"].value.item() == r.rounds_won
        assert list(mine[mine.metric == "ratio_round"].value) == pytest.approx(list(r.per_round))
    parity = frame[frame.kind == "parity"]
    for p in synthetic.parity:
        mine = parity[(parity["shape"] == p.shape) & (parity["arm"] == p.arm)]
        assert mine[mine.metric == "rel_l2"].value.item() == pytest.approx(p.rel_l2) and set(mine.ref) == {p.oracle}
    assert set(frame.kind) == {"sample", "summary", "ratio"} | ({"parity"} if synthetic.parity else set())


def test_csv_every_row_has_a_metric_and_unit(synthetic):
    frame = result_frame(synthetic)
    assert frame.metric.notna().all() and frame.unit.notna().all() and frame.value.notna().all()
    assert str(frame["round"].dtype) == "Int64"


def test_csv_events_result_names_its_metric():
    frame = result_frame(make_result(rounds=2, samples=2, timer="events", read_bandwidth=None))
    samples = frame[frame.kind == "sample"]
    assert set(samples.metric) == {"events"}
    assert samples.gpu_span_ns.isna().all()
    assert "fraction_of_read_bandwidth" not in set(frame.metric)


# --- every format, every result ---------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_renders(any_result, fmt):
    out = io.StringIO()
    FORMATS[fmt](any_result, out, ())
    text = out.getvalue()
    assert text.strip()
    if fmt == "json":
        assert loads(text) == any_result
    if fmt == "csv":
        assert len(pd.read_csv(io.StringIO(text))) > len(any_result.samples)


def test_every_plot_renders(any_result, tmp_path):
    written = write_plots(ResultIndex(any_result), tmp_path)
    names = {p.paths[0].stem for p in written}
    ix = ResultIndex(any_result)
    for shape in ix.shapes:
        assert f"{shape}-samples" in names
        assert (f"{shape}-ratios" in names) == bool(ix.compared_arms(shape))
    assert "bandwidth" in names
    for plot in written:
        png, svg = plot.paths
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in svg.read_bytes()[:1000]


# --- plots -----------------------------------------------------------------------------

def test_sweep_plots_use_a_log2_m_axis():
    result = sweep_result(ms=(1, 4, 16, 64), rounds=3, samples=3)
    plots = {p.name: p for p in make_plots(ResultIndex(result))}
    assert {"sweep-A-duration", "sweep-A-speedup"} <= set(plots)
    ax = plots["sweep-A-duration"].figure.axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16", "64"]
    assert ax.get_yscale() == "log"
    speedup = plots["sweep-A-speedup"].figure.axes[0]
    assert speedup.get_xscale() == "log"


def test_two_shapes_of_one_family_are_not_a_sweep():
    names = {p.name for p in make_plots(ResultIndex(make_result(rounds=2, samples=2)))}
    assert not any(n.startswith("sweep-") for n in names)


def test_plots_are_reproducible(tmp_path):
    result = make_result(shapes=("A8",), rounds=2, samples=3)
    first = write_plots(ResultIndex(result), tmp_path / "a")
    second = write_plots(ResultIndex(result), tmp_path / "b")
    for x, y in zip(first, second):
        for p, q in zip(x.paths, y.paths):
            assert p.read_bytes() == q.read_bytes(), p.name


def test_bandwidth_plot_falls_back_to_tb_per_s_without_a_measured_bandwidth():
    result = make_result(rounds=2, samples=2, read_bandwidth=None)
    plot = next(p for p in make_plots(ResultIndex(result)) if p.name == "bandwidth")
    assert plot.figure.axes[0].get_ylabel() == "TB/s"


# --- the command -----------------------------------------------------------------------

@pytest.mark.parametrize("path", _h200_params())
def test_report_command_on_committed_h200_results(path, tmp_path):
    code, out, err = run_cli(["report", str(path), "--format", "markdown",
                              "--output", str(tmp_path / "h200.md"), "--plot", str(tmp_path / "img")])
    assert code == 0, err
    md = (tmp_path / "h200.md").read_text()
    assert "### moebench:" in md and "](img/" in md
    for link in (ln.split("](", 1)[1].rstrip(")") for ln in md.splitlines() if ln.startswith("![")):
        assert (tmp_path / link).is_file()


def test_report_writes_docs_assets(tmp_path):
    """The command that regenerates the README's assets: Markdown linking the plots beside it."""
    path = save(make_result(rounds=3, samples=3), tmp_path / "run.json")
    docs = tmp_path / "docs"
    docs.mkdir()  # a report makes no folder tree; --plot makes its own last folder
    code, out, err = run_cli(["report", str(path), "--format", "markdown", "--output", str(docs / "h200.md"),
                              "--plot", str(docs / "img"), "--prefix", "run-"])
    assert code == 0, err
    md = (docs / "h200.md").read_text()
    assert "![A8: samples by round](img/run-A8-samples.png)" in md
    assert (docs / "img" / "run-A8-samples.svg").is_file()
    assert out == ""


@pytest.mark.parametrize("fmt", ["markdown", "csv", "json", "table"])
def test_report_command_prints_each_format(fmt, tmp_path):
    result = make_result(rounds=2, samples=2)
    path = save(result, tmp_path / "run.json")
    code, out, err = run_cli(["report", str(path), "--format", fmt])
    assert code == 0, err
    assert out.strip()
    if fmt == "json":
        assert json.loads(out)["format"] == "moebench.RunResult"


def test_factory_statistics_agree_with_moebench_stats():
    """The synthetic results are filled the way a real run fills them."""
    from moebench.analysis.stats import summarize
    r = make_result(shapes=("A8", "Q128"), arms=("triton", "cuda-swapab", "cuda-fused"), rounds=4, samples=5)
    summaries, ratios = summarize(r.samples, r.settings.shapes, r.settings.arms, r.settings.ref,
                                  {f.name: f.floors.hbm_bytes for f in r.fixtures},
                                  r.provenance.gpu.read_bandwidth_bytes_per_s)
    for mine, theirs in zip(r.summaries, summaries, strict=True):
        assert (mine.shape, mine.arm) == (theirs.shape, theirs.arm)
        assert mine.median_ns == pytest.approx(theirs.median_ns)
        assert mine.row_medians_ns == pytest.approx(theirs.row_medians_ns)
        assert mine.hbm_bandwidth_bytes_per_s == pytest.approx(theirs.hbm_bandwidth_bytes_per_s)
        assert mine.fraction_of_read_bandwidth == pytest.approx(theirs.fraction_of_read_bandwidth)
    for mine, theirs in zip(r.ratios, ratios, strict=True):
        assert (mine.shape, mine.arm, mine.ref) == (theirs.shape, theirs.arm, theirs.ref)
        assert mine.median == pytest.approx(theirs.median)
        assert (mine.low, mine.high, mine.rounds_won) == pytest.approx((theirs.low, theirs.high, theirs.rounds_won))


def test_summary_format_is_the_first_screen_only():
    result = make_result(rounds=2, samples=2)
    out = io.StringIO()
    FORMATS["summary"](result, out, ())
    text = out.getvalue()
    full = io.StringIO()
    FORMATS["markdown"](result, full, ())
    assert text.startswith("### moebench:") and "rounds won" in text and "Each sample is one call" in text
    assert "Per round" not in text and "Per round" in full.getvalue()
    assert full.getvalue().startswith(text.rsplit("\n\n", 1)[0].split("\n\n")[0])


def test_report_ref_retakes_the_ratios_against_another_arm_of_the_run(tmp_path):
    from moebench.analysis.stats import with_ref
    r = make_result(shapes=("A8",), arms=("triton", "cuda-swapab", "cuda-fused"), rounds=4, samples=5)
    s = with_ref(r, "cuda-swapab")
    assert s.settings.ref == "cuda-swapab" and s.summaries == r.summaries
    got = {x.arm: x for x in s.ratios}
    assert set(got) == {"triton", "cuda-fused"}
    # per round: swapab row / fused row, from the same rows the original ratios used
    rows = {a: {x.shape: x.row_medians_ns for x in r.summaries if x.arm == a}["A8"] for a in r.settings.arms}
    per_round = sorted(a / b for a, b in zip(rows["cuda-swapab"], rows["cuda-fused"]))
    assert got["cuda-fused"].median == pytest.approx((per_round[1] + per_round[2]) / 2)
    med = {x.arm: x.median_ns for x in r.summaries}
    for arm in ("triton", "cuda-fused"):  # > 1 exactly where the arm is the faster of the pair
        assert (got[arm].median > 1) == (med[arm] < med["cuda-swapab"])
    assert with_ref(r, "triton") is r

    path = save(r, tmp_path / "run.json")
    code, out, err = run_cli(["report", str(path), "--format", "markdown", "--ref", "cuda-swapab"])
    assert code == 0, err
    assert "vs `cuda-swapab`" in out and "`cuda-swapab` (ref)" in out
    code, out, err = run_cli(["report", str(path), "--ref", "nope"])
    assert code == 2 and "not an arm of this run" in err and "Traceback" not in err


@pytest.mark.parametrize("path", H200_VERDICT_FILES, ids=lambda p: p.name)
def test_a_file_of_verdicts_reports_its_table_and_draws_no_plot(path, tmp_path):
    code, out, err = run_cli(["report", str(path), "--format", "markdown",
                              "--output", str(tmp_path / "v.md"), "--plot", str(tmp_path / "img")])
    assert code == 0, err
    md = (tmp_path / "v.md").read_text()
    assert "### moebench determinism:" in md and "cuda-fused-det" in md and "](img/" not in md
    assert not list((tmp_path / "img").glob("*.png"))
