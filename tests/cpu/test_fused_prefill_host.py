"""CPU tests of cuda-fused's prefill path: the NVRTC build (wgmma, no spills), the host's mirror
of its shared-memory layout, the work tiling, the path rule, the arm's options and the input
checks."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import ShapeRegistry, route_plan
from moebench.fixtures.builder import fixture_routes
from moebench.kernels.cuda import fused_prefill
from moebench.kernels.cuda.fused_arm import CudaFusedArm
from moebench.kernels.cuda.fused_prefill import (BLOCK_M, PrefillWeights, choose_path, make_prefill_launch, prefill_weights,
                                            down_chunk, overlap_down, prefill_overlaps, shared_bytes, split_work,
                                            validate_prefill, work_items)

from test_fused_host import _cuobjdump

FP8 = torch.float8_e4m3fn


@pytest.fixture
def cache(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from moebench.kernels.cuda import nvrtc as cuda_build
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    fused_prefill.build_prefill.cache_clear()
    yield
    cuda_build.clear_memo()
    fused_prefill.build_prefill.cache_clear()


# ------------------------------------------------------------------------------ build


def test_both_kernels_compile_for_sm90a_without_spills(cache):
    m = fused_prefill.build_prefill()
    assert m.build.arch == "sm_90a"
    for name in fused_prefill.kernel_names(False) + fused_prefill.kernel_names(True):
        r = m.resources(name)
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, (name, r)
        assert r.registers <= 65536 // fused_prefill.THREADS // 8 * 8, (name, r)  # one CTA an SM
        assert r.shared_bytes == 0  # all dynamic, sized by shared_bytes()


def test_the_host_launches_the_block_each_build_declares():
    """A build's kernels say their block size (the launch bound the driver reports): 384 threads
    for this tree's file, 288 for a file from before the producer warpgroup, nothing else."""
    from types import SimpleNamespace
    from moebench.kernels.cuda.fused_prefill import block_threads

    def k(n):
        return SimpleNamespace(attributes=SimpleNamespace(max_threads_per_block=n))
    assert block_threads(k(384), k(384)) == 384 == fused_prefill.THREADS
    assert block_threads(k(288), k(288)) == 288
    for pair in ((k(384), k(288)), (k(256), k(256)), (k(1024), k(1024))):
        with pytest.raises(UserError, match="declare blocks of"):
            block_threads(*pair)


def test_the_producer_warpgroup_gives_the_consumers_their_registers():
    """The .cu's setmaxnreg split fits one CTA an SM, and its warpgroup is what the host launches."""
    from moebench.kernels.cuda.source import KernelSource
    src = KernelSource.shipped(fused_prefill.SOURCE).text
    threads = int(re.search(r"constexpr int THREADS = CONSUMERS \+ (\d+);", src).group(1)) + 256
    prod, cons = map(int, re.search(r"PRODUCER_REGS = (\d+), CONSUMER_REGS = (\d+);", src).groups())
    assert threads == fused_prefill.THREADS
    assert 128 * prod + 256 * cons <= 65536 and prod % 8 == 0 and cons % 8 == 0
    assert src.count("setmaxnreg.dec.sync.aligned") == 1 and src.count("setmaxnreg.inc.sync.aligned") == 1


