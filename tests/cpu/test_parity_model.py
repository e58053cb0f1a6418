"""The parity check's error model (moebench.fixtures.error_model, moebench.kernels.api.parity.within_model)
on a matrix of geometries: correct kernels computed the ways the arms compute (shuffled sums, FP8
tensor-core accumulation cut to 14 bits, BF16 running sums of per-slot or per-(slot, 128 columns of
I) partials, BF16 rows summed in FP32, FP32 sums of those partials rounded once, the stock path's
BF16 intermediates, requant codes moved
across their rounding midpoint) pass; kernels with a planted fault (tests/helpers/planted_kernels.py) fail.

Geometries: DeepSeek-V3 (K 7168, 257 experts with the shared one, top_k 9, I 128 per rank of 16 and
I 2048 whole, 33 experts: an expert-parallel rank), Qwen3-30B-A3B (K 2048, E 128, top_k 8, I 768),
and odd ones (I 4096, I 384 at K 2560, top_k 3). Large K and I at M = 1 only; M = 8 and 128 on
the smaller ones (two CPU cores).
"""

from __future__ import annotations

import pytest
import torch

from moebench.fixtures.error_model import MODELS, error_model, error_terms
from moebench.fixtures.oracle import moe_reference
from moebench.kernels.api.parity import within_model
from planted_kernels import FAULTS, TENSORS, Geometry, make_inputs, simulate

DS_RANK = Geometry("deepseek-v3-tp16", 7168, 128, 257, 9, True, 2.5)
DS_WHOLE = Geometry("deepseek-v3-ep8", 7168, 2048, 33, 9, True, 2.5)
QWEN30 = Geometry("qwen3-30b-a3b", 2048, 768, 128, 8, False)
ODD_WIDE = Geometry("odd-i4096", 2048, 4096, 6, 2, False)
ODD = Geometry("odd-k2560", 2560, 384, 12, 3, False)
SMALL = Geometry("odd-i128", 2048, 128, 16, 4, True, 2.5)

MATRIX = [(DS_RANK, 1), (DS_WHOLE, 1), (QWEN30, 1), (ODD_WIDE, 1), (ODD, 8), (SMALL, 128)]
IDS = [f"{g.name}-M{m}" for g, m in MATRIX]

# the ways of computing the oracle's function correctly, and the model each declares
CORRECT = {
    "slot sums (cuda-swapab)": ("exact", dict()),
    "slot-group BF16 sums (cuda-fused)": ("bf16-partials", dict(partials="slot-group")),
    "slot-group rows (cuda-fused-det)": ("bf16-partial-rows", dict(partials="slot-group", summed="bf16-rows")),
    "slot-group FP32 sums (cuda-fused, I > 128)": ("fp32-partials", dict(partials="slot-group", summed="fp32")),
    "BF16 intermediates (triton)": ("bf16-intermediates", dict(bf16_intermediates=True)),
}


@pytest.fixture(scope="module", params=MATRIX, ids=IDS)
def case(request):
    geo, M = request.param
    torch.manual_seed(0)
    inp = make_inputs(geo, M, seed=1000 + M)
    return geo, inp, Terms(inp)


class Terms(dict):
    """Each model's error terms for one input set, computed on first use."""

    def __init__(self, inp):
        super().__init__()
        self.inp = {k: inp[k] for k in TENSORS}

    def __missing__(self, model):
        self[model] = error_terms(**self.inp, model=model)
        return self[model]


@pytest.mark.parametrize("way", list(CORRECT))
def test_correct_kernels_pass_on_every_geometry(case, way):
    geo, inp, terms = case
    model, kw = CORRECT[way]
    if geo is DS_WHOLE and model in ("bf16-partial-rows", "bf16-intermediates"):
        pytest.skip("the whole-expert geometry with the arms of issue 52's table only (CPU time)")
    check = within_model(simulate(inp, seed=3, shared=geo.shared, **kw), terms[model])
    assert check.passed and check.excess < 0.5, f"{way} on {geo.name}: {check}"


def test_requant_codes_flipped_at_their_boundaries_pass(case):
    geo, inp, terms = case
    check = within_model(simulate(inp, flips=2, shared=geo.shared), terms["exact"])
    assert check.passed, f"two flips a slot on {geo.name}: {check}"


@pytest.mark.parametrize("fault", list(FAULTS))
def test_planted_faults_fail_on_every_geometry(case, fault):
    geo, inp, terms = case
    if fault == "missing_shared_expert" and not geo.shared:
        pytest.skip("no shared expert in this geometry")
    # judged against the fused arm's model, the one with the most BF16 adds (the widest allowance
    # of the FP32-intermediate models), computed the fused way
    check = within_model(simulate(inp, partials="slot-group", fault=fault, shared=geo.shared),
                         terms["bf16-partials"])
    assert not check.passed, f"{fault} on {geo.name} passed: {check}"


