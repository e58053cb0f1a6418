"""CPU tests of cuda-fused-det: the DETERMINISTIC build compiles through NVRTC for sm_90a without
spills at every launch the arm can make, its SASS keeps no BF16 reduction (plain stores into the
workspace) and has the in-kernel sum's pieces (GPU fences, arrival atomics, GPU-scope loads) that
the default build lacks, the builds that would spill are refused, the default build's defines are
unchanged, the arm declares one kernel, the host sizes the shared memory and counters the kernel
uses, and the plan check that the arrival counters rely on passes route_plan's plans and refuses
one that leaves a slot out or repeats it."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import route_plan
from moebench.kernels import fused_arm, fused_policy
from moebench.kernels.fused_arm import choose_stages
from moebench.kernels.fused_checks import check_slots_once
from moebench.kernels.registry import make_arm
from moebench.timing.audit import kernel_mismatch
from test_fused_host import _cuobjdump


@pytest.fixture
def cache(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from moebench.kernels import cuda_build
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    yield
    cuda_build.clear_memo()


def _det_builds():
    out = []
    for cluster in fused_arm.CLUSTERS:
        for bm in (8, 16, 24, 32):
            if cluster == 1 and bm > fused_arm.MAX_BLOCK_M_ALONE:
                continue
            for per_sm in fused_arm.deterministic_occupancies(bm, cluster):
                out.append((bm, per_sm, cluster))
    return out


@pytest.mark.parametrize("block_m,per_sm,cluster", _det_builds())
def test_deterministic_builds_compile_without_spills(cache, block_m, per_sm, cluster):
    from moebench.kernels.cuda_build import compile_source
    stages = choose_stages(block_m, 7168, per_sm, cluster, True)
    m = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(block_m, stages, per_sm, cluster, True))
    r = m.resources(fused_arm.KERNEL_NAME)
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    assert r.registers <= 65536 // (fused_arm.THREADS * per_sm)
    assert r.shared_bytes == 0  # all dynamic: the host's shared_bytes(..., deterministic=True)


def _sass(tool: str, module, path) -> str:
    path.write_bytes(module.cubin)
    return subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout


def test_deterministic_sass_stores_then_sums_in_the_kernel(cache, tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    from moebench.kernels.cuda_build import compile_source
    det = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(8, 5, 2, 4, True))
    functions = re.split(r"\n\s*Function : ", _sass(tool, det, tmp_path / "det.cubin"))
    assert [f.split("\n")[0].strip() for f in functions[1:]] == [fused_arm.KERNEL_NAME]  # one kernel
    fused = functions[1]
    assert "REDG.E.ADD.BF16" not in fused and "STG.E.128" in fused  # each contribution into its own row
    assert "HMMA" in fused and "CALL" not in fused and not re.search(r"\b(LDL|STL)\b", fused)
    # the in-kernel sum: arrivals that read the old count, GPU fences (release and acquire, beyond
    # the default build's two), and the rows read at GPU scope, from L2
    assert "ATOMG.E.ADD.S32.STRONG.GPU" in fused and fused.count("MEMBAR.ALL.GPU") > 2
    assert "LDG.E.128.STRONG.GPU" in fused
    default = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(8, 5, 2, 4))
    plain = _sass(tool, default, tmp_path / "default.cubin")
    assert "LDG.E.128.STRONG.GPU" not in plain and "REDG.E.ADD.BF16x8" in plain


def test_the_spilling_deterministic_builds_are_refused(cache):
    from moebench.kernels.cuda_build import compile_source
    assert fused_arm.deterministic_occupancies(16) == (2,) and fused_arm.deterministic_occupancies(8) == (2, 3)
    assert fused_arm.deterministic_occupancies(40) == () and fused_arm.deterministic_occupancies(48) == ()
    assert fused_arm.deterministic_occupancies(32) == fused_arm.occupancies(32) == (1,)
    with pytest.raises((UserError, RuntimeError), match="two accumulator chains spill"):
        compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(16, 3, 3, 4, True))
    with pytest.raises((UserError, RuntimeError), match="168 registers of BLOCK_M 40 or 48"):
        compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(48, 4, 1, 4, True))
    with pytest.raises(UserError, match="per_sm=3 at block_m=16: at most 2 CTAs an SM"):
        fused_arm.launch_options(16, 7168, 0, 4, per_sm=3, deterministic=True)
    with pytest.raises(UserError, match="the deterministic build goes up to block_m=32"):
        fused_arm.launch_options(48, 7168, 0, 4, deterministic=True)


def test_default_build_keeps_its_defines():
    assert "DETERMINISTIC" not in fused_arm.kernel_defines(8, 5, 2, 4)
    assert fused_arm.kernel_defines(8, 5, 2, 4, True)["DETERMINISTIC"] == "1"


def test_the_deterministic_arm_declares_one_kernel():
    declared = fused_arm.FUSED_KERNELS
    assert kernel_mismatch([fused_arm.KERNEL_NAME], declared) is None
    assert kernel_mismatch([fused_arm.KERNEL_NAME, "moebench_fused_moe_combine"], declared) is not None
    assert kernel_mismatch([fused_arm.KERNEL_NAME, fused_arm.KERNEL_NAME], declared) is not None
    arm = make_arm("cuda-fused-det")
    assert arm.name == "cuda-fused-det" and arm.deterministic and not make_arm("cuda-fused").deterministic
    assert arm.unavailable_reason("cpu")


def test_shared_memory_and_counters_of_the_deterministic_build():
    # the owned-slice lists, 8 warps x (1 + BLOCK_M + 8) ints, on top of the default layout; at the
    # fixtures' K they cost no stage: 5 at two CTAs an SM, 3 at three, as in the default build
    for bm in (8, 16, 32):
        for K in (2048, 7168):
            plain = fused_policy.shared_bytes(bm, 3, K, 4)
            assert fused_policy.shared_bytes(bm, 3, K, 4, True) - plain == 8 * (bm + 9) * 4
    for K in (2048, 7168):
        assert choose_stages(8, K, 2, 4, True) == choose_stages(8, K, 2, 4) == 5
        assert choose_stages(8, K, 3, 4, True) == choose_stages(8, K, 3, 4) == 3
    # tickets and per-SM counts, then one arrival counter a token, CTA rank and consumer warp
    assert fused_policy.work_counters(8, 4, False) == 258
    assert fused_policy.work_counters(8, 4, True) == 258 + 8 * 4 * 8
    assert fused_policy.work_counters(128, 1, True) == 258 + 128 * 8


def _plan(M: int = 12, E: int = 6, top_k: int = 3, block_m: int = 8, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).to(torch.int32)
    plan = route_plan(ids, E, block_m)
    return plan, fused_policy.launch_blocks(plan.num_slots, E, block_m, plan.sorted_token_ids.numel())


def _with(plan, ids=None, total=None):
    return type(plan)(plan.block_m, plan.sorted_token_ids if ids is None else ids, plan.expert_ids,
                      plan.num_tokens_post_padded if total is None else total, plan.num_slots)


def test_the_plan_check_passes_what_route_plan_makes():
    plan, blocks = _plan()
    check_slots_once(plan, blocks)
    # garbage past the padded total is not the plan's: the kernel never reads it either
    total = plan.padded_total
    garbage = plan.sorted_token_ids.clone()
    garbage[total:] = torch.arange(garbage.numel() - total, dtype=torch.int32) % 5
    check_slots_once(_with(plan, ids=garbage), blocks)
    # a block skipped for its expert still holds its slots (they are counted, as zeros)
    plan.expert_ids[0] = -1
    check_slots_once(plan, blocks)


def test_the_plan_check_refuses_a_missing_or_repeated_slot():
    plan, blocks = _plan()
    ids = plan.sorted_token_ids
    real = torch.nonzero(ids[: plan.padded_total] < plan.num_slots).flatten()
    missing = ids.clone()
    missing[real[0]] = plan.num_slots  # a slot turned into padding: its token's counters fall short
    with pytest.raises(UserError, match="1 of 36 slots are missing, 0 repeated"):
        check_slots_once(_with(plan, ids=missing), blocks)
    repeated = ids.clone()
    repeated[real[0]] = ids[real[1]]  # one slot twice, another gone
    with pytest.raises(UserError, match="1 of 36 slots are missing, 1 repeated"):
        check_slots_once(_with(plan, ids=repeated), blocks)
    short = torch.tensor([plan.padded_total - plan.block_m], dtype=torch.int32)  # the last block cut off
    with pytest.raises(UserError, match="slots are missing"):
        check_slots_once(_with(plan, total=short), blocks)
