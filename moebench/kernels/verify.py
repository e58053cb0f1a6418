"""Verification: run arms once on inputs they were never tuned on and compare with the oracle.

Each case derives a fixture from the shape's (same weights, fresh activations and routes,
`moebench.fixtures.derive`), prepares each arm on it, poisons the output, runs once and
compares (moebench.kernels.api.parity). The edge cases are the ones a route plan gets wrong
first: one token, every token on the same experts, experts without tokens, and M one past a
multiple of the block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, derive
from moebench.kernels.api.arm import geometry_refusals
from moebench.kernels.api.parity import Parity, References, check_parity
from moebench.kernels.registry import make_arms

EDGE_CASE_M = 64 + 3  # one past a multiple of the stock BLOCK_SIZE_M (64) and of every smaller one


@dataclass(frozen=True)
class VerifyCase:
    label: str  # "fresh" or the edge case's name
    fixture: Fixture


def _routes_on(fx: Fixture, experts: list[int], M: int) -> torch.Tensor:
    """[M, top_k] ids: every row takes its routed experts from `experts` (rotating), the shared
    expert last when the family has one."""
    fam = fx.spec.family
    k = fam.routed_top_k
    if len(experts) < k:
        raise ValueError(f"need at least {k} experts, got {len(experts)}")
    rows = [[experts[(m + j) % len(experts)] for j in range(k)] for m in range(M)]
    ids = torch.tensor(rows, dtype=torch.int32)
    if fam.shared_expert:
        ids = torch.cat([ids, torch.full((M, 1), fam.E - 1, dtype=torch.int32)], dim=1)
    return ids


def empty_expert_set(routed: int, k: int) -> list[int]:
    """The experts the "empty experts" case routes to: every other one (at most half), and as many
    of the rest as a row of k distinct experts needs, so that one expert or more stays empty
    wherever the routed experts outnumber k (a rank of few experts, e.g. under wide expert
    parallelism, has fewer than 2k)."""
    evens, odds = list(range(0, routed, 2)), list(range(1, routed, 2))
    need = min(routed, k + 1)
    return (evens + odds[: max(0, need - len(evens))])[: max(need, routed // 2)]


def edge_cases(fx: Fixture, seed: int) -> list[VerifyCase]:
    """M=1; every token on the same top_k experts (M=67, so each of them gets 67 slots: a full
    block of 64 and a partial one); half the experts empty; M=67 with the shape's routing."""
    fam = fx.spec.family
    k, routed = fam.routed_top_k, fam.routed_experts
    M = max(fx.M, 4)
    return [
        VerifyCase("M=1", derive(fx, seed, M=1)),
        VerifyCase("one expert set", derive(fx, seed + 1, topk_ids=_routes_on(fx, list(range(k)), EDGE_CASE_M))),
        VerifyCase("empty experts", derive(fx, seed + 2, topk_ids=_routes_on(fx, empty_expert_set(routed, k), M))),
        VerifyCase(f"M={EDGE_CASE_M}", derive(fx, seed + 3, M=EDGE_CASE_M)),
    ]


def verify_cases(fx: Fixture, seed: int | None = None, *, with_edge_cases: bool = False) -> list[VerifyCase]:
    seed = fx.spec.seed + 1 if seed is None else seed
    cases = [VerifyCase("fresh", derive(fx, seed))]
    if with_edge_cases:
        cases += edge_cases(fx, seed + 1)
    return cases


def verify_arms(fx: Fixture, arm_names: list[str], *, options: dict | None = None, seed: int | None = None,
                with_edge_cases: bool = False, threshold: float | None = None,
                log=lambda line: None) -> list[Parity]:
    """One Parity row per (case, arm); raises UserError if an arm cannot run on fx's device. An arm
    that refuses a case's geometry (Arm.refuses) is not run there: `log` gets its one line, and
    a case no arm can serve is a UserError. `threshold`: a fixed relative-L2 limit instead of
    each arm's error model."""
    options = options or {}
    arms = make_arms(arm_names, options)
    for arm in arms:
        reason = arm.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {arm.name!r} cannot run here: {reason}")
    rows = []
    for case in verify_cases(fx, seed, with_edge_cases=with_edge_cases):
        shape = fx.spec.name if case.label == "fresh" else f"{fx.spec.name} {case.label}"
        refused = geometry_refusals(arms, [case.fixture.spec])
        for line in refused.values():
            log(f"refused, not checked: {line} ({shape})")
        refs = References(case.fixture)
        for arm in arms:
            if (case.fixture.spec.name, arm.name) in refused:
                continue
            call = arm.prepare(case.fixture)
            rows.append(check_parity(call, refs, shape, threshold))
    return rows
