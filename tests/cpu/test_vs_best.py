"""Ratios against the best of the stock and peer arms (moebench.analysis.stats.best_ratios) on synthetic
runs: the best is the fastest of `triton`, `triton-tuned`, `sglang`, `cublas` present, per shape;
each arm's ratio is best-row / arm-row paired by round; the terminal table and the Markdown show
it beside the ratio against the ref, within 100 columns."""

from __future__ import annotations

import io
from statistics import median

import pytest

from moebench.views.markdown import render_markdown
from moebench.views.tables import make_console, print_tables
from moebench.analysis.stats import BEST_OF, best_arms, best_ratios, rows_by_round, summary_samples
from result_factory import make_result
from synthetic_runs import lognormal, run_of


def test_best_of_names_the_stock_and_peer_arms():
    assert BEST_OF == ("triton", "triton-tuned", "sglang", "cublas")


def test_ratio_against_the_fastest_peer_paired_by_round():
    run = run_of({"triton": lognormal(), "sglang": lognormal(shift=-0.05), "cublas": lognormal(shift=0.2),
                  "cuda-fused": lognormal(shift=-0.3)}, seed=3)
    best = {b.arm: b for b in best_ratios(run)}
    assert {b.best for b in best.values()} == {"sglang"} and best["sglang"].ratio is None
    rows = {arm: rows_by_round((s.round, s.value_ns) for s in summary_samples(run) if s.arm == arm)
            for arm in ("sglang", "cuda-fused")}
    want = median(rows["sglang"][r] / rows["cuda-fused"][r] for r in rows["sglang"])
    fused = best["cuda-fused"].ratio
    assert fused.ref == "sglang" and fused.median == pytest.approx(want) and fused.rounds == 5
    assert 1.25 < fused.median < 1.45  # 0.95 / 0.70
    assert best["triton"].ratio.median < 1.0 and best["cublas"].ratio.median < 1.0


def test_the_best_is_chosen_per_shape():
    run = make_result(shapes=("A8", "Q8"), arms=("triton", "cublas", "cuda-fused"),
                      scale={("A8", "cublas"): 0.5, ("Q8", "cublas"): 1.5})
    assert best_arms(run) == {"A8": "cublas", "Q8": "triton"}
    by = {(b.shape, b.arm): b for b in best_ratios(run)}
    assert by[("A8", "cuda-fused")].ratio.ref == "cublas" and by[("Q8", "cuda-fused")].ratio.ref == "triton"


def test_one_peer_arm_makes_no_best_table():
    run = make_result(shapes=("A8",), arms=("triton", "cuda-fused"))
    assert best_ratios(run) == ()
    assert "vs the best" not in _terminal(run) and "Against the best" not in render_markdown(run)


def _terminal(run) -> str:
    out = io.StringIO()
    print_tables(run, make_console(out))
    return out.getvalue()


def test_tables_show_it_beside_the_ref_within_100_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    run = make_result(shapes=("A8", "A128"), arms=("cuda-fused", "triton", "triton-tuned", "sglang", "cublas"),
                      scale={"triton-tuned": 1.2, "cublas": 1.1})
    text = _terminal(run)
    assert "vs the best of triton, triton-tuned, sglang, cublas" in " ".join(text.split())
    for line in text.splitlines():
        assert len(line) <= 100 and "…" not in line, line
    table = text[text.index("vs the best of"):]
    table = table[:table.index("└")]
    rows = [[c.strip() for c in line.strip("│").split("│")]
            for line in table.splitlines() if line.startswith("│")]
    shape = None
    for cells, b in zip(rows, best_ratios(run)):
        shape = cells[0] or shape
        assert (shape, cells[1]) == (b.shape, b.arm)
        assert cells[3] == ("best" if b.ratio is None else f"{b.ratio.median:.3f}")
    assert len(rows) == len(best_ratios(run)) == 10
    md = render_markdown(run)
    assert "| shape | arm | vs `cuda-fused` | vs best | best | rounds won vs best |" in md
    fused = next(b for b in best_ratios(run) if b.shape == "A8" and b.arm == "cuda-fused")
    ref_ratio = next(r for r in run.ratios if (r.shape, r.arm) == ("A8", "triton"))
    assert f"| A8 | `cuda-fused` | ref | {fused.ratio.median:.3f} | `{fused.best}` |" in md
    assert f"| A8 | `triton` | {ref_ratio.median:.3f} |" in md


def test_csv_gives_every_arm_against_the_best_with_the_best_named():
    from moebench.views.csv_view import result_frame
    run = make_result(shapes=("A8", "Q8"), arms=("triton", "cublas", "cuda-fused"),
                      scale={("A8", "cublas"): 0.5, ("Q8", "cublas"): 1.5})
    frame = result_frame(run)
    rows = frame[(frame.kind == "vs_best") & (frame.metric == "ratio_median")]
    got = {(r.shape, r.arm): (r.ref, r.value) for r in rows.itertuples()}
    want = {(b.shape, b.arm): (b.best, b.ratio.median) for b in best_ratios(run) if b.ratio is not None}
    assert got.keys() == want.keys()
    for key, (best, value) in want.items():
        assert got[key][0] == best and got[key][1] == pytest.approx(value)
    assert ("A8", "cublas") not in got and ("Q8", "triton") not in got  # the best is not its own row
    assert set(rows.unit) == {"best/arm"}
    single = make_result(shapes=("A8",), arms=("triton", "cuda-fused"))
    assert "vs_best" not in set(result_frame(single).kind)
