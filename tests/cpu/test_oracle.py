"""The oracle against an independent, slow, per-token loop."""

import pytest
import torch
import torch.nn.functional as F

from moebench.fixtures import build_fixture, derive, fixture_reference, rel_l2_error


def slow_reference(fx) -> torch.Tensor:
    """Token by token, slot by slot, scalar scales applied by explicit indexing."""
    M, K = fx.x_fp8.shape
    N = fx.w1.shape[1]
    inter = N // 2
    out = torch.zeros(M, K, dtype=torch.float64)
    for t in range(M):
        x = torch.tensor([float(fx.x_fp8[t, k]) * float(fx.x_scale[t, k // 128]) for k in range(K)],
                         dtype=torch.float64)
        for j in range(fx.topk_ids.shape[1]):
            e = int(fx.topk_ids[t, j])
            w1 = fx.w1[e].double() * fx.w1_scale[e].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
            w2 = fx.w2[e].double() * fx.w2_scale[e].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
            h = w1 @ x
            a = F.silu(h[:inter]) * h[inter:]
            # per-group FP8 requant, written out longhand
            deq = torch.empty_like(a)
            for g0 in range(0, inter, 128):
                grp = a[g0:g0 + 128].float()
                scale = max(float(grp.abs().max()) / 448.0, 1e-10)
                codes = (grp / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
                deq[g0:g0 + 128] = codes.double() * scale
            out[t] += float(fx.topk_weights[t, j]) * (w2 @ deq)
    return out


@pytest.mark.parametrize("name", ["T1", "T5", "T16"])
def test_oracle_equals_slow_loop(registry, name):
    fx = build_fixture(registry.resolve(name))
    ref = fixture_reference(fx)
    slow = slow_reference(fx)
    assert ref.dtype == torch.bfloat16 and ref.shape == slow.shape
    assert rel_l2_error(ref.double(), slow) < 4e-3  # BF16 output rounding only
    assert (ref.double() - slow).abs().max() <= 2 ** -7 * slow.abs().max()


def test_oracle_on_edge_routes(registry):
    fx = build_fixture(registry.resolve("T8"))
    one_hot = derive(fx, seed=11, topk_ids=torch.tensor([[3, 5]] * 6, dtype=torch.int32))
    assert rel_l2_error(fixture_reference(one_hot).double(), slow_reference(one_hot)) < 4e-3


def test_oracle_detects_wrong_expert(registry):
    """A kernel that used the wrong expert's weights would fail the parity bar by far."""
    fx = build_fixture(registry.resolve("T8"))
    wrong = derive(fx, seed=0, topk_ids=(fx.topk_ids + 1) % fx.spec.E)
    wrong = type(fx)(**{**wrong.__dict__, "x_fp8": fx.x_fp8, "x_scale": fx.x_scale,
                        "topk_weights": fx.topk_weights})
    assert rel_l2_error(fixture_reference(wrong), fixture_reference(fx)) > 0.5
