"""The portable samplers: their distributions, their exp/log accuracy, and that chunking and the
draw order are what the builder's docstring says."""

import math

import pytest
import torch

from moebench.fixtures import portable
from moebench.fixtures.builder import fixture_routes


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def test_uniform_is_the_low_53_bits_of_each_word_as_torch_rand_takes_them():
    words = portable.random_words(1000, _gen())
    u = portable.uniform(1000, _gen())
    expected = [(w % 2**53) / 2**53 for w in words.tolist()]
    assert torch.equal(u, torch.rand(1000, generator=_gen(), dtype=torch.float64))
    assert u.tolist() == expected and float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_uniform_range_stays_inside_its_bounds():
    u = portable.uniform_range((200_000,), 0.5, 2.0, _gen())
    assert u.dtype == torch.float32 and float(u.min()) >= 0.5 and float(u.max()) <= 2.0
    assert abs(float(u.double().mean()) - 1.25) < 0.01


def test_normal_has_unit_variance_on_its_exact_grid():
    x = portable.normal((1 << 20,), _gen()).double()
    assert abs(float(x.mean())) < 0.01 and abs(float(x.var()) - 1.0) < 0.01
    assert float(x.abs().max()) <= 6.0 and bool(((x * 2**16) == (x * 2**16).round()).all())
    # tails near the normal's, within Irwin-Hall's: P(|x| > 3) is 0.0027 for N(0, 1)
    assert 0.0015 < float((x.abs() > 3).double().mean()) < 0.0035


def test_normal_does_not_depend_on_the_chunk_size(monkeypatch):
    whole = portable.normal((3, 1001), _gen(5))
    monkeypatch.setattr(portable, "_CHUNK_VALUES", 64)
    assert torch.equal(portable.normal((3, 1001), _gen(5)), whole)


def test_exp_and_log_match_libm_closely():
    x = torch.linspace(-16, 16, 20001, dtype=torch.float64)
    assert float(((portable.exp(x) - torch.exp(x)) / torch.exp(x)).abs().max()) < 1e-13
    u = torch.cat([portable.uniform(100_000, _gen()).clamp_min(1e-300),
                   torch.tensor([1e-300, 2**-53, 0.5, 1 - 2**-53, 1.0, 3.0], dtype=torch.float64)])
    assert float((portable.log(u) - torch.log(u)).abs().max()) < 1e-13
    assert portable.log(torch.tensor([1.0], dtype=torch.float64)).item() == 0.0


def test_exp_refuses_arguments_it_is_not_accurate_for():
    with pytest.raises(ValueError, match="outside"):
        portable.exp(torch.tensor([20.0], dtype=torch.float64))


def test_softmax_rows_match_torch_and_sum_to_one():
    logits = portable.normal((500, 8), _gen())
    p = portable.softmax(logits)
    assert float((p - torch.softmax(logits.double(), dim=1)).abs().max()) < 1e-14
    assert all(math.isclose(r, 1.0, abs_tol=1e-15) for r in p.sum(dim=1).tolist())


def test_fixture_routes_equal_the_built_fixtures(registry):
    from moebench.fixtures import build_fixture
    spec = registry.resolve("T8")
    ids, weights = fixture_routes(spec)
    fx = build_fixture(spec)
    assert torch.equal(ids, fx.topk_ids) and torch.equal(weights, fx.topk_weights)
