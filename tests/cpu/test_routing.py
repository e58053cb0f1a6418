"""Route plans: moe_align_block_size invariants, over random top-k tables."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moebench.fixtures import plan_capacity, route_plan


@st.composite
def topk_tables(draw):
    E = draw(st.integers(1, 12))
    top_k = draw(st.integers(1, E))
    M = draw(st.integers(1, 40))
    rows = [draw(st.permutations(range(E)))[:top_k] for _ in range(M)]
    return torch.tensor(rows, dtype=torch.int32), E


@settings(max_examples=200, deadline=None)
@given(table=topk_tables(), block_m=st.sampled_from([1, 2, 3, 8, 16, 64]))
def test_route_plan_invariants(table, block_m):
    ids, E = table
    plan = route_plan(ids, E, block_m)
    M, top_k = ids.shape
    slots = M * top_k
    flat = ids.reshape(-1).long()
    total = plan.padded_total
    sorted_ids = plan.sorted_token_ids.long()

    assert plan.sentinel == slots
    assert sorted_ids.numel() == plan_capacity(slots, E, block_m) >= total
    assert total % block_m == 0
    live = sorted_ids[:total]
    real = live[live != slots]
    # every slot appears exactly once
    assert sorted(real.tolist()) == list(range(slots))
    # past the padded total: only sentinels and -1 experts
    assert torch.all(sorted_ids[total:] == slots)
    assert torch.all(plan.expert_ids[total // block_m:] == -1)
    # one expert per block; each block's real slots belong to that expert
    blocks = live.reshape(-1, block_m)
    experts = plan.expert_ids[: total // block_m].long()
    for block, e in zip(blocks, experts):
        members = block[block != slots]
        assert members.numel() > 0, "a block with no real slot is wasted padding"
        assert torch.all(flat[members] == e)
    # groups: experts ascending, padding only at the end of each group, slot order kept
    assert torch.all(experts[1:] >= experts[:-1])
    for e in experts.unique().tolist():
        group = blocks[experts == e].reshape(-1)
        real_part = group[group != slots]
        assert torch.all(group[: real_part.numel()] == real_part)
        assert torch.all(real_part[1:] > real_part[:-1])
        count = int((flat == e).sum())
        assert group.numel() == (count + block_m - 1) // block_m * block_m


def test_route_plan_known_example():
    ids = torch.tensor([[2, 0], [0, 1], [2, 1]], dtype=torch.int32)
    plan = route_plan(ids, num_experts=4, block_m=2)
    S = 6
    assert plan.sorted_token_ids[: plan.padded_total].tolist() == [1, 2, 3, 5, 0, 4]
    assert plan.expert_ids.tolist()[:3] == [0, 1, 2]
    ids = torch.tensor([[3]], dtype=torch.int32)
    plan = route_plan(ids, num_experts=4, block_m=4)
    assert plan.sorted_token_ids[:4].tolist() == [0, 1, 1, 1]
    assert plan.padded_total == 4 and plan.expert_ids[0] == 3
    assert S == 6


def test_route_plan_rejects_bad_ids():
    import pytest
    with pytest.raises(ValueError):
        route_plan(torch.tensor([[5]]), num_experts=4, block_m=2)
    with pytest.raises(ValueError):
        route_plan(torch.tensor([[1]]), num_experts=4, block_m=0)
