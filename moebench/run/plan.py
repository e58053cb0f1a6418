"""The plan of a run: what to time (arms on fixtures) and how (the timing protocol).

A RunRequest is what the user asked for, as the command line or a caller gives it, and what a
partial result stores to be resumed. Planning checks it (user mistakes as UserError, before any
GPU work), resolves this run's own arms beside the registry (builds `ARM@NAME`, variants,
external `--arm`s) and splits it by who needs it; each stage takes only its part:

    Workload      what to run on: the shapes and how their fixtures are made (prepare, sweeps)
    ArmPlan       the arms: every arm by its label in the order odd rounds run them, the
                  reference, their options, the factories of the run's own arms (a build, a
                  variant, an external arm is an explicit input here, never a change to the
                  registry), what a parity failure does and the determinism checks asked for
    protocol      rounds, samples, warm-up, flush, timer, placements, order
                  (moebench.timing.measure.TimingProtocol: measure's, and prepare's placements)

Preparing those arms on the request's fixtures is moebench.run.prepare's.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

# The defaults of the protocol, defined where `--help` reads them (moebench.choices).
from moebench.choices import (DEFAULT_PLACEMENT_MODE, DEFAULT_PLACEMENTS, DEFAULT_ROUNDS,  # noqa: F401
                              DEFAULT_SAMPLES, DETERMINISM_RUNS, NO_AA, ORDERS, REF_AA)
from moebench.errors import UserError
from moebench.fixtures import ShapeRegistry
from moebench.kernels.api.arm import ArmFactory
from moebench.kernels.builds import build_arm_factories, resolve_builds
from moebench.kernels.registry import default_arms, external_arm_factories, load_builtin_arms
from moebench.run.noise import check_noise_source, copy_factory, copy_label
from moebench.run.variants import parse_variant, variant_factory
from moebench.timing.measure import TimingProtocol, check_protocol
from moebench.timing.timers import DEFAULT_TIMER, RUN_TIMERS


@dataclass(frozen=True)
class Workload:
    """What a run times on: its shapes, and how their fixtures are made."""

    shapes: tuple[str, ...]
    shapes_file: str | None = None
    balancedness: float = 0.8
    max_fixture_gb: float = 16.0

    def specs(self):
        """The shapes as fixture specs (unknown or oversized shapes are UserErrors)."""
        registry = ShapeRegistry(max_fixture_gb=self.max_fixture_gb)
        if self.shapes_file:
            registry = registry.with_shapes_file(self.shapes_file)
        return registry.resolve_many(list(self.shapes), balancedness=self.balancedness)

    def with_shapes(self, shapes: tuple[str, ...]) -> "Workload":
        return replace(self, shapes=shapes)


@dataclass(frozen=True)
class DeterminismAsk:
    """`--determinism`: each timed call's determinism verdicts, before timing."""

    runs: int = DETERMINISM_RUNS  # runs of the same inputs in the run-to-run check
    cross_process: bool = True  # the output hash against a fresh process's


