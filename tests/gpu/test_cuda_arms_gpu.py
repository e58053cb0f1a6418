"""cuda-gemm and cuda-swapab on an sm_90 GPU: oracle parity on the four reference shapes,
on fresh inputs, and on the edge cases a route plan gets wrong first."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moebench.fixtures import build_fixture, derive, route_plan
from moebench.kernels.cuda.arms import WGMMA_N
from moebench.kernels.registry import make_arm
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.verify import edge_cases

pytestmark = pytest.mark.gpu

ARMS = ("cuda-gemm", "cuda-swapab")
SHAPES = ("A8", "A128", "Q8", "Q128")


@pytest.fixture(scope="module")
def fixtures(registry):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build_fixture(registry.resolve(name)).to("cuda")
        return cache[name]
    return get


@pytest.fixture(scope="module", autouse=True)
def needs_hopper():
    reason = make_arm("cuda-swapab").unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


def _check(arm_name, fx, label, arm=None):
    call = (arm or make_arm(arm_name)).prepare(fx)
    parity = check_parity(call, References(fx), label)
    assert parity.passed, f"{arm_name} {label}: {parity.reason()} (max abs {parity.max_abs:.3g})"
    return call


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("arm", ARMS)
def test_parity_on_the_reference_fixture(fixtures, arm, shape):
    _check(arm, fixtures(shape), shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("arm", ARMS)
def test_parity_on_fresh_inputs(fixtures, arm, shape):
    fx = fixtures(shape)
    _check(arm, derive(fx, fx.spec.seed + 1), f"{shape} fresh")


@pytest.mark.parametrize("shape", ("A8", "Q8"))
@pytest.mark.parametrize("arm", ARMS)
def test_parity_on_edge_cases(fixtures, arm, shape):
    fx = fixtures(shape)
    cases = edge_cases(fx, fx.spec.seed + 2)  # M=1, one expert set, empty experts, M=67
    cases_extra = [derive(fx, fx.spec.seed + 7, M=17),  # M not a multiple of swapab's 16-slot block
                   derive(fx, fx.spec.seed + 8, topk_ids=_one_hot(fx, 40))]  # one expert takes every token
    for case in cases:
        _check(arm, case.fixture, f"{shape} {case.label}")
    for i, case in enumerate(cases_extra):
        _check(arm, case, f"{shape} extra {i}")


def _one_hot(fx, M):
    """Expert 5 in every row (and the rest distinct), so one expert gets M slots."""
    fam = fx.spec.family
    k = fam.routed_top_k
    rows = [[5] + [6 + (m + j) % 20 for j in range(k - 1)] for m in range(M)]
    ids = torch.tensor(rows, dtype=torch.int32)
    if fam.shared_expert:
        ids = torch.cat([ids, torch.full((M, 1), fam.E - 1, dtype=torch.int32)], dim=1)
    return ids


@pytest.mark.parametrize("block_t", [b for b in WGMMA_N if b not in (16, 64)])
def test_swapab_parity_at_every_block_size(fixtures, block_t):
    """The Swap-AB kernels at the other wgmma N (the route plan in blocks of that size): the edge
    cases, M one more than a block, one hot expert, and the band's A512 on fresh inputs."""
    def check(fx, label):
        arm = make_arm("cuda-swapab")
        arm.config = dataclasses.replace(arm.config, block_t=block_t)
        call = _check(f"cuda-swapab block_t={block_t}", fx, label, arm)
        assert call.identity["route_blocks"] == route_plan(fx.topk_ids.cpu(), fx.spec.E, block_t).num_blocks
    fx = fixtures("A8")
    for case in edge_cases(fx, fx.spec.seed + 2):
        check(case.fixture, f"A8 {case.label}")
    check(derive(fx, fx.spec.seed + 9, M=block_t + 1), f"A8 M={block_t + 1}")
    check(derive(fx, fx.spec.seed + 8, topk_ids=_one_hot(fx, 3 * block_t + 5)), "A8 one hot expert")
    a512 = fixtures("A512")
    check(derive(a512, a512.spec.seed + 1), "A512 fresh")
    q = fixtures("Q128")
    check(derive(q, q.spec.seed + 1), "Q128 fresh")


@pytest.mark.parametrize("arm", ARMS)
def test_run_is_repeatable_zeroes_its_output_and_allocates_nothing(fixtures, arm):
    fx = fixtures("Q8")
    call = make_arm(arm).prepare(fx)
    call.run()
    torch.cuda.synchronize()
    first = call.output.clone()
    before = torch.cuda.memory_allocated()
    call.output.fill_(float("nan"))  # the zeroing in moe_swiglu_quant must clear any poison
    call.run()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert torch.isfinite(call.output).all()
    # GEMM2 reduces into the output in BF16, so the order of the reductions moves last bits
    # (of partial sums, which can be larger than the result): close, not bitwise. Each run is
    # within the parity tolerance (1e-2) of the oracle, so two runs may differ by about as much
    # (0.00502 seen for cuda-swapab on the H200, results/h200/fidelity/gpu-tests.log).
    rel = (first.float() - call.output.float()).norm() / first.float().norm()
    assert rel < 1e-2, f"repeat runs differ by {rel:.3g}"
    twice = first.float() * 2
    call.run()
    torch.cuda.synchronize()
    assert not torch.allclose(call.output.float(), twice, rtol=1e-3)  # zeroed, not accumulated


def test_arms_agree_closely(fixtures):
    fx = fixtures("A8")
    outs = []
    for arm in ARMS:
        call = make_arm(arm).prepare(fx)
        call.run()
        torch.cuda.synchronize()
        outs.append(call.output.float())
    rel = (outs[0] - outs[1]).norm() / outs[1].norm()
    assert rel < 1e-2, f"cuda-gemm and cuda-swapab differ by {rel:.3g}"
