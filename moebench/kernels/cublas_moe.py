"""The grouped layout of the `cublas` arm and its two Triton kernels (SwiGLU + requant, combine).

cuBLAS block-scaled FP8 GEMMs (torch's `scaled_mm`, 1x128 activation scales, 128x128 weight
scales) take one expert at a time, so the token slots are laid out as the engines lay them out
for a grouped GEMM (DeepGEMM's contiguous layout): rows sorted by expert, each expert's rows one
contiguous segment, each segment padded to ALIGN_ROWS rows so that every operand's first byte
(FP8 rows, BF16 outputs, FP32 scales) is 16-byte aligned, as cuBLAS asks of its pointers.

cuBLAS wants a 1x128 scale tensor "outer-dim-major": a segment's scales [rows, G] stored with
stride (1, rows), i.e. as [G, rows]. Segments have different row counts, so the scales of all
rows live in one flat buffer where segment s (first row r0, R rows) takes [r0 G, (r0 + R) G)
and the scale of (row r, group g) sits at r0 G + g R + (r - r0) = `scale_base[r] + g *
scale_stride[r]`. The activation's scales are gathered into that layout and the SwiGLU kernel
writes the intermediate's scales into it.

Under TRITON_INTERPRET=1 the @triton.jit decorator builds interpreter objects when the module
is imported; `kernels_module()` re-imports it when the mode has changed (as triton_arms does).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moebench.kernels.triton_rounding import INTERPRETED, exact_bf16, exact_e4m3

ALIGN_ROWS = 16  # rows of an expert's segment are a multiple of this (16-byte aligned operands)
GROUP = 128  # the FP8 scale group (1x128 activations, 128x128 weights)
ROWS = 16  # rows per program of the SwiGLU kernel
MIN_SCALE = 1e-10  # amax/448 floored, as moebench.fixtures.quant: an all-zero group stays zero


# ----------------------------------------------------------------------------------------------
# The grouped layout (host, untimed: it is the route plan).
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupedRows:
    """Token slots sorted by expert into padded segments; everything the timed call indexes by."""

    experts: tuple[int, ...]  # the routed experts, ascending, one segment each
    starts: tuple[int, ...]  # each segment's first row (a multiple of ALIGN_ROWS)
    counts: tuple[int, ...]  # slots routed to each expert
    padded: tuple[int, ...]  # each segment's rows (count rounded up to ALIGN_ROWS)
    rows: int  # all segments' rows
    row_token: torch.Tensor  # [rows] int64: the token each row holds (padding rows: token 0)
    slot_row: torch.Tensor  # [M * top_k] int64: the row of each slot
    scale_stride: torch.Tensor  # [rows] int64: its segment's rows (the stride between a row's groups)

    def scale_base(self, groups: int) -> torch.Tensor:
        """[rows] int64: the flat index of each row's group-0 scale, r0 groups + (r - r0)."""
        base = torch.empty(self.rows, dtype=torch.int64)
        for start, n in zip(self.starts, self.padded):
            base[start:start + n] = start * groups + torch.arange(n)
        return base.to(self.scale_stride.device)

    def scale_src(self, groups: int) -> torch.Tensor:
        """[rows * groups] int64: for each position of the flat scale buffer, the index of the
        activation scale [M, groups] (flattened) it takes."""
        src = torch.empty(self.rows * groups, dtype=torch.int64)
        row_token = self.row_token.cpu()
        for start, n in zip(self.starts, self.padded):
            tokens = row_token[start:start + n]
            block = tokens[None, :] * groups + torch.arange(groups)[:, None]  # [groups, n]
            src[start * groups:(start + n) * groups] = block.reshape(-1)
        return src

    def to(self, device) -> "GroupedRows":
        move = {k: getattr(self, k).to(device) for k in ("row_token", "slot_row", "scale_stride")}
        return GroupedRows(self.experts, self.starts, self.counts, self.padded, self.rows, **move)


def grouped_rows(topk_ids: torch.Tensor, num_experts: int, align: int = ALIGN_ROWS) -> GroupedRows:
    """The grouped layout of `topk_ids` [M, top_k]: slots of one expert in slot order (a stable
    sort), segments in expert order, each padded to `align` rows."""
    ids = topk_ids.reshape(-1).long().cpu()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
        raise ValueError(f"topk_ids outside [0, {num_experts})")
    top_k = topk_ids.shape[1] if topk_ids.dim() == 2 else 1
    order = torch.sort(ids, stable=True).indices
    counts_all = torch.bincount(ids, minlength=num_experts)
    experts = tuple(int(e) for e in torch.nonzero(counts_all).reshape(-1))
    counts = tuple(int(counts_all[e]) for e in experts)
    padded = tuple(-(-c // align) * align for c in counts)
    starts, total = [], 0
    for n in padded:
        starts.append(total)
        total += n
    row_token = torch.zeros(total, dtype=torch.int64)
    slot_row = torch.empty(ids.numel(), dtype=torch.int64)
    scale_stride = torch.empty(total, dtype=torch.int64)
    taken = 0
    for start, n, pad in zip(starts, counts, padded):
        slots = order[taken:taken + n]
        taken += n
        row_token[start:start + n] = slots // top_k
        slot_row[slots] = torch.arange(start, start + n)
        scale_stride[start:start + pad] = pad
    return GroupedRows(experts, tuple(starts), counts, padded, total, row_token, slot_row, scale_stride)


def segment_scales(flat: torch.Tensor, start: int, rows: int, groups: int) -> torch.Tensor:
    """A segment's scales [rows, groups] as a view of the flat buffer, outer-dim-major: stride (1, rows)."""
    return flat[start * groups:(start + rows) * groups].view(groups, rows).t()


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
    from moebench.kernels.triton_arms import interpreter_requested
    module = sys.modules[__name__]
    if module.INTERPRETED != interpreter_requested():
        importlib.reload(importlib.import_module("moebench.kernels.triton_rounding"))
        module = importlib.reload(module)
    return module
