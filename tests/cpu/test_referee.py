"""The stock arm against its referee: overlap-aware busy time, per-kernel medians, the 3% check,
and the `sglang` arm's loader (on a stand-in package: the real engine is an optional extra)."""

from __future__ import annotations

import io
import sys
import textwrap

import pytest
import torch

from moebench.views.formats import FORMATS
from moebench.record.schema import KernelRecord, Sample
from moebench.analysis.stats import kernel_summaries, referee_checks
from moebench.timing.audit import kernel_labels
from result_factory import make_result


def test_busy_time_is_the_union_of_the_kernels_intervals():
    # A PDL-launched kernel starts inside its predecessor: sum counts the 20 ns twice.
    s = Sample("A8", "triton", 1, 0, 7, kernels=(KernelRecord("a", 0, 100), KernelRecord("b", 80, 200),
                                                  KernelRecord("c", 250, 300), KernelRecord("d", 260, 280)))
    assert s.gpu_sum_ns == 100 + 120 + 50 + 20
    assert s.gpu_busy_ns == 200 + 50
    assert s.gpu_span_ns == 300
    assert s.value_ns == s.gpu_busy_ns
    plain = Sample("A8", "triton", 1, 0, 7, kernels=(KernelRecord("a", 0, 100), KernelRecord("b", 150, 200)))
    assert plain.gpu_busy_ns == plain.gpu_sum_ns == 150


def test_kernel_labels_follow_the_declaration_order_like_the_audit():
    from moebench.record.schema import DeclaredKernel
    decl = (DeclaredKernel("gemm1", "^fused_moe_kernel$", 1), DeclaredKernel("act", "^act$", 1),
            DeclaredKernel("gemm2", "^fused_moe_kernel$", 1))
    assert kernel_labels(["fused_moe_kernel", "act", "fused_moe_kernel"], decl) == ["gemm1", "act", "gemm2"]
    assert kernel_labels(["fused_moe_kernel", "other"], decl) == ["gemm1", None]


def test_a_faithful_stock_arm_passes_and_a_slow_one_does_not():
    same = referee_checks(make_result(arms=("triton", "sglang"), seed=3))
    assert [c.shape for c in same] == ["A8", "A128"] and all(c.passed for c in same)
    assert set(same[0].kernel_ratios) == {"gemm1", "swiglu", "requant", "gemm2", "combine"}
    slow = referee_checks(make_result(arms=("triton", "sglang"), seed=3, scale={("A128", "triton"): 1.05}))
    assert slow[0].passed and not slow[1].passed
    assert slow[1].call_ratio == pytest.approx(1.05, abs=0.01)
    assert slow[1].kernel_ratios["gemm1"] == pytest.approx(1.05, abs=0.01)
    assert referee_checks(make_result(arms=("triton", "cuda-fused"))) == ()


def test_kernel_summaries_are_medians_of_round_medians():
    result = make_result(arms=("triton", "sglang"), rounds=3, samples=5, seed=1)
    ks = {(k.shape, k.arm, k.label): k for k in kernel_summaries(result)}
    k = ks[("A8", "triton", "gemm2")]
    assert len(k.rows_ns) == 3 and min(k.rows_ns) <= k.median_ns <= max(k.rows_ns)
    summary = next(s for s in result.summaries if (s.shape, s.arm) == ("A8", "triton"))
    assert 0.3 * summary.median_ns < k.median_ns < 0.45 * summary.median_ns  # its 38% share


def test_kernels_format_prints_the_referee_table():
    out = io.StringIO()
    FORMATS["kernels"](make_result(arms=("triton", "sglang"), seed=2), out, ())
    text = out.getvalue()
    assert "per-kernel durations" in text and "stock arm vs its referee" in text and "within" in text
    md = FORMATS["markdown"].__call__
    buf = io.StringIO()
    md(make_result(arms=("triton", "sglang"), seed=2), buf, ())
    assert "Stock arm against its referee" in buf.getvalue()


