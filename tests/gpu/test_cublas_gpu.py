"""The `cublas` peer arm on a Hopper GPU: torch's block-wise scaled_mm accepts the arm's scale
layouts and computes what their exact emulation computes (segments at an offset inside a larger
buffer included), the arm passes its oracle check at A8, A128, Q8 and Q128, and one call
launches exactly the kernels it declares."""

from __future__ import annotations

import pytest
import torch

from moebench.kernels.peer.cublas_arm import CublasArm, cublas_gemm, emulated_gemm, weight_scales_b
from moebench.kernels.peer.cublas_layout import segment_scales
from moebench.kernels.api.parity import References, check_parity
from moebench.timing.audit import kernel_mismatch

from gpu_fixtures import cuda_fixture

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled_triton")]


@pytest.fixture(scope="module", autouse=True)
def served():
    reason = CublasArm().unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


# (rows, K, N): GEMM1 of A and Q (K/128 = 56, 16), GEMM2 of both (K = I = 128: scale_b padded 1 -> 4),
# a K/128 of 3 (padded to 4) and a 48-row segment
GEMMS = [(16, 7168, 256), (32, 2048, 256), (16, 128, 7168), (16, 128, 2048), (48, 384, 256)]


@pytest.mark.parametrize("rows,k,n", GEMMS)
def test_scale_layout_is_accepted_and_exact(rows, k, n):
    g = torch.Generator().manual_seed(rows + k + n)
    start, total, kb = 16, 16 + rows + 16, k // 128  # a segment inside a larger buffer, as the arm slices it
    a = ((torch.rand(total, k, generator=g) * 8 - 4).to(torch.float8_e4m3fn)).cuda()
    flat = (torch.rand(total * kb, generator=g) + 0.5).cuda()
    w = ((torch.rand(n, k, generator=g) * 8 - 4).to(torch.float8_e4m3fn)).cuda()
    w_scale = weight_scales_b((torch.rand(n // 128, kb, generator=g) + 0.5).cuda())
    seg = slice(start, start + rows)
    a_scale = segment_scales(flat, start, rows, kb)
    got = torch.empty(total, n, dtype=torch.bfloat16, device="cuda")
    want = torch.empty(rows, n, dtype=torch.float32, device="cuda")
    cublas_gemm(a[seg], a_scale, w, w_scale, got[seg])
    emulated_gemm(a[seg], a_scale, w, w_scale, want)
    rel = float((got[seg].float() - want).norm() / want.norm())
    assert rel < 4e-3, f"cuBLAS vs emulation rel L2 {rel:.2e}"  # BF16 output: ~2^-9 relative


@pytest.mark.parametrize("shape", ["A8", "A128", "Q8", "Q128"])
def test_parity_with_the_oracle(shape):
    fx = cuda_fixture(shape)
    call = CublasArm().prepare(fx)
    parity = check_parity(call, References(fx), shape)
    assert parity.passed and parity.nonfinite == 0, parity
    assert parity.model_excess < 1.0


@pytest.mark.parametrize("shape", ["A8", "Q8"])
def test_one_call_launches_the_declared_kernels(shape):
    fx = cuda_fixture(shape)
    call = CublasArm().prepare(fx)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call.run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
             and not e.name.startswith(("Memcpy", "Memset"))]
    assert kernel_mismatch(names, call.kernels) is None, (kernel_mismatch(names, call.kernels), sorted(set(names)))