@dataclass(frozen=True)
class RunRequest:
    shapes: tuple[str, ...]
    arms: tuple[str, ...]
    ref: str | None = None
    rounds: int = DEFAULT_ROUNDS
    samples: int = DEFAULT_SAMPLES
    warmup: int = 5
    flush: str = "read"
    timer: str = DEFAULT_TIMER
    out_dir: str = "results"
    balancedness: float = 0.8
    shapes_file: str | None = None
    command: tuple[str, ...] = ()
    measure_bandwidth: bool = True
    arm_options: dict = field(default_factory=dict)  # e.g. {"triton_config": path}, to the arms that take them
    builds: tuple[str, ...] = ()  # `--build NAME=PATH | NAME=git:REV[:PATH]`: arms ARM@NAME
    build_arm: str | None = None  # the arm the builds are sources of, when the file name does not say
    defines: tuple[str, ...] = ()  # `--define NAME:KEY=VALUE`, per build
    external_arms: tuple[str, ...] = ()  # `--arm NAME=module:factory`
    variants: tuple[str, ...] = ()  # `--variant NAME=ARM:KEY=VALUE,...`
    build_host: str = "revision"  # git builds: the arm's host module at the revision, or this tree's
    max_fixture_gb: float = 16.0  # shapes whose fixture takes more host memory to build are refused
    # `--aa ARM`: ARM and a second prepared copy ARM#2, whose ratio is the run's noise floor; "ref":
    # the reference arm's (`moebench run`'s default: a floor in every run); None or "none": no floor.
    aa_arm: str | None = None
    noise_from: str | None = None  # `--noise-from FILE`: copy the floors a noise run measured
    sampler: str = "eager"  # `--graph`: "graph", each sample a replayed CUDA graph of flush and call
    # `--placements P`: every arm prepared P times (each on its own copy of the fixture), the copies
    # taken in turn as `placement_mode` says (moebench.timing.schedule.copy_index); None: as many as
    # DEFAULT_PLACEMENTS that fit in memory, shape by shape (prepare.placements_for)
    placements: int | None = None
    placement_mode: str = DEFAULT_PLACEMENT_MODE
    order: str = "shuffled"  # `--order`: "shuffled" (drawn per pair of rounds from order_seed) or "alternating"
    order_seed: int | None = None  # None until the run draws one (runner.with_order_seed); stored, so it resumes
    keep_going: bool = False  # arms failing the oracle are left out and the rest timed, not a stop
    determinism: bool = False  # `--determinism`: each timed call's determinism verdicts, before timing
    determinism_runs: int = DETERMINISM_RUNS  # runs of the same inputs in the run-to-run check
    cross_process: bool = True  # with determinism: the output hash against a fresh process's

    @property
    def ref_arm(self) -> str:
        return self.ref or self.arms[0]

    @property
    def workload(self) -> Workload:
        return Workload(self.shapes, self.shapes_file, self.balancedness, self.max_fixture_gb)

    @property
    def protocol(self) -> TimingProtocol:
        return TimingProtocol(self.rounds, self.samples, self.warmup, self.flush, self.timer, self.measure_bandwidth,
                              self.sampler, self.placements_target, self.placement_mode,
                              self.order_seed if self.order == "shuffled" else None,
                              fit_placements=self.placements is None)

    @property
    def placements_target(self) -> int:
        """The placements asked for, or the default's: DEFAULT_PLACEMENTS, at most one per row
        sample (or per round, by rounds). Memory may give a shape fewer (prepare.placements_for)."""
        if self.placements is not None:
            return self.placements
        return min(DEFAULT_PLACEMENTS, self.samples if self.placement_mode == "samples" else self.rounds)

    @property
    def names_own_arms(self) -> bool:
        return bool(self.arms or self.builds or self.external_arms or self.variants or self.aa_arm not in (None, NO_AA, REF_AA))


@dataclass(frozen=True)
class ArmPlan:
    """The run's arms: their labels in order, the reference, their options, and this run's own
    arms beside the registry (builds ARM@NAME, variants, external arms) as factories."""

    factories: dict[str, ArmFactory] = field(default_factory=dict)
    build_arms: tuple[str, ...] = ()
    build_base: str | None = None  # the build the others' outputs are compared with
    arms: tuple[str, ...] = ()
    ref: str | None = None  # None: the first arm
    options: dict = field(default_factory=dict)  # e.g. {"triton_config": path}, to the arms that take them
    external_arms: tuple[str, ...] = ()  # `--arm NAME=module:factory`, as given (a fresh process makes them again)
    keep_going: bool = False  # arms failing the oracle are left out and the rest timed, not a stop
    determinism: DeterminismAsk | None = None

    @property
    def ref_arm(self) -> str:
        return self.ref or self.arms[0]


def plan_arms(req: RunRequest) -> tuple[RunRequest, ArmPlan]:
    """Resolve `--build`, `--variant` and `--arm` (files read, revisions pinned, names checked)
    and return the request with their arms appended to `arms` (unless named there already) and
    a `--ref` that names a build mapped to its arm."""
    builds = resolve_builds(req.builds, req.defines, req.build_arm, host=req.build_host)
    factories = {**build_arm_factories(builds), **external_arm_factories(req.external_arms)}
    known = {**load_builtin_arms(), **factories}
    for spec in map(parse_variant, req.variants):
        if spec.name in known:
            raise UserError(f"--variant {spec.name}: the name of an arm already (choose another)")
        factories[spec.name] = known[spec.name] = variant_factory(spec, known)
    arms = list(req.arms)
    names = arms + [n for n in factories if n not in arms]
    by_build = {b.name: b.arm_name for b in builds}
    ref = by_build.get(req.ref, req.ref) if req.ref not in names else req.ref
    aa = _aa_arm(req, ref or (names[0] if names else None), names, known, by_build)
    if aa is not None:
        copy = copy_label(aa)
        factories[copy] = copy_factory(known[aa], copy)
        names += [a for a in (aa, copy) if a not in names]
    build_arms = tuple(b.arm_name for b in builds)
    base = ref if ref in build_arms else (build_arms[0] if build_arms else None)
    req = replace(req, arms=tuple(names), ref=ref, aa_arm=aa)
    return req, ArmPlan(factories, build_arms, base, req.arms, req.ref, req.arm_options, req.external_arms,
                        req.keep_going, DeterminismAsk(req.determinism_runs, req.cross_process) if req.determinism else None)


