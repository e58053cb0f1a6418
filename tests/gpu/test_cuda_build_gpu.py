"""The GPU tests of test_cuda_build (the CPU ones stay there)."""

from __future__ import annotations

import pytest

from moebench.kernels.cuda import nvrtc as cuda_build
from moebench.kernels.cuda.nvrtc import compile_source

cuda_core = pytest.importorskip("cuda.core")
TINY = r'''
#include "sm90_common.cuh"
extern "C" __global__ void tiny(float* out) {
#ifdef SCALE
  out[threadIdx.x] = SCALE * threadIdx.x;
#else
  out[threadIdx.x] = threadIdx.x;
#endif
}
'''


def _without_log_resources(m):
    """The module as NVRTC 13.0 on the H200 machine left some builds: no ptxas log, no resources."""
    from dataclasses import replace
    return cuda_build.CudaModule(replace(m.build, resources={}), m.cubin, m.symbol_mapping, "")


@pytest.mark.gpu
def test_driver_resources_match_ptxas():
    m = compile_source(TINY)
    r = _without_log_resources(m).resources("tiny")
    assert r.source == "driver" and r.registers == m.resources("tiny").registers and r.stack_bytes == 0
