"""cuda-fused-det on an H100/H200: the same bits on 100 runs at A8 and Q8, a token's rows the same
alone (m = 1, 8, M) and inside larger batches, across block sizes and persistent-grid sizes, in a
fresh process; oracle parity on the fused arm's edge cases (M=1, one hot expert, empty experts,
M=67, every block_m, garbage past the padded total, skipped experts, accumulation into a non-zero
output, repeated launches of one launch object); and the in-kernel sum itself: every output
element is the previous output plus the token's workspace rows summed in slot, then group, order
(a reference in torch, bit for bit) whoever arrived last, in every cluster layout, with two
requant groups, with one cluster walking every item (its warps' lists of owned slices overflow
and are summed on the spot), with skipped experts (the kernel zeroes their rows), with M not a
multiple of the block and one hot expert; over 100 launches of one launch object with the
workspace poisoned between them (a sum that read a row before its store would be NaN) and the
arrival counters back at zero after each."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from moebench.determinism import PROOF_RUNS, check_arms, check_batch, check_run_to_run, difference
from moebench.fixtures import build_fixture, derive, fixture_reference, route_plan
from moebench.fixtures.shapes import Family, ShapeSpec
from moebench.fixtures.tokens import take_tokens
from moebench.kernels.fused_arm import CudaFusedDetArm, make_fused_launch, prepare_fused_weights
from moebench.kernels.parity import References, check_parity, compare
from moebench.kernels.verify import edge_cases

from gpu_fixtures import cuda_fixture

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
    for block_m in (16, 24, 32):  # (the deterministic build goes up to 32)
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


@pytest.mark.parametrize("block_m", [16, 24, 32])
def test_parity_every_block_m(block_m):
    fx = fixture("Q128")
    assert_parity(fx, run_det(fx, block_m=block_m, w=weights("Q128")), f"Q128-bm{block_m}")


def test_single_token_alone_equals_its_row_in_the_batch():
    fx = fixture("A128")
    alone = run_det(take_tokens(fx, 1), w=weights("A128"))
    assert difference(alone.cpu(), run_det(fx, w=weights("A128"))[:1].cpu()).bitwise


def test_garbage_past_the_padded_total_is_ignored():
    fx = fixture("Q8")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8)
    total, blocks = plan.padded_total, plan.num_blocks
    g = torch.Generator().manual_seed(15)
    ids, experts = plan.sorted_token_ids.clone(), plan.expert_ids.clone()
    ids[total:] = torch.randint(0, plan.num_slots, (ids.numel() - total,), generator=g, dtype=torch.int32)
    experts[blocks:] = torch.randint(0, fx.spec.E, (experts.numel() - blocks,), generator=g, dtype=torch.int32)
    garbage = type(plan)(plan.block_m, ids, experts, plan.num_tokens_post_padded, plan.num_slots).to("cuda")
    assert_parity(fx, run_det(fx, plan=garbage, w=weights("Q8")), "Q8-garbage")


def test_blocks_with_an_expert_outside_the_range_are_skipped():
    # the kernel zeroes their slots' workspace rows and counts them, so they add nothing; block 0
    # is a cluster's first item (its expert comes with the kernel's first trip)
    base = fixture("Q128")
    plan = route_plan(base.topk_ids, base.spec.E, 8)
    skip = torch.cat([torch.tensor([0]), torch.arange(2, plan.num_blocks, 5)])
    experts = plan.expert_ids.clone()
    experts[skip] = torch.where(skip % 2 == 0, -1, base.spec.E + 3).to(torch.int32)
    slots = plan.sorted_token_ids.view(-1, 8)[skip].flatten()
    slots = slots[slots < plan.num_slots].long()
    fx = derive(base, seed=17, topk_ids=base.topk_ids)
    kept = type(plan)(plan.block_m, plan.sorted_token_ids, experts, plan.num_tokens_post_padded, plan.num_slots)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights("Q128"), kept.to("cuda"),
                                             fx.topk_weights, deterministic=True)
    dims_ws = dims["workspace"]
    for _ in range(2):  # a second launch of the same object, over a poisoned workspace
        out.zero_()
        dims_ws.fill_(float("nan"))
        launch()
    torch.cuda.synchronize()
    weights_kept = fx.topk_weights.clone()
    weights_kept.view(-1)[slots.to(weights_kept.device)] = 0.0
    ref = fixture_reference(dataclasses.replace(fx, topk_weights=weights_kept))
    p = compare("cuda-fused-det", "Q128-skipped-experts", out, ref)
    assert slots.numel() > 50 and p.passed, f"{p.reason()} (rel_l2={p.rel_l2:.3g})"
    assert not dims_ws.view(-1, fx.spec.K)[slots.to(dims_ws.device)].any()  # zeroed by the kernel
    assert difference(fixed_order_sum(torch.zeros_like(out), dims_ws, fx.M).cpu(), out.cpu()).bitwise
    assert not dims["work"].any()


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


# ------------------------------------------------------------------------------ the in-kernel sum


def fixed_order_sum(before: torch.Tensor, ws: torch.Tensor, M: int) -> torch.Tensor:
    """What the kernel's sums must give, bit for bit: each element the previous output plus the
    token's top_k * G workspace rows added in FP32 in row order (slot, then group), rounded to
    BF16 once (round to nearest even, as cvt.rn.bf16x2.f32)."""
    rows = ws.view(M, -1, ws.shape[1]).float()
    s = torch.zeros(M, ws.shape[1], dtype=torch.float32, device=ws.device)
    for r in range(rows.shape[1]):
        s = s + rows[:, r]
    return (before.float() + s).to(torch.bfloat16)


def launch_det(fx, w, *, block_m: int = 8, plan=None, max_clusters=None, seed: int = 41):
    """A fresh launch object into a random non-zero output: (launch, out, before, dims)."""
    plan = plan if plan is not None else route_plan(fx.topk_ids, fx.spec.E, block_m).to(fx.device)
    g = torch.Generator(device="cuda").manual_seed(seed)
    before = (torch.randn(fx.M, fx.spec.K, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights, before.clone(),
                                             max_clusters=max_clusters, deterministic=True)
    return launch, out, before, dims


def assert_sum_is_exact(fx, w, label, **kw):
    launch, out, before, dims = launch_det(fx, w, **kw)
    launch()
    torch.cuda.synchronize()
    want = fixed_order_sum(before, dims["workspace"], fx.M)
    d = difference(want.cpu(), out.cpu())
    assert d.bitwise, f"{label}: {d}"
    assert not dims["work"].any(), f"{label}: counters left at {dims['work'].nonzero().flatten().tolist()[:8]}"
    assert_parity(fx, out.float() - before.float(), label)
    return out


@pytest.mark.parametrize("cluster", [4, 8, 1])
@pytest.mark.parametrize("name", ["A8", "Q8", "Q128"])
def test_every_element_is_the_fixed_order_sum(name, cluster):
    # each slice of columns (CTA rank, consumer warp) is summed by whichever warp arrived last on
    # it, in every cluster layout (a warp's m-tiles w, w + 8, ...)
    fx = fixture(name)
    assert_sum_is_exact(fx, weights(name, cluster), f"{name}-c{cluster}")


@pytest.mark.parametrize("max_clusters", [1, 3])
def test_few_clusters_walk_every_item(max_clusters):
    # one cluster: warp w of rank c owns every token's slice (c, w), far more than its list holds,
    # so most sums run on the spot inside the item loop; three: the ticket queue hands items out
    fx = fixture("Q128")
    assert_sum_is_exact(fx, weights("Q128"), f"Q128-{max_clusters}cl", max_clusters=max_clusters)


def test_two_requant_groups_and_blocks_of_32():
    # G = 2: rows slot * G + g, top_k * G of them a token; blocks of 32 tokens a warp's arrivals
    fam = Family("D", "two requant groups", K=1024, E=8, top_k=3, N=512, routed_scale=1.0, shared_expert=False)
    fx = build_fixture(ShapeSpec("D40", fam, 40, seed=43)).to("cuda")
    w = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, 4)
    for block_m in (8, 32):
        assert_sum_is_exact(fx, w, f"D40-bm{block_m}", block_m=block_m)


def test_m_not_a_multiple_of_the_block_and_one_hot_expert():
    base = fixture("A8")
    fam = base.spec.family
    k = fam.routed_top_k
    rows = [[(m + j) % k for j in range(k)] for m in range(67)]  # every token on the same k experts
    ids = torch.tensor(rows, dtype=torch.int32)
    if fam.shared_expert:
        ids = torch.cat([ids, torch.full((67, 1), fam.E - 1, dtype=torch.int32)], dim=1)
    for label, fx in (("M=13", derive(base, 44, M=13)), ("hot experts, M=67", derive(base, 45, topk_ids=ids))):
        for block_m in (8, 32):
            assert_sum_is_exact(fx, weights("A8"), f"A8 {label} bm{block_m}", block_m=block_m)


def test_a_token_whose_every_block_is_skipped_keeps_its_row():
    base = fixture("Q8")
    plan = route_plan(base.topk_ids, base.spec.E, 8)
    token0 = torch.nonzero(plan.sorted_token_ids[: plan.padded_total] // base.spec.top_k == 0).flatten()
    experts = plan.expert_ids.clone()
    experts[torch.unique(token0 // 8)] = -1  # every block holding one of token 0's slots
    kept = type(plan)(plan.block_m, plan.sorted_token_ids, experts, plan.num_tokens_post_padded, plan.num_slots)
    launch, out, before, dims = launch_det(base, weights("Q8"), plan=kept.to("cuda"))
    launch()
    torch.cuda.synchronize()
    assert difference(before[0].cpu(), out[0].cpu()).bitwise  # out + 0, once
    assert difference(fixed_order_sum(before, dims["workspace"], base.M).cpu(), out.cpu()).bitwise
    assert not dims["work"].any()


@pytest.mark.parametrize("name,clusters", [("A8", None), ("Q8", None), ("Q128", None), ("Q128", 2)])
def test_100_launches_over_a_poisoned_workspace(name, clusters):
    # every launch stores every row before any sum reads it, and the last arrival on each slice
    # zeroes its counter: with the workspace NaN before each launch, a sum that ran early, or a
    # counter left over from the launch before, shows as NaN or as different bits
    fx = fixture(name)
    launch, out, before, dims = launch_det(fx, weights(name), max_clusters=clusters)
    first = None
    for i in range(PROOF_RUNS):
        out.copy_(before)
        dims["workspace"].fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        assert not dims["work"].any(), f"launch {i}: counters left set"
        got = out.cpu()
        if first is None:
            first = got
            assert torch.isfinite(got.float()).all()
            assert difference(fixed_order_sum(before, dims["workspace"], fx.M).cpu(), got).bitwise
        else:
            assert difference(first, got).bitwise, f"launch {i}"


def test_a_poisoned_output_is_reset_and_fully_written():
    # the arm's reset zeroes a NaN-poisoned output; every element then holds its sum
    fx = fixture("A8")
    call = CudaFusedDetArm().prepare(fx)
    call.output.fill_(float("nan"))
    call.reset()
    call.run()
    torch.cuda.synchronize()
    assert torch.isfinite(call.output.float()).all()
    assert call.identity["det_sum"] == "in-kernel, arrival counters"
    want = fixed_order_sum(torch.zeros_like(call.output), call.workspace, fx.M)
    assert difference(want.cpu(), call.output.cpu()).bitwise
