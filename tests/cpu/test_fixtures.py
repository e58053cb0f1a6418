"""Fixtures: determinism, FP8 quantization, routing structure, floors."""

import json
import os
import subprocess
import sys

import pytest
import torch

from moebench.fixtures import build_fixture, derive
from moebench.fixtures.builder import fixture_routes
from moebench.fixtures.quant import (FP8, FP8_MAX, dequantize_blocks, dequantize_per_token_group,
                                     quantize_blocks, quantize_per_token_group, random_fp8_codes)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fixtures_json(shapes: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "moebench", "fixtures", "--shape", shapes, "--json"],
                         check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(out.stdout)


def test_fingerprints_identical_across_processes():
    first, second = _fixtures_json("A8,Q128"), _fixtures_json("A8,Q128")
    a8, q128 = first
    assert (a8["M"], a8["K"], a8["E"], a8["top_k"], a8["N"]) == (8, 7168, 257, 9, 256)
    assert (q128["M"], q128["K"], q128["E"], q128["top_k"], q128["N"]) == (128, 2048, 512, 10, 256)
    assert [s["fingerprint"] for s in first] == [s["fingerprint"] for s in second]
    assert a8["fingerprint"] != q128["fingerprint"]


def test_same_spec_same_bytes_other_seed_other_bytes(registry):
    a, b = build_fixture(registry.resolve("T16")), build_fixture(registry.resolve("T16"))
    c = build_fixture(registry.resolve("T16", seed=1))
    assert a.fingerprint == b.fingerprint
    assert torch.equal(a.w1.view(torch.uint8), b.w1.view(torch.uint8))
    assert c.fingerprint != a.fingerprint


def test_default_seeds(registry):
    assert registry.resolve("A8").seed == 28101
    assert registry.resolve("Q128").seed == 28104
    assert registry.resolve("T8").seed == registry.resolve("t8").seed  # derived, stable


def test_per_token_group_round_trip_within_fp8_precision():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 512, generator=g) * torch.logspace(-3, 3, 7).unsqueeze(1)
    codes, scale = quantize_per_token_group(x)
    assert codes.dtype == FP8 and scale.shape == (7, 4)
    back = dequantize_per_token_group(codes, scale)
    # e4m3: 3 mantissa bits, so relative rounding error <= 2^-4 for normals; subnormal
    # codes (below 2^-6 in code units) have an absolute step of 2^-9 code units.
    bound = 2.0 ** -4 * x.abs() + scale.repeat_interleave(128, dim=1) * 2.0 ** -9
    assert torch.all((back - x).abs() <= bound)
    # the largest element of each group maps to the largest code
    amax_codes = codes.float().reshape(7, 4, 128).abs().amax(-1)
    assert torch.all(amax_codes == FP8_MAX)


def test_all_zero_group_stays_zero():
    x = torch.zeros(2, 256)
    x[1, 128:] = 1.0
    codes, scale = quantize_per_token_group(x)
    assert torch.all(codes.float()[0] == 0) and torch.all(scale > 0)
    assert torch.equal(dequantize_per_token_group(codes, scale), x)


def test_block_round_trip_within_fp8_precision():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(2, 256, 384, generator=g)
    codes, scale = quantize_blocks(w)
    assert scale.shape == (2, 2, 3)
    back = dequantize_blocks(codes, scale)
    block_scale = scale.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    bound = 2.0 ** -4 * w.abs() + block_scale * 2.0 ** -9
    assert torch.all((back - w).abs() <= bound)


def test_fixture_weights_are_exact_block_quantizations(registry):
    """Re-quantizing the dequantized fixture weights gives back the same codes and scales."""
    fx = build_fixture(registry.resolve("T8"))
    for codes, scale in ((fx.w1, fx.w1_scale), (fx.w2, fx.w2_scale)):
        again_codes, again_scale = quantize_blocks(dequantize_blocks(codes, scale))
        assert torch.equal(again_codes.view(torch.uint8), codes.view(torch.uint8))
        torch.testing.assert_close(again_scale, scale, rtol=1e-6, atol=0)


def test_random_codes_have_no_nan_and_both_signs():
    codes = random_fp8_codes(1 << 16, torch.Generator().manual_seed(5))
    values = codes.view(FP8).float()
    assert torch.isfinite(values).all()
    assert values.abs().min() >= 2 and values.abs().max() == FP8_MAX
    assert 0.45 < (values > 0).float().mean() < 0.55


def test_nothing_is_zero(registry):
    fx = build_fixture(registry.resolve("T32"))
    assert fx.x_fp8.float().abs().sum(dim=1).min() > 0
    for w in (fx.w1, fx.w2):  # random codes have magnitude >= 2: no zero anywhere
        assert torch.all(w.float().abs() >= 2)
    assert torch.all(fx.topk_weights > 0)


def test_routes_alone_equal_the_fixtures(registry):
    spec = registry.resolve("Q8")
    ids, weights = fixture_routes(spec)
    fx = build_fixture(spec)
    assert torch.equal(ids, fx.topk_ids) and torch.equal(weights, fx.topk_weights)


@pytest.mark.parametrize("name", ["A8", "A128"])
def test_a_family_rows_hold_shared_expert_and_distinct_routed(registry, name):
    spec = registry.resolve(name)
    ids, weights = fixture_routes(spec)
    assert ids.shape == (spec.M, 9)
    assert torch.all(ids[:, -1] == 256) and torch.all(weights[:, -1] == 1.0)
    routed = ids[:, :-1]
    assert torch.all((routed >= 0) & (routed < 256))
    for row in routed.tolist():
        assert len(set(row)) == len(row)
    torch.testing.assert_close(weights[:, :-1].sum(1), torch.full((spec.M,), 2.5))


def test_balancedness_skews_routing(registry):
    def tokens_per_expert(b):
        ids, _ = fixture_routes(registry.resolve("Q128", balancedness=b))
        counts = torch.bincount(ids.reshape(-1).long())
        return counts[counts > 0]
    flat, skewed = tokens_per_expert(1.0), tokens_per_expert(0.0)
    assert skewed.max() > flat.max()
    assert flat.numel() > skewed.numel()  # a Zipf draw concentrates on fewer experts


def test_floors_count_routed_experts_only(registry):
    fx = build_fixture(registry.resolve("T4"))
    f = fx.floors()
    s = fx.spec
    experts = len(set(fx.topk_ids.reshape(-1).tolist()))
    assert f.experts_routed == experts
    per_expert = s.N * s.K + s.K * s.I + 4 * ((s.N // 128) * (s.K // 128) + (s.K // 128) * (s.I // 128))
    assert f.weight_bytes == experts * per_expert
    assert f.output_bytes == 2 * fx.M * s.K
    assert f.flops == fx.M * s.top_k * 2 * (s.N * s.K + s.K * s.I)


def test_derive_keeps_weights_and_redraws_inputs(registry):
    fx = build_fixture(registry.resolve("T8"))
    d = derive(fx, seed=9)
    assert d.w1 is fx.w1 and d.fingerprint != fx.fingerprint
    assert not torch.equal(d.x_fp8.view(torch.uint8), fx.x_fp8.view(torch.uint8))
    hot = derive(fx, seed=9, topk_ids=torch.zeros(5, 2, dtype=torch.int32).add_(torch.tensor([3, 5])))
    assert hot.M == 5 and hot.x_fp8.shape == (5, 256)
