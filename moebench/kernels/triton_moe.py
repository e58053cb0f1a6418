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

Under TRITON_INTERPRET=1 the @triton.jit decorator builds interpreter objects instead of GPU
kernels; it reads the variable when this module is imported, so moebench.kernels.triton_arms
re-imports this module when the mode has changed (see `kernels_module` there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

QUANT_GROUP = 128  # block-scale granularity: 128x128 weight blocks, 1x128 activation groups
FP8_MAX = 448.0  # largest finite e4m3 magnitude
MIN_SCALE = 1e-10  # floor for amax/448, as in moebench.fixtures.quant: an all-zero group stays zero

# ----------------------------------------------------------------------------------------------
# Rounding under the interpreter. Its FP32->bf16 cast truncates and its FP32->FP8 cast also
# loses the carry into the exponent (31.95 becomes 16); the GPU's casts round to nearest even.
# Truncation errors all point one way and add up through five stages (rel. L2 1.9e-2 on T5
# against 4e-3 with rounding), so under the interpreter the kernels round in FP32 arithmetic
# first; a value already on the target grid then converts exactly. On the GPU the flag is
# False and no code is emitted.
# ----------------------------------------------------------------------------------------------


@triton.jit
def _exact_bf16(x, ROUND_IN_FP32: tl.constexpr):
    """x rounded to the bf16 grid, nearest even, still FP32 (ROUND_IN_FP32), or x unchanged."""
    if ROUND_IN_FP32:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)
    return x


@triton.jit
def _exact_e4m3(y, ROUND_IN_FP32: tl.constexpr):
    """y (|y| <= 448) rounded to the e4m3 grid, nearest even, still FP32 (ROUND_IN_FP32), or y.

    Adding and subtracting a magic number whose FP32 spacing equals y's e4m3 spacing makes the
    FP32 adder do the rounding."""
    if ROUND_IN_FP32:
        exponent = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        spacing_exp = tl.maximum(exponent, -6) - 3  # 3 mantissa bits; subnormals are spaced 2^-9
        magic = ((spacing_exp + 23 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
        y = (y + magic) - magic
    return y


# ----------------------------------------------------------------------------------------------
# GEMM over a route plan, shared by GEMM1 and GEMM2.
# ----------------------------------------------------------------------------------------------


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
    ROUND_IN_FP32: tl.constexpr,  # True only under the interpreter, see _exact_bf16
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
    if A_SORTED:
        a_row = offs_plan
    else:
        a_row = slot // A_ROW_DIV
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
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
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
    if C_SORTED:
        c_row = offs_plan
    else:
        c_row = slot
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, _exact_bf16(acc, ROUND_IN_FP32).to(c_ptr.dtype.element_ty),
             mask=slot_mask[:, None] & (offs_cn[None, :] < N))
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
             _exact_bf16(out, ROUND_IN_FP32).to(out_ptr.dtype.element_ty), mask=write[:, None] & col_ok)


@triton.jit
def moebench_moe_act_quant(
    x_ptr, q_ptr, scale_ptr,  # x [rows, D] bf16 -> q [rows, D] e4m3 and scale [rows, D / GROUP] fp32
    sorted_slots_ptr, padded_total_ptr, num_slots,  # the route plan, read when SORTED
    n_rows, stride_x, stride_q, stride_s,
    SORTED: tl.constexpr,  # rows in route-plan order
    ROWS: tl.constexpr, GROUP: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,  # True only under the interpreter, see _exact_e4m3
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
             _exact_e4m3(y, ROUND_IN_FP32).to(q_ptr.dtype.element_ty), mask=write[:, None])
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
    tl.store(out_ptr + token * stride_out + cols, _exact_bf16(acc, ROUND_IN_FP32).to(out_ptr.dtype.element_ty),
             mask=mask)


# True when @triton.jit built interpreter objects (TRITON_INTERPRET=1 when this module was imported).
INTERPRETED = type(moebench_moe_gemm1).__name__ == "InterpretedFunction"

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


def _check_rowmajor(**tensors: torch.Tensor) -> None:
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
    _check_rowmajor(a=a, a_scale=a_scale, w=w, w_scale=w_scale, c=c)
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
    _check_rowmajor(h=h, act=act)
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
    _check_rowmajor(x=x, q=q, scale=scale)
    sorted_slots, padded_total, num_slots = plan if plan is not None else (x, x, S)
    moebench_moe_act_quant[(triton.cdiv(S, ROW_BLOCK), D // QUANT_GROUP)](
        x, q, scale, sorted_slots, padded_total, num_slots, S, x.stride(0), q.stride(0), scale.stride(0),
        SORTED=plan is not None, ROWS=ROW_BLOCK, GROUP=QUANT_GROUP, ROUND_IN_FP32=INTERPRETED, num_warps=4)


def launch_combine(y: torch.Tensor, out: torch.Tensor) -> None:
    M, top_k, K = y.shape
    if out.shape != (M, K):
        raise ValueError(f"out {tuple(out.shape)} must be [M, K] for y {tuple(y.shape)}")
    _check_rowmajor(y=y, out=out)
    block = elementwise_block(K)
    moebench_moe_combine[(M, triton.cdiv(K, block))](y, out, K, y.stride(0), y.stride(1), out.stride(0),
                                                      TOP_K=top_k, BLOCK_SIZE=block,
                                                      ROUND_IN_FP32=INTERPRETED, num_warps=4)
