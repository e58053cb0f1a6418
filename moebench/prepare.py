"""Prepare a plan's arms on its fixtures: fixtures on the device, every arm prepared and
checked against the oracle, builds' outputs compared bit for bit. Untimed.

An arm that fails parity is never timed: the run stops with every failure named, or with
`keep_going` that arm is left out at that shape and the rest is timed (moebench.failures).
Running out of GPU memory while moving a fixture, computing its oracle or preparing an arm is
one line naming which and the fixture's size. What comes out is the timed units
(moebench.measure), the records a result keeps of what was timed (fixtures, arms with their
declared kernels and identities, parity), and with `--determinism` what each unit was made
from (the fixture, the arm, the prepared call), which moebench.run_determinism checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.failures import (  # noqa: F401  (RunFailed: raised here, caught by the CLI)
    ParityFailure, RunFailed, excluded_line, gpu_memory_guard, kernel_fault_guard, parity_exclusions, tensor_bytes)
from moebench.fixtures import Fixture, build_fixture
from moebench.fixtures.builder import TENSOR_FIELDS
from moebench.fixtures.summary import fixture_summary
from moebench.kernels.arm import Arm, PreparedCall
from moebench.kernels.registry import make_arms
from moebench.kernels.builds import compare_outputs
from moebench.kernels.cuda_build import CudaBuildError
from moebench.kernels.parity import References, check_parity
from moebench.plan import ArmPlan, RunRequest, resolve_specs
from moebench.results import schema as S
from moebench.results.determinism_records import DeterminismVerdict
from moebench.timing.engine import Unit


@dataclass(frozen=True)
class Subjects:
    """What a result records of the things it timed, beside the samples."""

    shapes: tuple[str, ...]
    arms: tuple[str, ...]  # labels, in the order odd rounds run them
    ref: str
    hbm_bytes: dict[str, int]  # per shape: the bytes one call must move (0: not known)
    fixtures: tuple[S.FixtureInfo, ...] = ()
    arm_infos: tuple[S.ArmInfo, ...] = ()
    parity: tuple[S.ParityInfo, ...] = ()
    build_parity: tuple[S.BuildParity, ...] = ()
    balancedness: float = 0.8
    determinism: tuple[DeterminismVerdict, ...] = ()  # `run --determinism`: per timed (shape, arm)


@dataclass(frozen=True)
class Made:
    """What one timed unit was made from: its fixture on the device, its arm, its prepared call."""

    fixture: Fixture
    arm: Arm
    call: PreparedCall


@dataclass
class Prepared:
    subjects: Subjects
    units: list[Unit]
    keep_alive: list = field(default_factory=list)  # the prepared calls the units' closures use
    # With --determinism, per unit in the units' order, until the checks are done (a fixture whose
    # tensors no call keeps, as when an arm lays its weights out anew, is not held while timing).
    made: list[Made] = field(default_factory=list)
    excluded: set[tuple[str, str]] = field(default_factory=set)  # (shape, arm) failed the oracle: not timed


def prepare(req: RunRequest, plan: ArmPlan, device: torch.device,
            log: Callable[[str], None] = lambda m: None) -> Prepared:
    """Fixtures on `device`, every arm prepared and checked against the oracle. Builds' outputs
    are then compared with the base build's, bit for bit. Raises RunFailed on a parity failure
    unless `req.keep_going`; then the failing units are left out, and so is an arm with none left."""
    specs = resolve_specs(req)
    arms = make_arms(req.arms, req.arm_options, plan.factories)
    for arm in arms:
        why = arm.unavailable_reason(device)
        if why:
            raise UserError(f"arm {arm.name!r} cannot run here: {why}")
    fixtures, infos, parity, build_parity, units, keep, made = [], [], [], [], [], [], []
    hbm: dict[str, int] = {}
    failures = []
    for spec in specs:
        host = build_fixture(spec)
        size = tensor_bytes(getattr(host, n) for n in TENSOR_FIELDS)
        with gpu_memory_guard(f"moving fixture {spec.name} to the GPU", size, device):
            fx = host.to(device)
        del host
        summary = fixture_summary(fx)
        fixtures.append(_fixture_info(summary))
        hbm[spec.name] = summary["floors"]["hbm_bytes"]
        with gpu_memory_guard(f"computing the oracle for {spec.name}", size, device):
            refs = References(fx)
        build_outputs: dict[str, torch.Tensor] = {}
        for arm in arms:
            copies = f" ({req.placements} placements)" if req.placements > 1 else ""
            log(f"{spec.name}: preparing {arm.name}{copies}")
            calls, par, which = _placed_calls(arm, fx, refs, spec.name, req.placements, size, device)
            parity.append(replace(par, rel_l2=_finite(par.rel_l2), max_abs=_finite(par.max_abs),
                                  rel_l2_exact=None if par.rel_l2_exact is None else _finite(par.rel_l2_exact)))
            if not par.passed:
                failures.append(ParityFailure(spec.name, arm.name, which + par.reason()))
                continue
            call = calls[0]
            decl = tuple(call.kernels)
            infos.append(S.ArmInfo(arm.name, arm.description, spec.name, decl, dict(call.identity)))
            units.append(Unit.placed(spec.name, arm.name, [(c.run, c.reset) for c in calls], decl))
            keep.extend(calls)
            if req.determinism:
                made.append(Made(fx, arm, call))
            if arm.name in plan.build_arms:
                build_outputs[arm.name] = call.output.detach().clone()  # as parity's run left it
        build_parity.extend(_build_parity(spec.name, build_outputs, plan.build_base))
        del refs, build_outputs
    excluded = parity_exclusions(failures, req.keep_going, req.ref_arm)
    if excluded:
        log(excluded_line(failures))
    timed = {u.arm for u in units}  # --keep-going: an arm with no unit left is no arm of this run
    subjects = Subjects(shapes=tuple(f.name for f in fixtures), arms=tuple(a for a in req.arms if a in timed),
                        ref=req.ref_arm,
                        hbm_bytes=hbm, fixtures=tuple(fixtures), arm_infos=tuple(infos), parity=tuple(parity),
                        build_parity=tuple(build_parity), balancedness=req.balancedness)
    return Prepared(subjects, units, keep, made, excluded)


def _placed_calls(arm: Arm, fx: Fixture, refs: References, shape: str, placements: int, size: int,
                  device: torch.device) -> tuple[list[PreparedCall], S.ParityInfo, str]:
    """`arm` prepared `placements` times on `fx`, each copy on buffers of its own (all alive at
    once, so no two share an address) and each checked against the oracle. The parity record is
    the first copy's, or the first failing copy's; the str names that copy ("" for the first)."""
    calls = []
    for k in range(placements):
        where = f"{arm.name} at {shape}" + (f", placement {k + 1} of {placements}" if placements > 1 else "")
        with gpu_memory_guard(f"preparing {where}", size, device), kernel_fault_guard(where):
            try:
                call = arm.prepare(fx)
            except CudaBuildError as err:  # a build's source NVRTC rejects: one line, the log saved
                raise UserError(f"{arm.name} at {shape}: {err.one_line()}") from None
            par = check_parity(call, refs, shape)
        if not par.passed:
            return calls, par, f"placement {k + 1} of {placements}: " if k else ""
        if k == 0:
            first = par
        elif tuple(call.kernels) != tuple(calls[0].kernels):  # the audit holds every copy to the first's
            raise RuntimeError(f"{where}: prepared again, it declares other kernels than its first copy")
        calls.append(call)
    return calls, first, ""


def _build_parity(shape: str, outputs: dict[str, torch.Tensor], base: str | None) -> list[S.BuildParity]:
    if base not in outputs:
        return []
    out = []
    for name, output in outputs.items():
        if name != base:
            d = compare_outputs(output, outputs[base])
            out.append(S.BuildParity(shape, name, base, d.bitwise_equal, _finite(d.max_abs_diff), d.mismatched))
    return out


def _finite(x: float) -> float:
    return x if x == x and abs(x) != float("inf") else -1.0  # JSON has no inf; -1 marks "not finite"


def _fixture_info(s: dict) -> S.FixtureInfo:
    f = s["floors"]
    floors = S.Floors(**f)
    return S.FixtureInfo(s["name"], s["family"], s["M"], s["K"], s["E"], s["top_k"], s["N"], s["seed"],
                         s["balancedness"], s["fingerprint"], floors,
                         {k: float(v) for k, v in s["tokens_per_expert"].items()})
