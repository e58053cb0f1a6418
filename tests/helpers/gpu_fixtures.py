"""Fixtures on the GPU, built once a process for every GPU test module that asks."""

import functools

import torch

from moebench.fixtures import ShapeRegistry, build_fixture


@functools.lru_cache(maxsize=None)
def cuda_fixture(name: str):
    return build_fixture(ShapeRegistry().resolve(name)).to("cuda")


def with_garbage_past_the_padded_total(plan, E: int, seed: int):
    """`plan` on the GPU with random slot ids past its padded total and random experts past its
    real blocks: entries a kernel must never read."""
    total, blocks = plan.padded_total, plan.num_blocks
    g = torch.Generator().manual_seed(seed)
    ids, experts = plan.sorted_token_ids.clone(), plan.expert_ids.clone()
    ids[total:] = torch.randint(0, plan.num_slots, (ids.numel() - total,), generator=g, dtype=torch.int32)
    experts[blocks:] = torch.randint(0, E, (experts.numel() - blocks,), generator=g, dtype=torch.int32)
    return type(plan)(plan.block_m, ids, experts, plan.num_tokens_post_padded, plan.num_slots).to("cuda")
