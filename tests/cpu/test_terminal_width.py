"""Terminal tables at 100 columns: every number whole, no line past the edge.

The committed sweeps (the widest runs: 15 shapes, floors beside each median) and the four-shape
run are rendered as `moebench report` prints them with COLUMNS=100; `compare` of two committed
runs likewise. `--wide` brings back the columns the default leaves out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.record.index import us
from moebench.analysis.load import load
from result_factory import run_cli

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "results").glob("h*/sweep-*.json.gz"))
FOUR_SHAPES = ROOT / "results" / "h200" / "all-arms.json"
COMPARED = [ROOT / "results" / "h200" / n for n in ("house-before.json.gz", "all-arms-untimed-reset.json.gz")]


@pytest.fixture
def columns_100(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")


def _assert_fits(out: str) -> None:
    assert out.strip()
    for line in out.splitlines():
        assert len(line) <= 100, f"{len(line)} columns: {line!r}"
        assert "…" not in line, f"cut: {line!r}"


@pytest.mark.parametrize("path", [*SWEEPS, FOUR_SHAPES], ids=lambda p: f"{p.parent.name}-{p.name}")
def test_report_table_fits_100_columns_with_every_median_whole(columns_100, path):
    code, out, err = run_cli(["report", str(path)])
    assert code == 0, err
    _assert_fits(out)
    result = load(path)
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃").split("│")]
        if len(cells) > 3:
            rows.setdefault(cells[1], []).append(cells[2])
    for s in result.summaries:
        assert us(s.median_ns) in rows[s.arm], (s.shape, s.arm)
    for r in result.ratios:
        assert f"{r.median:.3f}" in out


def test_wide_adds_the_columns_the_default_leaves_out(columns_100):
    code, narrow, err = run_cli(["report", str(SWEEPS[0])])
    assert code == 0, err
    code, wide, err = run_cli(["report", str(SWEEPS[0]), "--wide"])
    assert code == 0, err
    def summary_header(out: str) -> list[str]:
        return [c.strip() for c in next(line for line in out.splitlines() if line.startswith("┃")).strip("┃").split("┃")]
    assert summary_header(narrow) == ["shape", "arm", "median", "rows min–max", "span", "% read BW", "× floor"]
    assert summary_header(wide) == ["shape", "arm", "median", "rows min–max", "span", "n", "floor TB/s", "% read BW",
                                    "HBM floor µs", "FP8 floor µs", "binding", "× floor"]  # whole: wider than 100
    assert "--wide: every column" in " ".join(narrow.split())  # the caption may wrap


def test_compare_fits_100_columns_and_never_breaks_a_number(columns_100):
    code, out, err = run_cli(["compare", *map(str, COMPARED)])
    assert code == 0, err
    for line in out.splitlines():
        assert len(line) <= 100, line
    table_rows = [line for line in out.splitlines() if line.startswith("│")]
    a, b = (load(p) for p in COMPARED)
    for s in a.summaries:  # A's median of each arm sits whole in its row (compare's medians come from
        # the samples, as the stored ones do: they agree to the printed digits)
        row = next(r for r in table_rows if r.split("│")[1].strip() == s.shape and r.split("│")[2].strip() == s.arm)
        cell = row.split("│")[3].strip()
        assert cell.replace(",", "").replace(".", "").isdigit(), row
        change = row.split("│")[5].strip()
        assert change.count("[") == 1 and change.endswith("]"), row
    assert "--wide" in out


def test_compare_wide_keeps_intervals_and_reasons(columns_100):
    code, out, err = run_cli(["compare", *map(str, COMPARED), "--wide"])
    assert code == 0, err
    assert "why" in out and " p " in out.replace("┃", " ")
