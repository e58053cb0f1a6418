"""The route-plan GEMM of the Triton MoE path: GEMM1 (gate/up) and GEMM2 (down) share one body.

A program multiplies BLOCK_SIZE_M slots of one expert (one route-plan block) by a
BLOCK_SIZE_N-wide slice of that expert's weights, one BLOCK_SIZE_K step (inside one 128-wide
scale group) at a time: an FP8 tl.dot with FP32 accumulation, scaled by the outer product of
the two scale vectors. triton_moe's docstring says what SWAP_AB, the TMA loads, the sorted
layouts and PDL change. The two entry kernels differ only in name: CUPTI reports a Triton
kernel by its function's name (and the interpreter finds it by the name its `def` gives), so
each is a `def` of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench.kernels.stock.rounding import INTERPRETED, exact_bf16

QUANT_GROUP = 128  # block-scale granularity: 128x128 weight blocks, 1x128 activation groups


@triton.jit
def _moe_gemm_tile(
    # Operands: A rows are tokens (GEMM1: x, one row per token, read by slot // A_ROW_DIV), slots
    # (GEMM2: the requantized intermediate) or route-plan positions (A_SORTED); W is [E, N, K]
    # with K contiguous. a_desc / w_desc are their tensor descriptors when A_TMA / W_TMA.
    a_ptr, a_desc, a_scale_ptr, w_ptr, w_desc, w_scale_ptr,
    # C is [rows, N] bf16, one row per slot (or per plan position, C_SORTED); route weights [S].
    c_ptr, route_weight_ptr,
    # The route plan: slot ids grouped by expert, one expert per block, the padded total.
    sorted_slots_ptr, block_expert_ptr, padded_total_ptr,
    # Problem size: C is N wide, the reduction is K deep; S valid slots; `capacity` plan entries.
    N, K, num_slots, capacity,
    # Strides, in elements. Every innermost stride is 1 (checked by the launcher).
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
    # Meta-parameters.
    A_ROW_DIV: tl.constexpr,  # top_k for GEMM1 (a slot reads its token's row), 1 for GEMM2
    MUL_ROUTE_WEIGHT: tl.constexpr,
    SWAP_AB: tl.constexpr,
    A_SORTED: tl.constexpr, C_SORTED: tl.constexpr,  # A / C rows in route-plan order
    A_TMA: tl.constexpr, W_TMA: tl.constexpr,  # loads through tensor descriptors
    USE_GDC: tl.constexpr, GDC_EARLY: tl.constexpr,  # launched with PDL; release dependents at entry
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    GROUP: tl.constexpr,  # QUANT_GROUP
    ROUND_IN_FP32: tl.constexpr,  # True only under the interpreter, see triton_rounding
):
    # Launched with PDL this program may start while the previous kernel still runs: wait for
    # its writes before reading anything it wrote.
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        if GDC_EARLY:
            tl.extra.cuda.gdc_launch_dependents()

    # Programs are ordered in groups of GROUP_SIZE_M row-blocks, so the programs in flight
    # share the weight slices they read from L2 (Triton tutorial 03).
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(capacity, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # The grid covers the plan's capacity, as the engines launch it; blocks past the padded
    # total hold no slots and leave at once.
    if pid_m * BLOCK_SIZE_M >= tl.load(padded_total_ptr):
        return

    offs_plan = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    slot = tl.load(sorted_slots_ptr + offs_plan).to(tl.int64)
    slot_mask = slot < num_slots  # padding entries hold the sentinel num_slots
    expert32 = tl.load(block_expert_ptr + pid_m)
    expert = expert32.to(tl.int64)
    if expert32 == -1:
        # A block of an expert this rank does not hold (the engines' expert filter): its slots'
        # rows are zeros, written here unless C is in plan order (GEMM2 never reads those rows).
        if not C_SORTED:
            offs_zn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            tl.store(c_ptr + slot[:, None] * stride_cm + offs_zn[None, :],
                     tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=c_ptr.dtype.element_ty),
                     mask=slot_mask[:, None] & (offs_zn[None, :] < N))
        return

    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    # A's row of each slot, made past the exits, the tile's from the [BM, 1] slots themselves: in
    # this order (the engine's) Triton 3.6 gives GEMM1 16-24 fewer integer instructions a program
    # at A1-A128 than with the row vector made first and then expanded.
    if A_SORTED:
        a_row = offs_plan
        a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
    else:
        a_row = slot // A_ROW_DIV
        a_ptrs = a_ptr + (slot[:, None] // A_ROW_DIV) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    a_scale_ptrs = a_scale_ptr + a_row * stride_asm  # [BM], advanced by one group per 128 of K
    if BLOCK_SIZE_N > GROUP:
        w_scale_ptrs = w_scale_ptr + expert * stride_wse + (offs_n // GROUP) * stride_wsn  # [BN]
    else:
        w_scale_ptrs = w_scale_ptr + expert * stride_wse + (pid_n * BLOCK_SIZE_N // GROUP) * stride_wsn

    if SWAP_AB:
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)

    # Per step: reads BM*BK + BN*BK FP8 bytes and BM + (1 or BN) FP32 scales; 2*BM*BN*BK FLOPs.
    # Over the loop: one expert's BN x K weight slice (BN*K bytes) and BM token rows (BM*K bytes).
    for k_start in range(0, K, BLOCK_SIZE_K):
        if A_TMA:
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k_start])
        else:
            a = tl.load(a_ptrs, mask=slot_mask[:, None], other=0.0)
        if W_TMA:
            w = w_desc.load([expert32, pid_n * BLOCK_SIZE_N, k_start]).reshape(BLOCK_SIZE_N, BLOCK_SIZE_K).T
        else:
            w = tl.load(w_ptrs)
        group_k = k_start // GROUP
        a_scale = tl.load(a_scale_ptrs + group_k, mask=slot_mask, other=0.0)
        w_scale = tl.load(w_scale_ptrs + group_k)
        if SWAP_AB:
            part = tl.dot(tl.trans(w), tl.trans(a))  # [BN, BM]: the weights fill the tall side
            if BLOCK_SIZE_N > GROUP:
                acc += part * w_scale[:, None] * a_scale[None, :]
            else:
                acc += part * (w_scale * a_scale[None, :])
        else:
            part = tl.dot(a, w)  # [BM, BN]
            if BLOCK_SIZE_N > GROUP:
                acc += part * a_scale[:, None] * w_scale[None, :]
            else:
                acc += part * (a_scale[:, None] * w_scale)
        a_ptrs += BLOCK_SIZE_K
        w_ptrs += BLOCK_SIZE_K

    if SWAP_AB:
        acc = tl.trans(acc)
    if MUL_ROUTE_WEIGHT:
        route_weight = tl.load(route_weight_ptr + slot, mask=slot_mask, other=0.0)
        acc = acc * route_weight[:, None]

    # Epilogue: BM*BN bf16 stores, scattered to the slots' rows (or the plan's rows, in order).
    # The cast before the store's address arithmetic, as the engine orders it: with the cast
    # last, the A1 down GEMM's epilogue gets the same instructions in another order.
    out = exact_bf16(acc, ROUND_IN_FP32).to(c_ptr.dtype.element_ty)
    if C_SORTED:
        c_row = offs_plan
    else:
        c_row = slot
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, out, mask=slot_mask[:, None] & (offs_cn[None, :] < N))
    if USE_GDC and not GDC_EARLY:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def moebench_moe_gemm1(
    a_ptr, a_desc, a_scale_ptr, w_ptr, w_desc, w_scale_ptr, c_ptr, route_weight_ptr,
    sorted_slots_ptr, block_expert_ptr, padded_total_ptr,
    N, K, num_slots, capacity,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
    A_ROW_DIV: tl.constexpr, MUL_ROUTE_WEIGHT: tl.constexpr, SWAP_AB: tl.constexpr,
    A_SORTED: tl.constexpr, C_SORTED: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr,
    USE_GDC: tl.constexpr, GDC_EARLY: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, GROUP: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """Gate/up projection: h[slot] = x[token] . W1[e]^T, blockwise dequantized, bf16 out."""
    _moe_gemm_tile(a_ptr, a_desc, a_scale_ptr, w_ptr, w_desc, w_scale_ptr, c_ptr, route_weight_ptr,
                   sorted_slots_ptr, block_expert_ptr, padded_total_ptr, N, K, num_slots, capacity,
                   stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
                   A_ROW_DIV, MUL_ROUTE_WEIGHT, SWAP_AB, A_SORTED, C_SORTED, A_TMA, W_TMA, USE_GDC, GDC_EARLY,
                   BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, GROUP, ROUND_IN_FP32)


@triton.jit
def moebench_moe_gemm2(
    a_ptr, a_desc, a_scale_ptr, w_ptr, w_desc, w_scale_ptr, c_ptr, route_weight_ptr,
    sorted_slots_ptr, block_expert_ptr, padded_total_ptr,
    N, K, num_slots, capacity,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
    A_ROW_DIV: tl.constexpr, MUL_ROUTE_WEIGHT: tl.constexpr, SWAP_AB: tl.constexpr,
    A_SORTED: tl.constexpr, C_SORTED: tl.constexpr, A_TMA: tl.constexpr, W_TMA: tl.constexpr,
    USE_GDC: tl.constexpr, GDC_EARLY: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, GROUP: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """Down projection: y[slot] = w_route[slot] * a_q[slot] . W2[e]^T, bf16 out."""
    _moe_gemm_tile(a_ptr, a_desc, a_scale_ptr, w_ptr, w_desc, w_scale_ptr, c_ptr, route_weight_ptr,
                   sorted_slots_ptr, block_expert_ptr, padded_total_ptr, N, K, num_slots, capacity,
                   stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
                   A_ROW_DIV, MUL_ROUTE_WEIGHT, SWAP_AB, A_SORTED, C_SORTED, A_TMA, W_TMA, USE_GDC, GDC_EARLY,
                   BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, GROUP, ROUND_IN_FP32)


def check_rowmajor(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, strides {t.stride()}")


def tensor_descriptor(t: torch.Tensor, block: list[int]):
    """A host-side TMA descriptor of `t` with box `block` (Triton's TensorDescriptor)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def set_tma_allocator() -> None:
    """Triton asks a global allocator for descriptor scratch; give it torch's (once)."""
    global _TMA_ALLOCATOR_SET
    if not _TMA_ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
        _TMA_ALLOCATOR_SET = True


_TMA_ALLOCATOR_SET = False


def tensor_descriptors_available() -> bool:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def launch_moe_gemm(kernel, a, a_scale, w, w_scale, c, route_weights, sorted_slots, block_experts,
                    padded_total, *, a_row_div: int, mul_route_weight: bool, swap_ab: bool,
                    config: dict, a_sorted: bool = False, c_sorted: bool = False, a_desc=None, w_desc=None,
                    pdl: bool = False, pdl_early: bool = False) -> None:
    """c[slot] = (a[slot // a_row_div] . w[e]^T) [* route weight], for the slots of a route plan.

    a [rows, K] e4m3, a_scale [rows, K/128]; w [E, N, K] e4m3, w_scale [E, N/128, K/128];
    c [rows, N] (any 2-D view with unit inner stride); route_weights [S] fp32. With `a_sorted`
    / `c_sorted` the rows of a / c are route-plan positions. `a_desc`, `w_desc`: tensor
    descriptors of a and w (boxes [BM, BK] and [1, BN, BK]) to load through. `pdl`: launch with
    programmatic dependent launch (the kernel waits for its predecessor's writes itself).
    """
    E, N, K = w.shape
    S = route_weights.numel()
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    if a.shape[1] != K or c.shape[1] != N:
        raise ValueError(f"GEMM shapes disagree: a {tuple(a.shape)}, w {tuple(w.shape)}, c {tuple(c.shape)}")
    if K % bk or QUANT_GROUP % bk:
        raise ValueError(f"BLOCK_SIZE_K={bk} must divide {QUANT_GROUP} and K={K}")
    if a_scale.shape[1] != K // QUANT_GROUP or w_scale.shape[1:] != (N // QUANT_GROUP, K // QUANT_GROUP):
        raise ValueError("scale shapes do not match 128-wide groups")
    if block_experts.numel() != triton.cdiv(sorted_slots.numel(), bm):
        raise ValueError(f"route plan of {sorted_slots.numel()} slots and {block_experts.numel()} blocks "
                         f"is not a plan for BLOCK_SIZE_M={bm}")
    if (a_desc is not None) and not a_sorted:
        raise ValueError("a tensor descriptor of A needs A in route-plan order")
    check_rowmajor(a=a, a_scale=a_scale, w=w, w_scale=w_scale, c=c)
    capacity = sorted_slots.numel()
    grid = (triton.cdiv(capacity, bm) * triton.cdiv(N, bn),)
    launch = {"launch_pdl": True} if pdl else {}
    kernel[grid](
        a, a if a_desc is None else a_desc, a_scale, w, w if w_desc is None else w_desc, w_scale,
        c, route_weights, sorted_slots, block_experts, padded_total,
        N, K, S, capacity,
        a.stride(0), a_scale.stride(0), w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1),
        c.stride(0),
        A_ROW_DIV=a_row_div, MUL_ROUTE_WEIGHT=mul_route_weight, SWAP_AB=swap_ab,
        A_SORTED=a_sorted, C_SORTED=c_sorted, A_TMA=a_desc is not None, W_TMA=w_desc is not None,
        USE_GDC=pdl, GDC_EARLY=pdl and pdl_early,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=config["GROUP_SIZE_M"],
        GROUP=QUANT_GROUP, ROUND_IN_FP32=INTERPRETED,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **launch,
    )
