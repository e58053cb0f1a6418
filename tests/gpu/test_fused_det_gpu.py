"""cuda-fused-det on an H100/H200: the same bits on 100 runs at A8 and Q8, a token's rows the same
alone (m = 1, 8, M) and inside larger batches, across block sizes and persistent-grid sizes, in a
fresh process; and oracle parity on the fused arm's edge cases (M=1, one hot expert, empty
experts, M=67, every block_m, garbage past the padded total, skipped experts, accumulation into
a non-zero output, repeated launches of one launch object)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from moebench.determinism.checks import PROOF_RUNS, check_arms, check_batch, check_run_to_run, difference
from moebench.fixtures import derive, fixture_reference, route_plan
from moebench.fixtures.tokens import take_tokens
from moebench.kernels.cuda.fused_arm import CudaFusedDetArm, make_fused_launch, prepare_fused_weights
from moebench.kernels.api.parity import References, check_parity, compare
from moebench.kernels.verify import edge_cases

from gpu_fixtures import cuda_fixture, with_garbage_past_the_padded_total

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90")]


fixture = cuda_fixture


@functools.lru_cache(maxsize=None)
def weights(name: str, cluster: int = 4):
    fx = fixture(name)
    return prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, cluster)


def run_det(fx, *, block_m: int = 8, out=None, plan=None, w=None, max_clusters=None, per_sm=None):
    w = w if w is not None else prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, 4)
    plan = plan if plan is not None else route_plan(fx.topk_ids, fx.spec.E, block_m).to(fx.device)
    launch, out, _, _ = make_fused_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights, out,
                                          max_clusters=max_clusters, per_sm=per_sm, deterministic=True)
    launch()
    torch.cuda.synchronize()
    return out


def assert_parity(fx, out, label):
    p = compare("cuda-fused-det", label, out.to(fx.device), fixture_reference(fx))
    assert p.passed, f"{label}: {p.reason()} (rel_l2={p.rel_l2:.3g}, max_abs={p.max_abs:.3g})"
    return p


# ------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("name", ["A8", "Q8"])
def test_bitwise_identical_over_100_runs(name):
    repeat, first = check_run_to_run(CudaFusedDetArm().prepare(fixture(name)), PROOF_RUNS)
    assert repeat.runs == PROOF_RUNS and repeat.bitwise, repeat
    assert_parity(fixture(name), first, f"{name}-det")


@pytest.mark.parametrize("name", ["A8", "Q8", "A128", "Q128"])
def test_batch_invariant_at_one_eight_and_m(name):
    fx, arm = fixture(name), CudaFusedDetArm()
    repeat, first = check_run_to_run(arm.prepare(fx), 3)
    rows = check_batch(arm, fx, first)
    assert repeat.bitwise
    assert sorted({b.m for b in rows}) == sorted({1, 8, fx.M}) and all(b.bitwise for b in rows), rows


@pytest.mark.parametrize("name", ["A128", "Q128"])
def test_rows_do_not_follow_block_size_or_grid(name):
    # the plan puts a token beside other tokens in blocks of 8 to 48, and a persistent grid of 1 or
    # all clusters takes the items in another order: the bits stay
    fx = fixture(name)
    base = run_det(fx, w=weights(name))
    for block_m in (16, 24, 32, 48):
        d = difference(base.cpu(), run_det(fx, block_m=block_m, w=weights(name)).cpu())
        assert d.bitwise, f"block_m={block_m}: {d}"
    d = difference(base.cpu(), run_det(fx, w=weights(name), max_clusters=1).cpu())
    assert d.bitwise, f"one cluster: {d}"
    d = difference(base.cpu(), run_det(fx, w=weights(name), per_sm=3).cpu())
    assert d.bitwise, f"three CTAs an SM: {d}"


def test_a_fresh_process_gives_the_same_hash():
    (v,) = check_arms(fixture("Q8"), ["cuda-fused-det"], runs=2)
    assert v.cross_process.equal is True and v.passed, v


# ------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("name", ["A8", "Q8", "A128", "Q128"])
def test_parity_standard_fixtures_and_edge_cases(name):
    fx = fixture(name)
    arm = CudaFusedDetArm()
    for case in [("fixture", fx)] + [(c.label, c.fixture) for c in edge_cases(fx, fx.spec.seed + 2)]:
        p = check_parity(arm.prepare(case[1]), References(case[1]), f"{name} {case[0]}")
        assert p.passed, f"{name} {case[0]}: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("block_m", [16, 24, 32, 48])
def test_parity_every_block_m(block_m):
    fx = fixture("Q128")
    assert_parity(fx, run_det(fx, block_m=block_m, w=weights("Q128")), f"Q128-bm{block_m}")


def test_more_rows_a_token_than_one_combine_batch():
    """top_k 8 over two requant groups (I = 256): 16 workspace rows a token, two of the combine's
    batches of ten; parity, the same bits twice, and a token alone equal to its row."""
    from moebench.fixtures import build_fixture
    from moebench.fixtures.shapes import Family, ShapeSpec
    family = Family("D", "two groups, top_k 8", K=2048, E=64, top_k=8, N=512, routed_scale=1.0, shared_expert=False)
    fx = build_fixture(ShapeSpec("D40", family, 40, seed=61)).to("cuda")
    w = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, 4)
    first = run_det(fx, w=w)
    assert_parity(fx, first, "D40")
    assert difference(first.cpu(), run_det(fx, w=w).cpu()).bitwise
    assert difference(run_det(take_tokens(fx, 1), w=w).cpu(), first[:1].cpu()).bitwise


def test_single_token_alone_equals_its_row_in_the_batch():
    fx = fixture("A128")
    alone = run_det(take_tokens(fx, 1), w=weights("A128"))
    assert difference(alone.cpu(), run_det(fx, w=weights("A128"))[:1].cpu()).bitwise


def test_garbage_past_the_padded_total_is_ignored():
    fx = fixture("Q8")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8)
    garbage = with_garbage_past_the_padded_total(plan, fx.spec.E, seed=15)
    assert_parity(fx, run_det(fx, plan=garbage, w=weights("Q8")), "Q8-garbage")


def test_blocks_with_an_expert_outside_the_range_are_skipped():
    # their slots' workspace rows stay the zeros they were allocated as, so they add nothing
    base = fixture("Q128")
    plan = route_plan(base.topk_ids, base.spec.E, 8)
    skip = torch.arange(2, plan.num_blocks, 5)
    experts = plan.expert_ids.clone()
    experts[skip] = torch.where(skip % 2 == 0, -1, base.spec.E + 3).to(torch.int32)
    slots = plan.sorted_token_ids.view(-1, 8)[skip].flatten()
    slots = slots[slots < plan.num_slots].long()
    fx = derive(base, seed=17, topk_ids=base.topk_ids)
    kept = type(plan)(plan.block_m, plan.sorted_token_ids, experts, plan.num_tokens_post_padded, plan.num_slots)
    launch, out, _, _ = make_fused_launch(fx.x_fp8, fx.x_scale, weights("Q128"), kept.to("cuda"), fx.topk_weights,
                                          deterministic=True)
    for _ in range(2):  # a second launch of the same object: the skipped rows are still zero
        out.zero_()
        launch()
    torch.cuda.synchronize()
    weights_kept = fx.topk_weights.clone()
    weights_kept.view(-1)[slots.to(weights_kept.device)] = 0.0
    ref = fixture_reference(dataclasses.replace(fx, topk_weights=weights_kept))
    p = compare("cuda-fused-det", "Q128-skipped-experts", out, ref)
    assert slots.numel() > 50 and p.passed, f"{p.reason()} (rel_l2={p.rel_l2:.3g})"


def test_accumulates_into_a_nonzero_output():
    fx = fixture("A8")
    ref = fixture_reference(fx).float()
    g = torch.Generator(device="cuda").manual_seed(16)
    before = (torch.randn(ref.shape, generator=g, device="cuda") * ref.std()).to(torch.bfloat16)
    out = run_det(fx, out=before.clone(), w=weights("A8"))
    p = compare("cuda-fused-det", "A8-accumulate", out.float() - before.float(), ref)
    assert p.passed, p.reason()


def test_every_launch_does_all_the_work():
    fx = fixture("Q128")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8).to(fx.device)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights("Q128"), plan, fx.topk_weights,
                                             max_clusters=3, deterministic=True)
    outs = []
    for i in range(3):
        out.zero_()
        launch()
        torch.cuda.synchronize()
        assert not dims["work"].any(), f"launch {i}: counters left set"
        assert_parity(fx, out, f"Q128-launch{i}")
        outs.append(out.cpu())
    assert all(difference(outs[0], o).bitwise for o in outs[1:])
