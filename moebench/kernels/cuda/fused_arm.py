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
checks fused_checks', the builds and launches fused_launch's; this module registers the arm and
chooses, per call, the path and the launch. Calls whose experts
average many tokens take fused_prefill's two FP8 wgmma kernels instead, and a band between the
two (wide K, 14 to 20 slots an expert) the Swap-AB grouped GEMMs of cuda-swapab, unless the pair
runs its two kernels overlapped there (`choose_path`; the call's identity says which path ran and
why). The arm's call writes its whole output: the kernels add into it, so on the decode path
the fused kernel zeroes it itself (at three CTAs an SM) or a zeroing kernel runs ahead of it (its
programmatic dependent) (`fused_policy.zeroes_in_kernel`), and on the prefill path gate_up zeroes it.
"""

from __future__ import annotations

import dataclasses

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, RoutePlan, route_plan
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.cuda.fused_checks import MAX_E, MAX_TOP_K, geometry_refusal, validate  # noqa: F401
from moebench.kernels.cuda.fused_launch import (COMBINE_NAME, DONE_COUNT, KERNEL_NAME, SOURCE, WORK_INTS,  # noqa: F401
                                                ZERO_COUNT, ZERO_NAME, ZERO_SPAN, bind_zero, build_fused,
                                                can_zero_in_kernel, check_zero, fused_moe, launch_options,
                                                make_fused_launch, place_launch, shipped_source, zeroing_mode)
from moebench.kernels.cuda.fused_layout import (CLUSTERS, DEFAULT_CLUSTER, FP8, GROUP, LAYOUT,  # noqa: F401
                                                FusedWeights, prepare_fused_weights)
from moebench.kernels.cuda.fused_policy import (MAX_BLOCK_M, MAX_BLOCK_M_ALONE, SMEM_PER_CTA, SMEM_PER_SM,  # noqa: F401
                                                STG_ROW, THREADS, build_occupancies, can_sum_fp32, check_sums,
                                                choose_stages, cluster_policy, ctas_per_sm, default_block_m,
                                                deterministic_occupancies, kernel_defines, launch_blocks, occupancies,
                                                pick_occupancy, shared_bytes, summing_mode, tail_launch, x_row,
                                                zeroes_in_kernel)
from moebench.kernels.cuda.fused_prefill import BLOCK_M as PREFILL_BLOCK_M
from moebench.kernels.cuda.fused_prefill import GROUPED_MIN_K, GROUPED_SLOTS_PER_EXPERT, MIN_TOKENS_PER_EXPERT, PATHS
from moebench.kernels.cuda.fused_prefill import SOURCE as PREFILL_SOURCE
from moebench.kernels.cuda.fused_prefill import choose_path, prefill_overlaps, prepare_prefill_call
from moebench.kernels.cuda.source import KernelSource

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
    host_helpers = ("moebench.kernels.cuda.fused_checks", "moebench.kernels.cuda.fused_layout",
                    "moebench.kernels.cuda.fused_policy", "moebench.kernels.cuda.fused_launch",
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

