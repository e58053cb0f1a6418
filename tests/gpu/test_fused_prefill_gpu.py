"""cuda-fused's prefill path (two FP8 wgmma kernels) on an H100/H200: oracle parity at M = 256,
4096 and 16384 in families A and Q, one hot expert taking every token, E = 512 top-10 at an M
that is no multiple of the block, other K and N, a persistent grid squeezed to 1 or 3 CTAs,
garbage past the padded total, experts outside [0, E), poisoned intermediates, and accumulation
into a non-zero output."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from moebench.fixtures import ShapeRegistry, build_fixture, derive, fixture_reference, route_plan
from moebench.fixtures.shapes import Family, ShapeSpec
from moebench.kernels.cuda.fused_arm import CudaFusedArm, CudaFusedDetArm
from moebench.kernels.cuda.fused_prefill import BLOCK_M, kernel_names, make_prefill_launch, prefill_weights
from moebench.kernels.api.parity import References, check_parity, compare

from gpu_fixtures import with_garbage_past_the_padded_total

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90")]


@functools.lru_cache(maxsize=None)
def base(family: str):
    """One fixture's weights a family (M = 256); larger M derive fresh tokens and routes from them."""
    return build_fixture(ShapeRegistry().resolve(f"{family}256")).to("cuda")


@functools.lru_cache(maxsize=None)
def weights(family: str):
    fx = base(family)
    return prefill_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale)


def at(family: str, M: int, seed: int):
    return base(family) if M == 256 else derive(base(family), seed=seed, M=M)


def run_prefill(fx, *, w=None, plan=None, out=None, max_ctas=None, poison=False, splits=None, chunk=None,
                times=1, zero_out=False, overlap=None, dims_out=None):
    w = w if w is not None else prefill_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale)
    plan = plan if plan is not None else route_plan(fx.topk_ids, fx.spec.E, BLOCK_M).to(fx.device)
    launch, out, _, dims = make_prefill_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights, out,
                                               max_ctas=max_ctas, splits=splits, chunk=chunk, zero_out=zero_out,
                                               overlap=overlap)
    if splits is not None:
        assert dims["splits"] == splits
    if overlap is not None:
        assert dims["overlap"] == overlap
    if dims_out is not None:
        dims_out.update(dims)
    start = out.clone()
    for _ in range(times - 1):  # earlier launches of the same call: each leaves its flags and counters at 0
        launch()
        torch.cuda.synchronize()
        assert int(dims["flags"].abs().sum()) == 0 and int(dims["sync"].abs().sum()) == 0
        out.copy_(start)
    if poison:  # e4m3 0xFF is NaN: a code or scale the kernels read without writing shows
        a, a_scale = dims["intermediate"]
        a.fill_(0xFF)
        a_scale.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    assert int(dims["sync"].abs().sum()) == 0, "the overlap's counters or flags were left raised"
    return out


def assert_parity(fx, out, label, ref=None):
    p = compare("cuda-fused", label, out, fixture_reference(fx) if ref is None else ref)
    assert p.passed, f"{label}: {p.reason()} (rel_l2={p.rel_l2:.3g}, max_abs={p.max_abs:.3g})"
    return p


@pytest.mark.parametrize("M", [256, 4096, 16384])
@pytest.mark.parametrize("family", ["A", "Q"])
def test_parity_through_the_arm(family, M):
    fx = at(family, M, seed=40 + M % 997)
    call = CudaFusedArm(path=None if M >= 4096 else "prefill").prepare(fx)
    assert call.identity["path"] == "prefill"  # at M >= 4096 the route plan picks it
    assert [k.pattern for k in call.kernels] == ["moebench_prefill_gate_up", "moebench_prefill_down"]
    assert call.identity["spills"] == 0 and call.identity["wgmma_serialized"] == {}
    assert call.identity["down_walk"] == "two accumulators, one K step a tile"  # both families: I = 128
    p = check_parity(call, References(fx), f"{family}{M}")
    assert p.passed, f"{family}{M}: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("family, M", [("A", 512), ("Q", 512)])
