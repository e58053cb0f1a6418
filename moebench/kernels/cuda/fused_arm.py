"""Arm `cuda-fused`: the whole FP8 MoE layer in one sm_90a kernel (sm90_fused_moe.cu).

Public helpers:
  prepare_fused_weights(w1, w1_scale, w2, w2_scale, cluster=4) -> FusedWeights   one-off, untimed layout change
  fused_moe(x, x_scale, weights, plan, topk_weights, out=None) -> out  checks, allocates, launches

The kernel reads every routed expert's weights once per plan block, 384*K bytes per work item
(plan block x group of 128 columns), split over the CTAs of one cluster (8 CTAs of 48*K bytes,
or 4 of 96*K, the default), or streamed by one CTA (cluster=1, block_m up to 16: no SwiGLU
exchange, but one SM's bulk copies; an option, not the default); the grid is persistent (as
many clusters as the GPU holds at once). The weight layout is fused_layout's, the launch
arithmetic (shared memory, occupancy, ring depth, cluster placement) fused_policy's, the input
checks fused_checks'; this module builds, launches and registers the arm. Calls whose experts
average many tokens take fused_prefill's two FP8 wgmma kernels instead, and a band between the
two (wide K, 14 to 20 slots an expert) the Swap-AB grouped GEMMs of cuda-swapab, unless the pair
runs its two kernels overlapped there (`choose_path`; the call's identity says which path ran and
why). The arm's call writes its whole output: the kernels add into it, so on the decode path
the fused kernel zeroes it itself (at three CTAs an SM) or a zeroing kernel runs ahead of it (its
programmatic dependent) (`fused_policy.zeroes_in_kernel`), and on the prefill path gate_up zeroes it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, RoutePlan, route_plan
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.cuda.fused_checks import MAX_E, MAX_TOP_K, geometry_refusal, validate  # noqa: F401
from moebench.kernels.cuda.fused_checks import need as _need
from moebench.kernels.cuda.fused_layout import (CLUSTERS, DEFAULT_CLUSTER, FP8, GROUP, LAYOUT,  # noqa: F401
                                           FusedWeights, prepare_fused_weights)
from moebench.kernels.cuda.fused_prefill import SOURCE as PREFILL_SOURCE
from moebench.kernels.cuda.fused_prefill import BLOCK_M as PREFILL_BLOCK_M
from moebench.kernels.cuda.fused_prefill import (GROUPED_MIN_K, GROUPED_SLOTS_PER_EXPERT, MIN_TOKENS_PER_EXPERT, PATHS,
                                            choose_path, prefill_overlaps, prepare_prefill_call)
from moebench.kernels.cuda.fused_policy import (AQ_ROW, MAX_BLOCK_M, MAX_BLOCK_M_ALONE, MAX_STAGES,  # noqa: F401
                                           SMEM_PER_CTA, SMEM_PER_SM, STG_ROW, SUMS, THREADS, ZERO_MODES,
                                           can_sum_fp32, check_sums, choose_stages, summing_mode, sums_in_fp32,
                                           chunk_bytes, cluster_policy, ctas_per_sm, default_block_m,
                                           build_occupancies, deterministic_occupancies, kernel_defines, launch_blocks, meta_bytes, occupancies,
                                           pick_occupancy, shared_bytes, tail_launch, x_row, zeroes_in_kernel)
from moebench.kernels.cuda.source import KernelSource

SOURCE = "sm90_fused_moe.cu"
KERNEL_NAME = "moebench_fused_moe"
COMBINE_NAME = "moebench_fused_moe_combine"  # the deterministic build's second kernel
COMBINE_THREADS = 128  # the .cu's COMBINE_THREADS
ZERO_NAME = "moebench_zero_out"  # zeroes the output ahead of the fused kernel, when the call writes it
ZERO_CTAS = 264
ZERO_SPAN = 1024  # the .cu's: what a ZERO_OUT launch adds to its count of zeroed stripes (at least the grid)
# the kernel's counters: tickets, busy CTAs per SM, then the counts that only grow (by ZERO_SPAN a
# launch): (ZERO_OUT) zeroed stripes, (FP32_SUM) CTAs done; the .cu's ZERO_COUNT and DONE_COUNT
ZERO_COUNT, DONE_COUNT = 2 + 256, 2 + 256 + 1
WORK_INTS = DONE_COUNT + 1
_ZERO_OUT_RE = re.compile(r"^\s*#\s*ifndef\s+ZERO_OUT\b", re.MULTILINE)


# ------------------------------------------------------------------------------ build and launch shape


@functools.lru_cache(maxsize=None)
def build_fused(source: KernelSource, block_m: int, stages: int, per_sm: int | None, cluster: int,
                deterministic: bool = False, zero_out: bool = False, fp32_sum: bool = False):
    """The module `source` compiles to for one meta-parameter set (NVRTC, cached on disk)."""
    from moebench.kernels.cuda.nvrtc import compile_source
    per_sm = ctas_per_sm(block_m, cluster) if per_sm is None else per_sm
    return compile_source(source, defines=kernel_defines(block_m, stages, per_sm, cluster, deterministic, zero_out,
                                                         fp32_sum))


def can_zero_in_kernel(source: KernelSource) -> bool:
    """Whether `source` has the ZERO_OUT meta-parameter (a --build of an older copy has not: it
    zeroes behind the zeroing kernel, as it did)."""
    return _ZERO_OUT_RE.search(source.text) is not None


def check_zero(zero: str | None, deterministic: bool) -> None:
    """The `zero` option's user errors: an unknown mode, or any mode for the deterministic build."""
    who = "cuda-fused-det" if deterministic else "cuda-fused"
    if zero is not None and zero not in ZERO_MODES:
        raise UserError(f"{who}: zero={zero!r} must be one of {', '.join(ZERO_MODES)}")
    if zero is not None and deterministic:
        raise UserError(f"{who}: zero={zero} does not apply (the combine writes the output)")


