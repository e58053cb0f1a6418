"""The host side of `cuda-fused`'s decode kernel (sm90_fused_moe.cu): its builds (the defines of a
launch shape, the zeroing and the FP32-sum builds), the launch shapes a GPU can hold and their
placement, and `make_fused_launch` / `fused_moe`, which check a call's tensors and bind its
launch. The arm (fused_arm.py) chooses among them per call."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from moebench.errors import UserError
from moebench.fixtures import RoutePlan
from moebench.kernels.cuda.fused_checks import need as _need
from moebench.kernels.cuda.fused_checks import validate
from moebench.kernels.cuda.fused_layout import GROUP, FusedWeights
from moebench.kernels.cuda.fused_policy import (SMEM_PER_CTA, THREADS, ZERO_MODES, build_occupancies, choose_stages,
                                                cluster_policy, ctas_per_sm, kernel_defines, launch_blocks,
                                                pick_occupancy, shared_bytes, summing_mode, zeroes_in_kernel)
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

    from moebench.kernels.cuda.launch import bind_launch
    from moebench.kernels.cuda.nvrtc import need_kernels
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