def test_path_grouped_runs_the_swap_ab_gemms_under_the_arm(family, M):
    fx = at(family, M, seed=60 + M)
    call = CudaFusedArm(path="grouped").prepare(fx)
    assert call.arm == "cuda-fused" and call.identity["path"] == "grouped"
    assert call.identity["kernels_of"] == "cuda-swapab" and call.identity["path_rule"]["chosen_by"] == "grouped"
    assert [k.pattern for k in call.kernels] == ["moe_grouped_gemm1", "moe_swiglu_quant", "moe_grouped_gemm2"]
    p = check_parity(call, References(fx), f"{family}{M}-grouped")
    assert p.passed, f"{family}{M}: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("M", [448, 512])
def test_the_band_takes_the_overlapped_pair(M):
    # A448 and A512 (the registry's fixtures, as the sweeps time them) lie in the grouped band, but
    # their third gate_up round is a few CTAs: the pair runs down beside it and is the faster there
    fx = build_fixture(ShapeRegistry().resolve(f"A{M}")).to("cuda")
    call = CudaFusedArm().prepare(fx)
    assert call.identity["path"] == "prefill" and call.identity["overlap"] is True
    assert call.identity["path_rule"]["prefill_overlaps"] is True
    p = check_parity(call, References(fx), f"A{M}-band-overlap")
    assert p.passed, f"A{M}: {p.reason()} (rel_l2={p.rel_l2:.3g})"


def test_decode_sized_calls_keep_the_decode_kernel():
    call = CudaFusedArm().prepare(build_fixture(ShapeRegistry().resolve("Q8")).to("cuda"))
    # three CTAs an SM: the decode kernel zeroes its own output, one kernel a call
    assert call.identity["path"] == "decode" and call.identity["zeroing"] == "kernel"
    assert call.kernels_per_sample == 1


def test_one_hot_expert_takes_every_token():
    b = base("Q")
    M, E, top_k = 1000, b.spec.E, b.spec.top_k
    g = torch.Generator().manual_seed(41)
    others = torch.stack([torch.randperm(E - 1, generator=g)[: top_k - 1] + 1 for _ in range(M)])
    ids = torch.cat([torch.full((M, 1), 0), others], dim=1)  # expert 0: 16 blocks, the last one partial
    fx = derive(b, seed=41, topk_ids=ids)
    assert_parity(fx, run_prefill(fx, w=weights("Q")), "Q1000-hot")


def test_every_token_on_the_same_experts():
    b = base("A")
    M = 300
    ids = torch.arange(b.spec.top_k).repeat(M, 1)  # top_k experts, 300 slots each: no other expert
    fx = derive(b, seed=42, topk_ids=ids)
    assert_parity(fx, run_prefill(fx, w=weights("A")), "A300-same")


@pytest.mark.parametrize("family, M", [("Q", 1000), ("A", 777)])
def test_parity_m_not_a_multiple_of_the_block(family, M):
    fx = at(family, M, seed=43)
    assert (family != "Q") or (fx.spec.E == 512 and fx.spec.top_k == 10)
    assert_parity(fx, run_prefill(fx, w=weights(family)), f"{family}{M}")


@pytest.mark.parametrize("ctas", [1, 3])
def test_few_ctas_walk_every_item(ctas):
    # the persistent grid squeezed: one CTA takes ~400 items of each kernel, so the ring's
    # barriers wrap their phases hundreds of times across item boundaries
    fx = at("Q", 512, seed=44)
    assert_parity(fx, run_prefill(fx, w=weights("Q"), max_ctas=ctas), f"Q512-{ctas}cta")


