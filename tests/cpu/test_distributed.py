"""Sharded sweeps on the CPU: the assignment, the merge, and torchrun with two gloo ranks
(a dry run that shards, gathers and writes one result; a rank killed mid-way; resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import external_arm_example as example
import pytest
import torch

from moebench.cli import main
from moebench.run.distributed import cells_folder, launch_command, sharded_sweep, without_option
from moebench.timing.measure import TimingBackend
from moebench.timing.read_floor import ReadProbe
from moebench.run.plan import RunRequest
from moebench.record.schema import MissingCell
from moebench.analysis.load import load
from moebench.analysis.validate import problems
from moebench.run.sweep_cells import Cell, assign, cell_cost, sweep_cells
from moebench.timing.engine import Unit
from moebench.timing.timers import KernelRecordTimer
from timing_fakes import FakeTracer

ROOT = Path(__file__).resolve().parents[2]
CELL_ARMS = ["--arms", "triton", "--aa", "none"]  # the stock path, interpreted (a cell takes seconds); no A/A copy


def test_assignment_is_deterministic_balanced_and_keeps_the_sweep_order():
    cells = [Cell(f"T{i}", cost) for i, cost in enumerate([5.0, 1.0, 4.0, 2.0, 3.0, 3.0], start=1)]
    given = assign(cells, 2)
    assert given == assign(list(cells), 2)
    assert sorted(c.shape for cs in given.values() for c in cs) == sorted(c.shape for c in cells)
    loads = [sum(c.cost for c in given[r]) for r in (0, 1)]
    assert loads == [9.0, 9.0]  # costliest first to the least loaded rank: 5+3+1 and 4+3+2
    for cs in given.values():
        assert [c.shape for c in cs] == sorted((c.shape for c in cs), key=lambda s: int(s[1:]))
    assert assign(cells[:1], 3) == {0: cells[:1], 1: [], 2: []}


def test_cell_cost_grows_with_tokens_and_is_the_same_on_every_call():
    costs = [c.cost for c in sweep_cells(RunRequest(shapes=("A1", "A64", "A4096"), arms=("triton",)).workload)]
    assert costs[0] < costs[1] < costs[2]
    assert costs == [c.cost for c in sweep_cells(RunRequest(shapes=("A1", "A64", "A4096"), arms=("triton",)).workload)]
    (spec,) = RunRequest(("Q8",), ("triton",)).workload.specs()
    assert cell_cost(spec) == sweep_cells(RunRequest(("Q8",), ("triton",)).workload)[0].cost > 0


def test_the_launcher_runs_torchrun_without_gpus_and_spells_m_for_it():
    argv = ["sweep", "--family", "A", "--m", "1,2", "--gpus", "0,1", "--arms=triton", "--gpus=2"]
    assert without_option(argv, "--gpus") == ["sweep", "--family", "A", "--m", "1,2", "--arms=triton"]
    cmd = launch_command(2, argv)
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5:] == ["-m", "moebench", "sweep", "--family", "A", "--ms", "1,2", "--arms=triton"]


def _backend():
    gpu = example.GPU

    def probe():
        return ReadProbe((Unit("_read_floor", "1x1x1", run=lambda: gpu.launch("read_kernel", 250_000)),), 500_000_000,
                         "fake read")
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(lambda cap: FakeTracer(gpu)),
                         flush=lambda: gpu.launch("flush_reduce", 50_000), flush_bytes=256 * 2**20,
                         sync=lambda: None, probe=probe)


def test_a_timed_sweep_of_one_rank_merges_its_cells_into_one_checked_result(tmp_path):
    req = RunRequest(shapes=("T8", "T16", "T4"), arms=(), rounds=2, samples=3, warmup=1, out_dir=str(tmp_path),
                     external_arms=("one=external_arm_example:prepare_copy", "two=external_arm_example:prepare_dict"),
                     command=("moebench", "sweep"))
    out = sharded_sweep(req, backend=_backend())
    result = load(out.path)  # validated against its own samples on load
    assert result == out.result and not problems(result)
    assert result.settings.shapes == ("T8", "T16", "T4") and result.settings.arms == ("one", "two")
    assert [c.shape for c in result.sharding.cells] == ["T8", "T16", "T4"] and not result.sharding.missing
    assert {(c.rank, c.device, c.host) for c in result.sharding.cells} == {(0, "cpu", result.provenance.hostname)}
    assert all(c.read_bandwidth_bytes_per_s == pytest.approx(2e12) for c in result.sharding.cells)
    assert all(len(c.clocks) == 0 for c in result.sharding.cells)  # the fake backend samples no clocks
    assert len(result.samples) == 3 * 2 * 2 * 3 and result.audit.samples_total == len(result.samples)
    assert [(r.shape, r.arm) for r in result.ratios] == [("T8", "two"), ("T16", "two"), ("T4", "two")]
    assert result.ratios[0].median == pytest.approx(4000 / 3000)
    assert result.settings.options["external_arms"] == list(req.external_arms)  # shared by every cell
    assert all("external_arms" not in c.options for c in result.sharding.cells)
    assert not cells_folder(out.path).exists()


def test_the_file_check_refuses_a_sweep_whose_cells_do_not_match_its_shapes(tmp_path):
    req = RunRequest(shapes=("T8", "T4"), arms=(), rounds=1, samples=1, warmup=0, out_dir=str(tmp_path),
                     external_arms=("one=external_arm_example:prepare_copy",), measure_bandwidth=False)
    result = sharded_sweep(req, backend=_backend()).result
    sh = result.sharding
    twice = replace(result, sharding=replace(sh, cells=(sh.cells[0], sh.cells[0])))
    assert any("two cells" in p for p in problems(twice)) and any("not the shapes" in p for p in problems(twice))
    clash = replace(result, sharding=replace(sh, missing=(MissingCell("T8", 5, "lost"),)))
    assert any("finished cells" in p for p in problems(clash))
    assert any("outside the world" in p for p in problems(clash))
    assert not problems(result)


def test_resume_is_refused_with_other_settings_and_a_sweep_needs_its_shapes(capsys, tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    for argv, needle in ((["sweep", "--resume", str(path), "--rounds", "3"], "leave out --rounds"),
                         (["sweep", "--arms", "triton"], "needs --family and --m"),
                         (["sweep", "--family", "T", "--m", "1", "--gpus", "0,0", "--dry-run"], "given twice")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


# --- torchrun, two gloo ranks on the CPU ---------------------------------------------------

def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}


def _moebench(*args) -> list[str]:
    return [sys.executable, "-m", "moebench", *args]


def test_torchrun_two_ranks_dry_run_shards_gathers_and_writes_one_result(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "moebench", "sweep", "--dry-run", "--family", "T", "--ms", "1,2,3,4", *CELL_ARMS,
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    result = load(path)
    sh = result.sharding
    assert sh.world_size == 2 and sh.dist_backend == "gloo" and sh.dry_run and not sh.missing
    assert result.settings.shapes == ("T1", "T2", "T3", "T4") and not result.samples
    expected = assign(sweep_cells(RunRequest(shapes=("T1", "T2", "T3", "T4"), arms=("triton",)).workload), 2)
    assert {c.shape: c.rank for c in sh.cells} == {c.shape: r for r, cs in expected.items() for c in cs}
    assert {c.rank for c in sh.cells} == {0, 1} and all(c.device == "cpu" for c in sh.cells)
    assert [(p.shape, p.arm, p.passed) for p in result.parity] == [(s, "triton", True) for s in result.settings.shapes]
    assert sh.request["shapes"] == ["T1", "T2", "T3", "T4"] and "saved" in done.stdout
    assert not cells_folder(path).exists()


def test_a_killed_rank_leaves_a_result_naming_its_missing_cells_and_resume_finishes_them(tmp_path):
    shapes = [f"T{m}" for m in range(1, 5)]
    proc = subprocess.Popen(_moebench("sweep", "--gpus", "0,1", "--dry-run", "--family", "T",
                                      "--m", ",".join(s[1:] for s in shapes), *CELL_ARMS, "--out", str(tmp_path)),
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rank1 = _wait_for(lambda: _rank_file(tmp_path, 1), 120)
        assert len(rank1["cells"]) >= 2
        first = _wait_for(lambda: (cells_folder_of(tmp_path) / f"{rank1['cells'][0]}.json").exists(), 120)
        assert first
        os.kill(rank1["pid"], signal.SIGKILL)  # mid-way: its first cell saved, the others not
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    (path,) = tmp_path.glob("*.json")
    partial = load(path)
    sh = partial.sharding
    missing = {c.shape: c for c in sh.missing}
    assert rank1["cells"][0] in partial.settings.shapes
    assert rank1["cells"][-1] in missing and missing[rank1["cells"][-1]].rank == 1
    assert "rank 1 did not finish" in missing[rank1["cells"][-1]].reason
    assert sorted([*partial.settings.shapes, *missing]) == sorted(shapes)
    assert "not finished" in err and "--resume" in err

    done = subprocess.run(_moebench("sweep", "--resume", str(path)), env=_env(), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    full = load(path)
    assert full.settings.shapes == tuple(shapes) and not full.sharding.missing
    kept = {c.shape: c for c in full.sharding.cells}
    assert all(kept[c.shape] == c for c in sh.cells)  # the cells the partial run finished are kept as they were
    assert [p.shape for p in full.parity] == shapes and full.provenance.command == partial.provenance.command


def cells_folder_of(out: Path) -> Path:
    folders = list(out.glob("*.cells"))
    return folders[0] if folders else out / "none.cells"


def _rank_file(out: Path, rank: int):
    f = cells_folder_of(out) / f"rank-{rank}.json"
    return json.loads(f.read_text()) if f.exists() else None


def _wait_for(probe, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting")