def zeroing_mode(zero: str | None, per_sm: int, cluster: int, source: KernelSource, deterministic: bool) -> str:
    """Who zeroes the output of a decode call that writes it: "kernel" (the fused kernel's
    ZERO_OUT build) or "launch" (the zeroing kernel ahead of it); `zero` forces one, else
    `zeroes_in_kernel`. The deterministic build's combine stores its sums: nothing to zero."""
    check_zero(zero, deterministic)
    if deterministic:
        return "launch"
    if zero is None:
        return "kernel" if zeroes_in_kernel(per_sm, cluster) and can_zero_in_kernel(source) else "launch"
    _need(zero == "launch" or can_zero_in_kernel(source),
          f"{source.origin or source.filename}: no ZERO_OUT meta-parameter (zero=kernel needs the kernel to zero its output)")
    return zero


def shipped_source() -> KernelSource:
    return KernelSource.shipped(SOURCE)


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
                   stages: int | None = None, source: KernelSource | None = None,
                   deterministic: bool = False, fp32: bool = False) -> list[LaunchOption]:
    """The launches `pick_occupancy` weighs: the default occupancy and one more CTA an SM
    with the deepest ring that still fits (that the build, `deterministic` or `fp32`, may take);
    only the given occupancy or ring depth where one is set."""
    from moebench.kernels.cuda.launch import raise_shared_limit, set_cluster_policy
    allowed = build_occupancies(block_m, cluster, deterministic, fp32)
    if per_sm is None and stages is None:
        per_sm_options = [ctas_per_sm(block_m, cluster)]
        for ps in allowed[1:]:
            try:
                choose_stages(block_m, K, ps, cluster)
                per_sm_options.append(ps)
            except UserError:
                pass
    else:
        per_sm_options = [ctas_per_sm(block_m, cluster) if per_sm is None else per_sm]
        most = max(allowed)
        _need(1 <= per_sm_options[0] <= most,
              f"per_sm={per_sm_options[0]} at block_m={block_m}: at most {most} CTA{'s' if most > 1 else ''} an SM")
    out = []
    for ps in per_sm_options:
        st = choose_stages(block_m, K, ps, cluster) if stages is None else stages
        smem = shared_bytes(block_m, st, K, cluster)
        _need(2 <= st <= 10 and smem <= SMEM_PER_CTA, f"stages={st} needs {smem} B of shared memory")
        module = build_fused(source or shipped_source(), block_m, st, ps, cluster, deterministic)
        kernel = module.kernel(KERNEL_NAME, device_index)
        raise_shared_limit(kernel, smem, device_index)
        resident = resident_lb = resident_clusters(kernel, smem, device_index, ps, cluster)
        if cluster > 1:
            set_cluster_policy(kernel, "load-balancing", device_index)
            resident_lb = resident_clusters(kernel, smem, device_index, ps, cluster)
            set_cluster_policy(kernel, "default", device_index)
        out.append(LaunchOption(ps, st, smem, resident, resident_lb, module, kernel))
    return out


