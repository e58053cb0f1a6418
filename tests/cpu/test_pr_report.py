"""`report --format pr`: a paste that fits a GitHub comment, and bold only for a win.

The sizes are checked on the committed runs: the four reference shapes (results/h200/all-arms.json)
within 8 KB, every committed sweep within 64 KB; the cut on a synthetic run made too big for it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moebench.analysis.compare import compare_results
from moebench.views.compare_view import render_markdown as compare_markdown
from moebench.views.markdown import render_markdown
from moebench.views.pr_view import render_pr
from moebench.analysis.load import load
from moebench.analysis.ratio_verdicts import ratio_verdicts
from moebench.analysis.verdicts import Verdict
from result_factory import make_result, run_cli

ROOT = Path(__file__).resolve().parents[2]
FOUR_SHAPES = ROOT / "results" / "h200" / "all-arms.json"
SWEEPS = sorted((ROOT / "results").glob("h*/sweep-*.json.gz"))
KB = 1024


@pytest.fixture(scope="module")
def four_shapes():
    return load(FOUR_SHAPES)


def _rows(text: str) -> list[list[str]]:
    """The cells of the paste's one result table (before the details block)."""
    table = text.split("<details>")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| shape")]


def test_four_reference_shapes_fit_8_kb_with_every_row_and_the_details(four_shapes):
    text = render_pr(four_shapes)
    assert len(text.encode("utf-8")) <= 8 * KB
    rows = _rows(text)
    assert [(r[0], r[1].split("`")[1]) for r in rows] == [(s.shape, s.arm) for s in four_shapes.summaries]
    assert text.count("<details>") == 1 and text.rstrip().endswith("</details>")
    assert "Left out" not in text
    assert " ".join(four_shapes.provenance.command) in text
    for f in four_shapes.fixtures:
        assert f.fingerprint[:16] in text


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_committed_sweep_fits_64_kb_with_every_row(path):
    result = load(path)
    text = render_pr(result)
    assert len(text.encode("utf-8")) <= 64 * KB
    assert len(_rows(text)) == len(result.summaries)
    # The old Markdown of the same file did not fit a comment: the pr format is the one to paste.
    assert len(render_markdown(result).encode("utf-8")) > len(text.encode("utf-8"))


def test_the_table_shows_each_ratio_with_its_range_and_verdict(four_shapes):
    verdicts = ratio_verdicts(four_shapes)
    rows = {(r[0], r[1].split("`")[1]): r for r in _rows(render_pr(four_shapes))}
    for r in four_shapes.ratios:
        shape, arm, us, ratio, verdict = rows[(r.shape, r.arm)]
        v = verdicts[(r.shape, r.arm)]
        assert ratio == f"{r.median:.3f}× [{v.ci[0]:.3f}, {v.ci[1]:.3f}]"
        assert v.ci[0] <= r.median <= v.ci[1]
        assert verdict.strip("*") == v.verdict.value
    ref_rows = [r for r in rows.values() if r[1].endswith("(ref)")]
    assert len(ref_rows) == len(four_shapes.settings.shapes) and all(r[4] == "ref" for r in ref_rows)


def test_a_paste_too_big_drops_details_then_rows_and_says_what():
    big = make_result(shapes=tuple(f"A{m}" for m in (1, 2, 4, 8, 16, 32, 64, 128)),
                      arms=("triton", "cuda-fused", "cuda-swapab", "sglang"), rounds=2, samples=2)
    full = render_pr(big)
    assert "Left out" not in full
    limit = len(full.encode("utf-8")) - 200
    cut = render_pr(big, limit_bytes=limit)
    assert len(cut.encode("utf-8")) <= limit
    assert "Left out to fit a comment: arm builds" in cut and "--format markdown" in cut
    tiny = render_pr(big, limit_bytes=2500)
    assert len(tiny.encode("utf-8")) <= 2500
    assert re.search(r"table rows after \w+ `[\w-]+` \(\d+ rows\)", tiny)
    assert "fixtures" in tiny.split("Left out")[1]


def test_cli_writes_the_pr_format():
    code, out, err = run_cli(["report", str(FOUR_SHAPES), "--format", "pr"])
    assert code == 0, err
    assert out.startswith("### moebench: A8, A128, Q8, Q128") and "<details>" in out


# --- bold marks a win, nothing else ---------------------------------------------------------

def _bold_rows(text: str) -> list[list[str]]:
    return [r for r in _rows(text) if any(c.startswith("**") for c in r)]


def test_pr_bold_only_for_faster(four_shapes):
    rows = _rows(render_pr(four_shapes))
    assert any(float(r[3].split("×")[0]) < 1 for r in rows if r[3] != "—")  # the file has regressions
    for r in rows:
        bold = r[4].startswith("**")
        assert bold == (r[4] == "**faster**")
        if r[3] != "—" and float(r[3].split("×")[0]) < 1:
            assert not bold


def test_markdown_bolds_a_ratio_only_when_its_verdict_is_a_win(four_shapes):
    text = render_markdown(four_shapes)
    verdicts = ratio_verdicts(four_shapes)
    summary = text.split("Per round")[0]
    checked = 0
    for line in summary.splitlines():
        m = re.match(r"\| (\w+) \| `([\w-]+)` \|", line)
        if not m or (m[1], m[2]) not in verdicts:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5].startswith("**") == (verdicts[(m[1], m[2])].verdict is Verdict.FASTER), line
        checked += 1
    assert checked == len(four_shapes.ratios)
    slower = [k for k, v in verdicts.items() if v.verdict is Verdict.SLOWER]
    assert slower, "the file has arms slower than the reference"


def test_compare_markdown_bolds_faster_and_not_slower():
    import io
    a = make_result(seed=1)
    b = make_result(seed=2, scale={("A8", "cuda-fused"): 0.85, ("A128", "cuda-fused"): 1.15})
    out = io.StringIO()
    compare_markdown(compare_results(a, b), out)
    lines = out.getvalue().splitlines()
    faster = next(line for line in lines if line.startswith("| A8 | `cuda-fused` |"))
    slower = next(line for line in lines if line.startswith("| A128 | `cuda-fused` |"))
    assert "| **faster** |" in faster
    assert "| slower |" in slower and "**" not in slower
