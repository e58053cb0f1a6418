"""Prepare a plan's arms on its fixtures: fixtures on the device, every arm prepared and
checked against the oracle, builds' outputs compared bit for bit. Untimed.

An arm that fails parity is never timed: the run stops with every failure named, or with
`keep_going` that arm is left out at that shape and the rest is timed (moebench.failures).
Running out of GPU memory while moving a fixture, computing its oracle or preparing an arm is
one line naming which and the fixture's size. What comes out is the timed units
(moebench.timing.measure), the records a result keeps of what was timed (fixtures, arms with their
declared kernels and identities, parity), and with `--determinism` what each unit was made
from (the fixture, the arm, the prepared call), which moebench.run.determinism checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.failures import (ParityFailure, RunFailed,  # noqa: F401  (RunFailed: raised here, caught by the CLI)
                               excluded_line, gpu_memory_guard, kernel_fault_guard, parity_exclusions, tensor_bytes)
from moebench.fixtures import Fixture, build_fixture
from moebench.fixtures.builder import TENSOR_FIELDS
from moebench.fixtures.summary import fixture_summary
from moebench.kernels.api.arm import Arm, PreparedCall, geometry_refusals
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.builds import compare_outputs
from moebench.kernels.cuda.nvrtc import CudaBuildError
from moebench.kernels.registry import make_arms
from moebench.kernels.stock.engine_logs import ENGINE_MESSAGES, messages_line
from moebench.record import schema as S
from moebench.record.determinism import DeterminismVerdict
from moebench.run.noise import copied_fixture
from moebench.run.plan import ArmPlan, Workload
from moebench.timing.engine import Unit
from moebench.timing.measure import TimingProtocol

# The default placements may take this share of the GPU's free memory (the rest is the timed
# calls' headroom: the flush buffer is already allocated, workspaces are not).
PLACEMENT_MEMORY_SHARE = 0.7


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
    placements: dict[str, int] = field(default_factory=dict)  # per shape: the prepared copies of each arm


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
    excluded: set[tuple[str, str]] = field(default_factory=set)  # (shape, arm) failed the oracle or refused: not timed


def prepare(work: Workload, protocol: TimingProtocol, plan: ArmPlan, device: torch.device,
            log: Callable[[str], None] = lambda m: None) -> Prepared:
    """Fixtures of `work` on `device`, every arm of `plan` prepared (as many placements as
    `protocol` asks and memory allows) and checked against the oracle. Builds' outputs are then
    compared with the base build's, bit for bit. Raises RunFailed on a parity failure unless
    `plan.keep_going`; then the failing units are left out, and so is an arm with none left."""
    specs = work.specs()
    arms = make_arms(plan.arms, plan.options, plan.factories)
    for arm in arms:
        why = arm.unavailable_reason(device)
        if why:
            raise UserError(f"arm {arm.name!r} cannot run here: {why}")
    refused = geometry_refusals(arms, specs)  # before any fixture is built: one line each
    for (shape, name), line in refused.items():
        if name == plan.ref_arm:
            raise UserError(f"the reference arm cannot serve {shape}: {line} (choose another --ref)")
        log(f"refused, not timed: {line} ({shape})")
    fixtures, infos, parity, build_parity, units, keep, made = [], [], [], [], [], [], []
    hbm: dict[str, int] = {}
    placed: dict[str, int] = {}
    failures = []
    for n_spec, spec in enumerate(specs):
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
        # First copies of every arm, then as many more placements as memory allows: what the
        # first copies took (and a copy of the fixture) is what each further placement takes.
        before = _allocated(device)
        served = [arm for arm in arms if (spec.name, arm.name) not in refused]
        firsts = {arm.name: _placed_calls(arm, [fx], refs, spec.name, size, device, log) for arm in served}
        per_copy = _allocated(device) - before + size
        n_place = placements_for(None if protocol.fit_placements else protocol.placements, protocol.placements,
                                 per_copy, len(specs) - n_spec, device)
        if protocol.fit_placements and protocol.placement_mode == "samples":
            n_place = balanced_placements(n_place, protocol.samples)
        placed[spec.name] = n_place
        more: dict[str, tuple] = {}
        if n_place > 1:
            with gpu_memory_guard(f"copying fixture {spec.name} for {n_place} placements", size * (n_place - 1),
                                  device):
                fxs = [copied_fixture(fx) for _ in range(n_place - 1)]
            log(f"{spec.name}: {n_place} placements of each arm")
            more = _more_placements([a for a in served if firsts[a.name][1].passed], fxs, refs, spec.name, size,
                                    device)
            del fxs
        build_outputs: dict[str, torch.Tensor] = {}
        for arm in served:
            calls, par, which = firsts[arm.name]
            if arm.name in more:
                extra, extra_par, extra_which = more[arm.name]
                calls = calls + extra
                if not extra_par.passed:
                    par, which = extra_par, extra_which
            parity.append(replace(par, rel_l2=_finite(par.rel_l2), max_abs=_finite(par.max_abs),
                                  rel_l2_exact=None if par.rel_l2_exact is None else _finite(par.rel_l2_exact)))
            if not par.passed:
                failures.append(ParityFailure(spec.name, arm.name, which + par.reason()))
                continue
            call = calls[0]
            if any(tuple(c.kernels) != tuple(call.kernels) for c in calls[1:]):  # the audit holds every copy to the first's
                raise RuntimeError(f"{arm.name} at {spec.name}: prepared again, it declares other kernels than its "
                                   f"first copy")
            decl = tuple(call.kernels)
            infos.append(S.ArmInfo(arm.name, arm.description, spec.name, decl, dict(call.identity)))
            units.append(Unit.placed(spec.name, arm.name, [(c.run, c.reset) for c in calls], decl))
            keep.extend(calls)
            if plan.determinism is not None:
                made.append(Made(fx, arm, call))
            if arm.name in plan.build_arms:
                build_outputs[arm.name] = call.output.detach().clone()  # as parity's run left it
        build_parity.extend(_build_parity(spec.name, build_outputs, plan.build_base))
        del refs, build_outputs, firsts, more
    for arm, by_shape in _engine_messages(infos).items():
        log(messages_line(arm, by_shape))
    excluded = parity_exclusions(failures, plan.keep_going, plan.ref_arm)
    if excluded:
        log(excluded_line(failures))
    excluded |= set(refused)
    timed = {u.arm for u in units}  # --keep-going: an arm with no unit left is no arm of this run
    subjects = Subjects(shapes=tuple(f.name for f in fixtures), arms=tuple(a for a in plan.arms if a in timed),
                        ref=plan.ref_arm,
                        hbm_bytes=hbm, fixtures=tuple(fixtures), arm_infos=tuple(infos), parity=tuple(parity),
                        build_parity=tuple(build_parity), balancedness=work.balancedness, placements=placed)
    return Prepared(subjects, units, keep, made, excluded)


def placements_for(asked: int | None, target: int, copy_bytes: int, shapes_left: int,
                   device: torch.device) -> int:
    """How many placements a shape gets: `asked` (`--placements P`) as given; by default
    `target` (the request's placements_target), fewer where the further copies (`copy_bytes`
    each: what the first copies of the arms took, and a copy of the fixture) would not fit in
    PLACEMENT_MEMORY_SHARE of the free memory, split over the shapes still to prepare."""
    if asked is not None:
        return asked
    free, _ = torch.cuda.mem_get_info(device) if device.type == "cuda" else (0, 0)
    return fitting_placements(target, copy_bytes, int(free * PLACEMENT_MEMORY_SHARE) // max(shapes_left, 1))


def fitting_placements(target: int, copy_bytes: int, budget_bytes: int) -> int:
    """The most placements, up to `target` and at least 1 (the copy already made), whose further
    copies fit in `budget_bytes`."""
    if copy_bytes <= 0:
        return target
    return max(1, min(target, 1 + budget_bytes // copy_bytes))


def balanced_placements(fitting: int, samples: int) -> int:
    """The most placements, at most `fitting`, that share `samples` evenly: turning sample by
    sample, every copy then takes the same number of each row's samples, so a row is the same
    blend of placements in every round (an uneven share moves the row's median from round to
    round by as much as the placements differ)."""
    return next(p for p in range(max(1, min(fitting, samples)), 0, -1) if samples % p == 0)


def _more_placements(arms: list[Arm], fxs: list[Fixture], refs: References, shape: str, size: int,
                     device: torch.device) -> dict[str, tuple[list[PreparedCall], S.ParityInfo, str]]:
    """Placements 2.. of every arm, one placement at a time, and in each the arms in an order
    rotated by one: no arm's buffers are always the first (or last) allocated. Per arm, as
    _placed_calls returns it: the calls, the parity (the first failing copy's), which copy."""
    calls: dict[str, list[PreparedCall]] = {a.name: [] for a in arms}
    parity: dict[str, tuple[S.ParityInfo, str]] = {}
    of = len(fxs) + 1
    for k, fx in enumerate(fxs, start=1):
        for arm in arms[k % len(arms):] + arms[:k % len(arms)]:
            if arm.name in parity and not parity[arm.name][0].passed:
                continue  # its first failing copy is what the run reports
            made, check, which = _placed_calls(arm, [fx], refs, shape, size, device, lambda m: None, k, of)
            calls[arm.name] += made
            if arm.name not in parity or not check.passed:
                parity[arm.name] = (check, which)
    return {name: (calls[name], *parity[name]) for name in calls}


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _placed_calls(arm: Arm, fxs: list[Fixture], refs: References, shape: str, size: int, device: torch.device,
                  log: Callable[[str], None], first: int = 0, of: int = 1
                  ) -> tuple[list[PreparedCall], S.ParityInfo, str]:
    """`arm` prepared once on each of `fxs` (placements `first`, `first` + 1, ... of `of`: the
    fixture's tensors, or copies of them in allocations of their own), each copy on buffers of
    its own (all alive at once, so no two share an address) and each checked against the oracle.
    The parity record is the first copy's, or the first failing copy's; the str names that copy
    ("" for placement 1)."""
    if first == 0:
        log(f"{shape}: preparing {arm.name}")
    calls, par = [], None
    for k, fx in enumerate(fxs, start=first):
        where = f"{arm.name} at {shape}" + (f", placement {k + 1} of {of}" if of > 1 else "")
        with gpu_memory_guard(f"preparing {where}", size, device), kernel_fault_guard(where):
            try:
                call = arm.prepare(fx)
            except CudaBuildError as err:  # a build's source NVRTC rejects: one line, the log saved
                raise UserError(f"{arm.name} at {shape}: {err.one_line()}") from None
            check = check_parity(call, refs, shape)
        if not check.passed:
            return calls, check, f"placement {k + 1} of {of}: " if k else ""
        par = par or check
        calls.append(call)
    return calls, par, ""


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
                         {k: float(v) for k, v in s["tokens_per_expert"].items()},
                         s.get("model", ""), s.get("layout", ""), s.get("config", ""))


def _engine_messages(infos) -> dict[str, dict[str, list[str]]]:
    """arm -> shape -> what its engine logged while it prepared (kernels/engine_logs.py)."""
    out: dict[str, dict[str, list[str]]] = {}
    for info in infos:
        said = info.identity.get(ENGINE_MESSAGES)
        if said:
            out.setdefault(info.name, {})[info.shape] = list(said)
    return out
