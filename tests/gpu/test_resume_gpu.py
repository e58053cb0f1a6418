"""The GPU tests of test_resume (the CPU ones stay there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moebench.analysis.load import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_on_the_gpu_a_killed_run_is_resumed(tmp_path):
    """`moebench run` on the GPU, SIGKILLed once a few rounds are saved, then `--resume`d."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "moebench", "run", "--shape", "A8", "--arms", "triton", "--rounds", "60",
            "--samples", "20", "--warmup", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        files = list(out.glob("*.json"))
        if files and load(files[0]).rounds_done >= 3:
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    partial = load(files[0])
    assert not partial.status.complete and 3 <= partial.rounds_done < 60
    done_rc = subprocess.run([sys.executable, "-m", "moebench", "run", "--resume", str(files[0])], cwd=tmp_path,
                             env=env, capture_output=True, text=True)
    assert done_rc.returncode == 0, done_rc.stderr
    done = load(files[0])
    assert done.status.complete and done.status.resumed_at == (partial.rounds_done + 1,) and done.audit.passed
    assert done.samples[:len(partial.samples)] == partial.samples
    assert [(s.round, s.index, s.external_id) for s in done.samples] == \
        [(r, i, (r - 1) * 20 + i + 1) for r in range(1, 61) for i in range(20)]
    assert len(done.clocks) == 60 and done.fixtures == partial.fixtures and done.arms == partial.arms
