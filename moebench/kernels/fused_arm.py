"""Arm `cuda-fused`: the whole FP8 MoE layer in one sm_90a kernel (sm90_fused_moe.cu).

Public helpers:
  prepare_fused_weights(w1, w1_scale, w2, w2_scale, cluster=4) -> FusedWeights   one-off, untimed layout change
  fused_moe(x, x_scale, weights, plan, topk_weights, out=None) -> out  checks, allocates, launches

The layout change re-orders each expert's FP8 weights so that every CTA of the kernel streams
one contiguous range, tile by tile in mma fragment order (the kernel's header comment has the
details). Bytes per fixture are unchanged: the kernel reads every routed expert's weights once
per plan block, 384*K bytes per work item (plan block x group of 128 columns), split over the
CTAs of one cluster (8 CTAs of 48*K bytes, or 4 of 96*K, the default), or streamed by one CTA
(cluster=1, block_m up to 16: no SwiGLU exchange, but one SM's bulk copies are slower than
four SMs'; measured slower at every M up to 8, so not the default); the grid is persistent (as
many clusters as the GPU holds at once).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, RoutePlan, plan_capacity, route_plan
from moebench.kernels.arm import Arm, KernelDecl, PreparedCall, register_arm

SOURCE = "sm90_fused_moe.cu"
KERNEL_NAME = "moebench_fused_moe"
LAYOUT = "fused-v1"  # bump when prepare_fused_weights changes the order it writes

GROUP = 128  # FP8 block-scale granularity (weights 128x128, activations 1x128)
# CTAs per work item: clusters of 8 x 16 or 4 x 32 intermediate columns = one requant group,
# or one CTA with the whole group (no SwiGLU exchange between CTAs).
CLUSTERS = (8, 4, 1)
# Clusters of 4 by default: against 8 on the H200, 1.156x at A8, 1.005x at A128, 1.032x at Q8
# and 1.068x at Q128 (results/h200/experiments/cuda-fused-clusters-*.json.gz).
DEFAULT_CLUSTER = 4
THREADS = 288  # 8 consumer warps + 1 producer warp
AQ_ROW, STG_ROW = 144, 20
MAX_BLOCK_M = 48  # BLOCK_M 56 and 64 do not fit the consumers in the 168 registers of 9 warps without spilling
MAX_BLOCK_M_ALONE = 16  # one CTA an item holds gate and up sums: from BLOCK_M 32 they spill
MAX_E, MAX_TOP_K = 1024, 16
SMEM_PER_SM = 228 * 1024  # H100/H200: shared memory per SM; 1 KB of it reserved per CTA
SMEM_PER_CTA = 227 * 1024
MAX_STAGES = 8
FP8 = torch.float8_e4m3fn


# ------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class FusedWeights:
    """Expert weights in the kernel's layout (same bytes, another order) and their scales."""

    w1: torch.Tensor  # [E, N, K] uint8, re-laid gate/up codes
    w1_scale: torch.Tensor  # [E, N/128, K/128] fp32, unchanged
    w2: torch.Tensor  # [E, K, I] uint8, re-laid down codes
    w2_scale: torch.Tensor  # [E, K/128, I/128] fp32, unchanged
    cluster: int  # the cluster size the order is for (CTAs per work item)
    layout: str = LAYOUT

    @property
    def E(self) -> int:
        return self.w1.shape[0]

    @property
    def N(self) -> int:
        return self.w1.shape[1]

    @property
    def K(self) -> int:
        return self.w1.shape[2]

    @property
    def I(self) -> int:  # noqa: E743
        return self.N // 2

    @property
    def device(self) -> torch.device:
        return self.w1.device


