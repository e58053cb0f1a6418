"""`moebench run --determinism`: the checks of moebench.determinism.checks on the calls a run times.

A stage between preparing (moebench.run.prepare: every arm checked against the oracle) and the
first timed round. For every timed (shape, arm): the run-to-run check runs the very prepared
call the rounds will time, the batch check prepares the arm on the fixture's first 1, 8 tokens
and on the fixture grown by M tokens, and one fresh process per fixture hashes the output of
every arm it can make again. The verdicts are the same records `verify --determinism` writes,
kept in the run's RunResult.determinism.

Before timing, not after: a partial result saved after the first round already carries them,
and nothing the checks leave behind lands in a timed round. The calls' outputs hold the last
check run's bits (every sample resets them); the batches' calls and the fixtures held for the
checks are dropped, the device synchronised and the allocator's cache emptied, so the rounds
start on the memory the run would have had without the checks. A resumed run keeps the file's verdicts (moebench.run.runner).
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Callable

import torch

from moebench.determinism.checks import across_processes, batch_sizes, check_prepared
from moebench.failures import gpu_memory_guard
from moebench.record.determinism import DeterminismVerdict
from moebench.run.plan import ArmPlan
from moebench.run.prepare import Made, Prepared


def with_determinism(plan: ArmPlan, prep: Prepared, log: Callable[[str], None] = lambda m: None) -> Prepared:
    """`prep` with its subjects carrying every timed unit's verdicts (unchanged unless the
    request asks for them). The fixtures `prep.made` held for the checks are let go."""
    if plan.determinism is None or not prep.made:
        return prep
    device = prep.made[0].fixture.device
    verdicts = check_units(prep.made, runs=plan.determinism.runs, cross_process=plan.determinism.cross_process,
                           options=plan.options, external=plan.external_arms, log=log)
    prep.made.clear()  # the calls stay alive in keep_alive; a fixture no call uses is freed
    _settle(device)
    return replace(prep, subjects=replace(prep.subjects, determinism=tuple(verdicts)))


def check_units(made: list[Made], *, runs: int, cross_process: bool, options: dict | None = None,
                external: tuple[str, ...] = (),
                log: Callable[[str], None] = lambda m: None) -> list[DeterminismVerdict]:
    """The verdicts of each unit's arm on its call, fixture by fixture in the units' order."""
    verdicts: list[DeterminismVerdict] = []
    by_fixture: dict[str, list[Made]] = {}
    for m in made:
        by_fixture.setdefault(m.fixture.spec.name, []).append(m)
    for shape, units in by_fixture.items():
        fx = units[0].fixture
        rows = ", ".join(map(str, batch_sizes(fx.M)))
        checked = []
        for m in units:
            log(f"{shape}: determinism of {m.arm.name} ({runs} runs; rows of {rows} tokens inside larger batches)")
            with gpu_memory_guard(f"checking the determinism of {m.arm.name} at {shape}", device=fx.device):
                checked.append(check_prepared(m.arm, fx, m.call, runs=runs))
        if cross_process:
            log(f"{shape}: output hashes in a fresh process")
            verdicts += across_processes(fx, checked, options=options, external=external)
        else:
            verdicts += [v for v, _ in checked]
    return verdicts


def _settle(device: torch.device) -> None:
    """The checks' batches freed and their work finished before anything is timed."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
