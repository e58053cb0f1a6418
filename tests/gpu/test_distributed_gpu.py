"""Sharded sweeps on real GPUs: one rank per GPU through `sweep --gpus` (torchrun).

The one-GPU test checks what a rank records of its cells on real hardware; the two-GPU test
is the issue's check that sharding changes no cell's timing: per-cell medians of a sweep
across two GPUs against the same cells on one GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moebench.analysis.load import load

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _sweep(out: Path, gpus: str, ms: str, arms: str, *extra: str):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "moebench", "sweep", "--gpus", gpus, "--family", "Q", "--m", ms,
                           "--arms", arms, "--out", str(out), *extra], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    (path,) = out.glob("*.json")
    return load(path)


def test_one_gpu_sweep_records_its_cells_device_and_bandwidth(tmp_path):
    result = _sweep(tmp_path, "0", "8,16", "triton,triton-default", "--rounds", "2", "--samples", "5",
                    "--warmup", "1")
    sh = result.sharding
    assert sh.world_size == 1 and not sh.missing and not sh.dry_run
    assert [c.shape for c in sh.cells] == ["Q8", "Q16"]
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    for c in sh.cells:
        assert c.device == "cuda:0" and c.gpu_uuid == uuid and c.read_bandwidth_bytes_per_s > 0 and c.clocks
    assert result.audit.passed
    assert {(s.shape, s.arm) for s in result.summaries} == {(m, a) for m in ("Q8", "Q16")
                                                            for a in ("triton", "triton-default")}
    assert [(r.shape, r.arm) for r in result.ratios] == [("Q8", "triton-default"), ("Q16", "triton-default")]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpu_sweep_agrees_with_one_gpu_per_cell_within_3_percent(tmp_path):
    ms, arms = "8,16,32,64", "triton,cuda-fused"
    two = _sweep(tmp_path / "two", "0,1", ms, arms)
    one = _sweep(tmp_path / "one", "0", ms, arms)
    assert {c.rank for c in two.sharding.cells} == {0, 1}
    assert len({c.gpu_uuid for c in two.sharding.cells}) == 2
    medians = {(s.shape, s.arm): s.median_ns for s in one.summaries}
    for s in two.summaries:
        assert s.median_ns == pytest.approx(medians[(s.shape, s.arm)], rel=0.03), (s.shape, s.arm)
