"""Host validation for the fused kernel: every assumption sm90_fused_moe.cu makes about its
inputs, checked once per prepared launch and reported as one clear sentence each."""

from __future__ import annotations

import torch

from moebench.errors import UserError
from moebench.fixtures import RoutePlan, plan_capacity
from moebench.kernels.cuda.fused_layout import CLUSTERS, FP8, GROUP, LAYOUT, FusedWeights
from moebench.kernels.cuda.fused_policy import MAX_BLOCK_M, MAX_BLOCK_M_ALONE, choose_stages

MAX_E, MAX_TOP_K = 1024, 16


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(f"cuda-fused: {msg}")


PREFILL_OFFSETS = 2**31  # the prefill kernels' offsets into [slots, max(I, K)] are 32-bit (validate_prefill)


def geometry_refusal(M: int, K: int, E: int, top_k: int, I: int, block_m: int, cluster: int, *,  # noqa: E741
                     decode: bool = True, prefill: bool = True) -> str | None:
    """The first limit a problem of these dimensions passes, as one line, or None: what `validate`,
    `choose_stages` and the prefill path's checks would refuse once the tensors exist, decided
    from the dimensions alone. `decode` / `prefill`: whether the call may take that path."""
    if E > MAX_E:
        return f"E={E} experts, at most {MAX_E}"
    if top_k > MAX_TOP_K:
        return f"top_k={top_k}, at most {MAX_TOP_K}"
    if prefill and M * top_k * max(I, K) >= PREFILL_OFFSETS:
        return (f"M*top_k*max(I, K) = {M * top_k * max(I, K):,} must stay below 2^31 "
                f"(the prefill kernels' 32-bit offsets); at most M={(PREFILL_OFFSETS - 1) // (top_k * max(I, K))}")
    if decode:
        try:
            choose_stages(block_m, K, None, cluster)
        except UserError as err:
            return str(err).removeprefix("cuda-fused: ")
    return None


def check_plan(plan: RoutePlan, num_slots: int, E: int, bm: int) -> int:
    """A route plan both fused paths can launch on: num_slots slots, int32 buffers, room for the
    worst case at block_m `bm`. Returns its capacity in slots."""
    need(plan.num_slots == num_slots, f"the plan has {plan.num_slots} slots, expected M*top_k = {num_slots}")
    for name in ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"):
        t = getattr(plan, name)
        need(t.dtype == torch.int32 and t.dim() == 1, f"plan.{name} must be a 1-D int32 tensor")
    cap = plan.sorted_token_ids.numel()
    want = plan_capacity(num_slots, E, bm)
    need(cap >= want and cap % bm == 0,
         f"plan.sorted_token_ids holds {cap} slots; the worst case needs {want} (a multiple of block_m={bm})")
    need(plan.expert_ids.numel() >= cap // bm, f"plan.expert_ids holds {plan.expert_ids.numel()} blocks, needs {cap // bm}")
    need(plan.num_tokens_post_padded.numel() >= 1, "plan.num_tokens_post_padded is empty")
    return cap


def validate(x, x_scale, weights: FusedWeights, plan: RoutePlan, topk_weights, out) -> dict:
    """Every check the kernel relies on, as one clear sentence each; returns the dimensions."""
    need(isinstance(weights, FusedWeights) and weights.layout == LAYOUT,
         f"weights must come from prepare_fused_weights (layout {LAYOUT})")
    E, N, K, I = weights.E, weights.N, weights.K, weights.I
    need(K % GROUP == 0 and K > 0, f"K={K} must be a positive multiple of {GROUP}")
    need(N % (2 * GROUP) == 0 and N > 0, f"N={N} must be a positive multiple of {2 * GROUP}")
    need(1 <= E <= MAX_E, f"E={E} must be in [1, {MAX_E}]")
    need(x.dtype == FP8, f"x must be float8_e4m3fn, got {x.dtype}")
    need(x.dim() == 2 and x.shape[1] == K, f"x must be [M, K={K}], got {list(x.shape)}")
    M = x.shape[0]
    need(M >= 1, "x has no rows")
    need(x_scale.dtype == torch.float32, f"x_scale must be float32, got {x_scale.dtype}")
    need(tuple(x_scale.shape) == (M, K // GROUP), f"x_scale must be [{M}, {K // GROUP}], got {list(x_scale.shape)}")
    need(topk_weights.dtype == torch.float32, f"topk_weights must be float32, got {topk_weights.dtype}")
    need(topk_weights.dim() == 2 and topk_weights.shape[0] == M,
         f"topk_weights must be [M={M}, top_k], got {list(topk_weights.shape)}")
    top_k = topk_weights.shape[1]
    need(1 <= top_k <= MAX_TOP_K, f"top_k={top_k} must be in [1, {MAX_TOP_K}]")
    bm = plan.block_m
    need(bm % 8 == 0 and 8 <= bm <= MAX_BLOCK_M, f"block_m={bm} must be a multiple of 8 in [8, {MAX_BLOCK_M}]")
    need(weights.cluster > 1 or bm <= MAX_BLOCK_M_ALONE,
         f"block_m={bm} with one CTA an item (cluster=1): at most {MAX_BLOCK_M_ALONE}")
    cap = check_plan(plan, M * top_k, E, bm)
    need(weights.cluster in CLUSTERS, f"weights.cluster={weights.cluster} must be one of {CLUSTERS}")
    need(weights.cluster * (cap // bm) < 2**31, "the plan is too large for one launch")
    if out is not None:
        need(out.dtype == torch.bfloat16, f"out must be bfloat16, got {out.dtype}")
        need(tuple(out.shape) == (M, K), f"out must be [{M}, {K}], got {list(out.shape)}")
    tensors = {"x": x, "x_scale": x_scale, "w1": weights.w1, "w1_scale": weights.w1_scale, "w2": weights.w2,
               "w2_scale": weights.w2_scale, "topk_weights": topk_weights, "out": out,
               "plan.sorted_token_ids": plan.sorted_token_ids, "plan.expert_ids": plan.expert_ids,
               "plan.num_tokens_post_padded": plan.num_tokens_post_padded}
    dev = x.device
    for name, t in tensors.items():
        if t is None:
            continue
        need(t.device == dev, f"{name} is on {t.device}, x on {dev}: all tensors must share one CUDA device")
        need(t.is_contiguous(), f"{name} must be contiguous")
        need(t.data_ptr() % 16 == 0, f"{name} must be 16-byte aligned")
    need(dev.type == "cuda", f"tensors must be on a CUDA device, got {dev}")
    cap_major_minor = torch.cuda.get_device_capability(dev)
    need(cap_major_minor == (9, 0), f"needs an sm_90 GPU (H100/H200), {dev} is sm_{cap_major_minor[0]}{cap_major_minor[1]}")
    return dict(M=M, K=K, N=N, I=I, E=E, top_k=top_k, block_m=bm, capacity=cap)
