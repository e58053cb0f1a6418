"""`moebench sweep`: one family at several M through `moebench run`, reported as a sweep."""

from __future__ import annotations

import pytest

import moebench.run.runner as runner
from moebench.run.plan import sweep_shapes
from moebench.errors import UserError
from moebench.record.store import save
from result_factory import run_cli, sweep_result


def test_sweep_shapes():
    assert sweep_shapes("A", "1,2,4") == ("A1", "A2", "A4")
    assert sweep_shapes("q", " 8, 128 ") == ("Q8", "Q128")


@pytest.mark.parametrize("family, ms, message", [
    ("A", "1,x", "--m: expected positive token counts"),
    ("A", "0,2", "--m: expected positive token counts"),
    ("A", "", "--m: expected positive token counts"),
    ("A", "2,4,2", "--m: M given twice: 2"),
    ("AB", "1", "--family: expected one family letter"),
])
def test_sweep_shapes_rejects(family, ms, message):
    with pytest.raises(UserError, match=message):
        sweep_shapes(family, ms)


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """`moebench run`'s pipeline replaced: records the request, saves a synthetic sweep."""
    requests = []

    def run(req, **kwargs):
        requests.append(req)
        ms = tuple(int(s[1:]) for s in req.shapes)
        result = sweep_result(req.shapes[0][0], ms, arms=req.arms, rounds=req.rounds, samples=req.samples)
        return result, save(result, tmp_path / "sweep.json")

    monkeypatch.setattr(runner, "run", run)  # `moebench run` imports the pipeline when it runs
    return requests


def test_sweep_runs_the_grid_as_one_result(fake_run, tmp_path):
    code, out, err = run_cli(["sweep", "--family", "A", "--m", "1,2,4,8", "--arms", "triton,cuda-fused",
                              "--rounds", "3", "--samples", "4", "--flush", "write"])
    assert code == 0, err
    (req,) = fake_run
    assert req.shapes == ("A1", "A2", "A4", "A8")
    assert req.arms == ("triton", "cuda-fused") and req.rounds == 3 and req.samples == 4
    assert req.flush == "write" and req.timer == "cupti"
    assert "saved" in out

    code, out, err = run_cli(["report", str(tmp_path / "sweep.json"), "--format", "markdown",
                              "--output", str(tmp_path / "sweep.md"), "--plot", str(tmp_path / "img")])
    assert code == 0, err
    assert (tmp_path / "img" / "sweep-A-duration.png").is_file()
    assert (tmp_path / "img" / "sweep-A-speedup.svg").is_file()
    assert "](img/sweep-A-speedup.png)" in (tmp_path / "sweep.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--family", "A", "--m", "1,x", "--arms", "triton"], "--m: expected positive token counts"),
    (["sweep", "--m", "1,2", "--arms", "triton"], "sweep needs --family and --m"),
])
def test_sweep_errors_are_one_line(fake_run, argv, message):
    code, out, err = run_cli(argv)
    assert code == 2 and not fake_run
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_sweep_unknown_family_is_refused_before_any_gpu_work():
    """The real pipeline: shape names are checked before it looks for a GPU."""
    code, out, err = run_cli(["sweep", "--family", "Z", "--m", "1,2", "--arms", "triton"])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "unknown shape family 'Z'" in lines[0], err