def test_poisoned_intermediate_and_a_nonzero_output():
    fx = at("A", 1024, seed=45)
    ref = fixture_reference(fx).float()
    g = torch.Generator(device="cuda").manual_seed(45)
    before = (torch.randn(ref.shape, generator=g, device="cuda") * ref.std()).to(torch.bfloat16)
    out = run_prefill(fx, w=weights("A"), out=before.clone(), poison=True)
    assert torch.isfinite(out.float()).all()
    assert_parity(fx, out.float() - before.float(), "A1024-poisoned-accumulate", ref=ref)


def test_garbage_past_the_padded_total_is_ignored():
    fx = at("Q", 700, seed=46)
    plan = route_plan(fx.topk_ids, fx.spec.E, BLOCK_M)
    garbage = with_garbage_past_the_padded_total(plan, fx.spec.E, seed=46)
    assert garbage.sorted_token_ids.numel() > plan.padded_total and garbage.expert_ids.numel() > plan.num_blocks
    assert_parity(fx, run_prefill(fx, w=weights("Q"), plan=garbage, poison=True), "Q700-garbage")


@pytest.mark.parametrize("overlap", [False, True])
def test_blocks_with_an_expert_outside_the_range_are_skipped(overlap):
    # (with the overlap, late blocks among the skipped: down skips them too, so no flag is left raised)
    fx = at("Q", 2048, seed=47)
    plan = route_plan(fx.topk_ids, fx.spec.E, BLOCK_M)
    skip = torch.arange(1, plan.num_blocks, 7)
    experts = plan.expert_ids.clone()
    experts[skip] = torch.where(skip % 2 == 0, -1, fx.spec.E + 3).to(torch.int32)
    slots = plan.sorted_token_ids.view(-1, BLOCK_M)[skip].flatten()
    slots = slots[slots < plan.num_slots].long()
    kept = type(plan)(plan.block_m, plan.sorted_token_ids, experts, plan.num_tokens_post_padded, plan.num_slots)
    out = run_prefill(fx, w=weights("Q"), plan=kept.to("cuda"), poison=True, overlap=overlap, times=2)
    w_kept = fx.topk_weights.clone()
    w_kept.view(-1)[slots.to(w_kept.device)] = 0.0
    assert slots.numel() > 100
    assert_parity(fx, out, "Q2048-skipped", ref=fixture_reference(dataclasses.replace(fx, topk_weights=w_kept)))


OTHER_DIMS = {
    "N300 (N=1024)": (Family("N", "four requant groups", K=1024, E=16, top_k=4, N=1024, routed_scale=1.0,
                             shared_expert=False), 300, 48),
    "U200 (K=640)": (Family("U", "K no multiple of 256", K=640, E=16, top_k=4, N=512, routed_scale=1.0,
                            shared_expert=False), 200, 49),
    "K90 (K=128)": (Family("K", "one k block", K=128, E=8, top_k=2, N=256, routed_scale=1.0,
                           shared_expert=False), 90, 50),
    "R1200 (I=128, K=1024)": (Family("R", "the families' I, 4 down tiles a block", K=1024, E=16, top_k=4,
                                     N=256, routed_scale=1.0, shared_expert=False), 1200, 51),
}


@pytest.mark.parametrize("name", list(OTHER_DIMS))
def test_parity_other_dims(name):
    fam, M, seed = OTHER_DIMS[name]
    fx = build_fixture(ShapeSpec(name.split()[0], fam, M, seed=seed)).to("cuda")
    assert_parity(fx, run_prefill(fx, poison=True), name)


