"""The grouped layout of the `cublas` arm (host, untimed: it is the route plan).

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
(moebench.kernels.peer.cublas_moe) writes the intermediate's scales into it.

Pure torch: importable where Triton is not (the registry imports the arm's module).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN_ROWS = 16  # rows of an expert's segment are a multiple of this (16-byte aligned operands)
GROUP = 128  # the FP8 scale group (1x128 activations, 128x128 weights)


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
