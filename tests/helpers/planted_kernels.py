"""CPU stand-ins for MoE kernels, correct and wrong, for the parity check's tests.

A correct kernel here is the oracle's function computed the way the arms compute it: GEMM sums by
128-wide k blocks with each block's partial cut to the ~14 bits an FP8 tensor core keeps, the
blocks summed in a shuffled order, optionally h and the SwiGLU output stored in BF16 (the stock
path), the intermediate requantized per 128 columns, and the output summed from per-slot or
per-(slot, 128 columns of I) partials in a BF16 running sum in a shuffled order, from BF16 rows
summed in FP32, or in an FP32 running sum in a shuffled order rounded to BF16 once. A wrong kernel
is the same with one fault planted (FAULTS).

Inputs are built compact: only the experts the routes use hold weights (ids are renumbered), so
a geometry with 257 experts of K 7168 costs what its routed experts cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moebench.fixtures.builder import WEIGHT_SCALE_HI, WEIGHT_SCALE_LO
from moebench.fixtures.quant import (FP8, dequantize_blocks, dequantize_per_token_group,
                                     quantize_per_token_group, random_fp8_codes)

TENSORS = ("x_fp8", "x_scale", "w1", "w1_scale", "w2", "w2_scale", "topk_ids", "topk_weights")


@dataclass(frozen=True)
class Geometry:
    name: str
    K: int
    I: int  # noqa: E741
    E: int  # experts, the shared one included
    top_k: int  # the shared one included
    shared: bool
    routed_scale: float = 1.0


def make_inputs(geo: Geometry, M: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    routed_e, routed_k = geo.E - geo.shared, geo.top_k - geo.shared
    ids = torch.stack([torch.randperm(routed_e, generator=g)[:routed_k] for _ in range(M)])
    weights = torch.softmax(torch.randn(M, routed_k, generator=g), dim=1) * geo.routed_scale
    if geo.shared:
        ids = torch.cat([ids, torch.full((M, 1), geo.E - 1)], dim=1)
        weights = torch.cat([weights, torch.ones(M, 1)], dim=1)
    used, compact = torch.unique(ids, return_inverse=True)
    x = torch.randn(M, geo.K, generator=g) * torch.empty(M, 1).uniform_(0.5, 2.0, generator=g)
    x_fp8, x_scale = quantize_per_token_group(x)

    def weights_of(rows, cols):
        codes = random_fp8_codes(len(used) * rows * cols, g).view(FP8).reshape(len(used), rows, cols)
        return codes, torch.empty(len(used), rows // 128, cols // 128).uniform_(WEIGHT_SCALE_LO, WEIGHT_SCALE_HI,
                                                                                generator=g)
    w1, w1_scale = weights_of(2 * geo.I, geo.K)
    w2, w2_scale = weights_of(geo.K, geo.I)
    return dict(x_fp8=x_fp8, x_scale=x_scale, w1=w1, w1_scale=w1_scale, w2=w2, w2_scale=w2_scale,
                topk_ids=compact.to(torch.int32), topk_weights=weights.float())


def _cut(t: torch.Tensor, bits: int) -> torch.Tensor:
    """t with its significand cut toward zero to `bits` bits (a tensor core's kept precision)."""
    m, e = torch.frexp(t)
    return torch.ldexp(torch.trunc(m * 2.0 ** bits) / 2.0 ** bits, e)


def _blocked_matmul(a: torch.Tensor, b: torch.Tensor, bits: int, g: torch.Generator) -> torch.Tensor:
    """a [S, D] . b [R, D]^T by 128-wide blocks of D, each cut after each of its four k32 steps: [S, R, D/128]
    (the blocks shuffled; summed by the caller in FP32)."""
    S, D = a.shape
    steps = torch.einsum("sbjk,rbjk->srbj", a.reshape(S, D // 128, 4, 32), b.reshape(-1, D // 128, 4, 32))
    acc = torch.zeros_like(steps[..., 0])
    for j in range(4):  # four k32 steps a block, the accumulator cut after each
        acc = _cut(acc + steps[..., j], bits)
    return acc[..., torch.randperm(D // 128, generator=g)]


def _bf16(t):
    return t.bfloat16().float()


def simulate(inp: dict, *, bf16_intermediates: bool = False, partials: str = "slot", summed: str = "bf16-running",
             bits: int = 14, seed: int = 0, flips: int = 0, fault: str | None = None,
             shared: bool = False) -> torch.Tensor:
    """The [M, K] BF16 output of a kernel computing the oracle's function as described above;
    `summed`: how the partials reach the output (error_model.SUMS: a BF16 running sum, BF16 rows
    summed in FP32 in order, an FP32 running sum);
    `flips`: per slot, that many requant codes nearest a rounding midpoint moved to the other side;
    `fault`: one of FAULTS, planted; `shared`: each row's last slot is the shared expert."""
    g = torch.Generator().manual_seed(seed)
    t = {k: inp[k].clone() if k in ("topk_ids", "topk_weights") else inp[k] for k in TENSORS}
    t["shared"] = shared
    M, K = t["x_fp8"].shape
    top_k = t["topk_ids"].shape[1]
    cache = inp.setdefault("_dequantized", {})  # expert -> (w1, w2) dequantized, shared by every call
    touched = FAULTS[fault](t) if fault is not None else None  # an expert whose weights the fault changed
    x = dequantize_per_token_group(t["x_fp8"], t["x_scale"])
    ids, w = t["topk_ids"].reshape(-1).long(), t["topk_weights"].reshape(-1).float()
    token = torch.arange(ids.numel()) // top_k
    skip = t.get("skip", torch.zeros_like(ids, dtype=torch.bool))
    parts_of_token: list[list[torch.Tensor]] = [[] for _ in range(M)]
    for e in torch.unique(ids).tolist():
        slots = torch.nonzero((ids == e) & ~skip).squeeze(1)
        if not len(slots):
            continue
        if e not in cache:
            cache[e] = (dequantize_blocks(inp["w1"][e], inp["w1_scale"][e]),
                        dequantize_blocks(inp["w2"][e], inp["w2_scale"][e]))
        w1e, w2e = cache[e]
        if e == touched:
            w2e = dequantize_blocks(t["w2_e"], t["w2_scale_e"])
        h = _blocked_matmul(x[token[slots]], w1e, bits, g).sum(-1)
        inter = h.shape[1] // 2
        if bf16_intermediates:
            h = _bf16(h)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        if bf16_intermediates:
            a = _bf16(a)
        codes, scale = quantize_per_token_group(a)
        if flips:
            codes = _flip_nearest(a, codes, scale, flips)
        a_q = dequantize_per_token_group(codes, scale)
        yg = _blocked_matmul(a_q, w2e, bits, g) * w[slots, None, None]
        yg = yg.permute(0, 2, 1)  # [S, G, K]: the partial of every 128 columns of I
        y = yg.sum(1, keepdim=True)
        if bf16_intermediates:
            y = _bf16(y)
        for s, tok in enumerate(token[slots].tolist()):
            parts_of_token[tok] += list((yg[s] if partials == "slot-group" else y[s]).unbind(0))
    out = torch.zeros(M, K)
    for tok, parts in enumerate(parts_of_token):
        order = range(len(parts)) if summed == "bf16-rows" else torch.randperm(len(parts), generator=g).tolist()
        acc = torch.zeros(K)  # FP32
        for i in order:
            acc = (_bf16(acc + parts[i]) if summed == "bf16-running" else
                   acc + _bf16(parts[i]) if summed == "bf16-rows" else acc + parts[i])
        out[tok] = acc
    return out.bfloat16()


def _flip_nearest(a, codes, scale, n):
    """Move the n codes of each row whose scaled value lies nearest a rounding midpoint to the other side."""
    from moebench.fixtures.error_model import _fp8_neighbours
    S, I = a.shape
    v = (a.reshape(S, -1, 128) / scale[..., None]).reshape(S, I)
    q, dist, spacing = _fp8_neighbours(v)
    other = torch.where(v >= q, q + spacing, q - spacing)  # the neighbour across the nearer midpoint
    rel = dist / spacing.clamp_min(1e-30)
    pick = rel.topk(n, dim=1, largest=False).indices
    out = q.clone()
    out.scatter_(1, pick, other.gather(1, pick))
    return out.to(FP8)


# ------------------------------------------------------------------------ planted faults


def _first_routed(t) -> int:
    """Token 0's most heavily weighted routed expert: a fault there moves the output most (a fault
    on an expert of route weight 0.05 among eight is near the FP8 path's own noise)."""
    k = t["topk_weights"].shape[1] - int(t.get("shared", 0))
    return int(t["topk_ids"][0, int(t["topk_weights"][0, :k].argmax())])


def drop_expert(t):
    t["skip"] = t["topk_ids"].reshape(-1).long() == _first_routed(t)


def missing_shared_expert(t):
    ids = t["topk_ids"]
    t["skip"] = torch.zeros_like(ids, dtype=torch.bool)
    t["skip"][:, -1] = True  # the shared expert is each row's last slot
    t["skip"] = t["skip"].reshape(-1)


def wrong_scale_block(t):
    e = _first_routed(t)  # w2's block scales of one expert read one k block off
    t["w2_e"], t["w2_scale_e"] = t["w2"][e], t["w2_scale"][e].roll(1, dims=0)
    return e


def transposed_tile(t):
    e = _first_routed(t)  # one 128x128 tile of w2 read transposed
    w2 = t["w2"][e].clone()
    w2[:128, :128] = w2[:128, :128].view(torch.uint8).T.contiguous().view(FP8)
    t["w2_e"], t["w2_scale_e"] = w2, t["w2_scale"][e]
    return e


def wrong_route_weight(t):
    w = t["topk_weights"]  # token 0's largest route weight taken from its smallest slot's
    w[0, int(w[0].argmax())] = w[0].min()


FAULTS = {f.__name__: f for f in (drop_expert, missing_shared_expert, wrong_scale_block, transposed_tile,
                                  wrong_route_weight)}