def _codes(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in (FP8, torch.uint8):
        raise UserError(f"{name} must be float8_e4m3fn codes, got {t.dtype}")
    return t.contiguous().view(torch.uint8)


def prepare_fused_weights(w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor,
                          w2_scale: torch.Tensor, cluster: int = DEFAULT_CLUSTER) -> FusedWeights:
    """Re-lay gate/up [E,N,K] and down [E,K,I] FP8 weights for the fused kernel run with
    clusters of `cluster` CTAs (untimed). With C = 128/cluster columns a CTA:

    w1: row n = h1*I + 128g + C*c + 16u + 8q + r (h1 0 gate / 1 up, c the CTA of the cluster,
        u its 16-row tile), column k = 128kb + 32t + 8s + 4h + j; written as
        [E, g, c, kb, (h1 u), s, r, t, h, q, j]: per CTA 2*C*K contiguous bytes, per
        (kb, m-tile, s) one 512-byte mma A tile whose lane r*4+t holds rows (r, r+8) x bytes
        (8s + 4h + j) of its 32-byte k slice.
    w2: row = c*K/cluster + 16m + 8q + r, column i = 128g + 32t + 8s + 4h + j; written as
        [E, g, c, m, s, r, t, h, q, j]: per CTA 128*K/cluster contiguous bytes.
    """
    if cluster not in CLUSTERS:
        raise UserError(f"cluster={cluster} must be one of {', '.join(map(str, CLUSTERS))}")
    w1b, w2b = _codes(w1, "w1"), _codes(w2, "w2")
    if w1b.dim() != 3 or w2b.dim() != 3:
        raise UserError(f"w1 must be [E, N, K] and w2 [E, K, I], got {tuple(w1.shape)} and {tuple(w2.shape)}")
    E, N, K = w1b.shape
    I = N // 2  # noqa: E741
    if K % GROUP or K < GROUP:
        raise UserError(f"K={K} must be a positive multiple of {GROUP}")
    if N % (2 * GROUP) or N < 2 * GROUP:
        raise UserError(f"N={N} must be a positive multiple of {2 * GROUP}")
    if tuple(w2b.shape) != (E, K, I):
        raise UserError(f"w2 must be [E, K, I] = {(E, K, I)}, got {tuple(w2.shape)}")
    _check_scale(w1_scale, (E, N // GROUP, K // GROUP), "w1_scale")
    _check_scale(w2_scale, (E, K // GROUP, I // GROUP), "w2_scale")
    G, KB, U = I // GROUP, K // GROUP, GROUP // cluster // 16
    a = w1b.view(E, 2, G, cluster, U, 2, 8, KB, 4, 4, 2, 4)  # e h1 g c u q r kb t s h j
    a = a.permute(0, 2, 3, 7, 1, 4, 9, 6, 8, 10, 5, 11)  # e g c kb h1 u s r t h q j
    b = w2b.view(E, cluster, K // cluster // 16, 2, 8, G, 4, 4, 2, 4)  # e c m q r g t s h j
    b = b.permute(0, 5, 1, 2, 7, 4, 6, 8, 3, 9)  # e g c m s r t h q j
    return FusedWeights(a.contiguous().view(E, N, K), w1_scale.float().contiguous(),
                        b.contiguous().view(E, K, I), w2_scale.float().contiguous(), cluster)


def _check_scale(t: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    if t.dtype != torch.float32:
        raise UserError(f"{name} must be float32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise UserError(f"{name} must be {list(shape)}, got {list(t.shape)}")


# ------------------------------------------------------------------------------ launch shape


def meta_bytes(block_m: int, K: int) -> int:
    KB = K // GROUP
    return (16 + 3 * block_m * 4 + block_m * (KB + 4) * 4 + 3 * KB * 4 + 15) & ~15


def chunk_bytes(cluster: int) -> int:
    """One ring stage of weights (the kernel's CHUNK_BYTES): 16 KB, or 32 KB (one k block of
    the group's 256 gate and up rows) for one CTA an item."""
    return 32768 if cluster == 1 else 16384


def x_row(cluster: int) -> int:
    """Bytes of one activation row of a GEMM1 chunk in shared memory (the kernel's X_ROW):
    the chunk's k blocks (4 at clusters of 8, 2 at 4, 1 alone) + 16, so the B loads hit every
    bank once."""
    return max(cluster // 2, 1) * GROUP + 16


def shared_bytes(block_m: int, stages: int, K: int, cluster: int) -> int:
    """Dynamic shared memory of one CTA: mirrors `carve` in the kernel (which checks it)."""
    red = 0 if cluster == 1 else 8 * 16 * block_m * 4  # GEMM1's partials of the cluster's warps
    n = stages * chunk_bytes(cluster) + stages * block_m * x_row(cluster) + block_m * GROUP * 4 + red
    n += block_m * AQ_ROW
    n = (n + 15) & ~15
    n += 8 * 8 * STG_ROW * 4 + 2 * meta_bytes(block_m, K)
    return n + 2 * stages * 8 + 4 * 8 + 2 * 8 + 4 * 8 + 2 * 4  # ring, meta, exchange, ticket barriers; tickets


def ctas_per_sm(block_m: int, cluster: int = DEFAULT_CLUSTER) -> int:
    """CTAs an SM holds (the kernel's MIN_CTAS_PER_SM default): two small ones hide each
    other's SwiGLU exchange; from BLOCK_M 32 the per-item buffers leave room for one. One CTA
    an item runs alone on its SM, with the deepest ring."""
    return 2 if block_m <= 16 and cluster > 1 else 1


def occupancies(block_m: int, cluster: int = DEFAULT_CLUSTER) -> tuple[int, ...]:
    """CTAs an SM the arm may launch at: the default and, up to BLOCK_M 16 in clusters, one
    more (from BLOCK_M 32 on, the register budget of one more CTA does not hold the consumers
    without spilling under the H200's ptxas, the CI guard's nvcc 13.0)."""
    base = ctas_per_sm(block_m, cluster)
    return (base, base + 1) if base == 2 else (base,)


def pick_occupancy(items: int, options: list[tuple[int, int]]) -> int:
    """Index into `options` ((CTAs an SM, resident clusters), fewest CTAs an SM first) of
    the launch to use: one more CTA an SM (shallower ring, more consumer warps: measured
    1.10-1.12x at A128 and Q128 on the H200 with clusters of 8,
    results/h200/experiments/cuda-fused-stages-*) only where its extra clusters take whole
    rounds of items off, since each round is slower; where the rounds stay the same it lost
    (A8: 0.96x at clusters of 8; 0.97x at clusters of 4, experiments/cuda-fused-clusters-*)."""
    rounds = [-(-items // max(c, 1)) for _, c in options]
    return rounds.index(min(rounds))  # the first (fewest CTAs an SM) of those with fewest rounds


@dataclass(frozen=True)
class LaunchOption:
    """One way to launch the kernel: occupancy, ring depth, and the clusters the driver
    keeps resident at that occupancy (the persistent grid's size)."""

    per_sm: int
    stages: int
    smem: int
    resident: int     # with the default cluster placement
    resident_lb: int  # with "load-balancing" placement (clusters of one: the same)
    module: object
    kernel: object


def launch_options(block_m: int, K: int, device_index: int, cluster: int, per_sm: int | None = None,
                   stages: int | None = None) -> list[LaunchOption]:
    """The launches `pick_occupancy` weighs: the default occupancy and one more CTA an SM
    with the deepest ring that still fits; only the given occupancy or ring depth where one
    is set."""
    from moebench.kernels.cuda_launch import raise_shared_limit, set_cluster_policy
    if per_sm is None and stages is None:
        per_sm_options = [ctas_per_sm(block_m, cluster)]
        for ps in occupancies(block_m, cluster)[1:]:
            try:
                choose_stages(block_m, K, ps, cluster)
                per_sm_options.append(ps)
            except UserError:
                pass
    else:
        per_sm_options = [ctas_per_sm(block_m, cluster) if per_sm is None else per_sm]
        most = max(occupancies(block_m, cluster))
        _need(1 <= per_sm_options[0] <= most,
              f"per_sm={per_sm_options[0]} at block_m={block_m}: at most {most} CTA{'s' if most > 1 else ''} an SM")
    out = []
    for ps in per_sm_options:
        st = choose_stages(block_m, K, ps, cluster) if stages is None else stages
        smem = shared_bytes(block_m, st, K, cluster)
        _need(2 <= st <= 10 and smem <= SMEM_PER_CTA, f"stages={st} needs {smem} B of shared memory")
        module = build_fused(block_m, st, ps, cluster)
        kernel = module.kernel(KERNEL_NAME, device_index)
        raise_shared_limit(kernel, smem, device_index)
        resident = resident_lb = resident_clusters(kernel, smem, device_index, ps, cluster)
        if cluster > 1:
            set_cluster_policy(kernel, "load-balancing", device_index)
            resident_lb = resident_clusters(kernel, smem, device_index, ps, cluster)
            set_cluster_policy(kernel, "default", device_index)
        out.append(LaunchOption(ps, st, smem, resident, resident_lb, module, kernel))
    return out


def choose_stages(block_m: int, K: int, per_sm: int | None, cluster: int) -> int:
    """The deepest ring (up to MAX_STAGES) that keeps `per_sm` CTAs (None: `ctas_per_sm`)
    resident on an SM."""
    per_sm = ctas_per_sm(block_m, cluster) if per_sm is None else per_sm
    per_cta = min(SMEM_PER_CTA, SMEM_PER_SM // per_sm - 1024)
    for stages in range(MAX_STAGES, 1, -1):
        if shared_bytes(block_m, stages, K, cluster) <= per_cta:
            return stages
    raise UserError(f"cuda-fused: block_m={block_m} with K={K} needs "
                    f"{shared_bytes(block_m, 2, K, cluster)} B of shared memory, more than an SM has")


def default_block_m(num_slots: int, num_experts: int) -> int:
    """Tokens per plan block: decode-sized groups get 8 (Swap-AB n-tile), larger ones more."""
    per_expert = num_slots / max(num_experts, 1)
    for bm in (8, 16, 32):
        if per_expert <= 0.75 * bm:
            return bm
    return MAX_BLOCK_M


def launch_blocks(num_slots: int, num_experts: int, block_m: int, capacity: int) -> int:
    """Plan blocks the grid covers: the most that any routing can fill, whatever the plan
    buffers hold. Only experts with slots get blocks (moe_align_block_size), so at most
    min(E, slots) experts each waste up to block_m - 1 slots: at A8 72 blocks, not the 234 the
    buffers are sized for; every block past the device-side padded total exits at once."""
    worst = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return min(capacity // block_m, (worst + block_m - 1) // block_m)


def kernel_defines(block_m: int, stages: int, per_sm: int, cluster: int) -> dict[str, str]:
    """The .cu's meta-parameters for one build."""
    return {"BLOCK_M": str(block_m), "STAGES": str(stages), "MIN_CTAS_PER_SM": str(per_sm),
            "CLUSTER": str(cluster)}


def source_with_defines(*defines: tuple[str, str]):
    """A SourceOverride that compiles the kernel's own source with `defines` added, for
    diagnostic builds (MOEBENCH_TRACE, STATIC_WORK); enter it with `source_override` before
    the first build of the process (`build_fused` caches)."""
    from moebench.kernels.cuda_build import SourceOverride
    return SourceOverride(SOURCE, Path(__file__).with_name(SOURCE), tuple(defines))


@functools.lru_cache(maxsize=None)
def build_fused(block_m: int, stages: int, per_sm: int | None, cluster: int):
    """The compiled module for one meta-parameter set (NVRTC, cached on disk)."""
    from moebench.kernels.cuda_build import compile_source
    per_sm = ctas_per_sm(block_m, cluster) if per_sm is None else per_sm
    return compile_source(SOURCE, defines=kernel_defines(block_m, stages, per_sm, cluster))


def cluster_policy(one_round: bool, forced: str | None = None) -> str:
    """How the hardware is asked to place the clusters on SMs (cuda_launch.CLUSTER_POLICIES).
    Persistent launches (more work items than the default placement keeps resident) take
    "load-balancing": it puts clusters of 4 on all 132 SMs of an H200 where the default
    leaves 8 without one, so more clusters are resident (96 against 92 at three CTAs an SM).
    Measured on the H200 as builds of paired runs (docs/kernels.md, "The hardware's cluster
    placement"): A128 1.029-1.033x (280 items: three rounds of 96 clusters, not four of 92),
    Q128 0.994-0.998x. Launches of one round keep the default (Q8: 0.984x with load-balancing).
    `forced` (a build's CLUSTER_POLICY define, see `forced_policy`) overrides the rule."""
    if forced is not None:
        return forced
    return "default" if one_round else "load-balancing"


def forced_policy(module) -> str | None:
    """The policy a build's CLUSTER_POLICY define (0, 1, 2 or a policy's name) forces, so that
    policies can be timed as builds of one paired run; the kernel itself ignores the define."""
    from moebench.kernels.cuda_launch import CLUSTER_POLICIES
    value = dict(module.build.defines).get("CLUSTER_POLICY")
    if value is None:
        return None
    names = {str(v): name for name, v in CLUSTER_POLICIES.items()}  # the driver's values, by name
    _need(value in names or value in names.values(),
          f"CLUSTER_POLICY={value}: one of 0, 1, 2, {', '.join(names.values())}")
    return names.get(value, value)


def resident_clusters(kernel, smem: int, device_index: int, per_sm: int, cluster: int) -> int:
    """Clusters of `cluster` CTAs that the GPU runs at once (the persistent grid): the driver's
    answer (it knows how the SMs group into GPCs), else a cautious estimate."""
    try:
        from cuda.core import Device, LaunchConfig
        dev = Device(device_index)
        cfg = LaunchConfig(grid=(cluster, 1, 1), cluster=(cluster, 1, 1), block=(THREADS, 1, 1),
                           shmem_size=smem)
        n = int(kernel.occupancy.max_active_clusters(cfg, stream=dev.default_stream))
        if n > 0:
            return n
    except Exception:  # noqa: BLE001 - an older cuda.core or driver: estimate instead
        pass
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    return max(1, (sms * per_sm) // cluster - 2)


# ------------------------------------------------------------------------------ host wrapper


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(f"cuda-fused: {msg}")


def validate(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights, out) -> dict:
    """Every check the kernel relies on, as one clear sentence each; returns the dimensions."""
    _need(isinstance(weights, FusedWeights) and weights.layout == LAYOUT,
          f"weights must come from prepare_fused_weights (layout {LAYOUT})")
    E, N, K, I = weights.E, weights.N, weights.K, weights.I
    _need(K % GROUP == 0 and K > 0, f"K={K} must be a positive multiple of {GROUP}")
    _need(N % (2 * GROUP) == 0 and N > 0, f"N={N} must be a positive multiple of {2 * GROUP}")
    _need(1 <= E <= MAX_E, f"E={E} must be in [1, {MAX_E}]")
    _need(x.dtype == FP8, f"x must be float8_e4m3fn, got {x.dtype}")
    _need(x.dim() == 2 and x.shape[1] == K, f"x must be [M, K={K}], got {list(x.shape)}")
    M = x.shape[0]
    _need(M >= 1, "x has no rows")
    _need(x_scale.dtype == torch.float32, f"x_scale must be float32, got {x_scale.dtype}")
    _need(tuple(x_scale.shape) == (M, K // GROUP), f"x_scale must be [{M}, {K // GROUP}], got {list(x_scale.shape)}")
    _need(topk_weights.dtype == torch.float32, f"topk_weights must be float32, got {topk_weights.dtype}")
    _need(topk_weights.dim() == 2 and topk_weights.shape[0] == M,
          f"topk_weights must be [M={M}, top_k], got {list(topk_weights.shape)}")
    top_k = topk_weights.shape[1]
    _need(1 <= top_k <= MAX_TOP_K, f"top_k={top_k} must be in [1, {MAX_TOP_K}]")
    bm = plan.block_m
    _need(bm % 8 == 0 and 8 <= bm <= MAX_BLOCK_M, f"block_m={bm} must be a multiple of 8 in [8, {MAX_BLOCK_M}]")
    _need(weights.cluster > 1 or bm <= MAX_BLOCK_M_ALONE,
          f"block_m={bm} with one CTA an item (cluster=1): at most {MAX_BLOCK_M_ALONE}")
    _need(plan.num_slots == M * top_k, f"the plan has {plan.num_slots} slots, expected M*top_k = {M * top_k}")
    for name in ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"):
        t = getattr(plan, name)
        _need(t.dtype == torch.int32 and t.dim() == 1, f"plan.{name} must be a 1-D int32 tensor")
    cap = plan.sorted_token_ids.numel()
    need = plan_capacity(M * top_k, E, bm)
    _need(cap >= need and cap % bm == 0,
          f"plan.sorted_token_ids holds {cap} slots; the worst case needs {need} (a multiple of block_m={bm})")
    _need(plan.expert_ids.numel() >= cap // bm, f"plan.expert_ids holds {plan.expert_ids.numel()} blocks, needs {cap // bm}")
    _need(plan.num_tokens_post_padded.numel() >= 1, "plan.num_tokens_post_padded is empty")
    _need(weights.cluster in CLUSTERS, f"weights.cluster={weights.cluster} must be one of {CLUSTERS}")
    _need(weights.cluster * (cap // bm) < 2**31, "the plan is too large for one launch")
    if out is not None:
        _need(out.dtype == torch.bfloat16, f"out must be bfloat16, got {out.dtype}")
        _need(tuple(out.shape) == (M, K), f"out must be [{M}, {K}], got {list(out.shape)}")
    tensors = {"x": x, "x_scale": x_scale, "w1": weights.w1, "w1_scale": weights.w1_scale, "w2": weights.w2,
               "w2_scale": weights.w2_scale, "topk_weights": topk_weights, "out": out,
               "plan.sorted_token_ids": plan.sorted_token_ids, "plan.expert_ids": plan.expert_ids,
               "plan.num_tokens_post_padded": plan.num_tokens_post_padded}
    dev = x.device
    for name, t in tensors.items():
        if t is None:
            continue
        _need(t.device == dev, f"{name} is on {t.device}, x on {dev}: all tensors must share one CUDA device")
        _need(t.is_contiguous(), f"{name} must be contiguous")
        _need(t.data_ptr() % 16 == 0, f"{name} must be 16-byte aligned")
    _need(dev.type == "cuda", f"tensors must be on a CUDA device, got {dev}")
    cap_major_minor = torch.cuda.get_device_capability(dev)
    _need(cap_major_minor == (9, 0), f"needs an sm_90 GPU (H100/H200), {dev} is sm_{cap_major_minor[0]}{cap_major_minor[1]}")
    return dict(M=M, K=K, N=N, I=I, E=E, top_k=top_k, block_m=bm, capacity=cap)


def make_fused_launch(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights,
                      out: torch.Tensor | None = None, *, stages: int | None = None,
                      per_sm: int | None = None, max_clusters: int | None = None,
                      items: int | None = None):
    """Validate once and allocate the output if needed (a zeroed one when None); returns
    (launch, out, module, dims): `launch()` runs the one kernel on torch's current stream.
    With neither `stages` nor `per_sm` given, the occupancy is picked for `items` work items
    (plan blocks x requant groups; the plan's worst case when None) by `pick_occupancy`; the
    cluster size is the one `weights` were laid out for."""
    import numpy as np

    from moebench.kernels.cuda_launch import bind_launch, set_cluster_policy
    dims = validate(x, x_scale, weights, plan, topk_weights, out)
    if out is None:
        out = torch.zeros(dims["M"], dims["K"], dtype=torch.bfloat16, device=x.device)
    # The kernel's work counters: zero at every launch (the last cluster out of work resets the
    # tickets, each CTA takes back its SM's count), so one launch of this object in flight at a time.
    work = torch.zeros(2 + 256, dtype=torch.int32, device=x.device)  # tickets, then busy CTAs per SM
    bm, K, cluster = dims["block_m"], dims["K"], weights.cluster
    G = dims["I"] // GROUP
    max_blocks = launch_blocks(plan.num_slots, dims["E"], bm, dims["capacity"])
    items = max_blocks * G if items is None else items
    options = launch_options(bm, K, x.device.index, cluster, per_sm, stages)
    opt = options[pick_occupancy(items, [(o.per_sm, min(o.resident, max_blocks * G)) for o in options])]
    per_sm, stages, smem, module, kernel = opt.per_sm, opt.stages, opt.smem, opt.module, opt.kernel
    # (the occupancy is picked on the default placement's residency; the policy then sets the grid)
    policy = "default"
    resident = opt.resident
    if cluster > 1:
        policy = cluster_policy(items <= opt.resident, forced_policy(module))
        resident = opt.resident_lb if policy == "load-balancing" else opt.resident
    clusters = min(resident, max_blocks * G)
    clusters = max(1, clusters if max_clusters is None else min(clusters, max_clusters))
    grid = (cluster * clusters, 1, 1)
    ptrs = [t.data_ptr() for t in (x, x_scale, weights.w1, weights.w1_scale, weights.w2, weights.w2_scale,
                                   plan.sorted_token_ids, plan.expert_ids, plan.num_tokens_post_padded,
                                   topk_weights, out, work)]
    ints = (plan.num_slots, dims["top_k"], K, dims["E"], max_blocks, G)
    args = [np.uint64(p) for p in ptrs] + [np.int32(v) for v in ints]
    # The cluster shape (cluster, 1, 1) is compiled into the kernel (__cluster_dims__): a plain launch.
    run = bind_launch(kernel, grid, (THREADS, 1, 1), smem, *args)
    keep = (x, x_scale, weights, plan, topk_weights, out, work)  # the pointers stay valid while launch lives
    device = x.device.index

    def launch() -> None:
        _ = keep
        if cluster > 1:  # (the kernel is shared by launches of other shapes: set where it changed)
            set_cluster_policy(kernel, policy, device)
        run()

    return launch, out, module, dict(dims, stages=stages, shared_bytes=smem, grid=grid, per_sm=per_sm,
                                      cluster_policy=policy,
                                      max_blocks=max_blocks, cluster=cluster, work=work)


def fused_moe(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] += sum_k w[t,k] * MoE expert ids[t,k] (x_t), one kernel on torch's current stream.
    `out` (BF16 [M, K]) is accumulated into; a zeroed one is allocated when None."""
    launch, out, _, _ = make_fused_launch(x, x_scale, weights, plan, topk_weights, out)
    launch()
    return out


# ------------------------------------------------------------------------------ the arm


@register_arm("cuda-fused")
class CudaFusedArm(Arm):
    name = "cuda-fused"
    description = "one sm_90a kernel: gate/up, SwiGLU, FP8 requant on chip, down, BF16 reduce-add (Swap-AB mma)"

    def __init__(self, block_m: int | None = None, stages: int | None = None, per_sm: int | None = None,
                 cluster: int | None = None, max_clusters: int | None = None):
        if cluster is not None and cluster not in CLUSTERS:
            raise UserError(f"cuda-fused: cluster={cluster} must be one of {', '.join(map(str, CLUSTERS))}")
        if max_clusters is not None and max_clusters < 1:
            raise UserError(f"cuda-fused: max_clusters={max_clusters} must be at least 1")
        self.block_m, self.stages, self.per_sm, self.cluster = block_m, stages, per_sm, cluster
        self.max_clusters = max_clusters

    def unavailable_reason(self, device: torch.device) -> str | None:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return "needs a CUDA device (sm_90: H100/H200)"
        cap = torch.cuda.get_device_capability(device)
        if cap != (9, 0):
            return f"needs an sm_90 GPU (H100/H200); {torch.cuda.get_device_name(device)} is sm_{cap[0]}{cap[1]}"
        try:
            import cuda.core  # noqa: F401
            from cuda.bindings import nvrtc  # noqa: F401
        except ImportError as err:
            return f"needs cuda-core and NVRTC ({err})"
        return None

    def prepare(self, fx: Fixture) -> PreparedCall:
        s = fx.spec
        bm = self.block_m or default_block_m(fx.M * s.top_k, s.E)
        if self.block_m is None and self.cluster == 1:
            bm = min(bm, MAX_BLOCK_M_ALONE)  # the default never picks a block one CTA cannot hold
        plan = route_plan(fx.topk_ids, s.E, bm)
        items = plan.num_blocks * (s.I // GROUP)  # untimed: the plan's real size picks the launch
        plan = plan.to(fx.device)
        weights = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, self.cluster or DEFAULT_CLUSTER)
        launch, out, module, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights, plan, fx.topk_weights,
                                                      stages=self.stages, per_sm=self.per_sm, items=items,
                                                      max_clusters=self.max_clusters)
        res = module.resources(KERNEL_NAME, fx.device.index)
        identity = {
            "kernel": KERNEL_NAME, "source": SOURCE, "layout": LAYOUT, "block_m": bm,
            "stages": dims["stages"], "shared_bytes": dims["shared_bytes"], "cluster": dims["cluster"],
            "threads": THREADS, "grid": list(dims["grid"]), "ctas_per_sm": dims["per_sm"],
            "clusters": dims["grid"][0] // dims["cluster"], "cluster_policy": dims["cluster_policy"],
            "items": items, "build": module.build.to_dict(),
            "registers": res.registers, "spills": res.spill_stores + res.spill_loads, "resources_from": res.source,
        }
        return PreparedCall(arm=self.name, run=launch, output=out,
                            kernels=(KernelDecl("fused", r"moebench_fused_moe", 1),),
                            reset=out.zero_, identity=identity)

