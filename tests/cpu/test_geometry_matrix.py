"""The geometry matrix on the CPU: the registry's models at two layouts each, families A and Q,
and odd geometries (I from 128 to 4096, K from 2048 to 7168), at M = 1, 8, 128, 4096 and the
verify edge cases. Host checks: routes and route plans at every block size an arm takes, floors,
fixture sizes, each arm's accept or refuse decision and its launch arithmetic; then NVRTC builds
of every CUDA arm's kernels at the meta-parameters the accepted geometries take, each distinct
define set once (a build depends on the geometry only through them). Parity on these geometries
needs the GPU (`moebench verify MODEL/LAYOUT/M --edge-cases`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, ShapeRegistry, ShapeSpec, route_plan
from moebench.fixtures.builder import fixture_routes
from moebench.fixtures.routing import plan_capacity
from moebench.fixtures.shapes import Family, fixture_build_bytes
from moebench.kernels.cuda import fused_prefill
from moebench.kernels.api.arm import geometry_refusals
from moebench.kernels.cuda.arms import BLOCK_R, CUDA_GEMM, CUDA_SWAPAB, gemm_grid, swiglu_grid
from moebench.kernels.cuda.fused_arm import CudaFusedArm, CudaFusedDetArm
from moebench.kernels.cuda.fused_layout import CLUSTERS, DEFAULT_CLUSTER
from moebench.kernels.cuda.fused_policy import (TAIL_CLUSTER, WIDE_K, build_occupancies, choose_stages, default_block_m,
                                           deterministic_occupancies, kernel_defines, launch_blocks, occupancies,
                                           sums_in_fp32, zeroes_in_kernel)
from moebench.kernels.stock.arms import StockTritonArm
from moebench.kernels.verify import EDGE_CASE_M, _routes_on, empty_expert_set

MS = (1, 8, 128, 4096)
LAYOUTS = {  # the two layouts of each model the GPU runs take (docs/models.md)
    "deepseek-v3": ("ep8", "tp8"), "kimi-k2": ("ep8", "tp8"), "glm-4.5": ("ep8", "tp4"),
    "qwen3-235b-a22b": ("ep8", "tp4"), "qwen3-30b-a3b": ("tp1", "ep8"), "qwen3-next-80b-a3b": ("tp4", "ep8"),
}
# (K, E incl. shared, top_k incl. shared, I, shared expert): not any model's
ODD = {
    "odd-k2560-i384": (2560, 60, 6, 384, False),
    "odd-k2176-i640": (2176, 24, 4, 640, True),  # K/128 = 17: GEMM1 chunks end part-filled
    "odd-i4096": (4096, 8, 2, 4096, False),
    "odd-limits": (3072, 1024, 16, 128, False),  # cuda-fused's most experts and top_k
    "odd-k7168-i128-e12": (7168, 12, 10, 128, True),
}
REFUSED = {  # geometries cuda-fused cannot serve, and the limit it names
    "odd-e1025": ((2048, 1025, 8, 128, False), "E=1025 experts, at most 1024"),
    "odd-topk17": ((2048, 64, 17, 128, False), "top_k=17, at most 16"),
}
SMS = 132  # an H100's and an H200's SMs, for the launch arithmetic that depends on them


def _odd_family(name, dims) -> Family:
    K, E, top_k, I, shared = dims
    return Family(name, "odd geometry", K=K, E=E, top_k=top_k, N=2 * I, routed_scale=1.0, shared_expert=shared,
                  model="(none)", layout="tp1")


def _spec(family: str, M: int) -> ShapeSpec:
    if family in ODD:
        return ShapeSpec(f"{family}/M{M}", _odd_family(family, ODD[family]), M, seed=M + 17)
    if family in REFUSED:
        return ShapeSpec(f"{family}/M{M}", _odd_family(family, REFUSED[family][0]), M, seed=M + 23)
    if family in ("A", "Q"):
        return ShapeRegistry().resolve(f"{family}{M}")
    return ShapeRegistry(max_fixture_gb=1e3).resolve(f"{family}/M{M}")


FAMILIES = ["A", "Q", *(f"{k}/{lay}" for k, lays in LAYOUTS.items() for lay in lays), *ODD]


def _cases(spec: ShapeSpec) -> list[tuple[str, torch.Tensor]]:
    """The shape's own routes, and verify's edge cases (one expert set of M=67, every other expert empty)."""
    ids, _ = fixture_routes(spec)
    fam, fx = spec.family, SimpleNamespace(spec=spec)
    cases = [("routes", ids)]
    if spec.M == 8:  # the edge cases are about the plan, not M: once a geometry
        cases.append(("one expert set", _routes_on(fx, list(range(fam.routed_top_k)), EDGE_CASE_M)))
        cases.append(("empty experts", _routes_on(fx, empty_expert_set(fam.routed_experts, fam.routed_top_k), 8)))
    return cases


def _check_plan(ids: torch.Tensor, E: int, block_m: int) -> int:
    """Every slot in exactly one block of its own expert; within the capacity and the grid the
    kernels launch. Returns the plan's blocks."""
    plan = route_plan(ids, E, block_m)
    slots = ids.numel()
    assert plan.sorted_token_ids.numel() >= plan_capacity(slots, E, block_m) >= plan.padded_total
    assert plan.padded_total % block_m == 0
    assert launch_blocks(slots, E, block_m, plan.sorted_token_ids.numel()) >= plan.num_blocks
    covered = plan.sorted_token_ids[: plan.padded_total]
    real = covered[covered < plan.sentinel]
    assert sorted(real.tolist()) == list(range(slots))
    block_of = torch.arange(plan.padded_total) // block_m
    mask = covered < plan.sentinel
    assert (ids.reshape(-1)[covered[mask].long()] == plan.expert_ids[block_of[mask]]).all()
    return plan.num_blocks


