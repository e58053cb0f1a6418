"""Imports the modules that define built-in arms; each registers itself with `register_arm`.

An arm module that cannot import here (a missing optional library) must still import:
it reports the problem through `Arm.unavailable_reason`, not at import time.
"""
from moebench.kernels import cuda_arms  # noqa: F401
from moebench.kernels import triton_arms  # noqa: F401

from moebench.kernels import fused_arm  # noqa: F401
from moebench.kernels import sglang_arm  # noqa: F401

# The order a run with no --arms times the built-in arms in (the ref first).
DEFAULT_ORDER = ("triton", "sglang", "triton-default", "triton-swapab", "cuda-gemm", "cuda-swapab", "cuda-fused")