def test_the_intermediate_is_kept_in_plan_order_as_downs_tiles():
    # gate_up stores row r of plan block b, group g, in tile (b, g) of 64 x 128 bytes, already in the
    # wgmma's 128-byte swizzle (chunk c of row r at chunk c ^ (r % 8)), its scale at [b][g][r]: down
    # loads each tile whole. Read back and unswizzled, every real position holds its slot's
    # requantized intermediate (the oracle's), and padding positions are never written.
    from moebench.fixtures.oracle import swiglu_requant
    from moebench.fixtures.quant import dequantize_blocks, dequantize_per_token_group
    fam, M, seed = OTHER_DIMS["N300 (N=1024)"]
    fx = build_fixture(ShapeSpec("N300", fam, M, seed=seed)).to("cuda")
    plan = route_plan(fx.topk_ids, fx.spec.E, BLOCK_M)
    dims = {}
    assert_parity(fx, run_prefill(fx, plan=plan.to("cuda"), poison=True, dims_out=dims), "N300-plan-order")
    a, a_scale = dims["intermediate"]
    groups, top_k = fx.spec.I // 128, fx.spec.top_k
    blocks = plan.padded_total // BLOCK_M
    tiles = a[:blocks * BLOCK_M].view(blocks, groups, BLOCK_M, 8, 16)  # [b][g][row][stored chunk][byte]
    rows = torch.arange(BLOCK_M, device="cuda")
    unswizzled = tiles[:, :, rows[:, None], torch.arange(8, device="cuda")[None, :] ^ (rows[:, None] % 8)]
    codes = unswizzled.reshape(blocks, groups, BLOCK_M, 128).permute(0, 2, 1, 3).reshape(blocks * BLOCK_M, -1)
    scales = a_scale[:blocks * BLOCK_M].view(blocks, groups, BLOCK_M).permute(0, 2, 1).reshape(blocks * BLOCK_M, -1)
    sorted_ids = plan.sorted_token_ids[:blocks * BLOCK_M].to("cuda").long()
    real = sorted_ids < fx.M * top_k
    assert bool((~real).any()) and bool(real.sum() == fx.M * top_k)
    assert bool((codes[~real] == 0xFF).all()), "a padding position of the intermediate was written"
    x = dequantize_per_token_group(fx.x_fp8, fx.x_scale)
    experts = plan.expert_ids[:blocks].to("cuda").long().repeat_interleave(BLOCK_M)
    got = dequantize_per_token_group(codes[real].view(torch.float8_e4m3fn), scales[real])
    want = torch.empty_like(got)
    pos = torch.nonzero(real).squeeze(1)
    for e in torch.unique(experts[real]).tolist():
        mine = experts[pos] == e
        tokens = sorted_ids[pos[mine]] // top_k
        want[mine] = swiglu_requant(x[tokens] @ dequantize_blocks(fx.w1[e], fx.w1_scale[e]).T)
    err = float((got - want).norm() / want.norm())
    assert err < 2e-2, f"the intermediate by plan position is {err:.3g} from the oracle's"