# ---- the sglang arm's loader ---------------------------------------------------------------------

KERNELS_SRC = '''
from sglang.kernels.jit.utils import is_arch_support_pdl
from sglang.kernels.ops.quantization.fp8_kernel import per_token_group_quant_fp8, scaled_fp8_quant
from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
from sglang.srt.environ import envs
from sglang.srt.layers.moe.utils import get_moe_padding_size
from sglang.srt.utils import cpu_has_amx_support, is_cpu, is_cuda, is_hip, is_sm90_supported
padding_size = get_moe_padding_size(envs.SGLANG_USE_AITER.get())
def support_tensor_descriptor():
    return True
def should_enable_swap_ab(bm, bn):
    return is_sm90_supported() and bm < 64 and bn >= 64
'''
CONFIG_SRC = '''
from sglang.srt.runtime_context import get_exec
from sglang.srt.utils import get_device_name, is_hip
def try_get_optimal_moe_config(*args, **kwargs):
    from sglang.srt.layers.moe.moe_runner.triton_utils import get_config
    assert get_config() is None and not get_exec().deterministic.enable_deterministic_inference
    return {"BLOCK_SIZE_M": 16}, (None, None)
'''


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """An installed `sglang` 9.9.9 whose package does not import whole (as without its deps)."""
    from moebench.kernels.stock import sglang_arm
    site = tmp_path / "site"
    files = {
        "sglang/__init__.py": "raise ImportError('the whole engine needs orjson')\n",
        "sglang/kernels/ops/moe/fused_moe_triton_kernels.py": KERNELS_SRC,
        "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py": CONFIG_SRC,
        "sglang-9.9.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n",
    }
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sglang_arm, "_ENGINE", None)
    yield sglang_arm
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        sys.modules.pop(name)


def test_the_engines_modules_load_with_stand_ins_when_it_does_not_import_whole(fake_sglang):
    engine = fake_sglang.load_engine()
    ident = engine.identity
    assert ident["engine"] == "sglang 9.9.9" and ident["engine_import"].startswith("kernel and config modules")
    assert ident["stand_ins"]["sglang.srt.utils"] == sorted(
        ["cpu_has_amx_support", "is_cpu", "is_cuda", "is_hip", "is_sm90_supported", "get_device_name"])
    assert not any(n.startswith("sglang.srt") for n in sys.modules)  # nothing left behind
    assert engine.kernels.padding_size == 0
    with engine.resolving():  # the config lookup's lazy import finds its stand-in
        assert engine.configs.try_get_optimal_moe_config() == ({"BLOCK_SIZE_M": 16}, (None, None))
    engine.set_pdl(False)
    assert engine.kernels.is_arch_support_pdl() is False
    engine.set_pdl(True)
    assert engine.kernels.is_arch_support_pdl() is (torch.cuda.is_available()
                                                    and torch.cuda.get_device_capability()[0] >= 9)


def test_sglang_arm_says_why_it_cannot_run(fake_sglang, monkeypatch):
    from moebench.kernels.registry import make_arm
    arm = make_arm("sglang")
    if not torch.cuda.is_available():
        assert arm.unavailable_reason(torch.device("cpu")) == "the engine's kernels run on a CUDA device only"
    monkeypatch.setattr(fake_sglang, "sglang_version", lambda: None)
    assert arm.unavailable_reason(torch.device("cpu")) == "SGLang is not installed (pip install 'moebench[sglang]')"


def test_doctor_reports_the_stock_tables_and_the_referee_without_failing_on_them():
    from result_factory import run_cli
    code, out, _ = run_cli(["doctor"])
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln.split()[1:2] in (["stock"], ["referee:"])}
    assert "sglang 0.5.23 tables for" in lines["stock"]
    assert lines["referee:"].startswith(("OK", "WARN"))
    if not torch.cuda.is_available():
        assert "none: the engines' default config" in lines["stock"]
        assert code == 1  # no GPU is a failure of the required checks, not of these two
