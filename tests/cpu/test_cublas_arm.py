"""The `cublas` peer arm on the CPU: its grouped layout, the scale layouts torch's block-wise
scaled_mm asks for, and the whole path with the cuBLAS GEMM replaced by its exact emulation
(dequantize, one FP32 matmul), against the oracle on T shapes and the edge cases (M=1, one
expert set, empty experts, M=67: not a multiple of the 16-row segments); a planted layout fault
fails. The real GEMMs are tests/gpu/test_cublas_gpu.py's."""

from __future__ import annotations

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import Family, ShapeSpec, build_fixture, derive
from moebench.kernels.peer import cublas_arm
from moebench.kernels.peer import cublas_layout
from moebench.kernels.peer.cublas_arm import CublasArm, check_operands, emulated_gemm, kernels_for, weight_scales_b
from moebench.kernels.peer.cublas_layout import ALIGN_ROWS, grouped_rows, segment_scales
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.registry import load_builtin_arms, make_arm
from moebench.kernels.verify import edge_cases

pytestmark = pytest.mark.usefixtures("interpreted_triton")


@pytest.fixture(scope="module")
def t8(registry):
    return build_fixture(registry.resolve("T8"))


def test_grouped_rows_sorts_slots_into_padded_segments():
    ids = torch.tensor([[3, 0], [3, 5], [0, 3]])  # expert 3 three slots, 0 two, 5 one; 1, 2, 4 empty
    layout = grouped_rows(ids, 8)
    assert layout.experts == (0, 3, 5) and layout.counts == (2, 3, 1)
    assert layout.padded == (16, 16, 16) and layout.starts == (0, 16, 32) and layout.rows == 48
    flat = ids.reshape(-1)
    for slot, row in enumerate(layout.slot_row.tolist()):
        seg = layout.experts.index(int(flat[slot]))
        assert layout.starts[seg] <= row < layout.starts[seg] + layout.counts[seg]
        assert int(layout.row_token[row]) == slot // 2
    assert sorted(layout.slot_row.tolist()) == [0, 1, 16, 17, 18, 32]  # slot order kept inside a segment
    assert layout.slot_row[[0, 2, 5]].tolist() == [16, 17, 18]  # expert 3: slots 0, 2, 5 in order


def test_segments_start_aligned_at_every_count():
    counts = [1, 15, 16, 17, 33]
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)]).reshape(-1, 1)
    layout = grouped_rows(ids, len(counts))
    assert layout.padded == (16, 16, 16, 32, 48)
    assert all(s % ALIGN_ROWS == 0 for s in layout.starts)


def test_scale_layout_is_what_torch_asks_for():
    ids = torch.tensor([[1], [1], [0]])
    layout = grouped_rows(ids, 2)
    groups = 3
    x_scale = torch.arange(3 * groups, dtype=torch.float32).reshape(3, groups) + 1
    flat = x_scale.reshape(-1)[layout.scale_src(groups)]
    for start, n, e in zip(layout.starts, layout.padded, layout.experts):
        view = segment_scales(flat, start, n, groups)
        assert view.shape == (n, groups) and view.stride() == (1, n)  # outer-dim-major
        assert torch.equal(view, x_scale[layout.row_token[start:start + n]])
    base, stride = layout.scale_base(groups), layout.scale_stride
    for r in range(layout.rows):
        for g in range(groups):
            assert flat[base[r] + g * stride[r]] == x_scale[layout.row_token[r], g]


@pytest.mark.parametrize("kb,l4", [(56, 56), (16, 16), (1, 4), (10, 12)])
def test_weight_scales_are_padded_to_four_and_transposed(kb, l4):
    scales = torch.rand(3, kb) + 0.5
    b = weight_scales_b(scales)
    assert b.shape == (l4, 3) and b.stride() == (1, l4)
    assert torch.equal(b[:kb].t(), scales) and not b[kb:].any()