def _aa_arm(req: RunRequest, ref: str | None, names: list[str], known: dict, by_build: dict) -> str | None:
    """The arm whose A/A copy this run times, or None. `--aa ref` (the command line's default)
    is the reference arm, unless the floor comes from `--noise-from` or the reference is not an
    arm of the run (validate names that mistake); `--aa none` is none; `--aa ARM` must be known."""
    if req.aa_arm in (None, NO_AA):
        return None
    if req.aa_arm == REF_AA:
        return ref if ref in names and ref in known and not req.noise_from else None
    aa = by_build.get(req.aa_arm, req.aa_arm)
    if aa not in known:
        raise UserError(f"--aa {aa!r}: unknown arm (known: {', '.join(sorted(known))})")
    return aa


def validate(req: RunRequest, timers: tuple[str, ...] = RUN_TIMERS) -> None:
    """User mistakes in the request, as UserError (before any GPU work)."""
    if not req.arms:
        raise UserError("no arm given: name them with --arms (or add --build / --variant / --arm)")
    validate_settings(req, timers)
    if req.ref is not None and req.ref not in req.arms:
        raise UserError(f"--ref {req.ref!r} is not one of the arms ({', '.join(req.arms)})")
    if req.noise_from:
        check_noise_source(req.noise_from, req.arms)


def validate_settings(req: RunRequest, timers: tuple[str, ...] = RUN_TIMERS) -> None:
    """The mistakes validate finds whatever the arms: shapes, the protocol, the determinism runs."""
    if not req.shapes:
        raise UserError("no shape given")
    req.workload.specs()  # unknown or oversized shapes
    check_protocol(req.protocol, timers)
    if req.order not in ORDERS:
        raise UserError(f"unknown --order {req.order!r} (known: {', '.join(ORDERS)})")
    if req.order_seed is not None and not 0 <= req.order_seed < 2**63:
        raise UserError(f"--order-seed must be a whole number from 0 to 2**63 - 1, got {req.order_seed}")
    if req.determinism and req.determinism_runs < 2:
        raise UserError(f"--determinism-runs must be at least 2, got {req.determinism_runs}")


def with_order_seed(req: RunRequest) -> RunRequest:
    """`req` with a drawn order seed when it shuffles and names none (the file keeps it, so the
    run can be redone and resumed in the same order)."""
    if req.order != "shuffled" or req.order_seed is not None:
        return req
    return replace(req, order_seed=secrets.randbelow(2**31))


def with_default_arms(req: RunRequest, device: torch.device, log: Callable[[str], None]) -> RunRequest:
    """A request that names no arm (no --arms, --build, --variant or --arm) times every built-in
    arm that can run on `device`; one line says which were left out and why."""
    if req.names_own_arms:
        return req
    names, skipped = default_arms(device, req.arm_options)
    if skipped:
        log("arms left out: " + "; ".join(f"{n} ({why})" for n, why in skipped))
    if not names:
        raise UserError("no arm can run here: " + "; ".join(f"{n}: {why}" for n, why in skipped))
    return replace(req, arms=tuple(names))


def sweep_shapes(family: str, ms_text: str) -> tuple[str, ...]:
    """`A` and `1,2,4` -> (`A1`, `A2`, `A4`); `deepseek-v3/ep8` -> (`deepseek-v3/ep8/M1`, ...); the
    run resolves and checks the names."""
    family = family.strip()
    model = "/" in family
    if not model and (len(family) != 1 or not family.isalpha()):
        raise UserError(f"--family: expected one family letter like A or Q, or MODEL/LAYOUT like deepseek-v3/ep8, "
                        f"got {family!r}")
    items = [m.strip() for m in ms_text.split(",") if m.strip()]
    if not items or not all(m.isdigit() and len(m) <= 7 and int(m) > 0 for m in items):  # int() of 5,000 digits raises
        raise UserError(f"--m: expected positive token counts like 1,2,4,8, got {ms_text!r}")
    ms = [int(m) for m in items]
    dupes = sorted({m for m in ms if ms.count(m) > 1})
    if dupes:
        raise UserError(f"--m: M given twice: {', '.join(map(str, dupes))}")
    return tuple(f"{family}/M{m}" if model else f"{family.upper()}{m}" for m in ms)
