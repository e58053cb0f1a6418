"""CPU tests of cuda-fused's FP32 sums (the decode kernel's FP32_SUM build): the rule that takes
them (I > 128), the `sums` option and its one-line refusals, the counters the host allocates
against the kernel's, and the SASS of the build: FP32 vector reductions, no BF16 ones, the output
stored once after the CTAs' count, nothing in local memory. Parity on the GPU:
tests/gpu/test_fused_fp32_gpu.py."""

from __future__ import annotations

import re

import pytest

from moebench.errors import UserError
from moebench.kernels.cuda import fused_arm
from moebench.kernels.cuda.fused_policy import kernel_defines, summing_mode, sums_in_fp32
from moebench.kernels.cuda.source import KernelSource

from test_fused_host import _cuobjdump, _fused_sass, cache  # noqa: F401 - the compile cache fixture


def test_fp32_sums_where_an_element_takes_more_than_top_k_partials():
    # I = 128: one group an expert, top_k BF16 adds as cuda-swapab's; from 256 they multiply
    assert not sums_in_fp32(128)
    assert all(sums_in_fp32(i) for i in (256, 384, 768, 2048, 4096))
    text = fused_arm.shipped_source().text
    rule = {I: summing_mode(None, I, text, "x.cu", False, True) for I in (128, 768, 2048)}
    assert rule == {128: "bf16", 768: "fp32", 2048: "fp32"}
    # a launch adding into a given output keeps BF16 reductions; the deterministic build has its combine
    assert summing_mode(None, 2048, text, "x.cu", False, False) == "bf16"
    assert summing_mode(None, 2048, text, "x.cu", True, True) is None
    # forced either way, at any I
    assert summing_mode("fp32", 128, text, "x.cu", False, True) == "fp32"
    assert summing_mode("bf16", 2048, text, "x.cu", False, True) == "bf16"


def test_a_source_without_fp32_sums_keeps_bf16_and_refuses_them_forced():
    shipped = fused_arm.shipped_source()
    assert fused_arm.can_sum_fp32(shipped.text)
    old = KernelSource.from_text(shipped.text.replace("#ifndef FP32_SUM", "#ifndef NOT_HERE"), "old_fused.cu")
    assert not fused_arm.can_sum_fp32(old.text)
    assert summing_mode(None, 2048, old.text, "old_fused.cu", False, True) == "bf16"
    with pytest.raises(UserError, match="^old_fused.cu: no FP32_SUM meta-parameter"):
        summing_mode("fp32", 2048, old.text, "old_fused.cu", False, True)


def test_the_sums_option_is_checked_in_one_line():
    with pytest.raises(UserError, match="^cuda-fused: sums='fp16' must be one of fp32, bf16$"):
        fused_arm.CudaFusedArm(sums="fp16")
    with pytest.raises(UserError, match="^cuda-fused-det: sums=fp32 does not apply"):
        fused_arm.CudaFusedDetArm(sums="fp32")
    with pytest.raises(UserError, match="^cuda-fused: sums=fp32 needs a call that writes its output"):
        summing_mode("fp32", 2048, fused_arm.shipped_source().text, "x.cu", False, False)
    arm = fused_arm.CudaFusedArm(sums="bf16")  # an option of the decode kernel: it picks that path
    assert arm.path == "decode" and arm.sums == "bf16"
    with pytest.raises(UserError, match="sums set the decode kernel"):
        fused_arm.CudaFusedArm(sums="fp32", chunk=2)


def test_the_host_counters_are_the_kernels():
    text = fused_arm.shipped_source().text
    assert re.search(r"constexpr int ZERO_COUNT = 2 \+ 256;", text)
    assert re.search(r"constexpr int DONE_COUNT = ZERO_COUNT \+ 1;", text)
    assert re.search(rf"constexpr int ZERO_SPAN = {fused_arm.ZERO_SPAN};", text)
    assert (fused_arm.ZERO_COUNT, fused_arm.DONE_COUNT, fused_arm.WORK_INTS) == (258, 259, 260)


def test_kernel_defines_name_fp32_sums_only_where_chosen():
    assert "FP32_SUM" not in kernel_defines(8, 3, 3, 4)
    assert kernel_defines(8, 3, 3, 4, zero_out=True, fp32_sum=True) == {
        "BLOCK_M": "8", "STAGES": "3", "MIN_CTAS_PER_SM": "3", "CLUSTER": "4", "ZERO_OUT": "1", "FP32_SUM": "1"}


@pytest.mark.parametrize("zero_out", [True, False])
def test_only_the_fp32_build_sums_in_fp32_and_stores_the_output_once(cache, tmp_path, zero_out):  # noqa: F811
    # FP32_SUM: 16-byte FP32 reductions in the epilogue (no BF16 ones), the producer's wait on the
    # consumers (named barrier 2) and on the count, the stores of the output; the same build without
    # it has none of them
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    plain = _fused_sass(tool, tmp_path, kernel_defines(8, 3, 3, 4, zero_out=zero_out))
    fp32 = _fused_sass(tool, tmp_path, kernel_defines(8, 3, 3, 4, zero_out=zero_out, fp32_sum=True))
    assert "REDG.E.ADD.F32x4" in fp32 and "REDG.E.ADD.BF16x8" not in fp32
    assert "REDG.E.ADD.BF16x8" in plain and "REDG.E.ADD.F32x4" not in plain
    assert "BAR.ARV 0x2" in fp32 and "BAR.SYNC.DEFER_BLOCKING 0x2" in fp32
    assert fp32.count("NANOSLEEP") > plain.count("NANOSLEEP")
    assert fp32.count("STG.E.128") > plain.count("STG.E.128")  # the output's 16-byte stores
    # one release a CTA more (the count), no sequentially consistent fence
    assert fp32.count("MEMBAR.ALL.GPU") <= plain.count("MEMBAR.ALL.GPU") + 1 and "MEMBAR.SC" not in fp32
    # behind the zeroing kernel it still waits for it (ACQBULK); with ZERO_OUT for nothing
    assert ("ACQBULK" in fp32) == (not zero_out)
    for sass in (plain, fp32):
        assert "CALL" not in sass and not re.search(r"\b(LDL|STL)\b", sass)



def test_fp32_sums_launch_block_m_16_at_two_ctas_an_sm():
    # (its consumers spill at three under nvcc 13.0); BLOCK_M 8, the decode path's own, keeps three
    assert fused_arm.build_occupancies(16, 4, fp32=True) == (2,) and fused_arm.build_occupancies(16, 4) == (2, 3)
    assert fused_arm.build_occupancies(8, 4, fp32=True) == (2, 3) == fused_arm.build_occupancies(8, 8, fp32=True)
    assert fused_arm.build_occupancies(32, 4, fp32=True) == (1,)
    with pytest.raises(UserError, match="^cuda-fused: per_sm=3 at block_m=16: at most 2 CTAs an SM$"):
        fused_arm.launch_options(16, 2048, 0, 4, per_sm=3, fp32=True)
