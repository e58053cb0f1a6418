"""`moebench verify`'s work: arms run once on fresh inputs (not the timed fixture's) and
compared with the oracle, on the GPU or, for Triton arms, the CPU interpreter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.registry import default_arms
from moebench.kernels.stock.arms import use_interpreter
from moebench.kernels.verify import verify_arms


@dataclass(frozen=True)
class VerifyRequest:
    shapes: tuple[str, ...]
    arms: tuple[str, ...] | None  # None: every built-in arm that can run here
    options: dict
    interpret: bool = False
    seed: int | None = None
    edge_cases: bool = False
    threshold: float | None = None  # a fixed relative-L2 limit instead of the arms' error models
    balancedness: float = 0.8
    shapes_file: str | None = None
    max_fixture_gb: float = 16.0
    external_arms: tuple[str, ...] = ()  # `--arm NAME=module:factory` (with --determinism)


def _setup(req: VerifyRequest, log: Callable[[str], None]) -> tuple[list, list[str], torch.device]:
    """The request's shape specs, arm names and device (user mistakes as UserError)."""
    registry = ShapeRegistry(max_fixture_gb=req.max_fixture_gb)
    if req.shapes_file:
        registry = registry.with_shapes_file(req.shapes_file)
    specs = registry.resolve_many(list(req.shapes), balancedness=req.balancedness)
    if req.threshold is not None and not req.threshold > 0:
        raise UserError(f"--threshold must be positive, got {req.threshold}")
    if req.interpret:
        use_interpreter(True)
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        raise UserError("no CUDA device here; --interpret runs the Triton kernels on the CPU")
    names = list(req.arms) if req.arms is not None else None
    if names is None and req.external_arms:
        names = []  # only the --arm arms
    if names is None:
        names, skipped = default_arms(device, req.options)
        if skipped:
            log("arms left out: " + "; ".join(f"{n} ({why})" for n, why in skipped))
        if not names:
            raise UserError("no arm can run here")
    return specs, names, device


def verify(req: VerifyRequest, log: Callable[[str], None] = lambda m: None, *,
           command: list[str] | None = None) -> tuple[list, torch.device, object]:
    """Every check's row (moebench.kernels.verify), the device they ran on, and the rows as a
    RunResult (moebench.determinism.result.checks_result) for `--out`."""
    from moebench.determinism.result import checks_result, fixture_info
    from moebench.record.provenance import utc_now
    specs, names, device = _setup(req, log)
    started_at = utc_now()
    rows, infos = [], []
    for spec in specs:
        fx = build_fixture(spec).to(device)
        infos.append(fixture_info(fx))
        rows += verify_arms(fx, names, options=req.options, seed=req.seed, with_edge_cases=req.edge_cases,
                            threshold=req.threshold, log=log)
        del fx
    options = {**req.options, "edge_cases": req.edge_cases or None, "seed": req.seed, "threshold": req.threshold}
    result = checks_result(infos, command=list(command or ["moebench", "verify"]), started_at=started_at,
                           device=device, options=options, parity=rows) if rows else None
    return rows, device, result


def verify_determinism(req: VerifyRequest, *, runs: int | None, cross_process: bool, command: list[str],
                       log: Callable[[str], None] = lambda m: None):
    """`verify --determinism`: every arm's verdicts at every shape, the device, and the
    verdicts as a RunResult (moebench.determinism.result) for `--out`."""
    from moebench.determinism.checks import DEFAULT_RUNS, check_arms
    from moebench.determinism.result import determinism_result
    from moebench.kernels.api.external import parse_external_arm
    from moebench.record.provenance import utc_now
    runs = DEFAULT_RUNS if runs is None else runs
    if runs < 2:
        raise UserError(f"--runs must be at least 2, got {runs}")
    specs, names, device = _setup(req, log)
    names = list(names) + [parse_external_arm(t)[0] for t in req.external_arms]
    started_at = utc_now()
    verdicts, fixtures = [], []
    for spec in specs:
        fx = build_fixture(spec).to(device)
        fixtures.append(fx)
        verdicts += check_arms(fx, names, options=req.options, external=tuple(req.external_arms), runs=runs,
                               cross_process=cross_process, seed=req.seed)
    result = determinism_result(verdicts, fixtures, command=command, started_at=started_at, device=device,
                                options={**req.options, "runs": runs})
    return verdicts, device, result