def test_small_prefill_for_the_sanitizers():
    # The shape compute-sanitizer runs (memcheck and racecheck, docs/kernels.md): small enough to
    # finish under racecheck, yet every mechanism of the path: chained K ranges over several
    # chunks of one requant group's K, down in chunks, three CTAs walking many items each, a
    # second launch after the first left its flags lowered, garbage intermediates, and gate_up's
    # bulk copies zeroing a NaN-poisoned output.
    fam, M, seed = OTHER_DIMS["U200 (K=640)"]
    fx = build_fixture(ShapeSpec("U200", fam, M, seed=seed)).to("cuda")
    out = torch.full((fx.M, fx.spec.K), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert_parity(fx, run_prefill(fx, out=out, poison=True, max_ctas=3, splits=2, chunk=1, times=2, zero_out=True),
                  "U200-sanitizers")
    # and down beside gate_up's last round: its counters, late flags and the zeroing's count
    out.fill_(float("nan"))
    assert_parity(fx, run_prefill(fx, out=out, poison=True, max_ctas=3, chunk=1, times=2, zero_out=True,
                                  overlap=True), "U200-sanitizers-overlap")


@pytest.mark.parametrize("chunk, overlap", [(4, False), (3, False), (2, True)])
def test_small_prefill_at_i128_for_the_sanitizers(chunk, overlap):
    # The sanitizers' second shape: I = 128 as in both families, where a down tile is one K step.
    # About 80 plan blocks; three CTAs walk 25-55 down items each, of 4, 3 (then 1) or 2 tiles,
    # beside gate_up's last round too; the intermediate poisoned, the output NaN.
    fam, M, seed = OTHER_DIMS["R1200 (I=128, K=1024)"]
    fx = build_fixture(ShapeSpec("R1200", fam, M, seed=seed)).to("cuda")
    out = torch.full((fx.M, fx.spec.K), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert_parity(fx, run_prefill(fx, out=out, poison=True, max_ctas=3, chunk=chunk, times=2, zero_out=True,
                                  overlap=overlap), f"R1200-chunk{chunk}")


@pytest.mark.parametrize("arm, shape, path", [(CudaFusedArm, "Q8", "decode"), (CudaFusedArm, "A128", "decode"),
                                              (CudaFusedDetArm, "A8", "decode"), (CudaFusedArm, "Q1024", "prefill"),
                                              (CudaFusedArm, "A1024", "prefill"), (CudaFusedArm, "A512", "prefill")])
def test_the_arm_writes_its_output_every_call(arm, shape, path):
    # No untimed reset: each timed call writes the whole output (a poisoned one comes out right),
    # and a second call writes it again rather than adding to it.
    fx = build_fixture(ShapeRegistry().resolve(shape)).to("cuda")
    call = arm().prepare(fx)
    assert call.reset is None and call.identity["path"] == path
    ref = fixture_reference(fx).float()
    outs = []
    for _ in range(2):
        call.output.fill_(float("nan"))
        call.run()
        torch.cuda.synchronize()
        outs.append(call.output.float().clone())
        assert_parity(fx, outs[-1], f"{shape}-{path}-written", ref=ref)
    rel = (outs[0] - outs[1]).norm() / outs[0].norm()
    assert rel < 1e-2, f"two calls differ by {rel:.3g}"


# ------------------------------------------------------------------------------ the work cuts


def test_the_arm_cuts_a512_down_into_chunks():
    fx = at("A", 512, seed=47)
    call = CudaFusedArm(path="prefill").prepare(fx)
    assert call.identity["splits"] == 1 and call.identity["chunk"] < 28  # down in chunks, gate_up whole
    p = check_parity(call, References(fx), "A512-cut")
    assert p.passed, f"A512-cut: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("family, M", [("A", 4096), ("Q", 4096)])
def test_a_chunk_of_one_tile_through_the_arm(family, M):
    """`chunk=1` (a --variant of the arm): down walks tile by tile over every block."""
    fx = at(family, M, seed=53)
    call = CudaFusedArm(chunk=1).prepare(fx)
    assert call.identity["path"] == "prefill" and call.identity["chunk"] == 1
    assert call.identity["cut_by"] == "arm options"
    p = check_parity(call, References(fx), f"{family}{M}-c1")
    assert p.passed, f"{family}{M}-c1: {p.reason()} (rel_l2={p.rel_l2:.3g})"


@pytest.mark.parametrize("family, M, splits, chunk", [
    ("A", 256, 4, 3), ("A", 512, 3, 10), ("Q", 256, 2, 1), ("Q", 512, 4, 3),
    ("A", 777, 2, 5), ("Q", 1000, 3, 8),
])
def test_parity_with_k_ranges_and_chunks(family, M, splits, chunk):
    fx = at(family, M, seed=48 + M % 101)
    assert_parity(fx, run_prefill(fx, w=weights(family), splits=splits, chunk=chunk, times=2),
                  f"{family}{M}-s{splits}-c{chunk}")


@pytest.mark.parametrize("ctas", [1, 3])
def test_chained_k_ranges_on_few_ctas(ctas):
    # one CTA runs every K range of a (block, group) itself, in order; three CTAs wait on each other
    fx = at("Q", 512, seed=49)
    assert_parity(fx, run_prefill(fx, w=weights("Q"), max_ctas=ctas, splits=4, chunk=3), f"Q512-{ctas}cta-s4")


def one_hot(M: int, seed: int):
    """Family A at M tokens, expert 0 in every token's routes (M / 64 full blocks), the others drawn."""
    b = base("A")
    E, top_k = b.spec.E, b.spec.top_k
    g = torch.Generator().manual_seed(seed)
    others = torch.stack([torch.randperm(E - 1, generator=g)[: top_k - 1] + 1 for _ in range(M)])
    return derive(b, seed=seed, topk_ids=torch.cat([torch.full((M, 1), 0), others], dim=1))


def test_one_hot_expert_with_k_ranges():
    fx = one_hot(512, seed=50)
    assert_parity(fx, run_prefill(fx, w=weights("A"), splits=3, chunk=7), "A512-hot-s3")


def test_e512_top10_poisoned_with_k_ranges():
    fx = at("Q", 512, seed=51)
    assert fx.spec.E == 512 and fx.spec.top_k == 10
    ref = fixture_reference(fx).float()
    g = torch.Generator(device="cuda").manual_seed(51)
    before = (torch.randn(ref.shape, generator=g, device="cuda") * ref.std()).to(torch.bfloat16)
    out = run_prefill(fx, w=weights("Q"), out=before.clone(), poison=True, splits=4, chunk=2)
    assert torch.isfinite(out.float()).all()
    assert_parity(fx, out.float() - before.float(), "Q512-poisoned-s4", ref=ref)


# ------------------------------------------------------------------------------ down beside gate_up


@pytest.mark.parametrize("family, M, max_ctas, splits, chunk", [
    ("A", 512, None, None, None), ("A", 1024, None, None, None), ("Q", 2048, None, None, None),
    ("A", 4096, None, None, None), ("Q", 512, 8, None, None), ("A", 777, 20, 2, 5), ("Q", 1000, 5, 3, 8),
    ("A", 256, None, None, None),
])
@pytest.mark.parametrize("zero_out", [True, False])
def test_parity_with_down_beside_gate_up(family, M, max_ctas, splits, chunk, zero_out):
    # down launched as gate_up's dependent and run beside its last round (forced), on fresh inputs,
    # a poisoned intermediate, an output that is NaN (zeroed by gate_up) or not zero (added into),
    # three launches in a row (each leaves every counter and flag at 0); A256 has one gate_up round
    # (no late blocks: down waits on the counter alone)
    fx = at(family, M, seed=60 + M % 97)
    ref = fixture_reference(fx).float()
    if zero_out:
        before = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    else:
        g = torch.Generator(device="cuda").manual_seed(61)
        before = (torch.randn(ref.shape, generator=g, device="cuda") * ref.std()).to(torch.bfloat16)
    out = run_prefill(fx, w=weights(family), out=before.clone(), poison=True, max_ctas=max_ctas, splits=splits,
                      chunk=chunk, times=3, zero_out=zero_out, overlap=True)
    assert torch.isfinite(out.float()).all()
    got = out.float() if zero_out else out.float() - before.float()
    assert_parity(fx, got, f"{family}{M}-overlap-{'written' if zero_out else 'added'}", ref=ref)


def test_one_hot_expert_beside_gate_up():
    fx = one_hot(1024, seed=62)
    assert_parity(fx, run_prefill(fx, w=weights("A"), overlap=True, zero_out=True, times=2), "A1024-hot-overlap")


@pytest.mark.parametrize("shape, overlap", [("A512", True), ("A1024", True), ("A2048", False), ("Q4096", False)])
def test_the_arm_overlaps_where_the_model_says(shape, overlap):
    fx = build_fixture(ShapeRegistry().resolve(shape)).to("cuda")
    call = CudaFusedArm(path="prefill").prepare(fx)
    assert call.identity["overlap"] is overlap and call.identity["kernels"] == list(kernel_names(overlap))
    grids = call.identity["grids"]
    assert (grids[1][0] < grids[0][0]) is overlap  # beside: down leaves the last round's SMs to gate_up
    p = check_parity(call, References(fx), f"{shape}-auto-overlap")
    assert p.passed, f"{shape}: {p.reason()} (rel_l2={p.rel_l2:.3g})"
