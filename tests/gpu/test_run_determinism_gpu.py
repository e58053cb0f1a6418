"""`moebench run --determinism` on an H100/H200: the fused arms timed at A8 with their verdicts
taken on the calls the rounds time (cuda-fused-det bitwise run to run, batch-invariant and the
same hash in a fresh process; cuda-fused's verdict recorded beside it, whatever it is), and the
checks leave the device's memory as they found it before the first timed round."""

from __future__ import annotations

import pytest
import torch

from moebench.run.prepare import prepare
from moebench.views.determinism_view import det_text
from moebench.analysis.load import load
from moebench.run.determinism import with_determinism
from moebench.run.runner import RunRequest, planned
from result_factory import run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90")]


def test_a_timed_run_at_a8_carries_the_fused_arms_verdicts(tmp_path):
    code, out, err = run_cli(["run", "--shape", "A8", "--arms", "cuda-fused,cuda-fused-det", "--rounds", "2",
                              "--samples", "10", "--warmup", "2", "--determinism", "--out", str(tmp_path)])
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    result = load(path)
    assert result.audit.passed and {s.arm for s in result.summaries} == {"cuda-fused", "cuda-fused-det"}
    v = {x.arm: x for x in result.determinism}
    assert set(v) == {"cuda-fused", "cuda-fused-det"} and all(x.shape == "A8" for x in v.values())
    det = v["cuda-fused-det"]
    # each of the three checks on its own, so that a failure names the one that failed: on a card
    # shared with other processes the fresh process may find no memory (it is tried again, then
    # recorded with its reason), which says nothing of the kernel's determinism
    assert det.run_to_run.runs == 10 and det.run_to_run.bitwise, det.run_to_run
    assert det.batch_invariant, det.batch
    assert det.cross_process.equal is True, det.cross_process
    assert det.passed
    assert det_text(det) == "bitwise · invariant" and "┃ det" in out
    identities = {a.name: a.identity for a in result.arms}
    assert all(x.identity == identities[x.arm] for x in v.values())  # the timed calls' own builds
    assert v["cuda-fused"].run_to_run.runs == 10 and v["cuda-fused"].cross_process.hash_there


def test_the_checks_leave_no_allocation_behind():
    device = torch.device("cuda", torch.cuda.current_device())
    req = RunRequest(shapes=("A8",), arms=("cuda-fused", "cuda-fused-det"), determinism=True, determinism_runs=3,
                     cross_process=False)
    req, plan = planned(req, None, lambda m: None)
    prep = prepare(req.workload, req.protocol, plan, device)
    fixtures = [m.fixture for m in prep.made]  # held here, so that the checks' own allocations alone can change
    torch.cuda.synchronize(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    checked = with_determinism(plan, prep)
    assert len(checked.subjects.determinism) == 2 and fixtures
    assert torch.cuda.memory_allocated(device) == allocated  # the batches' calls and outputs freed
    assert torch.cuda.memory_reserved(device) <= reserved  # and their blocks given back
    assert not checked.made and len(checked.keep_alive) == len(checked.units) == 2  # the timed calls stay
