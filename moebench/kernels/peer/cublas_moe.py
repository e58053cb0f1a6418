"""The `cublas` arm's two Triton kernels: SwiGLU with the FP8 requant, and the weighted combine.

Both work on the grouped layout of moebench.kernels.peer.cublas_layout (rows sorted by expert in
padded segments, scales outer-dim-major per segment).

Under TRITON_INTERPRET=1 the @triton.jit decorator builds interpreter objects when the module
is imported; `kernels_module()` re-imports it when the mode has changed (as triton_arms does).
"""

from __future__ import annotations

import importlib
import sys

import torch
import triton
import triton.language as tl

from moebench.kernels.peer.cublas_layout import GROUP
from moebench.kernels.stock.rounding import INTERPRETED, exact_bf16, exact_e4m3

ROWS = 16  # rows per program of the SwiGLU kernel


# ----------------------------------------------------------------------------------------------
# Kernels.
# ----------------------------------------------------------------------------------------------


@triton.jit
def moebench_cublas_swiglu_quant(
    h_ptr, q_ptr, scale_ptr,  # h [rows, 2I] bf16 (gate, then up) -> q [rows, I] e4m3, scales (flat, grouped layout)
    scale_base_ptr, scale_stride_ptr,  # [rows] int64 each: where a row's scales sit
    n_rows, I,
    ROWS: tl.constexpr, GROUP: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """a = silu(gate) * up in FP32 from the BF16 GEMM output, rounded to BF16 (as the stock path
    stores it), then per-row group-128 FP8: scale = max(amax / 448, 1e-10), q = a / scale.

    One program per (ROWS rows, one group of GROUP columns): reads 4*ROWS*GROUP bytes of h,
    writes ROWS*GROUP codes and ROWS scales; memory bound.
    """
    rows = tl.program_id(axis=0) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    ok = rows < n_rows
    group = tl.program_id(axis=1)
    cols = group * GROUP + tl.arange(0, GROUP)
    h_row = h_ptr + rows[:, None] * (2 * I) + cols[None, :]
    gate = tl.load(h_row, mask=ok[:, None], other=0.0).to(tl.float32)
    up = tl.load(h_row + I, mask=ok[:, None], other=0.0).to(tl.float32)
    a = exact_bf16(gate / (1.0 + tl.exp(-gate)) * up, ROUND_IN_FP32).to(tl.bfloat16).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(a), axis=1) / 448.0, 1e-10)
    y = tl.clamp(a / scale[:, None], -448.0, 448.0)
    tl.store(q_ptr + rows[:, None] * I + cols[None, :], exact_e4m3(y, ROUND_IN_FP32).to(q_ptr.dtype.element_ty),
             mask=ok[:, None])
    base = tl.load(scale_base_ptr + rows, mask=ok, other=0)
    stride = tl.load(scale_stride_ptr + rows, mask=ok, other=0)
    tl.store(scale_ptr + base + group * stride, scale, mask=ok)


@triton.jit
def moebench_cublas_combine(
    y_ptr, out_ptr,  # y [rows, K] bf16 (the down GEMM's rows) -> out [M, K] bf16
    slot_row_ptr, weight_ptr,  # [M * TOP_K]: each slot's row of y and its route weight
    K, TOP_K: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    """out[t] = sum over its slots of weight x y[row], in FP32, rounded to BF16 once.

    One program per (token, BLOCK_SIZE columns): reads 2*TOP_K*BLOCK_SIZE bytes, writes
    2*BLOCK_SIZE.
    """
    token = tl.program_id(axis=0).to(tl.int64)
    cols = tl.program_id(axis=1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < K
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        row = tl.load(slot_row_ptr + token * TOP_K + k)
        w = tl.load(weight_ptr + token * TOP_K + k)
        acc += w * tl.load(y_ptr + row * K + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * K + cols, exact_bf16(acc, ROUND_IN_FP32).to(out_ptr.dtype.element_ty), mask=mask)


KERNEL_NAMES = ("moebench_cublas_swiglu_quant", "moebench_cublas_combine")


def launch_swiglu_quant(h: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, scale_base: torch.Tensor,
                        scale_stride: torch.Tensor) -> None:
    rows, N = h.shape
    I = N // 2
    if q.shape != (rows, I) or I % GROUP or scales.numel() != rows * (I // GROUP):
        raise ValueError(f"swiglu shapes disagree: h {tuple(h.shape)}, q {tuple(q.shape)}, scales {scales.numel()}")
    if rows == 0:
        return
    moebench_cublas_swiglu_quant[(triton.cdiv(rows, ROWS), I // GROUP)](
        h, q, scales, scale_base, scale_stride, rows, I, ROWS=ROWS, GROUP=GROUP, ROUND_IN_FP32=INTERPRETED,
        num_warps=4)


def launch_combine(y: torch.Tensor, out: torch.Tensor, slot_row: torch.Tensor, weights: torch.Tensor,
                   top_k: int) -> None:
    M, K = out.shape
    if y.shape[1] != K or slot_row.numel() != M * top_k or weights.numel() != M * top_k:
        raise ValueError(f"combine shapes disagree: y {tuple(y.shape)}, out {tuple(out.shape)}, top_k {top_k}")
    block = min(triton.next_power_of_2(K), 1024)
    moebench_cublas_combine[(M, triton.cdiv(K, block))](y, out, slot_row, weights, K, TOP_K=top_k,
                                                         BLOCK_SIZE=block, ROUND_IN_FP32=INTERPRETED, num_warps=4)


def kernels_module():
    """This module, defined under the interpreter setting now in force (re-imported if not)."""
    from moebench.kernels.stock.arms import interpreter_requested
    module = sys.modules[__name__]
    if module.INTERPRETED != interpreter_requested():
        importlib.reload(importlib.import_module("moebench.kernels.stock.rounding"))
        module = importlib.reload(module)
    return module
