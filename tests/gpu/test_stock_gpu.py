"""The stock arm on the GPU against the engine: its resolution equals the engine's own at the
eight reference shapes, it and the `sglang` referee pass the oracle there with PDL on and off,
and a PDL run is audited clean (the flush fenced off, overlapping kernels one sample)."""

from __future__ import annotations

import pytest
import torch

from moebench.fixtures import build_fixture, derive
from moebench.kernels.registry import make_arm
from moebench.kernels.api.parity import References, check_parity

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled_triton")]

SHAPES = ["A1", "A8", "A128", "A512", "Q1", "Q8", "Q128", "Q4096"]
MODEL_BOUND = 1e-2
ORACLE_BOUND = 5e-2


def _engine():
    from moebench.kernels.stock.sglang_arm import load_engine, sglang_version
    if sglang_version() is None:
        pytest.skip("SGLang is not installed")
    return load_engine()


@pytest.fixture(scope="module")
def fixtures(registry):
    built = {}

    def get(name):
        if name not in built:
            built.clear()  # one at a time: the A family's weights are 1.9 GB on the GPU
            built[name] = build_fixture(registry.resolve(name)).to("cuda")
        return built[name]
    return get


@pytest.mark.parametrize("shape", SHAPES)
def test_triton_resolves_what_the_engine_resolves(fixtures, registry, shape):
    engine = _engine()
    spec = registry.resolve(shape)
    w1_shape, w2_shape = (spec.E, spec.N, spec.K), (spec.E, spec.K, spec.N // 2)
    with engine.resolving():
        config, (down, _) = engine.configs.try_get_optimal_moe_config(
            w1_shape, w2_shape, spec.top_k, "fp8_w8a8", spec.M, block_shape=[128, 128], return_down_config=True)
    config, down = dict(config), dict(down) if down is not None else None
    tma_ok = engine.kernels.support_tensor_descriptor()
    up_tma, down_tma = tma_ok and config.pop("USE_TMA", False), bool(down) and tma_ok and down.pop("USE_TMA", False)
    down = down or config
    plan = make_arm("triton").plan(fixtures(shape))
    ours = {k: v for k, v in plan.up.config.as_dict().items() if k != "USE_TMA"}
    ours_down = {k: v for k, v in plan.down.config.as_dict().items() if k != "USE_TMA"}
    assert ours == config and ours_down == down
    assert (plan.up.tma, plan.down.tma) == (bool(up_tma), bool(down_tma))
    for launch, c in ((plan.up, config), (plan.down, down)):
        assert launch.swap_ab is bool(engine.kernels.should_enable_swap_ab(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]))
        assert launch.pdl is bool(engine.kernels.is_arch_support_pdl())


def _check(arm, fx, label, **options):
    call = make_arm(arm, **options).prepare(fx)
    parity = check_parity(call, References(fx), label)
    assert parity.nonfinite == 0, parity.reason()
    assert parity.rel_l2 <= MODEL_BOUND, f"{arm} {label}: {parity.rel_l2:.3g} from the stock rounding model"
    assert parity.rel_l2_exact <= ORACLE_BOUND, f"{arm} {label}: {parity.rel_l2_exact:.3g} from the exact oracle"
    assert parity.passed, parity.reason()
    return call


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_matches_the_oracle(fixtures, shape, pdl):
    fx = fixtures(shape)
    call = _check("triton", derive(fx, fx.spec.seed + 5), shape, pdl=pdl)
    assert call.identity["pdl"] is pdl


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_sglang_referee_matches_the_oracle(fixtures, shape, pdl):
    _engine()
    fx = fixtures(shape)
    call = _check("sglang", derive(fx, fx.spec.seed + 5), shape, pdl=pdl)
    assert call.identity["pdl"] is pdl


def test_triton_and_the_referee_agree_closely(fixtures):
    _engine()
    fx = derive(fixtures("Q8"), 77)
    outs = [make_arm(a).prepare(fx) for a in ("triton", "sglang")]
    for call in outs:
        call.output.fill_(float("nan"))
        call.run()
    torch.cuda.synchronize()
    from moebench.fixtures import rel_l2_error
    assert rel_l2_error(outs[0].output, outs[1].output) < 1e-2


@pytest.mark.parametrize("arm", ["triton", "sglang"])
def test_a_pdl_run_is_audited_clean(arm, tmp_path):
    if arm == "sglang":
        _engine()
    from moebench.run.runner import RunRequest, run
    result, _ = run(RunRequest(shapes=("Q8",), arms=(arm,), rounds=2, samples=10, warmup=2,
                               out_dir=str(tmp_path), measure_bandwidth=False))
    assert result.audit.passed, result.audit.findings[:3]
    ident = next(a.identity for a in result.arms)
    assert ident["pdl"] is True
    for s in result.samples:
        assert len(s.kernels) == 5
        assert s.gpu_busy_ns <= s.gpu_sum_ns <= s.gpu_span_ns + sum(k.duration_ns for k in s.kernels)
