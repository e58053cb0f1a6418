"""Rounding helpers of the Triton MoE kernels, for the interpreter's casts.

Under TRITON_INTERPRET=1 its FP32->bf16 cast truncates and its FP32->FP8 cast also loses the
carry into the exponent (31.95 becomes 16); the GPU's casts round to nearest even.
Truncation errors all point one way and add up through five stages (rel. L2 1.9e-2 on T5
against 4e-3 with rounding), so under the interpreter the kernels round in FP32 arithmetic
first; a value already on the target grid then converts exactly. On the GPU the flag is
False and no code is emitted.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def exact_bf16(x, ROUND_IN_FP32: tl.constexpr):
    """x rounded to the bf16 grid, nearest even, still FP32 (ROUND_IN_FP32), or x unchanged."""
    if ROUND_IN_FP32:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)
    return x


@triton.jit
def exact_e4m3(y, ROUND_IN_FP32: tl.constexpr):
    """y (|y| <= 448) rounded to the e4m3 grid, nearest even, still FP32 (ROUND_IN_FP32), or y.

    Adding and subtracting a magic number whose FP32 spacing equals y's e4m3 spacing makes the
    FP32 adder do the rounding."""
    if ROUND_IN_FP32:
        exponent = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        spacing_exp = tl.maximum(exponent, -6) - 3  # 3 mantissa bits; subnormals are spaced 2^-9
        magic = ((spacing_exp + 23 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
        y = (y + magic) - magic
    return y


# True when @triton.jit built interpreter objects (TRITON_INTERPRET=1 when this module was imported).
INTERPRETED = type(exact_bf16).__name__ == "InterpretedFunction"