@pytest.mark.parametrize("fault", ["drop_expert", "wrong_route_weight", "missing_shared_expert"])
def test_the_stock_model_still_fails_a_dropped_or_misweighted_expert(case, fault):
    geo, inp, terms = case
    if fault == "missing_shared_expert" and not geo.shared:
        pytest.skip("no shared expert in this geometry")
    if geo is DS_WHOLE or geo is ODD_WIDE:
        pytest.skip("the stock model's faults on the smaller geometries (CPU time)")
    check = within_model(simulate(inp, bf16_intermediates=True, fault=fault, shared=geo.shared),
                         terms["bf16-intermediates"])
    assert not check.passed, f"{fault} on {geo.name} passed the stock model: {check}"


def test_the_model_value_is_the_oracle():
    inp = make_inputs(ODD, 4, seed=5)
    args = [inp[k] for k in TENSORS]
    for name in ("exact", "bf16-intermediates"):
        terms = error_terms(**inp, model=name)
        assert torch.equal(terms.value.to(torch.bfloat16), moe_reference(*args, rounding=name))


def test_more_bf16_adds_widen_the_allowance_and_fp32_sums_narrow_it():
    inp = make_inputs(ODD, 1, seed=7)
    names = ("exact", "bf16-partials", "bf16-partial-rows", "fp32-partials")
    terms = {m: error_terms(**inp, model=m) for m in names}
    var = {m: float(t.variance.sum() - t.flip_variance.sum()) for m, t in terms.items()}
    # 9 running BF16 adds against 3; rows round each partial once, not each partial sum
    assert var["bf16-partials"] > 2 * var["exact"] and var["bf16-partials"] > 2 * var["bf16-partial-rows"]
    # FP32 sums of the 9 partials round once: below the 3 BF16 adds of the slot sums and below the rows
    assert var["fp32-partials"] < var["exact"] and var["fp32-partials"] < var["bf16-partial-rows"]
    for m in names:  # the value and the flips do not depend on how the partials are summed
        assert torch.equal(terms[m].value, terms["exact"].value) and torch.equal(terms[m].flip_variance,
                                                                                 terms["exact"].flip_variance)


def test_the_rounding_variance_of_each_way_of_summing():
    # one element: sum S = 3 of top_k 9 slots (their squares 5) cut into 16 groups of I (squares 2)
    from moebench.fixtures.error_model import U_BF16, U_GEMM, _rounding_variance
    S, q_slot, q_group = (torch.tensor([[v]]) for v in (3.0, 5.0, 2.0))
    n_slot = torch.tensor([9.0])
    u2, gemm = U_BF16 ** 2 / 3, U_GEMM ** 2 * 2.0

    def var(model):
        return float(_rounding_variance(error_model(model), S, q_slot, q_group, n_slot, 16 * 128))
    # FP32 sums: the last rounding alone (the FP32 running sum's own is 2^-32 of it)
    assert var("fp32-partials") == pytest.approx(u2 * 9.0 + gemm, rel=1e-6)
    # BF16 running sums over 9 slots, or over 9 x 16 (slot, group) partials; BF16 rows summed in FP32
    assert var("exact") == pytest.approx(u2 * 10 * (2 * 9.0 + 5.0) / 6 + gemm, rel=1e-6)
    assert var("bf16-partials") == pytest.approx(u2 * 145 * (2 * 9.0 + 2.0) / 6 + gemm, rel=1e-6)
    assert var("bf16-partial-rows") == pytest.approx(u2 * (2.0 + 9.0) + gemm, rel=1e-6)


def test_unknown_models_are_named():
    with pytest.raises(ValueError, match="unknown oracle 'fp16'.*exact"):
        error_model("fp16")
    assert set(MODELS) >= {"exact", "bf16-intermediates", "bf16-partials", "bf16-partial-rows", "fp32-partials"}


# ---- through check_parity, as `run` and `verify` judge an arm


def _call(fx, out, oracle="exact"):
    from moebench.kernels.api.arm import KernelDecl, PreparedCall
    buf = torch.empty_like(out)
    return PreparedCall("planted", lambda: buf.copy_(out), buf, (KernelDecl("k", "k", 1),), oracle=oracle)


def test_check_parity_judges_by_the_declared_model_and_names_the_place(registry):
    from moebench.fixtures import build_fixture, fixture_reference
    from moebench.kernels.api.parity import References, check_parity
    fx = build_fixture(registry.resolve("T8"))
    refs = References(fx)
    good = check_parity(_call(fx, fixture_reference(fx)), refs, "T8")
    assert good.passed and good.model_excess < 0.1 and good.expected_rel_l2 > 0 and good.reason() == "ok"
    wrong = fixture_reference(fx).clone()
    wrong[3, 128:256] = 0  # one token's columns never written (zeroed, not NaN)
    bad = check_parity(_call(fx, wrong), refs, "T8")
    assert not bad.passed and "token 3, columns 128+" in bad.reason() and "error model" in bad.reason()
    fixed = check_parity(_call(fx, wrong), refs, "T8", threshold=1.0)  # a fixed limit, asked for
    assert fixed.passed and fixed.model_excess is None
    with pytest.raises(Exception, match="unknown oracle 'fp16'"):
        check_parity(_call(fx, wrong, oracle="fp16"), refs, "T8")
