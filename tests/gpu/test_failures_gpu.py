"""The GPU tests of test_failures (the CPU ones stay there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_OOM_CHILD = """
import json, sys, torch
from moebench.errors import UserError
from moebench.run.runner import RunRequest, run
free, _ = torch.cuda.mem_get_info()
hog = torch.empty(max(0, free - 512 * 2**20), dtype=torch.uint8, device="cuda")
req = RunRequest(shapes=("A8",), arms=("triton",), rounds=1, samples=2, warmup=0, out_dir=sys.argv[1],
                 measure_bandwidth=False)
try:
    run(req)
    print(json.dumps({"raised": None}))
except UserError as err:
    print(json.dumps({"raised": str(err)}))
"""


def _one_line(text: str) -> None:
    assert text and "\n" not in text.strip(), text


@pytest.mark.gpu
def test_out_of_gpu_memory_on_a_real_gpu_is_one_line_with_the_fixture_size(tmp_path):
    """Most of the GPU taken first (room left for the L2 flush buffer), then A8, whose weights alone take
    about 0.7 GB, does not fit."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", _OOM_CHILD, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = json.loads(done.stdout.strip().splitlines()[-1])["raised"]
    assert text is not None, "the run fitted in 512 MiB"
    _one_line(text)
    assert "out of GPU memory" in text and "A8" in text and "the fixture's tensors take" in text


@pytest.mark.gpu
def test_doctor_on_a_gpu_finds_cupti_free_and_reads_the_gpu_state():
    from moebench.tasks import doctor
    found = {f.label: f for f in doctor.findings()}
    assert found["GPU"].level == "OK" and found["CUPTI"].level == "OK", found["CUPTI"].line()
    assert found["clocks"].detail.startswith("SM ") and "?/?" not in found["clocks"].detail
    assert found["other processes"].level in ("OK", "WARN") and "unknown" not in found["other processes"].detail
