"""The stock FP8 W8A8 block-scale MoE path in Triton: five kernels, as vLLM and SGLang run it.

    x [M, K] e4m3 ─▶ GEMM1 ─▶ h [S, N] bf16 ─▶ SwiGLU ─▶ a [S, I] bf16 ─▶ quant ─▶ a_q [S, I] e4m3
                                                                              + a_s [S, I/128] fp32
    a_q ─▶ GEMM2 (× route weight) ─▶ y [M, top_k, K] bf16 ─▶ combine (sum over top_k) ─▶ out [M, K] bf16

S = M * top_k token slots. Both GEMMs walk a route plan (moe_align_block_size semantics): the
slots grouped by expert and padded to BLOCK_SIZE_M, one expert per block of rows, so a program
multiplies BLOCK_SIZE_M slots of one expert by a BLOCK_SIZE_N-wide slice of that expert's
weights. Weights carry one FP32 scale per 128x128 block, activations one per token per 128
columns; each BLOCK_SIZE_K step stays inside one scale group (BLOCK_SIZE_K divides 128), so a
step is one FP8 tl.dot with FP32 accumulation, scaled by the outer product of the two scale
vectors, exactly as the engines' fused_moe_kernel does it.

SWAP_AB computes the transposed tile, W^T . A^T -> [BLOCK_SIZE_N, BLOCK_SIZE_M], so that the
weights take the wide (M) side of the tensor-core instruction when the per-expert block of
tokens is small (BLOCK_SIZE_M < 64; Hopper's wgmma is 64 rows tall), and transposes the
accumulator back before the epilogue.

The launch paths the engines use on Hopper (engine_config.py says when):
  * W_TMA loads the weight tiles through a tensor descriptor (the bulk copy engine) instead of
    per-thread loads.
  * The sorted intermediate: GEMM1 writes h in route-plan order (C_SORTED), SwiGLU and the
    requant run over those rows (rows past the padded total skipped, padding rows zeroed), and
    GEMM2 reads its A tiles through a descriptor (A_SORTED, A_TMA): one block of plan rows is
    one contiguous box.
  * PDL: a GEMM launched with programmatic dependent launch may start while its predecessor
    finishes; it waits for the predecessor's writes first (USE_GDC), and with GDC_EARLY lets its
    own successor start at once.

Each kernel is a `moebench_moe_*` function: CUPTI reports a Triton kernel by its Python name,
and the arms declare these names as the kernels a sample must contain.

The GEMMs are triton_moe_gemm's, the interpreter's rounding helpers triton_rounding's; this
module holds the row kernels (SwiGLU, requant, combine), the buffers and the launchers.

Under TRITON_INTERPRET=1 the @triton.jit decorator builds interpreter objects instead of GPU
kernels; it reads the variable when a module is imported, so moebench.kernels.stock.arms
re-imports these modules when the mode has changed (see `kernels_module` there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moebench.kernels.stock.moe_gemm import (QUANT_GROUP, check_rowmajor, launch_moe_gemm,  # noqa: F401
                                             moebench_moe_gemm1, moebench_moe_gemm2, set_tma_allocator,
                                             tensor_descriptor, tensor_descriptors_available)
from moebench.kernels.stock.rounding import INTERPRETED, exact_bf16, exact_e4m3

FP8_MAX = 448.0  # largest finite e4m3 magnitude
MIN_SCALE = 1e-10  # floor for amax/448, as in moebench.fixtures.quant: an all-zero group stays zero

# ----------------------------------------------------------------------------------------------
# SwiGLU, FP8 requantization, combine.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _row_block(pid, n_rows, sorted_slots_ptr, padded_total_ptr, num_slots, ROWS: tl.constexpr,
               SORTED: tl.constexpr):
    """A program's ROWS rows of the intermediate: their indices, which of them to write, and
    which hold a token slot. In plan order, rows past the padded total are left alone and
    padding rows are written as zeros (GEMM2 reads them, masked)."""
    rows = pid * ROWS + tl.arange(0, ROWS).to(tl.int64)
    write = rows < n_rows
    if SORTED:
        write = write & (rows < tl.load(padded_total_ptr))
        holds = write & (tl.load(sorted_slots_ptr + rows, mask=write, other=num_slots) < num_slots)
    else:
        holds = write
    return rows, write, holds


@triton.jit
def moebench_moe_silu_and_mul(
    h_ptr, out_ptr,  # h [rows, 2I] bf16, gate columns then up columns; out [rows, I] bf16
    sorted_slots_ptr, padded_total_ptr, num_slots,  # the route plan, read when SORTED
    n_rows, I, stride_h, stride_out,
    SORTED: tl.constexpr,  # rows in route-plan order (the sorted layout of the TMA down GEMM)
    ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """out = silu(gate) * up, in FP32, rounded to bf16 once.

    One program per (ROWS rows, BLOCK_SIZE columns), as the engines' vectorized kernel covers
    the rows with few blocks: reads 4*ROWS*BLOCK_SIZE bytes, writes half that, about 5 FLOPs and
    one exp per element: bound by memory.
    """
    pid = tl.program_id(axis=0)
    if SORTED:
        if pid * ROWS >= tl.load(padded_total_ptr):  # rows past the plan's padded total are never read
            return
    rows, write, holds = _row_block(pid, n_rows, sorted_slots_ptr, padded_total_ptr, num_slots, ROWS, SORTED)
    cols = tl.program_id(axis=1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    col_ok = (cols < I)[None, :]
    h_row = h_ptr + rows[:, None] * stride_h + cols[None, :]
    gate = tl.load(h_row, mask=holds[:, None] & col_ok, other=0.0).to(tl.float32)
    up = tl.load(h_row + I, mask=holds[:, None] & col_ok, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             exact_bf16(out, ROUND_IN_FP32).to(out_ptr.dtype.element_ty), mask=write[:, None] & col_ok)


@triton.jit
def moebench_moe_act_quant(
    x_ptr, q_ptr, scale_ptr,  # x [rows, D] bf16 -> q [rows, D] e4m3 and scale [rows, D / GROUP] fp32
    sorted_slots_ptr, padded_total_ptr, num_slots,  # the route plan, read when SORTED
    n_rows, stride_x, stride_q, stride_s,
    SORTED: tl.constexpr,  # rows in route-plan order
    ROWS: tl.constexpr, GROUP: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,  # True only under the interpreter, see triton_rounding
):
    """Per-token group-128 FP8 quantization: scale = max(amax / 448, 1e-10), q = x / scale.

    One program per (ROWS rows, one group of GROUP columns): reads 2*ROWS*GROUP bytes, writes
    ROWS*(GROUP + 4).
    """
    pid = tl.program_id(axis=0)
    if SORTED:
        if pid * ROWS >= tl.load(padded_total_ptr):
            return
    rows, write, holds = _row_block(pid, n_rows, sorted_slots_ptr, padded_total_ptr, num_slots, ROWS, SORTED)
    group = tl.program_id(axis=1)
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=holds[:, None], other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / 448.0, 1e-10)
    y = tl.clamp(x / scale[:, None], -448.0, 448.0)
    tl.store(q_ptr + rows[:, None] * stride_q + cols[None, :],
             exact_e4m3(y, ROUND_IN_FP32).to(q_ptr.dtype.element_ty), mask=write[:, None])
    tl.store(scale_ptr + rows * stride_s + group, scale, mask=write)


@triton.jit
def moebench_moe_combine(
    y_ptr, out_ptr,  # y [M, TOP_K, K] bf16 -> out [M, K] bf16
    K, stride_y_token, stride_y_k, stride_out,
    TOP_K: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """out[t] = sum over k of y[t, k], in FP32, rounded to bf16 once.

    One program per (token, BLOCK_SIZE columns): reads 2*TOP_K*BLOCK_SIZE bytes, writes
    2*BLOCK_SIZE, TOP_K-1 adds per element.
    """
    token = tl.program_id(axis=0).to(tl.int64)
    cols = tl.program_id(axis=1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < K
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + token * stride_y_token + k * stride_y_k + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, exact_bf16(acc, ROUND_IN_FP32).to(out_ptr.dtype.element_ty),
             mask=mask)


KERNEL_NAMES = ("moebench_moe_gemm1", "moebench_moe_silu_and_mul", "moebench_moe_act_quant",
                "moebench_moe_gemm2", "moebench_moe_combine")


# ----------------------------------------------------------------------------------------------
# Host side: buffers (allocated once, untimed) and launchers (check, then launch).
# ----------------------------------------------------------------------------------------------


def allocate_buffers(M: int, top_k: int, K: int, N: int, device, rows: int | None = None) -> dict[str, torch.Tensor]:
    """Every intermediate of the path, like the engines' intermediate caches, and the output.
    `rows`: rows of the GEMM1-to-GEMM2 intermediates (default one per slot; more in the sorted
    layout, see engine_config.sorted_rows)."""
    S, I = M * top_k, N // 2
    rows = S if rows is None else rows
    return {
        "h": torch.empty(rows, N, dtype=torch.bfloat16, device=device),
        "act": torch.empty(rows, I, dtype=torch.bfloat16, device=device),
        "act_q": torch.empty(rows, I, dtype=torch.float8_e4m3fn, device=device),
        "act_scale": torch.empty(rows, I // QUANT_GROUP, dtype=torch.float32, device=device),
        "y": torch.empty(M, top_k, K, dtype=torch.bfloat16, device=device),
        "out": torch.empty(M, K, dtype=torch.bfloat16, device=device),
    }


def elementwise_block(n: int) -> int:
    """Columns per program for the row-wise kernels: the row, up to 1024."""
    return min(triton.next_power_of_2(n), 1024)


ROW_BLOCK = 16  # rows per program of the row kernels (SwiGLU, requant)


def launch_silu_and_mul(h: torch.Tensor, act: torch.Tensor, plan=None) -> None:
    """act = silu(gate) * up, row by row. `plan` = (sorted slots, padded total, slot count) when
    the rows are in route-plan order."""
    rows, I = act.shape
    if h.shape != (rows, 2 * I):
        raise ValueError(f"h {tuple(h.shape)} must be [rows, 2I] for act {tuple(act.shape)}")
    check_rowmajor(h=h, act=act)
    block = elementwise_block(I)
    sorted_slots, padded_total, num_slots = plan if plan is not None else (h, h, rows)
    moebench_moe_silu_and_mul[(triton.cdiv(rows, ROW_BLOCK), triton.cdiv(I, block))](
        h, act, sorted_slots, padded_total, num_slots, rows, I, h.stride(0), act.stride(0),
        SORTED=plan is not None, ROWS=ROW_BLOCK, BLOCK_SIZE=block, ROUND_IN_FP32=INTERPRETED, num_warps=4)


def launch_act_quant(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, plan=None) -> None:
    """Per-token group-128 FP8 quantization of x's rows (in route-plan order with `plan`)."""
    S, D = x.shape
    if D % QUANT_GROUP or q.shape != x.shape or scale.shape != (S, D // QUANT_GROUP):
        raise ValueError(f"quant shapes disagree: x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)}")
    check_rowmajor(x=x, q=q, scale=scale)
    sorted_slots, padded_total, num_slots = plan if plan is not None else (x, x, S)
    moebench_moe_act_quant[(triton.cdiv(S, ROW_BLOCK), D // QUANT_GROUP)](
        x, q, scale, sorted_slots, padded_total, num_slots, S, x.stride(0), q.stride(0), scale.stride(0),
        SORTED=plan is not None, ROWS=ROW_BLOCK, GROUP=QUANT_GROUP, ROUND_IN_FP32=INTERPRETED, num_warps=4)


def launch_combine(y: torch.Tensor, out: torch.Tensor) -> None:
    M, top_k, K = y.shape
    if out.shape != (M, K):
        raise ValueError(f"out {tuple(out.shape)} must be [M, K] for y {tuple(y.shape)}")
    check_rowmajor(y=y, out=out)
    block = elementwise_block(K)
    moebench_moe_combine[(M, triton.cdiv(K, block))](y, out, K, y.stride(0), y.stride(1), out.stride(0),
                                                      TOP_K=top_k, BLOCK_SIZE=block,
                                                      ROUND_IN_FP32=INTERPRETED, num_warps=4)