def _operands(m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(m, k, generator=g) * 8 - 4).to(torch.float8_e4m3fn)
    w = (torch.rand(n, k, generator=g) * 8 - 4).to(torch.float8_e4m3fn)
    a_scale = (torch.rand(k // 128, m, generator=g) + 0.5).t()  # [m, K/128], strides (1, m)
    w_scale = torch.rand(n // 128, k // 128, generator=g) + 0.5
    return a, a_scale, w, w_scale


@pytest.mark.parametrize("m,k,n", [(16, 256, 256), (32, 128, 384), (1, 384, 128)])
def test_emulated_gemm_is_the_block_scaled_product(m, k, n):
    a, a_scale, w, w_scale = _operands(m, k, n)
    out = torch.empty(m, n, dtype=torch.float32)
    emulated_gemm(a, a_scale, w, weight_scales_b(w_scale), out)
    want = torch.zeros(m, n)
    for i in range(m):  # element by element of the definition: sum over k blocks of scale products
        for kb in range(k // 128):
            ks = slice(kb * 128, kb * 128 + 128)
            part = a[i, ks].float() @ w[:, ks].float().t()
            want[i] += part * a_scale[i, kb] * w_scale[:, kb].repeat_interleave(128)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_plain_layouts_are_refused_as_torch_refuses_them():
    a, a_scale, w, w_scale = _operands(16, 256, 256)
    out = torch.empty(16, 256)
    with pytest.raises(ValueError, match="scale_a must be"):
        check_operands(a, a_scale.contiguous(), w, weight_scales_b(w_scale), out)  # row-major scale_a
    with pytest.raises(ValueError, match="scale_b must be"):
        check_operands(a, a_scale, w, w_scale, out)  # the weight's own [N/128, K/128] layout
    a1, s1, w1, ws1 = _operands(16, 128, 256)
    with pytest.raises(ValueError, match="scale_b must be"):
        check_operands(a1, s1, w1, ws1.t(), torch.empty(16, 256))  # K/128 = 1 not padded to 4
    check_operands(a1, s1, w1, weight_scales_b(ws1), torch.empty(16, 256))


@pytest.mark.parametrize("case", ["fresh", "M=1", "one expert set", "empty experts", "M=67"])
def test_emulated_path_matches_the_oracle(t8, case):
    fx = derive(t8, 7) if case == "fresh" else {c.label: c.fixture for c in edge_cases(t8, 11)}[case]
    call = CublasArm(gemm="emulated").prepare(fx)
    parity = check_parity(call, References(fx), case)
    assert parity.passed and parity.nonfinite == 0, parity
    assert parity.model_excess < 0.5  # a correct kernel sits well inside its model
    assert call.oracle == "bf16-intermediates"
    layout = call.workspace.layout
    assert call.kernels == kernels_for(len(layout.experts))
    assert call.identity["gemm_launches"] == 2 * len(set(fx.topk_ids.reshape(-1).tolist()))


def test_one_hot_expert_and_odd_m(t8):
    fx = derive(t8, 21, topk_ids=torch.tensor([[5, 2]] * 3))  # M=3: every token on experts 5 and 2
    call = CublasArm(gemm="emulated").prepare(fx)
    assert call.workspace.layout.experts == (2, 5) and call.workspace.layout.rows == 32
    assert check_parity(call, References(fx), "hot").passed


def test_a_scale_layout_fault_fails_parity(t8, monkeypatch):
    """Scales read with the rows' order reversed inside a segment (a plain [rows, G] layout taken
    for the outer-major one would do the like): the oracle check must catch it."""
    fx = derive(t8, 5, M=12)
    real = cublas_layout.GroupedRows.scale_src

    def shuffled(self, groups):
        src = real(self, groups)
        return src.roll(1)

    monkeypatch.setattr(cublas_layout.GroupedRows, "scale_src", shuffled)
    parity = check_parity(CublasArm(gemm="emulated").prepare(fx), References(fx), "fault")
    assert not parity.passed


def test_unavailable_and_refused_in_one_line():
    arm = make_arm("cublas")
    why = arm.unavailable_reason(torch.device("cpu"))
    assert why and "\n" not in why and "CUDA" in why
    with pytest.raises(UserError, match="cannot run here"):
        arm.prepare(build_fixture(ShapeSpec("T1", Family("T", "t", 256, 8, 2, 256, 1.0, False), 1, 1)))
    odd = ShapeSpec("X1", Family("X", "odd", 320, 8, 2, 256, 1.0, False), 1, 1)
    line = arm.refuses(odd)
    assert line and "\n" not in line and "320" in line and "128" in line
    assert arm.refuses(ShapeSpec("T1", Family("T", "t", 256, 8, 2, 256, 1.0, False), 1, 1)) is None
    assert "cublas" in load_builtin_arms()
    with pytest.raises(UserError, match="unknown gemm"):
        CublasArm(gemm="nope")


def test_missing_blockwise_torch_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    line = cublas_arm.blockwise_missing()
    assert line and "12.9" in line and "\n" not in line