def _floors(spec: ShapeSpec, ids: torch.Tensor):
    """The fixture's floors from its routes alone (Fixture.floors reads only M, the routes and the dims)."""
    M = ids.shape[0]
    empty = torch.empty(M, 0)
    fx = Fixture(spec, empty, empty, empty, empty, empty, empty, ids, torch.ones(ids.shape), "")
    return fx.floors()


DEFINE_SETS: set[tuple[str, tuple]] = set()  # (source, sorted defines) the accepted geometries build


def _decode_builds(K: int, I: int, block_m: int) -> None:  # noqa: E741
    """The decode kernel's builds a call at this block size may take: the default cluster and,
    at a wide K, clusters of 8 (tail_launch), at every occupancy pick_occupancy weighs, with the
    ZERO_OUT build where the rule zeroes in the kernel, and FP32_SUM where the rule sums in FP32
    (I > 128); and the deterministic build's."""
    for cluster in (DEFAULT_CLUSTER, TAIL_CLUSTER) if K >= WIDE_K else (DEFAULT_CLUSTER,):
        for det, allowed in ((False, occupancies), (True, deterministic_occupancies)):
            for per_sm in allowed(block_m, cluster):
                try:
                    stages = choose_stages(block_m, K, per_sm, cluster)
                except UserError:
                    assert per_sm > min(allowed(block_m, cluster)), "the default occupancy always fits"
                    continue
                zero = not det and zeroes_in_kernel(per_sm, cluster)
                fp32 = not det and sums_in_fp32(I) and per_sm in build_occupancies(block_m, cluster, fp32=True)
                for z in (False, True) if zero else (False,):
                    DEFINE_SETS.add(("sm90_fused_moe.cu", tuple(sorted(
                        kernel_defines(block_m, stages, per_sm, cluster, det, z, fp32).items()))))


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("family", FAMILIES)
def test_host_side_of_every_geometry(family, M):
    spec = _spec(family, M)
    K, E, top_k, N, I = spec.K, spec.E, spec.top_k, spec.N, spec.I
    fam = spec.family
    assert N == 2 * I and I % 128 == 0 and K % 128 == 0 and 1 <= top_k <= E
    arms = [StockTritonArm(), CudaFusedArm(), CudaFusedDetArm()]
    assert geometry_refusals(arms, [spec]) == {}  # every arm serves every geometry of the matrix
    assert fixture_build_bytes(M, fam) >= 2 * E * (N * K + K * I)  # the weights' codes alone
    for label, ids in _cases(spec):
        assert ids.dtype == torch.int32 and ids.shape[1] == top_k
        assert ((ids >= 0) & (ids < E)).all()
        assert all(len(set(row)) == top_k for row in ids.tolist()), f"{label}: an expert twice in a row"
        if fam.shared_expert:
            assert (ids[:, -1] == E - 1).all() and (ids[:, :-1] < E - 1).all()
        slots, routed = ids.numel(), int(torch.unique(ids).numel())
        floors = _floors(spec, ids)
        assert floors.experts_routed == routed
        assert floors.flops == ids.shape[0] * top_k * (2 * N * K + 2 * K * I)
        assert floors.weight_bytes <= E * (N * K + K * I + 4 * ((N // 128) * (K // 128) + (K // 128) * (I // 128)))
        # cuda-gemm / cuda-swapab: their plans and grids
        for cfg in (CUDA_GEMM, CUDA_SWAPAB):
            blocks = _check_plan(ids, E, cfg.block_t)
            grid1, _ = gemm_grid(blocks, N, K)
            grid2, _ = gemm_grid(blocks, K, I)
            assert grid1[0] == grid2[0] == blocks and grid1[1] >= 1 and grid2[1] * BLOCK_R <= K
        assert swiglu_grid(slots, I)[0] * 4 >= slots * (I // 128)
        # cuda-fused: the path the route plan picks, and that path's arithmetic
        path = fused_prefill.choose_path(slots, routed, K)
        if path == "prefill" or M >= 128:
            blocks = _check_plan(ids, E, fused_prefill.BLOCK_M)
            splits, chunk = fused_prefill.split_work(blocks, ids.shape[0], N, K, SMS)
            fused_prefill.check_cut(K, splits, chunk)
            items1, items2 = fused_prefill.work_items(blocks, N, K, splits, chunk)
            assert items1 >= blocks * (N // 256) and items2 >= blocks
            assert slots * max(I, K) < 2**31
        bm = default_block_m(slots, E)
        blocks = _check_plan(ids, E, bm)
        assert blocks * (I // 128) >= 1
        _decode_builds(K, I, bm)
        _decode_builds(K, I, 16)  # the deterministic arm's and the sanitizer's block size at any M


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_geometries_cuda_fused_cannot_serve_are_refused_in_one_line(family):
    spec = _spec(family, 8)
    line = CudaFusedArm().refuses(spec)
    assert line == f"cuda-fused: {REFUSED[family][1]}" and "\n" not in line
    assert CudaFusedDetArm().refuses(spec).startswith("cuda-fused-det: ")
    assert StockTritonArm().refuses(spec) is None
    assert geometry_refusals([StockTritonArm(), CudaFusedArm()], [spec]) == {(spec.name, "cuda-fused"): line}
    with pytest.raises(UserError, match=f"no arm can serve {spec.name}: cuda-fused: "):
        geometry_refusals([CudaFusedArm(), CudaFusedDetArm()], [spec])


@pytest.mark.parametrize("routed,k", [(256, 8), (11, 9), (32, 8), (8, 8), (4, 4), (16, 8), (60, 6)])
def test_the_empty_experts_case_routes_k_distinct_experts_and_leaves_some_empty(routed, k):
    used = empty_expert_set(routed, k)
    assert len(set(used)) == len(used) >= k and max(used) < routed
    assert len(used) < routed or routed == k  # an empty expert wherever there can be one
    if routed >= 2 * (k + 1):  # the case as it was for families A and Q: every other expert
        assert used == list(range(0, routed, 2))[: max(k + 1, routed // 2)]


def test_cuda_fused_refuses_what_its_prefill_offsets_cannot_hold():
    spec = ShapeRegistry(max_fixture_gb=1e3).resolve("A65536")
    assert "below 2^31 (the prefill kernels' 32-bit offsets); at most M=33288" in CudaFusedArm().refuses(spec)
    assert CudaFusedArm(path="decode").refuses(spec) is None  # the decode kernel has no such offsets
    assert CudaFusedArm().refuses(ShapeRegistry().resolve("A16384")) is None


def test_a_shape_no_arm_serves_is_a_user_error_before_any_fixture(monkeypatch):
    from moebench.run import prepare as prep
    from moebench.run.plan import ArmPlan, RunRequest, Workload
    built = []
    monkeypatch.setattr(prep, "build_fixture", lambda spec: built.append(spec))
    monkeypatch.setattr(CudaFusedArm, "unavailable_reason", lambda self, device: None)
    monkeypatch.setattr(Workload, "specs", lambda self: [_spec("odd-e1025", 8)])
    req = RunRequest(shapes=("odd-e1025/M8",), arms=("cuda-fused",))
    with pytest.raises(UserError, match="no arm can serve odd-e1025/M8: cuda-fused: E=1025 experts, at most 1024"):
        prep.prepare(req.workload, req.protocol, ArmPlan(arms=req.arms), torch.device("cpu"))
    assert built == []


def test_the_matrix_takes_every_cluster_and_more_than_one_ring_depth():
    # (runs after the host checks in file order: they fill DEFINE_SETS)
    if not DEFINE_SETS:
        pytest.skip("the host checks did not run")
    clusters = {dict(d)["CLUSTER"] for _, d in DEFINE_SETS}
    assert clusters == {str(c) for c in CLUSTERS if c > 1}
    assert len({dict(d)["STAGES"] for _, d in DEFINE_SETS}) > 1
    # FP32 sums with and without the kernel's own zeroing, and BF16 reductions (the I = 128 geometries)
    kinds = {(dict(d).get("FP32_SUM"), dict(d).get("ZERO_OUT")) for _, d in DEFINE_SETS if "DETERMINISTIC" not in dict(d)}
    assert kinds == {(None, None), (None, "1"), ("1", None), ("1", "1")}


cuda_core = pytest.importorskip("cuda.core")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    from moebench.kernels.cuda import nvrtc as cuda_build
    old = os.environ.get("MOEBENCH_CACHE")
    os.environ["MOEBENCH_CACHE"] = str(tmp_path_factory.mktemp("nvrtc"))
    cuda_build.clear_memo()
    yield
    cuda_build.clear_memo()
    if old is None:
        os.environ.pop("MOEBENCH_CACHE")
    else:
        os.environ["MOEBENCH_CACHE"] = old


def test_nvrtc_builds_every_define_set_the_matrix_takes(cache):
    from test_fused_host import _arm_define_sets, _nvrtc_13_0

    from moebench.kernels.cuda.nvrtc import compile_source
    if not DEFINE_SETS:
        pytest.skip("the host checks did not run (run the whole file)")
    builds = sorted(DEFINE_SETS) + [("sm90_grouped_gemm.cu", tuple(sorted(c.defines().items())))
                                    for c in (CUDA_GEMM, CUDA_SWAPAB)]
    builds.append((fused_prefill.SOURCE, (("STAGES", str(fused_prefill.STAGES)),)))
    # Where the NVRTC 13.0 test runs (MOEBENCH_NVRTC_13_0 set, as in CI) it compiles every build
    # the fixtures' K take, under the H200's compiler: only the matrix's others are compiled here.
    covered = {(source, tuple(sorted(d.items()))) for source, d in _arm_define_sets()} if _nvrtc_13_0() else set()
    for source, defines in builds:
        if (source, defines) in covered:
            continue
        m = compile_source(source, defines=dict(defines))
        assert m.build.resources, (source, defines)
        for kernel, r in m.build.resources.items():
            assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), (source, kernel, defines, r)
