"""`verify --out`: the parity rows (edge cases included) as a RunResult of their own, which
`load` checks and every report format shows; a forged row is refused like any forged number."""

from __future__ import annotations

import json

import pytest
from result_factory import run_cli

from moebench.analysis.load import load


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "parity.json"
    code, _, err = run_cli(["verify", "--shape", "T8", "--arms", "triton", "--interpret", "--edge-cases",
                            "--out", str(out)])
    assert code == 0 and f"wrote {out}" in err, err
    return out


def test_the_file_holds_every_check_and_loads(checked):
    result = load(checked)
    shapes = [p.shape for p in result.parity]
    assert shapes[0] == "T8" and {"T8 M=1", "T8 M=67", "T8 empty experts"} <= set(shapes)
    assert all(p.arm == "triton" and p.passed for p in result.parity)
    assert result.settings.shapes == ("T8",) and result.settings.timer == "none" and not result.samples
    assert result.settings.options["edge_cases"] is True


@pytest.mark.parametrize("fmt, needle", [("table", "T8 M=67"), ("markdown", "| T8 M=67 | `triton` |"),
                                         ("pr", "### moebench parity: T8"), ("csv", "parity,T8 M=67,triton")])
def test_every_format_shows_the_checks(checked, fmt, needle):
    code, out, err = run_cli(["report", str(checked), "--format", fmt])
    assert code == 0 and needle in out, err + out


def test_a_forged_verdict_or_stray_row_is_refused(checked, tmp_path):
    data = json.loads(checked.read_text())
    data["parity"][1]["rel_l2"] = data["parity"][1]["threshold"] * 2  # fails, but says passed
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    code, _, err = run_cli(["report", str(forged)])
    assert code == 2 and "parity[T8 M=1 triton].passed True" in err, err
    data = json.loads(checked.read_text())
    data["parity"][0]["shape"] = "Q8"
    forged.write_text(json.dumps(data))
    code, _, err = run_cli(["report", str(forged)])
    assert code == 2 and "parity[Q8 triton]: shape or arm not in the settings" in err, err


def test_the_parity_table_fits_100_columns_and_wide_adds_the_rest(checked, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run_cli(["report", str(checked)])
    assert code == 0 and "T8 M=67" in out and "threshold" not in out
    assert max(len(line) for line in out.splitlines()) <= 100
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(["report", str(checked), "--wide"])
    assert code == 0 and all(col in out for col in ("max abs err", "NaN/Inf", "threshold", "vs exact"))
