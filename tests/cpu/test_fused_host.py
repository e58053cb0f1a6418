"""CPU tests of the cuda-fused arm: NVRTC compile (no spills), the weight layout against the
PTX mma fragment maps, the epilogue's lane pairing, and host validation errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import route_plan
from moebench.kernels.cuda import fused_arm
from moebench.kernels.cuda.fused_arm import choose_stages, prepare_fused_weights, shared_bytes, validate

FP8 = torch.float8_e4m3fn


def _codes(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


# ------------------------------------------------------------------------------ compile


@pytest.fixture
def cache(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from moebench.kernels.cuda import nvrtc as cuda_build
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    yield
    cuda_build.clear_memo()


@pytest.mark.parametrize("cluster", fused_arm.CLUSTERS)
@pytest.mark.parametrize("block_m", [8, 16, 32, 48])
def test_compiles_for_sm90a_without_spills(cache, block_m, cluster):
    if cluster == 1 and block_m > fused_arm.MAX_BLOCK_M_ALONE:
        pytest.skip("one CTA an item runs up to MAX_BLOCK_M_ALONE (the host refuses more)")
    from moebench.kernels.cuda.nvrtc import compile_source
    per_sm = fused_arm.ctas_per_sm(block_m, cluster)
    stages = choose_stages(block_m, 7168, per_sm, cluster)
    m = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(block_m, stages, per_sm, cluster))
    r = m.resources(fused_arm.KERNEL_NAME)
    assert m.build.arch == "sm_90a"
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    limit = 65536 // (fused_arm.THREADS * per_sm)
    assert r.registers <= limit
    assert r.shared_bytes == 0  # all shared memory is dynamic, sized by shared_bytes()


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(p) if p.is_file() else None
    except ImportError:
        return None


def test_sass_has_the_instructions_we_meant(cache, tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    from moebench.kernels.cuda.nvrtc import compile_source
    m = compile_source(fused_arm.SOURCE, defines={"BLOCK_M": "8", "STAGES": "4"})
    cubin = tmp_path / "fused.cubin"
    cubin.write_bytes(m.cubin)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    for op in ("HMMA", "UBLKCP", "SYNCS.PHASECHK", "REDG.E.ADD.BF16x8", "STAS.128", "UCGABAR_ARV",
               "UCGABAR_WAIT"):
        assert op in sass, op
    # the final cluster barrier and the work counter's end-of-work release, once a launch each:
    # no per-item GPU fence
    assert sass.count("MEMBAR.ALL.GPU") <= 2
    assert "ATOMG.E.ADD" in sass  # the work tickets
    assert not re.search(r"\b(LDL|STL)\b", sass)  # nothing in local memory
    # no subroutine: IEEE division's slow path, called from the SwiGLU, cost Q8 2.8 us on the H200
    # (docs/kernels.md)
    assert "CALL" not in sass


def _fused_sass(tool: str, tmp_path: Path, defines: dict[str, str]) -> str:
    from moebench.kernels.cuda.nvrtc import compile_source
    cubin = tmp_path / "fused.cubin"
    cubin.write_bytes(compile_source(fused_arm.SOURCE, defines=defines).cubin)
    return subprocess.run([tool, "-sass", "-fun", fused_arm.KERNEL_NAME, str(cubin)], capture_output=True,
                          text=True, check=True).stdout


def test_only_the_zero_out_build_zeroes_and_waits(cache, tmp_path):
    # ZERO_OUT=1: the consumers' 16-byte zero stores, the share's release, the producer's spin on
    # the count; the build without it (what a launch behind the zeroing kernel runs) has none of them
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    base = fused_arm.kernel_defines(8, 3, 3, 4)
    plain = _fused_sass(tool, tmp_path, base)
    zeroing = _fused_sass(tool, tmp_path, fused_arm.kernel_defines(8, 3, 3, 4, zero_out=True))
    assert "ZERO_OUT" not in base and fused_arm.kernel_defines(8, 3, 3, 4, zero_out=True)["ZERO_OUT"] == "1"
    for op in ("STG.E.128", "NANOSLEEP", "REDG.E.ADD.S32.STRONG.GPU"):
        assert op in zeroing and op not in plain, op
    # griddepcontrol.wait: the plain build waits for the zeroing kernel ahead, the ZERO_OUT build for nothing
    assert "ACQBULK" in plain and "ACQBULK" not in zeroing
    for sass in (plain, zeroing):
        assert "CALL" not in sass and not re.search(r"\b(LDL|STL)\b", sass)
    assert zeroing.count("MEMBAR.ALL.GPU") <= plain.count("MEMBAR.ALL.GPU") + 1 and "MEMBAR.SC" not in zeroing  # one release a CTA


def test_zeroing_mode_follows_the_occupancy_and_the_source():
    from moebench.kernels.cuda.source import KernelSource
    shipped = fused_arm.shipped_source()
    assert fused_arm.can_zero_in_kernel(shipped)
    assert fused_policy_rule() == {1: False, 2: False, 3: True}
    # clusters of 8 keep the zeroing kernel at three CTAs an SM (their ZERO_OUT build spills under NVRTC 13.0)
    assert not fused_arm.zeroes_in_kernel(3, 8) and fused_arm.zeroing_mode(None, 3, 8, shipped, False) == "launch"
    assert fused_arm.zeroing_mode("kernel", 3, 8, shipped, False) == "kernel"
    assert fused_arm.zeroing_mode(None, 3, 4, shipped, False) == "kernel"
    assert fused_arm.zeroing_mode(None, 2, 4, shipped, False) == "launch"
    assert fused_arm.zeroing_mode("kernel", 2, 4, shipped, False) == "kernel"
    assert fused_arm.zeroing_mode("launch", 3, 4, shipped, False) == "launch"
    assert fused_arm.zeroing_mode(None, 3, 4, shipped, True) == "launch"  # (the det build's combine stores)
    # a --build of a copy from before ZERO_OUT zeroes behind the zeroing kernel, as it did; forced, one line
    old = KernelSource.from_text(shipped.text.replace("#ifndef ZERO_OUT", "#ifndef NOT_HERE"), "old_fused.cu")
    assert not fused_arm.can_zero_in_kernel(old)
    assert fused_arm.zeroing_mode(None, 3, 4, old, False) == "launch"
    with pytest.raises(UserError, match="old_fused.cu: no ZERO_OUT meta-parameter"):
        fused_arm.zeroing_mode("kernel", 3, 4, old, False)
    with pytest.raises(UserError, match="zero='both' must be one of kernel, launch"):
        fused_arm.zeroing_mode("both", 3, 4, shipped, False)


def fused_policy_rule() -> dict[int, bool]:
    return {per_sm: fused_arm.zeroes_in_kernel(per_sm, 4) for per_sm in (1, 2, 3)}


def test_the_arm_checks_its_zero_option():
    with pytest.raises(UserError, match="zero='both' must be one of kernel, launch"):
        fused_arm.CudaFusedArm(zero="both")
    with pytest.raises(UserError, match="cuda-fused-det: zero=kernel does not apply"):
        fused_arm.CudaFusedDetArm(zero="kernel")
    arm = fused_arm.CudaFusedArm(zero="kernel")  # an option of the decode kernel: it picks that path
    assert arm.path == "decode" and arm.zero == "kernel"
    with pytest.raises(UserError, match="zero set the decode kernel"):
        fused_arm.CudaFusedArm(zero="kernel", chunk=2)


def test_launch_blocks_cover_every_routing():
    from moebench.fixtures import plan_capacity
    from moebench.kernels.cuda.fused_arm import launch_blocks
    assert launch_blocks(72, 257, 8, plan_capacity(72, 257, 8)) == 72  # A8
    assert launch_blocks(1152, 257, 8, plan_capacity(1152, 257, 8)) == 369  # A128: the buffers' size
    g = torch.Generator().manual_seed(3)
    for M, E, top_k, bm in [(1, 512, 10, 8), (5, 8, 2, 16), (40, 16, 4, 8), (3, 300, 16, 64), (64, 4, 1, 24)]:
        cap = plan_capacity(M * top_k, E, bm)
        for trial in range(20):
            # adversarial: as many experts as possible with one slot each, or everyone on a few
            if trial % 2:
                ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)])
            else:
                ids = (torch.arange(M * top_k).view(M, top_k) % E)
            plan = route_plan(ids.int(), E, bm)
            assert plan.num_blocks <= launch_blocks(M * top_k, E, bm, cap)


def test_shared_bytes_and_stages():
    # BLOCK_M 8 at K=7168: two CTAs an SM with a 4-deep ring, or one with 8
    assert choose_stages(8, 7168, None, 8) == 4
    assert 2 * (shared_bytes(8, 4, 7168, 8) + 1024) <= fused_arm.SMEM_PER_SM
    assert choose_stages(8, 7168, 1, 8) == 8
    for bm in (8, 16, 24, 32, 64):  # every block_m fits at the widest K the tests use
        for cluster in fused_arm.CLUSTERS:
            stages = choose_stages(bm, 7168, None, cluster)
            assert shared_bytes(bm, stages, 7168, cluster) <= fused_arm.SMEM_PER_CTA
    with pytest.raises(UserError, match="shared memory"):
        choose_stages(64, 1 << 20, None, 4)


# ------------------------------------------------------------------------------ layout


def _a_fragment_coords():
    """PTX ISA, mma.m16n8k32 .e4m3 A fragment: (lane, reg, byte) -> (row, logical k)."""
    lane = torch.arange(32).view(32, 1, 1)
    reg = torch.arange(4).view(1, 4, 1)
    byte = torch.arange(4).view(1, 1, 4)
    i = 4 * reg + byte
    row = (lane >> 2) + 8 * ((i >= 4) & (i < 8) | (i >= 12))
    col = 4 * (lane & 3) + (i & 3) + 16 * (i >= 8)
    return row.expand(32, 4, 4), col.expand(32, 4, 4)


def _b_fragment_coords():
    """PTX ISA, mma.m16n8k32 .e4m3 B fragment: (lane, reg, byte) -> (logical k, column)."""
    lane = torch.arange(32).view(32, 1, 1)
    reg = torch.arange(2).view(1, 2, 1)
    byte = torch.arange(4).view(1, 1, 4)
    i = 4 * reg + byte
    k = 4 * (lane & 3) + (i & 3) + 16 * (i >= 4)
    return k.expand(32, 2, 4), (lane >> 2).expand(32, 2, 4)


def _physical_k_of_b(step: int):
    """Where the kernel's B fragment bytes come from: lane (g, t) reads bytes [32t, 32t+32) of
    its token's 128-byte k block, words 2s and 2s+1 for k-step s."""
    lane = torch.arange(32).view(32, 1, 1)
    reg = torch.arange(2).view(1, 2, 1)
    byte = torch.arange(4).view(1, 1, 4)
    return (32 * (lane & 3) + 8 * step + 4 * reg + byte).expand(32, 2, 4)