def place_launch(options: list[LaunchOption], items: int, most_items: int,
                 cluster: int) -> tuple[LaunchOption, str, int]:
    """The option of `options` a launch of `items` work items (of at most `most_items` any
    routing makes) takes, how its clusters are placed, and how many it runs: the occupancy is
    picked on the default placement's residency, then the placement policy sets the grid."""
    opt = options[pick_occupancy(items, [(o.per_sm, min(o.resident, most_items)) for o in options])]
    policy, resident = "default", opt.resident
    if cluster > 1:
        policy = cluster_policy(items <= opt.resident)
        resident = opt.resident_lb if policy == "load-balancing" else opt.resident
    return opt, policy, min(resident, most_items)


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


def make_fused_launch(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights,
                      out: torch.Tensor | None = None, *, stages: int | None = None,
                      per_sm: int | None = None, max_clusters: int | None = None,
                      items: int | None = None, source: KernelSource | None = None,
                      deterministic: bool = False, zero_out: bool = False, zero: str | None = None,
                      sums: str | None = None):
    """Validate once and allocate the output if needed (a zeroed one when None); returns
    (launch, out, module, dims): `launch()` runs the one kernel on torch's current stream, adding
    into `out`; with `zero_out` the launch writes `out` instead: the fused kernel zeroes it first
    (its ZERO_OUT build) or a zeroing kernel runs ahead of it (its programmatic dependent), as
    `zeroing_mode` picks from `zero` ("kernel", "launch", None: the policy's rule) and dims["zeroing"]
    says; the deterministic build's combine stores its sums.
    With neither `stages` nor `per_sm` given, the occupancy is picked for `items` work items
    (plan blocks x requant groups; the plan's worst case when None) by `pick_occupancy`; the
    cluster size is the one `weights` were laid out for. The kernel is compiled from `source`
    (the shipped file when None). `deterministic`: the DETERMINISTIC build,
    its contributions into a workspace (dims["workspace"]) and the combine kernel after it.
    `sums` ("fp32", "bf16", None: `sums_in_fp32`'s rule) chooses, for a launch that writes its
    output, the FP32_SUM build: partials reduce-added into FP32 sums (dims["workspace"], zeroed in
    the call where the output otherwise is), the output stored once from them; dims["sums"] says
    which ran."""
    import numpy as np

    from moebench.kernels.cuda.launch import bind_launch, set_cluster_policy
    dims = validate(x, x_scale, weights, plan, topk_weights, out)
    if out is None:
        out = torch.zeros(dims["M"], dims["K"], dtype=torch.bfloat16, device=x.device)
    # The kernel's work counters: zero at every launch (the last cluster out of work resets the
    # tickets, each CTA takes back its SM's count), so one launch of this object in flight at a time;
    # the last (ZERO_OUT's count of zeroed stripes) only grows, a multiple of ZERO_SPAN between launches.
    work = torch.zeros(WORK_INTS, dtype=torch.int32, device=x.device)
    bm, K, cluster = dims["block_m"], dims["K"], weights.cluster
    G = dims["I"] // GROUP
    max_blocks = launch_blocks(plan.num_slots, dims["E"], bm, dims["capacity"])
    items = max_blocks * G if items is None else items
    src = source or shipped_source()
    summing = summing_mode(sums, dims["I"], src.text, src.origin or src.filename, deterministic, zero_out)
    fp32 = summing == "fp32"
    options = launch_options(bm, K, x.device.index, cluster, per_sm, stages, source, deterministic, fp32)
    opt, policy, clusters = place_launch(options, items, max_blocks * G, cluster)
    per_sm, stages, smem, module, kernel = opt.per_sm, opt.stages, opt.smem, opt.module, opt.kernel
    clusters = max(1, clusters if max_clusters is None else min(clusters, max_clusters))
    grid = (cluster * clusters, 1, 1)
    zeroing = None if not zero_out else zeroing_mode(zero, per_sm, cluster, src, deterministic)
    if zeroing == "kernel" or fp32:
        # the same launch from the ZERO_OUT or FP32_SUM build (the same shared memory and launch
        # bounds: the residency above holds); its stripes and counts are in 32-bit units, and a
        # launch adds ZERO_SPAN to its counts
        from moebench.kernels.cuda.launch import raise_shared_limit
        what = "sums=fp32" if fp32 else "zero=kernel"
        _need(grid[0] <= ZERO_SPAN, f"cuda-fused: {what} needs a grid of at most {ZERO_SPAN} CTAs")
        _need(dims["M"] * K // (4 if fp32 else 8) < 2**31, f"cuda-fused: {what} needs an output below 32 GiB")
        module = build_fused(src, bm, stages, per_sm, cluster, False, zeroing == "kernel", fp32)
        kernel = module.kernel(KERNEL_NAME, x.device.index)
        raise_shared_limit(kernel, smem, x.device.index)
    # Deterministic: every routed slot's rows of the workspace are written by each launch; rows of
    # slots in skipped blocks (an expert outside [0, E)) stay the zeros they start as.
    ws = torch.zeros(plan.num_slots * G, K, dtype=torch.bfloat16, device=x.device) if deterministic else None
    # FP32_SUM: the output's FP32 sums, left as allocated: every call zeroes them before its first reduction
    acc = torch.empty(dims["M"], K, dtype=torch.float32, device=x.device) if fp32 else None
    ptrs = [t.data_ptr() for t in (x, x_scale, weights.w1, weights.w1_scale, weights.w2, weights.w2_scale,
                                   plan.sorted_token_ids, plan.expert_ids, plan.num_tokens_post_padded,
                                   topk_weights, out if ws is None else ws, work)]
    ints = (plan.num_slots, dims["top_k"], K, dims["E"], max_blocks, G)
    args = [np.uint64(p) for p in ptrs] + [np.int32(v) for v in ints] + ([np.uint64(acc.data_ptr())] if fp32 else [])
    # The cluster shape (cluster, 1, 1) is compiled into the kernel (__cluster_dims__): a plain launch.
    behind_zero = zeroing == "launch" and ws is None  # the zeroing kernel's programmatic dependent
    run = bind_launch(kernel, grid, (THREADS, 1, 1), smem, *args, pdl=behind_zero)
    if ws is not None:
        fused_run, combine = run, bind_combine(module, x.device.index, ws, out, dims["M"], dims["top_k"], G, K,
                                               accumulate=not zero_out)

        def run() -> None:
            fused_run()
            combine()
    elif behind_zero:
        fused_run, zero_run = run, bind_zero(module, x.device.index, out if acc is None else acc)

        def run() -> None:
            zero_run()
            fused_run()
    keep = (x, x_scale, weights, plan, topk_weights, out, work, ws, acc)  # the pointers stay valid while launch lives
    device = x.device.index

    def launch() -> None:
        _ = keep
        if cluster > 1:  # (the kernel is shared by launches of other shapes: set where it changed)
            set_cluster_policy(kernel, policy, device)
        run()

    return launch, out, module, dict(dims, stages=stages, shared_bytes=smem, grid=grid, per_sm=per_sm,
                                      cluster_policy=policy, zeroing=None if ws is not None else zeroing,
                                      max_blocks=max_blocks, cluster=cluster, work=work,
                                      workspace=ws if ws is not None else acc, sums=summing)


def bind_combine(module, device_index: int, ws: torch.Tensor, out: torch.Tensor, M: int, top_k: int, G: int, K: int,
                 accumulate: bool = True):
    """The deterministic build's combine: out[t] += its top_k * G workspace rows, summed in order
    (out[t] = when not `accumulate`); launched as the fused kernel's programmatic dependent (it
    waits for that kernel's end)."""
    import numpy as np

    from moebench.kernels.cuda.launch import bind_launch
    kernel = module.kernel(COMBINE_NAME, device_index)
    grid = (-(-M * (K // 8) // COMBINE_THREADS), 1, 1)
    return bind_launch(kernel, grid, (COMBINE_THREADS, 1, 1), 0, np.uint64(ws.data_ptr()), np.uint64(out.data_ptr()),
                       *(np.int32(v) for v in (M, top_k, G, K, int(accumulate))), pdl=True)


def bind_zero(module, device_index: int, out: torch.Tensor):
    """The launch that zeroes `out` (the output, or the FP32_SUM build's FP32 sums) ahead of the
    fused kernel (ZERO_NAME: 16 bytes a thread, at most ZERO_CTAS CTAs of 256); the fused kernel
    is launched as its programmatic dependent."""
    import numpy as np

    from moebench.kernels.cuda.nvrtc import need_kernels
    from moebench.kernels.cuda.launch import bind_launch
    need_kernels(module, (ZERO_NAME,), SOURCE, "cuda-fused launch")  # (e.g. a --build of an older copy)
    n16 = out.numel() * out.element_size() // 16
    grid = (max(1, min(ZERO_CTAS, -(-n16 // 256))), 1, 1)
    return bind_launch(module.kernel(ZERO_NAME, device_index), grid, (256, 1, 1), 0,
                       np.uint64(out.data_ptr()), np.int64(n16))


def fused_moe(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights,
              out: torch.Tensor | None = None, *, deterministic: bool = False) -> torch.Tensor:
    """out[t] += sum_k w[t,k] * MoE expert ids[t,k] (x_t), one kernel on torch's current stream
    (two when deterministic). `out` (BF16 [M, K]) is accumulated into; a zeroed one is allocated
    when None."""
    launch, out, _, _ = make_fused_launch(x, x_scale, weights, plan, topk_weights, out, deterministic=deterministic)
    launch()
    return out


# ------------------------------------------------------------------------------ the arm


FUSED_KERNELS = (KernelDecl("zero", ZERO_NAME, 1), KernelDecl("fused", r"moebench_fused_moe", 1))
FUSED_ZEROING_KERNELS = (KernelDecl("fused", r"moebench_fused_moe", 1),)  # the ZERO_OUT build: one kernel
FUSED_DET_KERNELS = (KernelDecl("fused", r"moebench_fused_moe(?!_combine)", 1),
                     KernelDecl("combine", r"moebench_fused_moe_combine", 1))


@register_arm("cuda-fused")
class CudaFusedArm(Arm):
    description = ("gate/up, SwiGLU, FP8 requant, down, BF16 reduce-add: one sm_90a kernel (Swap-AB mma) for decode, "
                   "two FP8 wgmma kernels for large expert groups, cuda-swapab's grouped GEMMs in the band between "
                   "at wide K where those two do not overlap")
    source_file = SOURCE
    # a build of the prefill pair's source (`--build NAME=.../sm90_fused_prefill.cu`), launched by
    # fused_prefill
    build_sources = {PREFILL_SOURCE: ("prefill_source", "moebench.kernels.cuda.fused_prefill")}
    host_helpers = ("moebench.kernels.cuda.fused_checks", "moebench.kernels.cuda.fused_layout", "moebench.kernels.cuda.fused_policy",
                    "moebench.kernels.cuda.fused_prefill")
    deterministic = False  # the DETERMINISTIC build and its combine (cuda-fused-det)

    def __init__(self, block_m: int | None = None, stages: int | None = None, per_sm: int | None = None,
                 cluster: int | None = None, max_clusters: int | None = None, path: str | None = None,
                 source: KernelSource | None = None, chunk: int | None = None, splits: int | None = None,
                 overlap: int | None = None, prefill_source: KernelSource | None = None, zero: str | None = None,
                 sums: str | None = None):
        if path is not None and path not in PATHS:
            raise UserError(f"cuda-fused: path={path!r} must be one of {', '.join(PATHS)}")
        if cluster is not None and cluster not in CLUSTERS:
            raise UserError(f"cuda-fused: cluster={cluster} must be one of {', '.join(map(str, CLUSTERS))}")
        if max_clusters is not None and max_clusters < 1:
            raise UserError(f"cuda-fused: max_clusters={max_clusters} must be at least 1")
        for key, value in (("chunk", chunk), ("splits", splits)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"cuda-fused: {key}={value!r} must be a whole number of at least 1")
        if overlap is not None and (isinstance(overlap, bool) or overlap not in (0, 1)):
            raise UserError(f"cuda-fused: overlap={overlap!r} must be 0 or 1")
        check_zero(zero, self.deterministic)
        check_sums(sums, self.deterministic)  # (a source without FP32_SUM is refused at prepare)
        # who zeroes the decode kernel's output (fused_policy.zeroes_in_kernel when None); how it
        # sums an element's partials (fused_policy.sums_in_fp32 when None)
        self.zero, self.sums = zero, sums
        # the prefill kernels' work cut (fused_prefill.split_work and overlap_down when None):
        # down's w2 tiles an item, gate_up's K ranges a (block, group), down beside gate_up's last round
        self.chunk, self.splits, self.overlap = chunk, splits, overlap
        cut = [k for k in ("chunk", "splits", "overlap") if getattr(self, k) is not None]
        self.block_m, self.stages, self.per_sm, self.cluster = block_m, stages, per_sm, cluster
        self.max_clusters = max_clusters
        self.source = source or shipped_source()
        tuned = [k for k in ("block_m", "stages", "per_sm", "cluster", "max_clusters", "zero", "sums")
                 if getattr(self, k) is not None]
        if path in ("prefill", "grouped") and tuned:
            raise UserError(f"cuda-fused: {', '.join(tuned)} set the decode kernel; path={path} does not launch it")
        # what keeps the prefill kernels from running, if anything
        but = (f"path={path} does not launch them" if path in ("decode", "grouped") else
               f"{', '.join(tuned)} set the decode kernel" if tuned else
               f"a build of {SOURCE} is the decode kernel's" if source is not None else
               "the deterministic build is the decode kernel's" if self.deterministic else None)
        if cut and but:
            raise UserError(f"cuda-fused: {', '.join(cut)} set the prefill kernels, but {but}")
        if path in ("prefill", "grouped") and (source is not None or self.deterministic):
            raise UserError(f"cuda-fused: path={path} runs other kernels, not "
                            f"{'a build of ' + SOURCE if source is not None else 'the deterministic build'}")
        # a build of the prefill pair: the route plan still picks the path, and a call it sends
        # elsewhere is refused at prepare (it would not run the build)
        if prefill_source is not None and but:
            raise UserError(f"cuda-fused: a build of {PREFILL_SOURCE} is of the prefill kernels, but {but}")
        self.prefill_source = prefill_source
        # options of the decode kernel, a build of its source or the deterministic build choose
        # it (the prefill kernels reduce-add in hardware order); otherwise the route plan does
        # and the prefill kernels' cut chooses them
        self.path = path or ("decode" if tuned or source is not None or self.deterministic else
                             "prefill" if cut else "auto")

    def pick_cluster(self, fx: Fixture, plan: RoutePlan, bm: int, items: int) -> tuple[int, int | None, str]:
        """The cluster size and the most clusters of a launch no option set (`fused_policy.tail_launch`),
        and who chose them: clusters of 4 as many as fit, or where those would end in a third round at
        most half full, clusters of 8 (K >= 4096) or clusters of 4 filling three whole rounds. Options
        that set the launch (block_m, per_sm, stages, max_clusters: the rule was measured at the default
        blocks), zero=kernel (the ZERO_OUT build of clusters of 8 at three CTAs an SM spills under
        NVRTC 13.0) and the deterministic build keep the default."""
        if self.deterministic or self.zero == "kernel" or any(
                v is not None for v in (self.block_m, self.per_sm, self.stages, self.max_clusters)):
            return DEFAULT_CLUSTER, self.max_clusters, "default"
        s = fx.spec
        most = launch_blocks(plan.num_slots, s.E, bm, plan.sorted_token_ids.numel()) * (s.I // GROUP)
        fp32 = summing_mode(self.sums, s.I, self.source.text, self.source.origin, False, True) == "fp32"
        options = launch_options(bm, s.K, fx.device.index, DEFAULT_CLUSTER, source=self.source, fp32=fp32)
        opt, _, clusters = place_launch(options, items, most, DEFAULT_CLUSTER)
        tail = tail_launch(items, s.K, opt.per_sm, clusters)
        return (*tail, "rule") if tail is not None else (DEFAULT_CLUSTER, None, "default")

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

    def refuses(self, spec) -> str | None:
        """The decode kernel's limits (experts, top_k, the shared memory K needs at the block size
        this call would take) and the prefill pair's (32-bit offsets), for the paths the call may take;
        the grouped path runs cuda-swapab's kernels."""
        if self.path == "grouped":
            return None
        bm = self.block_m or default_block_m(spec.M * spec.top_k, spec.E)
        if self.block_m is None and self.cluster == 1:
            bm = min(bm, MAX_BLOCK_M_ALONE)
        line = geometry_refusal(spec.M, spec.K, spec.E, spec.top_k, spec.I, bm, self.cluster or DEFAULT_CLUSTER,
                                decode=self.path in ("auto", "decode"), prefill=self.path in ("auto", "prefill"))
        return None if line is None else f"{self.name}: {line}"

    def prepare(self, fx: Fixture) -> PreparedCall:
        s = fx.spec
        # Which kernels this call launches, from the route plan (fused_prefill.choose_path): the
        # wgmma prefill pair for large expert groups, the one-kernel decode path otherwise.
        routed = int(torch.unique(fx.topk_ids).numel())
        path = choose_path(fx.M * s.top_k, routed, s.K) if self.path == "auto" else self.path
        overlaps = None  # (asked only in the grouped band, which gives way to the overlapped prefill pair)
        if self.path == "auto" and path == "grouped":
            sms = torch.cuda.get_device_properties(fx.device).multi_processor_count
            overlaps = prefill_overlaps(route_plan(fx.topk_ids, s.E, PREFILL_BLOCK_M).num_blocks, fx.M, s.N, s.K, sms)
            path = choose_path(fx.M * s.top_k, routed, s.K, overlaps)
        rule = dict(chosen_by=self.path, routed_experts=routed, min_tokens_per_expert=MIN_TOKENS_PER_EXPERT,
                    grouped_slots_per_expert=list(GROUPED_SLOTS_PER_EXPERT), grouped_min_K=GROUPED_MIN_K,
                    prefill_overlaps=overlaps)
        if self.prefill_source is not None and path != "prefill":
            raise UserError(f"{self.name}: at {s.name} the route plan takes path={path}, which does not run "
                            f"the build of {PREFILL_SOURCE}; time it at prefill shapes, or with path=prefill")
        if path == "prefill":
            call = prepare_prefill_call(self.name, fx, chunk=self.chunk, splits=self.splits,
                                        overlap=None if self.overlap is None else bool(self.overlap),
                                        source=self.prefill_source)
            call.identity["path_rule"] = rule
            return call
        if path == "grouped":  # cuda-swapab's three kernels, under this arm's name
            from moebench.kernels.cuda.arms import CudaSwapAbArm
            call = CudaSwapAbArm().prepare(fx)
            identity = {"path": "grouped", "path_rule": rule, "kernels_of": "cuda-swapab", **call.identity}
            return dataclasses.replace(call, arm=self.name, identity=identity)
        bm = self.block_m or default_block_m(fx.M * s.top_k, s.E)
        if self.block_m is None and self.cluster == 1:
            bm = min(bm, MAX_BLOCK_M_ALONE)  # the default never picks a block one CTA cannot hold
        plan = route_plan(fx.topk_ids, s.E, bm)
        items = plan.num_blocks * (s.I // GROUP)  # untimed: the plan's real size picks the launch
        cluster, max_clusters, cluster_by = self.cluster, self.max_clusters, "cluster"
        if cluster is None:
            cluster, max_clusters, cluster_by = self.pick_cluster(fx, plan, bm, items)
        plan = plan.to(fx.device)
        weights = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, cluster)
        launch, out, module, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights, plan, fx.topk_weights,
                                                      stages=self.stages, per_sm=self.per_sm, items=items,
                                                      max_clusters=max_clusters, source=self.source,
                                                      deterministic=self.deterministic, zero_out=True,
                                                      zero=self.zero, sums=self.sums)
        res = module.resources(KERNEL_NAME, fx.device.index)
        identity = {
            "path": "decode", "path_rule": rule,
            "kernel": KERNEL_NAME, "source": SOURCE, "layout": LAYOUT, "block_m": bm,
            "stages": dims["stages"], "shared_bytes": dims["shared_bytes"], "cluster": dims["cluster"],
            "threads": THREADS, "grid": list(dims["grid"]), "ctas_per_sm": dims["per_sm"],
            "clusters": dims["grid"][0] // dims["cluster"], "cluster_policy": dims["cluster_policy"],
            "items": items, "build": module.build.to_dict(), "deterministic": self.deterministic,
            "registers": res.registers, "spills": res.spill_stores + res.spill_loads, "resources_from": res.source,
            "output": ("written: the combine stores its sums" if self.deterministic else
                       ("written: the fused kernel zeroes its FP32 sums (ZERO_OUT), adds into them, then stores it"
                        if dims["zeroing"] == "kernel" else
                        f"written: {ZERO_NAME} zeroes its FP32 sums, the fused kernel adds into them, then stores it")
                       if dims["sums"] == "fp32" else
                       "written: the fused kernel zeroes it (ZERO_OUT), then adds into it"
                       if dims["zeroing"] == "kernel" else
                       f"written: {ZERO_NAME} zeroes it, the fused kernel adds into it"),
            "zeroing": dims["zeroing"], "zeroing_chosen_by": "zero" if self.zero is not None else "rule",
            "sums": dims["sums"], "sums_chosen_by": "sums" if self.sums is not None else "rule",
            "cluster_chosen_by": cluster_by,
        }
        kernels = (FUSED_DET_KERNELS if self.deterministic else
                   FUSED_ZEROING_KERNELS if dims["zeroing"] == "kernel" else FUSED_KERNELS)
        # where it rounds (moebench.fixtures.error_model): every (block, 128 columns of I) item adds
        # its partial into the BF16 output, top_k x I/128 BF16 adds an element, or (FP32_SUM) into
        # FP32 sums rounded once; the deterministic build stores each partial as a BF16 row and sums
        # the rows in FP32
        oracle = ("bf16-partial-rows" if self.deterministic else
                  "fp32-partials" if dims["sums"] == "fp32" else "bf16-partials")
        return PreparedCall(arm=self.name, run=launch, output=out, kernels=kernels,
                            identity=identity, workspace=dims["workspace"], oracle=oracle)


@register_arm("cuda-fused-det")
class CudaFusedDetArm(CudaFusedArm):
    description = ("cuda-fused with a fixed reduction order: each slot's contribution into its own BF16 "
                   "workspace row, a combine kernel sums them in order (bitwise run-to-run, batch-invariant); "
                   "the decode kernel at every M")
    deterministic = True