def _sass(tmp_path) -> str:
    """The prefill module's SASS (the test skips without cuobjdump)."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    cubin = tmp_path / "prefill.cubin"
    cubin.write_bytes(fused_prefill.build_prefill().cubin)
    return subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def test_sass_runs_fp8_wgmma_and_nothing_in_local_memory(cache, tmp_path):
    sass = _sass(tmp_path)
    # QGMMA is sm_90's FP8 tensor-core instruction (the decode kernel's mma.sync runs as HMMA)
    # four k32 steps a stage, the first K step peeled; down also has its one-step walk (I = 128)
    # with two accumulators: the first tile, then the two halves of its loop
    for name, body in _functions(sass).items():
        expect = 8 if "gate_up" in name else 8 + 12
        assert body.count("QGMMA.64x128x32.F32.E4M3.E4M3") == expect, name
    assert len(_functions(sass)) == 4
    assert "HMMA" not in sass
    for op in ("UTMALDG.2D", "LDGSTS", "REDG.E.ADD.BF16x8"):
        assert op in sass, op
    assert " LDL" not in sass and " STL" not in sass
    # shared memory through shared-space instructions: no generic LD/ST (an address that went
    # through an integer loses its space, and the staging stores and scale reads turn generic)
    generic = re.search(r".*\s(LD|ST)(\.[A-Z0-9]+)*\s.*", sass)
    assert generic is None, generic.group(0)


def _functions(sass: str) -> dict[str, str]:
    return {part.split("\n", 1)[0].strip(): part for part in re.split(r"\n\s*Function : ", sass)[1:]}


def test_the_builds_apart_carry_none_of_the_overlap(cache, tmp_path):
    # the kernels launched one after the other are compiled without the overlap's counters and
    # flags (its release adds, acquire loads, the ticket atomic and the PDL trigger); its builds have them
    funcs = _functions(_sass(tmp_path))
    gate_up, down = fused_prefill.kernel_names(False)
    gate_up_ov, down_ov = fused_prefill.kernel_names(True)
    # (gate_up's K-range chain has acquire loads of its own)
    for name, ops in ((gate_up, ("PREEXIT", "REDG.E.ADD.S32.STRONG.GPU", "ATOMG")),
                      (down, ("PREEXIT", "REDG.E.ADD.S32.STRONG.GPU", "LDG.E.STRONG.GPU", "ATOMG"))):
        assert not [op for op in ops if op in funcs[name]], name
    assert "PREEXIT" in funcs[gate_up_ov] and "REDG.E.ADD.S32.STRONG.GPU" in funcs[gate_up_ov]
    assert "LDG.E.STRONG.GPU" in funcs[down_ov] and "ATOMG.E.ADD.STRONG.GPU" in funcs[down_ov]


@pytest.mark.parametrize("stages", [3, 4])
def test_host_shared_bytes_match_the_kernel_layout(cache, stages):
    from moebench.kernels.cuda.nvrtc import compile_source
    src = (f'#include "{fused_prefill.SOURCE}"\n'
           f'static_assert(SMEM_BYTES == {shared_bytes(stages)}, "host/device shared memory");\n')
    compile_source(src, defines={"STAGES": str(stages)}, name="prefill_smem_check.cu")
    assert shared_bytes(fused_prefill.STAGES) <= 227 * 1024


def test_a_ring_too_deep_for_an_sm_does_not_compile(cache):
    from moebench.kernels.cuda.nvrtc import CudaBuildError, compile_source
    assert shared_bytes(5) > 227 * 1024
    with pytest.raises(CudaBuildError, match="sm_90a"):
        compile_source(fused_prefill.SOURCE, defines={"STAGES": "5"})


# ------------------------------------------------------------------------------ tiling and the path rule


def test_work_items():
    # gate_up: one item a block and requant group; down: one a block (all its output tiles)
    assert work_items(10, 256, 7168) == (10, 10)
    assert work_items(10, 1024, 2048) == (40, 10)
    # K ranges multiply gate_up's items; chunks of tiles divide down's blocks (the last one short)
    assert work_items(10, 1024, 2048, splits=3) == (120, 10)
    assert work_items(10, 256, 7168, chunk=10) == (10, 30)


def test_gate_up_ranges_fill_the_last_round():
    # A512's 267 blocks on 132 SMs: one item a block leaves 3 CTAs a third round; K ranges spread
    # that round over every CTA, and the default rule keeps gate_up's K whole
    assert split_work(267, 512, 256, 7168, 132)[0] == 1
    splits, _ = split_work(267, 512, 256, 7168, 132, max_splits=fused_prefill.MAX_SPLITS)
    g, _ = work_items(267, 256, 7168, splits)
    assert splits > 1 and -(-g // 132) * (56 / splits) <= 0.85 * 3 * 56  # K steps on the busiest CTA
    assert split_work(261, 256, 256, 7168, 132, max_splits=fused_prefill.MAX_SPLITS)[0] == 1  # two full rounds
    # never a K range below MIN_SPLIT_STEPS steps
    assert split_work(3, 8, 256, 640, 132, max_splits=fused_prefill.MAX_SPLITS)[0] == 1
    for blocks in (1, 5, 133, 300):
        s, c = split_work(blocks, 4 * blocks, 256, 7168, 132, max_splits=fused_prefill.MAX_SPLITS)
        assert 1 <= s <= fused_prefill.MAX_SPLITS and 7168 // 128 // s >= fused_prefill.MIN_SPLIT_STEPS
        assert 1 <= c <= 28


def test_down_chunks_keep_the_window_of_output_columns():
    window = fused_prefill.DOWN_WINDOW_BYTES
    # four tiles while tokens x 4 x 256 BF16 columns fit the window, fewer past it, never none
    assert down_chunk(2500, 8192, 7168, 132) == 4 and 8192 * 4 * 256 * 2 <= window
    assert down_chunk(2500, 16384, 7168, 132) == 2 and 16384 * 3 * 256 * 2 > window
    assert down_chunk(2800, 16384, 2048, 132) == 2
    assert down_chunk(10**5, 10**6, 7168, 132) == 1
    assert down_chunk(400, 1024, 7168, 132) == 4
    assert down_chunk(10, 40, 640, 132) == 1  # K = 640: three tiles, and ten blocks fill no grid
    # a plan of few blocks takes shorter chunks so that every CTA has an item
    assert down_chunk(20, 512, 7168, 132) == 4  # 20 x 7 chunks: 140 items
    assert down_chunk(10, 256, 7168, 132) == 2  # 10 x 7 and 10 x 10 leave CTAs idle, 10 x 14 does not
    assert down_chunk(4, 64, 7168, 132) == 1  # 4 x 28: as many items as there are
    assert split_work(2500, 16384, 256, 7168, 132)[1] == down_chunk(2500, 16384, 7168, 132)


def _box_rows(tile: int, inter: int, gate_up: bool) -> list[int]:
    """The .cu's box_row: the first row (inside the expert) of each of a tile's four TMA boxes."""
    if gate_up:
        return [(i & 1) * inter + tile * 128 + (i >> 1) * 64 for i in range(4)]
    return [tile * 256 + 64 * i for i in range(4)]


@pytest.mark.parametrize("N", [256, 512, 1024])
def test_gate_up_tiles_pair_each_gate_column_with_its_up_column(N):
    inter = N // 2
    seen = []
    for g in range(inter // 128):
        boxes = _box_rows(g, inter, True)
        rows = [r for b in boxes for r in range(b, b + 64)]  # stage rows 0..255
        for wg in range(2):
            half = rows[128 * wg:128 * wg + 128]  # warpgroup wg's wgmma B rows
            gate, up = half[:64], half[64:]
            assert [u - inter for u in up] == gate  # column c of the tile pairs with column c + 64
            assert gate == list(range(128 * g + 64 * wg, 128 * g + 64 * wg + 64))
        seen += rows
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("K", [256, 640, 7168])
def test_down_tiles_cover_every_output_column_once(K):
    tiles = -(-K // fused_prefill.BLOCK_N)  # the .cu's tiles of the down kernel
    rows = [r for t in range(tiles) for b in _box_rows(t, 128, False) for r in range(b, b + 64)]
    assert sorted(r for r in rows if r < K) == list(range(K)) and len(set(rows)) == len(rows)


@pytest.mark.parametrize("name, path", [("A8", "decode"), ("A128", "decode"), ("Q8", "decode"), ("Q128", "decode"),
                                        ("A256", "prefill"), ("A512", "grouped"), ("A1024", "prefill"),
                                        ("Q256", "decode"), ("Q512", "prefill"), ("A4096", "prefill"), ("Q1024", "prefill"),
                                        ("Q16384", "prefill")])
def test_the_path_rule_at_the_fixtures(name, path):
    spec = ShapeRegistry().resolve(name)
    ids, _ = fixture_routes(spec)
    assert choose_path(ids.numel(), int(torch.unique(ids).numel()), spec.K) == path


def test_the_path_rule_threshold():
    t = fused_prefill.MIN_TOKENS_PER_EXPERT
    assert choose_path(int(100 * t), 100) == "prefill"
    assert choose_path(int(100 * t) - 1, 100) == "decode"
    assert choose_path(1, 0) == "decode"


def test_the_grouped_band_needs_a_wide_hidden_size():
    low, high = fused_prefill.GROUPED_SLOTS_PER_EXPERT
    wide, narrow = fused_prefill.GROUPED_MIN_K, fused_prefill.GROUPED_MIN_K - 128
    assert choose_path(int(100 * low), 100, wide) == "grouped"
    assert choose_path(int(100 * low) - 1, 100, wide) == "prefill"  # below the band: the wgmma pair
    assert choose_path(int(100 * high) - 1, 100, wide) == "grouped"
    assert choose_path(int(100 * high), 100, wide) == "prefill"
    assert choose_path(int(100 * high) - 1, 100, narrow) == "prefill"  # Q's K = 2048 keeps the fused paths
    assert choose_path(int(100 * low), 100, narrow) == "prefill"
    assert low > fused_prefill.MIN_TOKENS_PER_EXPERT  # the decode kernel below both
    # the pair overlapped (down beside gate_up's last round) is the faster in the band
    assert choose_path(int(100 * low), 100, wide, overlaps=True) == "prefill"


@pytest.mark.parametrize("name, overlaps", [("A448", True), ("A512", True), ("A384", False), ("A2048", False),
                                            ("A1024", True), ("Q4096", False)])
def test_the_band_shapes_overlap(name, overlaps):
    spec = ShapeRegistry().resolve(name)
    ids, _ = fixture_routes(spec)
    blocks = route_plan(ids, spec.E, BLOCK_M).num_blocks
    assert prefill_overlaps(blocks, spec.M, spec.N, spec.K, 132) is overlaps


def test_arm_path_options():
    assert CudaFusedArm().path == "auto"
    assert CudaFusedArm(path="prefill").path == "prefill"
    assert CudaFusedArm(block_m=16).path == "decode"  # a decode-kernel option picks that kernel
    assert CudaFusedArm(path="grouped").path == "grouped"
    with pytest.raises(UserError, match="block_m set the decode kernel; path=grouped does not launch it"):
        CudaFusedArm(path="grouped", block_m=8)
    with pytest.raises(UserError, match="path='fast' must be one of auto, decode, grouped, prefill"):
        CudaFusedArm(path="fast")
    with pytest.raises(UserError, match="block_m, cluster set the decode kernel"):
        CudaFusedArm(path="prefill", block_m=8, cluster=4)


def test_the_prefill_cut_is_an_arm_option_that_picks_the_prefill_kernels():
    from moebench.kernels.cuda.fused_arm import CudaFusedDetArm
    from moebench.run.variants import parse_variant
    arm = CudaFusedArm(chunk=1)
    assert arm.path == "prefill" and arm.chunk == 1 and arm.splits is None
    assert CudaFusedArm(path="auto", splits=2).path == "auto"  # asked for auto: the plan still decides
    assert parse_variant("c1=cuda-fused:chunk=1").settings == (("chunk", 1),)
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(UserError, match=r"chunk=.* must be a whole number of at least 1"):
            CudaFusedArm(chunk=bad)
    with pytest.raises(UserError, match="chunk set the prefill kernels, but path=decode does not launch them"):
        CudaFusedArm(path="decode", chunk=2)
    with pytest.raises(UserError, match="chunk, splits set the prefill kernels, but path=grouped does not launch them"):
        CudaFusedArm(path="grouped", chunk=2, splits=2)
    with pytest.raises(UserError, match="splits set the prefill kernels, but block_m set the decode kernel"):
        CudaFusedArm(block_m=8, splits=2)
    with pytest.raises(UserError, match="chunk set the prefill kernels, but the deterministic build is the decode kernel"):
        CudaFusedDetArm(chunk=1)


def test_overlap_is_an_arm_option_of_0_or_1():
    from moebench.run.variants import parse_variant
    assert CudaFusedArm(overlap=0).path == "prefill" and CudaFusedArm(overlap=1).overlap == 1
    assert parse_variant("o0=cuda-fused:overlap=0").settings == (("overlap", 0),)
    for bad in (2, -1, True, "1", 0.5):
        with pytest.raises(UserError, match=r"overlap=.* must be 0 or 1"):
            CudaFusedArm(overlap=bad)
    with pytest.raises(UserError, match="overlap set the prefill kernels, but path=decode does not launch them"):
        CudaFusedArm(path="decode", overlap=1)


def test_down_runs_beside_gate_ups_last_round_where_the_model_gains():
    # the sweeps' plans (blocks from the fixtures' routes): A512's third round of 3 items leaves
    # 129 SMs to down; A2048's of 101 leaves 31, too few for down's 2,555 items; one round or a
    # full last round leaves nothing to overlap
    assert overlap_down(267, 1869, 132, 132, 56, 4) == (True, 129)
    assert overlap_down(282, 1974, 132, 132, 56, 4) == (True, 114)
    assert overlap_down(365, 2555, 132, 132, 56, 4) == (False, 132)
    assert overlap_down(2423, 33922, 132, 132, 56, 2) == (False, 132)
    assert overlap_down(261, 1827, 132, 132, 56, 4) == (False, 132)  # a second round of 129 of 132
    assert overlap_down(100, 700, 132, 132, 56, 4) == (False, 132)  # one round
    assert overlap_down(264, 1848, 132, 132, 56, 4) == (False, 132)  # two full rounds
    # the model: beside wins by the last round's length less down's longer rounds on fewer SMs
    go, ctas = overlap_down(673, 4711, 132, 132, 56, 4)
    assert go and ctas == 132 - 673 % 132


def test_a_build_without_a_kernel_this_tree_launches_is_one_line(cache):
    from moebench.kernels.cuda.nvrtc import compile_source
    # an older copy of the file: the two kernels apart, none of the overlap's builds
    old = compile_source("\n".join(f'extern "C" __global__ void {name}(int* p) {{ p[0] = 1; }}'
                                    for name in fused_prefill.kernel_names(False)), name="old.cu")
    fused_prefill.need_kernels(old, fused_prefill.kernel_names(False))  # the builds apart are there
    with pytest.raises(UserError, match=r"^old.cu: no moebench_prefill_gate_up_overlap kernel, which this tree's "
                                        r"prefill launch runs; build a copy of sm90_fused_prefill.cu that has it$"):
        fused_prefill.need_kernels(old, fused_prefill.kernel_names(True))


def test_a_chunk_past_the_tiles_is_refused():
    p = _problem()  # K = 256: one w2 tile
    with pytest.raises(UserError, match=r"chunk=2 must be in \[1, K/256 = 1\]"):
        make_prefill_launch(p["x"], p["x_scale"], p["w"], p["plan"], p["topk_weights"], chunk=2)


def test_builds_and_the_deterministic_arm_run_the_decode_kernel():
    from moebench.kernels.cuda.fused_arm import CudaFusedDetArm, shipped_source
    assert CudaFusedDetArm().path == "decode"  # the prefill kernels reduce-add in hardware order
    assert CudaFusedArm(source=shipped_source()).path == "decode"  # a build is of the decode kernel's source
    with pytest.raises(UserError, match="not the deterministic build"):
        CudaFusedDetArm(path="prefill")
    with pytest.raises(UserError, match="not a build of"):
        CudaFusedArm(path="prefill", source=shipped_source())


def test_decode_options_without_a_path_still_reach_the_decode_kernel():
    from moebench.kernels.registry import make_arms
    arm, = make_arms(["cuda-fused"], {"block_m": 8})
    assert arm.path == "decode" and arm.block_m == 8


# ------------------------------------------------------------------------------ validation


def _codes(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(FP8)


def _problem(M=40, K=256, N=256, E=4, top_k=2):
    w = prefill_weights(_codes(E, N, K, seed=1), torch.ones(E, N // 128, K // 128), _codes(E, K, N // 2, seed=2),
                        torch.ones(E, K // 128, N // 256))
    ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(M)]).int()
    return dict(x=_codes(M, K, seed=3), x_scale=torch.ones(M, K // 128), w=w, plan=route_plan(ids, E, BLOCK_M),
                topk_weights=torch.ones(M, top_k), out=None)


def _check(**changes):
    p = _problem()
    p.update(changes)
    validate_prefill(p["x"], p["x_scale"], p["w"], p["plan"], p["topk_weights"], p["out"])


def test_weight_views_are_the_same_bytes():
    E, N, K = 3, 512, 384
    w1, w2 = _codes(E, N, K, seed=4), _codes(E, K, N // 2, seed=5)
    w = prefill_weights(w1, torch.ones(E, 4, 3), w2, torch.ones(E, 3, 2))
    assert isinstance(w, PrefillWeights) and (w.E, w.N, w.K, w.I) == (E, N, K, N // 2)
    assert torch.equal(w.w1.view(E, N, K), w1.view(torch.uint8)) and w.w1.shape == (E * N, K)
    assert torch.equal(w.w2.view(E, K, N // 2), w2.view(torch.uint8)) and w.w2.shape == (E * K, N // 2)


@pytest.mark.parametrize("args, message", [
    (lambda: (_codes(2, 200, 256), torch.ones(2, 2, 2), _codes(2, 256, 100), torch.ones(2, 2, 1)), "N=200"),
    (lambda: (_codes(2, 256, 200), torch.ones(2, 2, 2), _codes(2, 200, 128), torch.ones(2, 2, 1)), "K=200"),
    (lambda: (_codes(2, 256, 256), torch.ones(2, 2, 2), _codes(2, 256, 64), torch.ones(2, 2, 1)), "w2 must be"),
    (lambda: (_codes(2, 256, 256), torch.ones(2, 2, 3), _codes(2, 256, 128), torch.ones(2, 2, 1)),
     r"w1_scale must be float32 \[2, 2, 2\]"),
    (lambda: (_codes(2, 256, 256).float(), torch.ones(2, 2, 2), _codes(2, 256, 128), torch.ones(2, 2, 1)),
     "float8_e4m3fn"),
])
def test_weight_errors(args, message):
    with pytest.raises(UserError, match=message):
        prefill_weights(*args())


def test_validation_reaches_the_device_check_when_all_else_is_right():
    with pytest.raises(UserError, match="CUDA device"):
        _check()


@pytest.mark.parametrize("change, message", [
    (lambda p: dict(x=p["x"].view(torch.uint8)), "x must be float8_e4m3fn"),
    (lambda p: dict(x_scale=p["x_scale"][:, :1].contiguous()), r"x_scale must be float32 \[40, 2\]"),
    (lambda p: dict(topk_weights=torch.ones(40, 17)), "top_k=17 must be in"),
    (lambda p: dict(topk_weights=torch.ones(40, 3)), "the plan has 80 slots"),
    (lambda p: dict(plan=route_plan(torch.zeros(40, 2, dtype=torch.int32), 4, 16)),
     "the prefill path takes plans of block_m=64, got 16"),
    (lambda p: dict(out=torch.zeros(40, 256)), r"out must be bfloat16 \[40, 256\]"),
    (lambda p: dict(x_scale=torch.ones(40, 4)[:, ::2]), "x_scale must be contiguous"),
])
def test_validation_errors(change, message):
    with pytest.raises(UserError, match=message):
        _check(**change(_problem()))


def test_plan_capacity_is_checked():
    plan = _problem()["plan"]
    short = type(plan)(plan.block_m, plan.sorted_token_ids[:64], plan.expert_ids, plan.num_tokens_post_padded,
                       plan.num_slots)
    with pytest.raises(UserError, match="worst case needs"):
        _check(plan=short)
    few = type(plan)(plan.block_m, plan.sorted_token_ids, plan.expert_ids[:1], plan.num_tokens_post_padded,
                     plan.num_slots)
    with pytest.raises(UserError, match="expert_ids holds 1 blocks"):
        _check(plan=few)


def test_more_experts_than_the_contract_is_refused():
    E = 1025
    w = PrefillWeights(torch.zeros(E * 256, 128, dtype=torch.uint8), torch.ones(E, 2, 1),
                       torch.zeros(E * 128, 128, dtype=torch.uint8), torch.ones(E, 1, 1), E, 256, 128)
    with pytest.raises(UserError, match=r"E=1025 must be in \[1, 1024\]"):
        _check(w=w)
