"""Arm `cublas`: a production non-Triton peer. The MoE layer on cuBLAS block-scaled FP8 GEMMs
(cuBLASLt's VEC128_32F activation and BLK128x128_32F weight scales, DeepSeek-V3's recipe),
reached through torch's `scaled_mm`, one GEMM per routed expert, as an engine without a grouped
kernel runs them.

What the timed call runs, in order:
  * gather: the tokens' FP8 rows and their 1x128 scales into the grouped layout
    (moebench.kernels.peer.cublas_layout: rows sorted by expert, each expert's segment padded to 16 rows,
    scales outer-dim-major per segment), two `index_select` kernels;
  * GEMM1 per routed expert: [rows_e, K] x [K, 2I] -> BF16 (cuBLAS);
  * SwiGLU and the FP8 requant of the intermediate per row per 128 columns, one Triton kernel
    that writes the codes and the scales in the layout GEMM2 reads (moebench.kernels.peer.cublas_moe);
  * GEMM2 per routed expert: [rows_e, I] x [I, K] -> BF16 (cuBLAS);
  * combine: each token's slots weighted and summed in FP32, rounded to BF16 once (Triton).

Per-expert launches are what this path costs: 2 x (routed experts) cuBLAS launches a call (18 at
A1, several hundred at A128 and Q128), each with its host-side dispatch, and tiles of 16-row
padded segments that a grouped kernel would share. The route plan (the sorted order, segment
offsets and counts, as index tensors and host integers) is untimed, as for every arm; so are
the weights' scale layout and every buffer. The timed call allocates nothing.

Where it rounds (declared `bf16-intermediates`, the stock path's model): GEMM1 accumulates in
FP32 by k block and stores h in BF16; SwiGLU in FP32 from that h, rounded to BF16; requant per
128 columns; GEMM2 in FP32 over all of I, each slot's row stored in BF16 (unweighted: the route
weight is applied in the combine, in FP32, where the stock path rounds after it); the slots
summed in FP32 and rounded once.

Torch's block-wise contract (read in torch's aten/src/ATen/native/cuda/ScaledBlas.cpp,
`_scaled_block1x128_block128x128`, and test/test_scaled_matmul_cuda.py): Hopper only (cuBLASLt
>= 12.9); a [M, K] row-major, b [K, N] column-major (an [N, K] row-major weight transposed);
scale_a [M, K/128] FP32 with strides (1, M); scale_b [L4, N/128] FP32 with strides (1, L4),
L4 = K/128 rounded up to 4 (the weight's [N/128, K/128] scales padded along K and transposed);
no fast accumulation. `torch.nn.functional.scaled_mm` (torch 2.10 and later) is the entry that
takes these recipes by name; the arm calls its out-variant op so each GEMM writes into its
segment of one buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, ShapeSpec
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.peer.cublas_layout import ALIGN_ROWS, GROUP, GroupedRows, grouped_rows, segment_scales

GEMM_PATTERN = r"nvjet|gemm|xmma|cutlass"  # cuBLASLt's kernel names on Hopper (none of moebench's)
TORCH_HINT = "torch >= 2.10 built with CUDA >= 12.9"


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def kernels_for(experts: int) -> tuple[KernelDecl, ...]:
    return (
        KernelDecl("gather", r"indexSelect", 2),
        KernelDecl("gemm", GEMM_PATTERN, 2 * experts),
        KernelDecl("swiglu_quant", r"^moebench_cublas_swiglu_quant", 1),
        KernelDecl("combine", r"^moebench_cublas_combine", 1),
    )


# ----------------------------------------------------------------------------------------------
# The block-scaled GEMM: cuBLAS through torch, or its exact emulation (CPU tests).
# ----------------------------------------------------------------------------------------------


def blockwise_missing() -> str | None:
    """Why this torch has no block-wise (1x128 x 128x128) scaled_mm, or None."""
    F = torch.nn.functional
    kinds = getattr(F, "ScalingType", None)
    if kinds is None or not all(hasattr(kinds, k) for k in ("BlockWise1x128", "BlockWise128x128")):
        return f"torch {torch.__version__} has no block-wise scaled_mm recipes ({TORCH_HINT})"
    op = getattr(torch.ops.aten, "_scaled_mm_v2", None)
    if op is None or "out" not in op.overloads():
        return f"torch {torch.__version__} has no aten._scaled_mm_v2.out ({TORCH_HINT})"
    cuda = torch.version.cuda
    if cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if tuple(int(x) for x in cuda.split(".")[:2]) < (12, 9):
        return f"cuBLAS block-wise FP8 scaling needs CUDA >= 12.9; torch {torch.__version__} is built with {cuda}"
    return None


def weight_scales_b(scales: torch.Tensor) -> torch.Tensor:
    """A weight's [N/128, K/128] block scales as scaled_mm's scale_b: [L4, N/128], strides (1, L4)."""
    nb, kb = scales.shape
    padded = torch.zeros(nb, _round_up(kb, 4), dtype=torch.float32, device=scales.device)
    padded[:, :kb] = scales
    return padded.t()


def check_operands(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   out: torch.Tensor) -> None:
    """torch's checks of a (1x128, 128x128) call, as its source states them, and cuBLAS's 16-byte
    pointer alignment: a ValueError naming the first that fails."""
    m, k = a.shape
    n = w.shape[0]
    kb, l4 = k // GROUP, _round_up(k // GROUP, 4)
    checks = (
        (a.dtype == w.dtype == torch.float8_e4m3fn, "a and w must be float8_e4m3fn"),
        (a.stride(1) == 1 and (m <= 1 or a.stride(0) == k) and w.is_contiguous(), "a and w must be row-major"),
        (w.shape[1] == k and k % GROUP == 0 and n % GROUP == 0, f"K {k} and N {n} must be multiples of {GROUP}"),
        (a_scale.dtype == w_scale.dtype == torch.float32, "scales must be float32"),
        (tuple(a_scale.shape) == (m, kb) and a_scale.stride(0) == 1
         and (a_scale.stride(1) == m or (kb == 1 and a_scale.stride(1) == 1)),
         f"scale_a must be [{m}, {kb}] with strides (1, {m}), got {tuple(a_scale.shape)} {a_scale.stride()}"),
        (tuple(w_scale.shape) == (l4, n // GROUP) and w_scale.stride(0) == 1
         and (w_scale.stride(1) == l4 or (n == GROUP and w_scale.stride(1) == 1)),
         f"scale_b must be [{l4}, {n // GROUP}] with strides (1, {l4}), got {tuple(w_scale.shape)} {w_scale.stride()}"),
        (tuple(out.shape) == (m, n) and out.is_contiguous(), f"out must be [{m}, {n}] contiguous"),
        (all(t.data_ptr() % 16 == 0 for t in (a, a_scale, w, w_scale, out)), "operands must be 16-byte aligned"),
    )
    for ok, what in checks:
        if not ok:
            raise ValueError(f"block-wise scaled_mm: {what}")


def cublas_gemm(a, a_scale, w, w_scale, out) -> None:
    """out = (a x a_scale) @ (w x w_scale)^T on cuBLAS: one launch."""
    kinds = torch.nn.functional.ScalingType
    torch.ops.aten._scaled_mm_v2.out(
        a, w.t(), [a_scale], [int(kinds.BlockWise1x128.value)], [], [w_scale], [int(kinds.BlockWise128x128.value)],
        [], None, out.dtype, [], False, out=out)


def emulated_gemm(a, a_scale, w, w_scale, out) -> None:
    """The same product, exactly: operands dequantized to FP32, one FP32 matmul, cast to out."""
    check_operands(a, a_scale, w, w_scale, out)
    k = a.shape[1]
    a32 = a.float() * a_scale.repeat_interleave(GROUP, dim=1)
    ws = w_scale[:k // GROUP, :].t()  # [N/128, K/128]
    w32 = w.float() * ws.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)
    out.copy_(a32 @ w32.t())


GEMMS: dict[str, Callable[..., None]] = {"cublas": cublas_gemm, "emulated": emulated_gemm}


# ----------------------------------------------------------------------------------------------
# The arm.
# ----------------------------------------------------------------------------------------------


@dataclass
class CublasWorkspace:
    """Everything run() touches, made once: the layout on the device, buffers, per-expert views."""

    layout: GroupedRows
    gather: tuple  # index_select's arguments: x codes, row tokens, gathered rows; x scales, sources, gathered
    up: list  # per routed expert: (x rows, their scales, w1[e], its scale_b, h rows)
    rows: tuple  # the SwiGLU kernel's: h, codes, scales (flat), scale_base, scale_stride
    down: list  # per routed expert: (a rows, their scales, w2[e], its scale_b, y rows)
    combine: tuple  # the combine's: y, out, slot rows, route weights, top_k
    out: torch.Tensor  # [M, K] bf16


@register_arm("cublas")
class CublasArm(Arm):
    description = ("peer: cuBLAS block-scaled FP8 GEMMs (1x128 x 128x128) through torch scaled_mm, one per "
                   "routed expert, sorted and padded rows")

    def __init__(self, gemm: str = "cublas"):
        if gemm not in GEMMS:
            raise UserError(f"cublas: unknown gemm {gemm!r} (known: {', '.join(GEMMS)})")
        self.gemm = gemm

    def unavailable_reason(self, device: torch.device) -> str | None:
        from moebench.kernels.stock.arms import interpreter_requested
        device = torch.device(device)
        if self.gemm == "emulated":
            return None
        if device.type != "cuda" or not torch.cuda.is_available():
            return "cuBLAS block-scaled GEMMs run on a CUDA device only"
        missing = blockwise_missing()
        if missing:
            return missing
        major, minor = torch.cuda.get_device_capability(device)
        if major != 9:
            return (f"cuBLAS's block-wise (1x128, 128x128) FP8 scaling runs on sm_90 (Hopper) only, "
                    f"found sm_{major}{minor}")
        if interpreter_requested():
            return "TRITON_INTERPRET=1 is set"
        return None

    def refuses(self, spec: ShapeSpec) -> str | None:
        if spec.K % GROUP or spec.I % GROUP:
            return (f"cublas: K {spec.K} and I {spec.I} must be multiples of {GROUP} (the scale blocks of "
                    f"block-wise scaled_mm)")
        return None

    def workspace(self, fx: Fixture) -> CublasWorkspace:
        """Untimed: the grouped layout, the weights' scale layout, buffers and per-expert views."""
        s, dev = fx.spec, fx.device
        M, K, N, I = fx.M, s.K, s.N, s.I
        layout = grouped_rows(fx.topk_ids, s.E)
        rows, kb, ib = layout.rows, K // GROUP, I // GROUP
        lay = layout.to(dev)
        x_src = layout.scale_src(kb).to(dev)
        xs = torch.empty(rows, K, dtype=torch.float8_e4m3fn, device=dev)
        xs_scale = torch.empty(rows * kb, dtype=torch.float32, device=dev)
        h = torch.empty(rows, N, dtype=torch.bfloat16, device=dev)
        aq = torch.empty(rows, I, dtype=torch.float8_e4m3fn, device=dev)
        aq_scale = torch.empty(rows * ib, dtype=torch.float32, device=dev)
        y = torch.empty(rows, K, dtype=torch.bfloat16, device=dev)
        out = torch.empty(M, K, dtype=torch.bfloat16, device=dev)
        w1, w2 = fx.w1.contiguous(), fx.w2.contiguous()
        up, down = [], []
        for e, start, n in zip(layout.experts, layout.starts, layout.padded):
            seg = slice(start, start + n)
            up.append((xs[seg], segment_scales(xs_scale, start, n, kb), w1[e], weight_scales_b(fx.w1_scale[e]), h[seg]))
            down.append((aq[seg], segment_scales(aq_scale, start, n, ib), w2[e], weight_scales_b(fx.w2_scale[e]),
                         y[seg]))
        gather = (fx.x_fp8.contiguous().view(torch.uint8), lay.row_token, xs.view(torch.uint8),
                  fx.x_scale.contiguous().view(-1), x_src, xs_scale)
        row_args = (h, aq, aq_scale, layout.scale_base(ib).to(dev), lay.scale_stride)
        combine = (y, out, lay.slot_row, fx.topk_weights.reshape(-1).float().contiguous(), s.top_k)
        return CublasWorkspace(lay, gather, up, row_args, down, combine, out)

    def prepare(self, fx: Fixture) -> PreparedCall:
        reason = self.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {self.name!r} cannot run here: {reason}")
        refused = self.refuses(fx.spec)
        if refused:
            raise UserError(refused)
        from moebench.kernels.peer.cublas_moe import kernels_module
        km = kernels_module()
        ws = self.workspace(fx)
        gemm = GEMMS[self.gemm]
        x_u8, row_token, xs_u8, x_scale, x_src, xs_scale = ws.gather
        up, down, rows, combine = ws.up, ws.down, ws.rows, ws.combine

        def run() -> None:
            torch.index_select(x_u8, 0, row_token, out=xs_u8)
            torch.index_select(x_scale, 0, x_src, out=xs_scale)
            for args in up:
                gemm(*args)
            km.launch_swiglu_quant(*rows)
            for args in down:
                gemm(*args)
            km.launch_combine(*combine)

        run()  # Triton compilation and cuBLAS's heuristics, untimed
        if fx.device.type == "cuda":
            torch.cuda.synchronize(fx.device)
        experts = len(ws.layout.experts)
        identity = {
            "gemm": "cuBLASLt block-scaled FP8 (VEC128_32F x BLK128x128_32F) via torch aten._scaled_mm_v2"
                    if self.gemm == "cublas" else "exact FP32 emulation of the block-scaled GEMM (tests)",
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "routed_experts": experts, "gemm_launches": 2 * experts, "grouped_rows": ws.layout.rows,
            "segment_align_rows": ALIGN_ROWS,
            "not_the_library": "gather (torch index_select), SwiGLU + requant and combine (Triton) are moebench's",
        }
        return PreparedCall(arm=self.name, run=run, output=ws.out, kernels=kernels_for(experts), identity=identity,
                            oracle="bf16-intermediates", workspace=ws)