def _logical_to_physical(step: int) -> torch.Tensor:
    """The k permutation the B loads imply: logical k of k-step `step` -> physical k in the block."""
    k, _ = _b_fragment_coords()
    perm = torch.full((32,), -1, dtype=torch.long)
    perm[k.reshape(-1)] = _physical_k_of_b(step).reshape(-1)
    assert (perm >= 0).all() and perm.unique().numel() == 32
    return perm


def _decode_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """[..., 4 k-steps, 32 lanes, 16 bytes] in fragment order -> [..., 16 rows, 128 physical k]."""
    row, col = _a_fragment_coords()
    lead = tiles.shape[:-3]
    out = torch.full((*lead, 16, 128), -1, dtype=torch.int16)
    for s in range(4):
        phys = _logical_to_physical(s)[col]  # [32, 4, 4]
        src = tiles[..., s, :, :].reshape(*lead, 32, 4, 4).to(torch.int16)
        out[..., row.reshape(-1), phys.reshape(-1)] = src.reshape(*lead, -1)
    return out


@pytest.mark.parametrize("cluster", fused_arm.CLUSTERS)
def test_w1_layout_matches_the_mma_fragments(cluster):
    E, N, K = 2, 512, 384  # two groups, three k blocks
    I, G, KB = N // 2, N // 256, K // 128
    cols = 128 // cluster  # intermediate columns a CTA: 16 gate + 16 up rows per 16 of them
    mts = 2 * cols // 16  # m-tiles a CTA: gate tiles first, then up
    w1, w2 = _codes(E, N, K, seed=1), _codes(E, K, I, seed=2)
    pw = prepare_fused_weights(w1.view(FP8), torch.ones(E, N // 128, KB), w2.view(FP8), torch.ones(E, KB, G),
                               cluster)
    assert pw.cluster == cluster
    # per CTA (e, g, c): 2*cols*K bytes = [kb, m-tile, s, lane, 16]; the kernel's GEMM1 chunk j
    # is k blocks [8/mts * j, 8/mts * (j+1)) of it, contiguous
    cta = pw.w1.view(E, G, cluster, KB, mts, 4, 32, 16)
    rows = _decode_tiles(cta)  # [E, G, cluster, KB, mts, 16, 128]
    assert (rows >= 0).all()
    for e in range(E):
        for g in range(G):
            for c in range(cluster):
                for mt in range(mts):
                    up, u = divmod(mt, mts // 2)
                    n0 = up * I + 128 * g + cols * c + 16 * u
                    want = w1[e, n0:n0 + 16].view(16, KB, 128).permute(1, 0, 2).to(torch.int16)
                    assert torch.equal(rows[e, g, c, :, mt], want)


@pytest.mark.parametrize("cluster", fused_arm.CLUSTERS)
def test_w2_layout_matches_the_mma_fragments(cluster):
    E, N, K = 2, 512, 384
    I, G, KB = N // 2, N // 256, K // 128
    mts = K // cluster // 16  # per CTA: K/cluster rows
    w1, w2 = _codes(E, N, K, seed=3), _codes(E, K, I, seed=4)
    pw = prepare_fused_weights(w1.view(FP8), torch.ones(E, N // 128, KB), w2.view(FP8), torch.ones(E, KB, G),
                               cluster)
    cta = pw.w2.view(E, G, cluster, mts, 4, 32, 16)
    rows = _decode_tiles(cta)  # [E, G, cluster, m-tile, 16, 128]
    for e in range(E):
        for g in range(G):
            for c in range(cluster):
                r0 = c * K // cluster
                want = w2[e, r0:r0 + K // cluster, 128 * g:128 * g + 128].view(mts, 16, 128).to(torch.int16)
                assert torch.equal(rows[e, g, c], want)


def test_cluster_sizes_are_checked():
    E, N, K = 1, 256, 128
    w1, w2 = _codes(E, N, K).view(FP8), _codes(E, K, N // 2).view(FP8)
    with pytest.raises(UserError, match="cluster=2 must be one of 8, 4"):
        prepare_fused_weights(w1, torch.ones(E, 2, 1), w2, torch.ones(E, 1, 1), cluster=2)
    with pytest.raises(UserError, match="cluster=16"):
        fused_arm.CudaFusedArm(cluster=16)
    with pytest.raises(UserError, match="max_clusters=0 must be at least 1"):
        fused_arm.CudaFusedArm(max_clusters=0)
    assert fused_arm.CudaFusedArm(max_clusters=74).max_clusters == 74


def test_permuted_mma_equals_the_plain_product():
    """A k block through the kernel's operand mapping gives W @ X^T exactly."""
    W = torch.randint(-8, 8, (16, 128)).float()
    X = torch.randint(-8, 8, (8, 128)).float()
    total = torch.zeros(16, 8)
    for s in range(4):
        perm = _logical_to_physical(s)
        total += W[:, perm] @ X[:, perm].T  # A logical [16, 32] times B logical [32, 8]
    assert torch.equal(total, W @ X.T)


def test_epilogue_stages_every_output_once():
    """Simulate GEMM2's epilogue: C fragment (PTX: c0,c1 row g cols 2t,2t+1; c2,c3 row g+8)
    stored as stg[token][row] (row stride STG_ROW), then lane 2u+h reads rows 8h..8h+7 of
    token u as two float4: every (row, token) lands once, in place, with no bank conflict."""
    R = fused_arm.STG_ROW
    val = {(r, t): 100 * r + t for r in range(16) for t in range(8)}
    stg = {}
    for c in range(4):  # one store instruction per C register: 32 lanes, distinct banks
        banks = []
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            row, tok = g + 8 * (c >= 2), 2 * t + (c & 1)
            addr = tok * R + row
            assert addr not in stg
            stg[addr] = val[(row, tok)]
            banks.append(addr % 32)
        assert len(set(banks)) == 32
    written = {}
    for lane in range(16):
        u, h = lane >> 1, lane & 1
        base = u * R + 8 * h
        assert (base * 4) % 16 == 0  # float4 loads
        for i in range(8):
            written[(8 * h + i, u)] = stg[base + i]
    assert written == val


# ------------------------------------------------------------------------------ validation


def _problem(M=4, K=256, N=256, E=4, top_k=2, block_m=8):
    w1, w2 = _codes(E, N, K, seed=5).view(FP8), _codes(E, K, N // 2, seed=6).view(FP8)
    weights = prepare_fused_weights(w1, torch.ones(E, N // 128, K // 128), w2, torch.ones(E, K // 128, N // 256))
    ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(M)]).int()
    plan = route_plan(ids, E, block_m)
    x = _codes(M, K, seed=7).view(FP8)
    return dict(x=x, x_scale=torch.ones(M, K // 128), weights=weights, plan=plan,
                topk_weights=torch.ones(M, top_k), out=None)


def _check(**changes):
    p = _problem()
    p.update(changes)
    validate(p["x"], p["x_scale"], p["weights"], p["plan"], p["topk_weights"], p["out"])


def test_validation_reaches_the_device_check_when_all_else_is_right():
    with pytest.raises(UserError, match="CUDA device"):
        _check()


@pytest.mark.parametrize("change, message", [
    (lambda p: dict(x=p["x"].view(torch.uint8)), "x must be float8_e4m3fn"),
    (lambda p: dict(x=p["x"][:, :128]), r"x must be \[M, K=256\]"),
    (lambda p: dict(x_scale=p["x_scale"].double()), "x_scale must be float32"),
    (lambda p: dict(x_scale=p["x_scale"][:, :1]), r"x_scale must be \[4, 2\]"),
    (lambda p: dict(topk_weights=p["topk_weights"].half()), "topk_weights must be float32"),
    (lambda p: dict(topk_weights=torch.ones(4, 17)), "top_k=17 must be in"),
    (lambda p: dict(topk_weights=torch.ones(4, 3)), "the plan has 8 slots"),
    (lambda p: dict(out=torch.zeros(4, 256)), "out must be bfloat16"),
    (lambda p: dict(out=torch.zeros(4, 128, dtype=torch.bfloat16)), r"out must be \[4, 256\]"),
    (lambda p: dict(weights=(p["weights"].w1, p["weights"].w2)), "prepare_fused_weights"),
    (lambda p: dict(x_scale=torch.ones(2, 4)[:, ::2]), r"x_scale must be \[4, 2\]"),
    (lambda p: dict(x_scale=torch.ones(4, 4)[:, ::2]), "x_scale must be contiguous"),
])
def test_validation_errors(change, message):
    p = _problem()
    with pytest.raises(UserError, match=message):
        _check(**change(p))


def test_plan_capacity_and_block_m_are_checked():
    p = _problem()
    plan = p["plan"]
    short = type(plan)(plan.block_m, plan.sorted_token_ids[:8], plan.expert_ids[:1],
                       plan.num_tokens_post_padded, plan.num_slots)
    with pytest.raises(UserError, match="worst case needs"):
        _check(plan=short)
    few_blocks = type(plan)(plan.block_m, plan.sorted_token_ids, plan.expert_ids[:1],
                            plan.num_tokens_post_padded, plan.num_slots)
    with pytest.raises(UserError, match="expert_ids holds 1 blocks"):
        _check(plan=few_blocks)
    int64 = type(plan)(plan.block_m, plan.sorted_token_ids.long(), plan.expert_ids,
                       plan.num_tokens_post_padded, plan.num_slots)
    with pytest.raises(UserError, match="1-D int32"):
        _check(plan=int64)
    ids = torch.tensor([[0, 1]] * 4, dtype=torch.int32)
    for bm in (4, 12 * 8, 13, 56, 64):  # 56 and 64: past the 168 registers of 9 warps
        with pytest.raises(UserError, match=r"block_m=\d+ must be a multiple of 8 in \[8, 48\]"):
            _check(plan=route_plan(ids, 4, bm))
    # one CTA an item holds the gate and the up sums of its 16 columns a warp: up to block_m 16
    alone = prepare_fused_weights(*(getattr(p["weights"], k) for k in ("w1", "w1_scale", "w2", "w2_scale")), 1)
    with pytest.raises(UserError, match=r"block_m=24 with one CTA an item \(cluster=1\): at most 16"):
        _check(weights=alone, plan=route_plan(ids, 4, 24))
    with pytest.raises(UserError, match="CUDA device"):  # block_m 16 passes
        _check(weights=alone, plan=route_plan(ids, 4, 16))


def test_weights_preparation_errors():
    w1, w2 = _codes(2, 256, 256).view(FP8), _codes(2, 256, 128).view(FP8)
    s1, s2 = torch.ones(2, 2, 2), torch.ones(2, 2, 1)
    prepare_fused_weights(w1, s1, w2, s2)
    with pytest.raises(UserError, match="float8_e4m3fn"):
        prepare_fused_weights(w1.view(torch.uint8).float(), s1, w2, s2)
    with pytest.raises(UserError, match="K=200"):
        prepare_fused_weights(_codes(2, 256, 200).view(FP8), s1, w2, s2)
    with pytest.raises(UserError, match="N=128"):
        prepare_fused_weights(_codes(2, 128, 256).view(FP8), s1, w2, s2)
    with pytest.raises(UserError, match="w2 must be"):
        prepare_fused_weights(w1, s1, _codes(2, 256, 64).view(FP8), s2)
    with pytest.raises(UserError, match="w1_scale must be"):
        prepare_fused_weights(w1, torch.ones(2, 2, 3), w2, s2)
    with pytest.raises(UserError, match="w2_scale must be float32"):
        prepare_fused_weights(w1, s1, w2, s2.double())


def test_arm_is_registered_and_explains_unavailability():
    from moebench.kernels.registry import load_builtin_arms, make_arm
    assert "cuda-fused" in load_builtin_arms()
    arm = make_arm("cuda-fused")
    reason = arm.unavailable_reason(torch.device("cpu"))
    assert reason and "CUDA" in reason


# ------------------------------------------------------------------------------ nvcc 13.0 guard
# The H200 image compiles through NVRTC 13.0.88, whose ptxas rejected PTX that this machine's
# pip NVRTC (13.5) accepted (v3: "Immediate addresses allowed only for .local state space").
# When an nvcc of release 13.0 is on PATH (the same ptxas), every .cu of the arms is compiled
# with each define set an arm really launches, and an error or a spill fails the test.
# nvcc's front end does not emit byte-identical PTX to NVRTC's (the register counts differ by
# a few), so this guards ptxas acceptance and spills, not the exact cubin the H200 runs.

from moebench.fixtures.shapes import BUILTIN_FAMILIES as _FAMILIES  # noqa: E402

NVCC_RELEASE = "13.0"


def test_pick_occupancy_takes_more_ctas_only_where_they_save_rounds():
    from moebench.kernels.cuda.fused_arm import pick_occupancy
    two, three = (2, 62), (3, 92)  # clusters of 4 the H200 fits at 2 and 3 CTAs an SM
    # the four fixtures' items (blocks of 8 x one requant group) and what the H200 measured
    assert pick_occupancy(57, [two, three]) == 0  # A8: 1 round either way; 3/SM lost (0.97x)
    assert pick_occupancy(74, [two, three]) == 1  # Q8: 2 rounds -> 1 (1.13x)
    assert pick_occupancy(280, [two, three]) == 1  # A128: 5 rounds -> 4 (1.01x)
    assert pick_occupancy(470, [two, three]) == 1  # Q128: 8 -> 6 (1.05x)
    assert pick_occupancy(62, [two, three]) == 0  # one round fits either way
    assert pick_occupancy(1, [two]) == 0
    assert pick_occupancy(0, [two, three]) == 0


def test_a_third_round_at_most_half_full_takes_clusters_of_8_or_whole_rounds():
    from moebench.kernels.cuda.fused_policy import tail_launch
    # (items, rounds of 96 clusters of 4 at three CTAs an SM) of the plans at BLOCK_M 8, and what an
    # H100 measured against them (results/h100/experiments/decode-clusters-*)
    assert tail_launch(217, 7168, 3, 96) == (8, None)  # A56, 2.26 rounds: clusters of 8 1.107x
    assert tail_launch(228, 7168, 3, 96) == (8, None)  # A64, 2.38: 1.060x (whole rounds 1.047x)
    assert tail_launch(226, 7168, 3, 96) == (8, None)  # A72, 2.35: 1.069x (whole rounds 1.051x)
    assert tail_launch(196, 2048, 3, 96) == (4, 66)  # Q24, 2.04: whole rounds 1.086x (clusters of 8 1.005x)
    assert tail_launch(235, 2048, 3, 96) == (4, 79)  # Q32, 2.45: whole rounds 1.013x (clusters of 8 0.972x)
    assert tail_launch(185, 7168, 3, 96) is None  # A40, 1.93: clusters of 8 0.994x
    assert tail_launch(255, 7168, 3, 96) is None  # A80, 2.66: clusters of 8 0.997x, whole rounds 1.000x
    assert tail_launch(298, 2048, 3, 96) is None  # Q48, 3.10: whole rounds 0.995x
    assert tail_launch(163, 7168, 3, 96) is None  # A32, 1.70
    assert tail_launch(228, 7168, 2, 66) is None  # two CTAs an SM: not measured, not taken
    # the band's edges: past two rounds, up to two and a half; the wide K from 4096
    assert tail_launch(192, 7168, 3, 96) is None and tail_launch(193, 7168, 3, 96) == (8, None)
    assert tail_launch(240, 7168, 3, 96) == (8, None) and tail_launch(241, 7168, 3, 96) is None
    assert tail_launch(228, 4095, 3, 96) == (4, 76) and tail_launch(228, 4096, 3, 96) == (8, None)
    # whole rounds: three of them, the last no emptier than one cluster
    for items in range(193, 241):
        cluster, most = tail_launch(items, 2048, 3, 96)
        assert cluster == 4 and 3 * (most - 1) < items <= 3 * most


def test_options_that_set_the_launch_keep_clusters_of_4_before_any_gpu_work():
    # (no fixture, no device: these return before the rule asks the GPU for its residency)
    for arm in (fused_arm.CudaFusedArm(per_sm=3), fused_arm.CudaFusedArm(stages=3), fused_arm.CudaFusedArm(max_clusters=9),
                fused_arm.CudaFusedArm(block_m=16),
                fused_arm.CudaFusedArm(zero="kernel"), fused_arm.CudaFusedDetArm()):
        assert arm.pick_cluster(None, None, 8, 228) == (fused_arm.DEFAULT_CLUSTER, arm.max_clusters, "default")


def test_cluster_policy_rule():
    from moebench.kernels.cuda.fused_arm import cluster_policy
    # persistent launches spread over every SM; one-round launches keep the default placement
    assert cluster_policy(one_round=False) == "load-balancing"
    assert cluster_policy(one_round=True) == "default"


def test_one_more_cta_an_sm_fits_only_with_a_shallow_ring():
    # BLOCK_M 8 at the fixtures' K (what pick_occupancy compares): clusters of 8, 4 stages at
    # 2 an SM and 2 at 3; clusters of 4 (activation rows of 2 k blocks, not 4), 5 and 3
    for K in (7168, 2048):
        assert choose_stages(8, K, 2, 8) == 4 and choose_stages(8, K, 3, 8) == 2
        assert 3 * (shared_bytes(8, 2, K, 8) + 1024) <= fused_arm.SMEM_PER_SM
        assert 3 * (shared_bytes(8, 3, K, 8) + 1024) > fused_arm.SMEM_PER_SM
        assert choose_stages(8, K, 2, 4) == 5 and choose_stages(8, K, 3, 4) == 3
        assert 3 * (shared_bytes(8, 3, K, 4) + 1024) <= fused_arm.SMEM_PER_SM
        assert 3 * (shared_bytes(8, 4, K, 4) + 1024) > fused_arm.SMEM_PER_SM
    assert fused_arm.x_row(8) == 528 and fused_arm.x_row(4) == 272


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if not found:
        return None
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return found if f"release {NVCC_RELEASE}," in out else None


def _arm_define_sets() -> list[tuple[str, dict[str, str]]]:
    """(source, defines) for every build an arm launches at the fixtures' K, plus the sanitizer's."""
    from moebench.kernels.cuda.arms import CUDA_GEMM, CUDA_SWAPAB
    out: list[tuple[str, dict[str, str]]] = []
    ks = sorted({f.K for f in _FAMILIES.values()} | {2048})
    for bm in (8, 16, 32, fused_arm.MAX_BLOCK_M):
        for K in ks:
            for cluster in fused_arm.CLUSTERS:
                if cluster == 1 and bm > fused_arm.MAX_BLOCK_M_ALONE:
                    continue
                for det in (False, True):  # cuda-fused, cuda-fused-det
                    allowed = fused_arm.deterministic_occupancies if det else fused_arm.occupancies
                    for per_sm in allowed(bm, cluster):  # what pick_occupancy weighs
                        try:
                            stages = choose_stages(bm, K, per_sm, cluster)
                        except UserError:
                            continue
                        d = fused_arm.kernel_defines(bm, stages, per_sm, cluster, det)
                        if (fused_arm.SOURCE, d) not in out:
                            out.append((fused_arm.SOURCE, d))
                        # the ZERO_OUT build the rule takes (zero=kernel forces it at any occupancy)
                        z = fused_arm.kernel_defines(bm, stages, per_sm, cluster, zero_out=True)
                        if not det and fused_arm.zeroes_in_kernel(per_sm, cluster) and (fused_arm.SOURCE, z) not in out:
                            out.append((fused_arm.SOURCE, z))
                        # FP32_SUM (the rule's where I > 128, sums=fp32's anywhere) at the occupancies it
                        # takes, behind the zeroing kernel and, where the rule zeroes in the kernel, with ZERO_OUT
                        zero_modes = (False, True) if fused_arm.zeroes_in_kernel(per_sm, cluster) else (False,)
                        fp32 = not det and per_sm in fused_arm.build_occupancies(bm, cluster, fp32=True)
                        for zero_out in zero_modes if fp32 else ():
                            f = fused_arm.kernel_defines(bm, stages, per_sm, cluster, zero_out=zero_out, fp32_sum=True)
                            if (fused_arm.SOURCE, f) not in out:
                                out.append((fused_arm.SOURCE, f))
    for cluster in fused_arm.CLUSTERS:  # the sanitizer's
        out.append((fused_arm.SOURCE, fused_arm.kernel_defines(16, 2, fused_arm.ctas_per_sm(16, cluster), cluster)))
    for cfg in (CUDA_GEMM, CUDA_SWAPAB):
        out.append(("sm90_grouped_gemm.cu", cfg.defines()))
    from moebench.kernels.cuda import fused_prefill  # the prefill path's two kernels, as the arm builds them
    out.append((fused_prefill.SOURCE, {"STAGES": str(fused_prefill.STAGES)}))
    known = {s for s, _ in out}
    for p in sorted(fused_arm_kernels_dir().glob("*.cu")):  # a new source compiles with its defaults
        if p.name not in known:
            out.append((p.name, {}))
    return out


def fused_arm_kernels_dir() -> Path:
    return Path(fused_arm.__file__).resolve().parent


def test_arm_define_sets_cover_every_source():
    names = {s for s, _ in _arm_define_sets()}
    assert names == {p.name for p in fused_arm_kernels_dir().glob("*.cu")}


@pytest.mark.skipif(_nvcc() is None, reason=f"needs nvcc release {NVCC_RELEASE} on PATH (the H200's compiler)")
@pytest.mark.parametrize("source,defines", _arm_define_sets(),
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_nvcc_13_0_compiles_every_arm_build_without_spills(tmp_path, source, defines):
    from moebench.kernels.cuda.nvrtc import parse_ptxas_log
    kdir = fused_arm_kernels_dir()
    cmd = [_nvcc(), "-cubin", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
           f"-I{kdir}", *(f"-D{k}={v}" for k, v in sorted(defines.items())),
           str(kdir / source), "-o", str(tmp_path / "out.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"nvcc {NVCC_RELEASE} rejects {source} {defines}:\n{log}"
    assert "error" not in log.lower(), log
    res = parse_ptxas_log(log)
    assert res, f"{source}: no kernels in ptxas's log:\n{log}"
    for kernel, k in res.items():
        assert k.spill_stores == 0 and k.spill_loads == 0, f"{source}:{kernel} {defines} spills: {k}"
        assert k.stack_bytes == 0, f"{source}:{kernel} {defines} uses a stack frame: {k}"


def _nvrtc_13_0() -> str | None:
    """libnvrtc.so.13 of NVRTC 13.0, the compiler the arms build with on the H200 (its CUDA 13.0
    wheels), named by MOEBENCH_NVRTC_13_0 (.ci/run installs it). Its ptxas can differ from nvcc
    13.0's: clusters of 8 at three CTAs an SM spill in the ZERO_OUT build under it, not under nvcc."""
    lib = os.environ.get("MOEBENCH_NVRTC_13_0")
    return lib if lib and Path(lib).is_file() else None


_COMPILE_ALL = """
import json, sys
from moebench.kernels.cuda.nvrtc import compile_source, nvrtc_version
print(json.dumps({"nvrtc": nvrtc_version(), "builds": [
    [source, defines, compile_source(source, defines=defines).build.to_dict()["resources"]]
    for source, defines in json.load(sys.stdin)]}))
"""


@pytest.mark.skipif(_nvrtc_13_0() is None, reason="needs MOEBENCH_NVRTC_13_0: libnvrtc.so.13 of NVRTC 13.0 (the H200's)")
def test_nvrtc_13_0_compiles_every_arm_build_without_spills(tmp_path):
    # every build in one child process, NVRTC 13.0 loaded ahead of the environment's own
    lib = Path(_nvrtc_13_0())
    env = dict(os.environ, LD_PRELOAD=str(lib), LD_LIBRARY_PATH=str(lib.parent), MOEBENCH_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _COMPILE_ALL], input=json.dumps(_arm_define_sets()), env=env,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["nvrtc"] == "13.0"
    assert len(got["builds"]) == len(_arm_define_sets())
    for source, defines, kernels in got["builds"]:
        assert kernels, (source, defines)
        for kernel, k in kernels.items():
            assert (k["spill_stores"], k["spill_loads"], k["stack_bytes"]) == (0, 0, 0), (source, kernel, defines, k)


def test_occupancy_beyond_what_compiles_clean_is_refused():
    # one more CTA an SM only up to BLOCK_M 16: above, the consumers spill at that budget
    assert fused_arm.occupancies(8) == (2, 3) and fused_arm.occupancies(16) == (2, 3)
    assert fused_arm.occupancies(32) == (1,) and fused_arm.occupancies(48) == (1,)
    with pytest.raises(UserError, match="per_sm=2 at block_m=32: at most 1 CTA an SM"):
        fused_arm.launch_options(32, 7168, 0, 4, per_sm=2)


def test_a_build_without_the_zeroing_kernel_is_refused_in_one_line(cache):
    from moebench.kernels.cuda.nvrtc import compile_source
    from moebench.kernels.cuda.fused_arm import ZERO_NAME, bind_zero
    old = compile_source(f'extern "C" __global__ void {fused_arm.KERNEL_NAME}(int* p) {{ p[0] = 1; }}',
                         name="old_fused.cu")  # an older copy of the file, before the zeroing kernel
    with pytest.raises(UserError, match=f"^old_fused.cu: no {ZERO_NAME} kernel"):
        bind_zero(old, 0, torch.empty(4, 128, dtype=torch.bfloat16))
