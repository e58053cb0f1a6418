"""Prepare a plan's arms on its fixtures: fixtures on the device, every arm prepared and
checked against the oracle, builds' outputs compared bit for bit. Untimed.

An arm that fails parity is never timed: the run stops with every failure named. What comes
out is the timed units (moebench.measure) and the records a result keeps of what was timed
(fixtures, arms with their declared kernels and identities, parity).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.fixtures import build_fixture
from moebench.fixtures.summary import fixture_summary
from moebench.kernels.registry import make_arms
from moebench.kernels.builds import compare_outputs
from moebench.kernels.parity import References, check_parity
from moebench.plan import ArmPlan, RunRequest, resolve_specs
from moebench.results import schema as S
from moebench.timing.engine import Unit


class RunFailed(Exception):
    """The run could not produce a trustworthy result (parity failure): exit 1."""

    exit_code = 1


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


@dataclass
class Prepared:
    subjects: Subjects
    units: list[Unit]
    keep_alive: list = field(default_factory=list)  # the prepared calls the units' closures use


def prepare(req: RunRequest, plan: ArmPlan, device: torch.device,
            log: Callable[[str], None] = lambda m: None) -> Prepared:
    """Fixtures on `device`, every arm prepared and checked against the oracle. Builds' outputs
    are then compared with the base build's, bit for bit. Raises RunFailed on a parity failure."""
    specs = resolve_specs(req)
    arms = make_arms(req.arms, req.arm_options, plan.factories)
    for arm in arms:
        why = arm.unavailable_reason(device)
        if why:
            raise UserError(f"arm {arm.name!r} cannot run here: {why}")
    fixtures, infos, parity, build_parity, units, keep = [], [], [], [], [], []
    hbm: dict[str, int] = {}
    failures = []
    for spec in specs:
        fx = build_fixture(spec).to(device)
        summary = fixture_summary(fx)
        fixtures.append(_fixture_info(summary))
        hbm[spec.name] = summary["floors"]["hbm_bytes"]
        refs = References(fx)
        build_outputs: dict[str, torch.Tensor] = {}
        for arm in arms:
            log(f"{spec.name}: preparing {arm.name}")
            call = arm.prepare(fx)
            par = check_parity(call, refs, spec.name)
            parity.append(replace(par, rel_l2=_finite(par.rel_l2), max_abs=_finite(par.max_abs),
                                  rel_l2_exact=None if par.rel_l2_exact is None else _finite(par.rel_l2_exact)))
            if not par.passed:
                failures.append(f"{arm.name} at {spec.name}: {par.reason()}")
                continue
            decl = tuple(call.kernels)
            infos.append(S.ArmInfo(arm.name, arm.description, spec.name, decl, dict(call.identity)))
            units.append(Unit(spec.name, arm.name, call.run, call.reset, decl))
            keep.append(call)
            if arm.name in plan.build_arms:
                build_outputs[arm.name] = call.output.detach().clone()  # as parity's run left it
        build_parity.extend(_build_parity(spec.name, build_outputs, plan.build_base))
        del refs, build_outputs
    if failures:
        raise RunFailed("parity failed, not timing: " + "; ".join(failures))
    subjects = Subjects(shapes=tuple(f.name for f in fixtures), arms=tuple(req.arms), ref=req.ref_arm,
                        hbm_bytes=hbm, fixtures=tuple(fixtures), arm_infos=tuple(infos), parity=tuple(parity),
                        build_parity=tuple(build_parity), balancedness=req.balancedness)
    return Prepared(subjects, units, keep)


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
