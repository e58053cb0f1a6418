"""cuda-fused on an H100/H200: oracle parity at the standard fixtures and at the edges of the
contract (M=1, one hot expert, E=512 top-10, N=1024, garbage past the padded total,
accumulation into a non-zero output, every block_m, a 2-deep ring, a persistent grid of 1 or
3 clusters walking hundreds of items, one CTA an SM), with clusters of 8 and of 4 and with one
CTA an item; and the output written by the call, zeroed by the kernel itself (ZERO_OUT) or by
the zeroing kernel ahead of it."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from moebench.fixtures import build_fixture, derive, fixture_reference, route_plan
from moebench.fixtures.shapes import Family, ShapeSpec
from moebench.kernels.cuda.fused_arm import (DEFAULT_CLUSTER, DONE_COUNT, MAX_BLOCK_M_ALONE, ZERO_COUNT, ZERO_SPAN,
                                        CudaFusedArm, fused_moe, make_fused_launch, prepare_fused_weights,
                                        zeroes_in_kernel)
from moebench.kernels.api.parity import References, check_parity, compare

from gpu_fixtures import cuda_fixture, with_garbage_past_the_padded_total

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90")]


fixture = cuda_fixture


@functools.lru_cache(maxsize=None)
def weights(name: str, cluster: int = 8):
    fx = fixture(name)
    return prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, cluster)


CLUSTERS = pytest.mark.parametrize("cluster", [8, 4, 1])


def run_fused(fx, *, block_m: int = 8, out=None, plan=None, stages=None, w=None, max_clusters=None, per_sm=None,
              zero=None):
    """One launch adding into `out` (a zeroed one when None); with `zero` ("kernel" or "launch")
    one writing it, the output NaN-poisoned first."""
    w = w if w is not None else prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale)
    plan = plan if plan is not None else route_plan(fx.topk_ids, fx.spec.E, block_m).to(fx.device)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights, out, stages=stages,
                                             max_clusters=max_clusters, per_sm=per_sm, zero_out=zero is not None,
                                             zero=zero)
    if zero is not None:
        assert dims["zeroing"] == zero
        out.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    return out


def assert_parity(fx, out, label):
    p = compare("cuda-fused", label, out, fixture_reference(fx))
    assert p.passed, f"{label}: {p.reason()} (rel_l2={p.rel_l2:.3g}, max_abs={p.max_abs:.3g})"
    return p


@pytest.mark.parametrize("name", ["A64", "A72"])
def test_a_third_round_at_most_half_full_takes_clusters_of_8(name):
    # family A at M = 64 and 72: clusters of 4 at three CTAs an SM would run 2.3-2.4 rounds
    fx = fixture(name)
    call = CudaFusedArm().prepare(fx)
    assert (call.identity["cluster"], call.identity["cluster_chosen_by"]) == (8, "rule")
    # three CTAs an SM behind the zeroing kernel (clusters of 8: fused_policy.zeroes_in_kernel)
    assert call.identity["zeroing"] == "launch" and call.identity["ctas_per_sm"] == 3
    assert call.identity["spills"] == 0
    p = check_parity(call, References(fx), name)
    assert p.passed, f"{name}: {p.reason()} (rel_l2={p.rel_l2:.3g})"
    # an option that sets the launch keeps clusters of 4
    kept = CudaFusedArm(per_sm=3).prepare(fx)
    assert (kept.identity["cluster"], kept.identity["cluster_chosen_by"]) == (DEFAULT_CLUSTER, "default")
    assert CudaFusedArm(cluster=4).prepare(fx).identity["cluster_chosen_by"] == "cluster"


def test_a_third_round_at_most_half_full_at_k_2048_takes_whole_rounds():
    # Q24: 196 items, 2.04 rounds of 96 clusters of 4 at three CTAs an SM: three rounds of 66 instead
    fx = fixture("Q24")
    call = CudaFusedArm().prepare(fx)
    i = call.identity
    assert i["items"] == 196 and i["cluster"] == 4
    if i["cluster_chosen_by"] == "default":  # a GPU whose residency ties 196 items at two CTAs an SM
        assert i["ctas_per_sm"] == 2
    else:
        assert (i["cluster_chosen_by"], i["ctas_per_sm"], i["clusters"], i["zeroing"]) == ("rule", 3, 66, "kernel")
    p = check_parity(call, References(fx), "Q24")
    assert p.passed, f"Q24: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("cluster", [None, 8, 4, 1])
@pytest.mark.parametrize("name", ["A8", "A128", "Q8", "Q128"])
def test_parity_standard_fixtures(name, cluster):
    fx = fixture(name)
    call = CudaFusedArm(cluster=cluster).prepare(fx)
    # the output zeroed by the kernel itself at three CTAs an SM, else by the zeroing kernel ahead
    in_kernel = zeroes_in_kernel(call.identity["ctas_per_sm"], call.identity["cluster"])
    assert call.identity["zeroing"] == ("kernel" if in_kernel else "launch")
    assert call.kernels_per_sample == (1 if in_kernel else 2)
    if cluster is None:  # Q8, A128 and Q128 launch three CTAs an SM, A8 two
        assert in_kernel == (name != "A8")
    assert call.identity["cluster"] == (cluster or DEFAULT_CLUSTER)
    assert call.identity["cluster_chosen_by"] == ("default" if cluster is None else "cluster")
    if cluster is None:  # persistent launches (A128, Q128) placed load-balanced, one-round ones as default
        assert call.identity["cluster_policy"] == ("load-balancing" if name in ("A128", "Q128") else "default")
    p = check_parity(call, References(fx), name)
    # bf16x2 reductions round every partial sum: ~4e-3 expected (CPU simulation), limit 1e-2
    assert p.passed, f"{name}: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@CLUSTERS
@pytest.mark.parametrize("family", ["A8", "Q8"])
def test_parity_single_token(family, cluster):
    fx = derive(fixture(family), seed=11, M=1)
    assert_parity(fx, run_fused(fx, w=weights(family, cluster)), f"{family[0]}1-c{cluster}")


def hot_expert_fixture():
    base = fixture("Q8")
    M, E, top_k = 96, base.spec.E, base.spec.top_k
    g = torch.Generator().manual_seed(12)
    others = torch.stack([torch.randperm(E - 1, generator=g)[: top_k - 1] + 1 for _ in range(M)])
    ids = torch.cat([torch.full((M, 1), 0), others], dim=1)  # expert 0 in every row: 12 blocks of 8
    return derive(base, seed=12, topk_ids=ids)


@CLUSTERS
def test_parity_one_hot_expert_takes_every_token(cluster):
    fx = hot_expert_fixture()
    assert_parity(fx, run_fused(fx, w=weights("Q8", cluster)), f"Q96-hot-c{cluster}")


@CLUSTERS
def test_parity_e512_top10_ragged(cluster):
    fx = derive(fixture("Q128"), seed=13, M=203)
    assert fx.spec.E == 512 and fx.spec.top_k == 10
    assert_parity(fx, run_fused(fx, w=weights("Q128", cluster)), f"Q203-c{cluster}")


@CLUSTERS
@pytest.mark.parametrize("block_m", [16, 24, 32, 48])
def test_parity_every_block_m(block_m, cluster):
    if cluster == 1 and block_m > MAX_BLOCK_M_ALONE:
        pytest.skip("one CTA an item: block_m up to MAX_BLOCK_M_ALONE (the host refuses more)")
    fx = fixture("Q128")
    assert_parity(fx, run_fused(fx, block_m=block_m, w=weights("Q128", cluster)), f"Q128-bm{block_m}-c{cluster}")


@CLUSTERS
def test_parity_two_stage_ring_wraps_many_times(cluster):
    fx = fixture("A8")  # 21 (clusters of 8) or 42 (of 4) chunks a CTA through 2 buffers
    assert_parity(fx, run_fused(fx, stages=2, w=weights("A8", cluster)), f"A8-stages2-c{cluster}")


@CLUSTERS
@pytest.mark.parametrize("clusters", [1, 3])
def test_parity_few_clusters_take_many_items(clusters, cluster):
    # the persistent grid, squeezed: every cluster walks ~470/clusters items, so the ring,
    # meta-slot and DSMEM-exchange barriers wrap their phases many times
    fx = fixture("Q128")
    assert_parity(fx, run_fused(fx, w=weights("Q128", cluster), max_clusters=clusters), f"Q128-{clusters}cl-c{cluster}")


@pytest.mark.parametrize("cluster", [8, 4])  # (one CTA an item runs alone on its SM)
def test_parity_three_ctas_an_sm(cluster):
    fx = fixture("A128")  # the 2-deep ring the third CTA an SM leaves room for
    assert_parity(fx, run_fused(fx, w=weights("A128", cluster), per_sm=3), f"A128-3cta-c{cluster}")


def test_parity_one_cta_per_sm_deep_ring():
    fx = fixture("A8")
    w = weights("A8")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8).to(fx.device)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights, per_sm=1)
    assert dims["per_sm"] == 1 and dims["stages"] == 8
    launch()
    torch.cuda.synchronize()
    assert_parity(fx, out, "A8-1cta")


# Dimensions no fixture has: (family, M, seed).
OTHER_DIMS = {
    # N = 1024: four requant groups a block
    "N48 (N=1024)": (Family("N", "four requant groups", K=1024, E=16, top_k=4, N=1024, routed_scale=1.0,
                            shared_expert=False), 48, 14),
    # K = 640: 5 k blocks, 20-byte scale rows, so the first item's meta cannot come by bulk
    # copies and takes the register path (as every later item does)
    "U24 (K=640)": (Family("U", "unaligned scale rows", K=640, E=16, top_k=4, N=512, routed_scale=1.0,
                           shared_expert=False), 24, 17),
    # K = 128 and 384: one k block, and three (GEMM1's second chunk of a cluster of 4 holds one of
    # its two): the first chunks' weights, sent before the meta, are partial or absent
    "K9 (K=128)": (Family("K", "one k block", K=128, E=16, top_k=4, N=256, routed_scale=1.0,
                          shared_expert=False), 9, 19),
    "L9 (K=384)": (Family("L", "three k blocks", K=384, E=16, top_k=4, N=256, routed_scale=1.0,
                          shared_expert=False), 9, 23),
}


@CLUSTERS
@pytest.mark.parametrize("name", list(OTHER_DIMS))
def test_parity_other_dims(name, cluster):
    fam, M, seed = OTHER_DIMS[name]
    fx = build_fixture(ShapeSpec(name.split()[0], fam, M, seed=seed)).to("cuda")
    w = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, cluster)
    assert_parity(fx, run_fused(fx, w=w), f"{name}-c{cluster}")


@CLUSTERS
def test_garbage_past_the_padded_total_is_ignored(cluster):
    fx = fixture("Q8")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8)
    garbage = with_garbage_past_the_padded_total(plan, fx.spec.E, seed=15)
    assert garbage.sorted_token_ids.numel() > plan.padded_total and garbage.expert_ids.numel() > plan.num_blocks
    assert_parity(fx, run_fused(fx, plan=garbage, w=weights("Q8", cluster)), f"Q8-garbage-c{cluster}")


@CLUSTERS
def test_accumulates_into_a_nonzero_output(cluster):
    fx = fixture("A8")
    ref = fixture_reference(fx).float()
    g = torch.Generator(device="cuda").manual_seed(16)
    before = (torch.randn(ref.shape, generator=g, device="cuda") * ref.std()).to(torch.bfloat16)
    out = run_fused(fx, out=before.clone(), w=weights("A8", cluster))
    p = compare("cuda-fused", "A8-accumulate", out.float() - before.float(), ref)
    assert p.passed, p.reason()


@CLUSTERS
@pytest.mark.parametrize("zero", [None, "launch", "kernel"])
@pytest.mark.parametrize("shape,clusters", [("Q128", None), ("Q128", 3), ("Q8", None)])
def test_every_launch_does_all_the_work(shape, clusters, cluster, zero):
    # work after each cluster's first item comes from a ticket counter that the last cluster
    # out of work zeroes, and in launches of one round (Q8, three CTAs an SM) each busy CTA
    # takes back its SM's count: each launch of one launch object must do every item again (and,
    # writing its output, zero all of it again: a NaN-poisoned output comes out right; the
    # kernel's own count of zeroed stripes grows by ZERO_SPAN a launch)
    fx = fixture(shape)
    plan = route_plan(fx.topk_ids, fx.spec.E, 8).to(fx.device)
    launch, out, _, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights(shape, cluster), plan,
                                             fx.topk_weights, max_clusters=clusters, zero_out=zero is not None,
                                             zero=zero)
    assert dims["zeroing"] == zero
    for i in range(3):
        out.fill_(0.0 if zero is None else float("nan"))
        launch()
        torch.cuda.synchronize()
        work = dims["work"]
        left = work[:ZERO_COUNT]
        assert not left.any(), f"launch {i}: counters left at {left.nonzero().flatten().tolist()}"
        assert int(work[ZERO_COUNT]) == (ZERO_SPAN * (i + 1) if zero == "kernel" else 0)
        assert int(work[DONE_COUNT]) == 0  # (I = 128: BF16 reductions, no count of CTAs done)
        assert_parity(fx, out, f"{shape}-launch{i}-{clusters}cl-c{cluster}")


@CLUSTERS
@pytest.mark.parametrize("shape", ["A8", "Q8", "A1", "Q96-hot", "K9 (K=128)"])
def test_the_kernel_zeroes_its_own_output(shape, cluster):
    # ZERO_OUT at every occupancy (the policy takes it at three CTAs an SM), one CTA an item, M = 1,
    # one hot expert, one k block: a NaN-poisoned output, written whole by the call
    if shape == "Q96-hot":
        fx = hot_expert_fixture()
    elif shape == "A1":
        fx = derive(fixture("A8"), seed=11, M=1)
    elif shape in OTHER_DIMS:
        fam, M, seed = OTHER_DIMS[shape]
        fx = build_fixture(ShapeSpec(shape.split()[0], fam, M, seed=seed)).to("cuda")
    else:
        fx = fixture(shape)
    w = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, cluster)
    for per_sm in ([None] if cluster == 1 else [2, 3]):
        assert_parity(fx, run_fused(fx, w=w, per_sm=per_sm, zero="kernel"), f"{shape}-zero-kernel-{per_sm}-c{cluster}")


def test_the_kernel_zeroes_on_a_grid_of_one_cluster_after_another_grid():
    # the count only grows, by ZERO_SPAN a launch whatever the grid: launch objects of other
    # grids share nothing, and one object's launches wait for their own multiple each time
    fx = fixture("Q128")
    for clusters in (1, None, 2):
        assert_parity(fx, run_fused(fx, w=weights("Q128", 4), max_clusters=clusters, zero="kernel"),
                      f"Q128-zero-kernel-{clusters}cl")


@CLUSTERS
@pytest.mark.parametrize("clusters", [None, 1])
def test_blocks_with_an_expert_outside_the_range_are_skipped(clusters, cluster):
    # expert ids of -1 or >= E inside the padded total (an expert-parallel rank's plan): those
    # blocks' slots contribute nothing, and the items after them are still done
    base = fixture("Q128")
    plan = route_plan(base.topk_ids, base.spec.E, 8)
    skip = torch.arange(2, plan.num_blocks, 5)
    experts = plan.expert_ids.clone()
    experts[skip] = torch.where(skip % 2 == 0, -1, base.spec.E + 3).to(torch.int32)
    slots = plan.sorted_token_ids.view(-1, 8)[skip].flatten()
    slots = slots[slots < plan.num_slots].long()
    fx = derive(base, seed=17, topk_ids=base.topk_ids)
    kept = type(plan)(plan.block_m, plan.sorted_token_ids, experts, plan.num_tokens_post_padded, plan.num_slots)
    out = run_fused(fx, plan=kept.to("cuda"), w=weights("Q128", cluster), max_clusters=clusters)
    weights_kept = fx.topk_weights.clone()
    weights_kept.view(-1)[slots.to(weights_kept.device)] = 0.0
    ref = fixture_reference(dataclasses.replace(fx, topk_weights=weights_kept))
    p = compare("cuda-fused", "Q128-skipped-experts", out, ref)
    assert slots.numel() > 50 and p.passed, f"{p.reason()} (rel_l2={p.rel_l2:.3g})"


def test_public_wrapper_allocates_a_zeroed_output():
    fx = fixture("Q8")
    plan = route_plan(fx.topk_ids, fx.spec.E, 8).to("cuda")
    out = fused_moe(fx.x_fp8, fx.x_scale, weights("Q8"), plan, fx.topk_weights)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (fx.M, fx.spec.K)
    assert_parity(fx, out, "Q8-wrapper")
