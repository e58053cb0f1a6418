"""`moebench run` as a pipeline: specs -> fixtures on the GPU -> prepared arms -> parity vs
the oracle -> timed rounds -> audit -> statistics -> RunResult (saved) .

Each step is a function of the one before; the CUDA-specific pieces (device, timer, flush,
sync, clocks) come in one TimingBackend, so the pipeline also runs on the CPU in tests.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.failures import (  # noqa: F401  (RunFailed: raised here, caught by the CLI)
    ParityFailure, RunFailed, excluded_line, gpu_memory_guard, parity_exclusions, tensor_bytes)
from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.fixtures.builder import TENSOR_FIELDS
from moebench.fixtures.summary import fixture_summary
from moebench.kernels.arm import ArmFactory, default_arms, make_arms
from moebench.kernels.builds import build_arm_factories, compare_outputs, resolve_builds
from moebench.kernels.external import external_arm_factories
from moebench.kernels.parity import References, check_parity
from moebench.results import schema as S
from moebench.results.provenance import provenance, utc_now
from moebench.results.store import ensure_writable_dir, reserve_path, save
from moebench.stats import summarize
from moebench.timing.audit import audit_samples
from moebench.timing.engine import EngineConfig, EngineOutput, Markers, NoMarkers, Timer, Unit, run_rounds
from moebench.timing.flush import FLUSH_MODES, L2Flush

TIMERS = ("cupti", "events")
PROBE_ID_BASE = 1 << 40  # external ids of the bandwidth probe, far from the run's
PROBE_SAMPLES = 20
MAX_ROUNDS = 1_000
MAX_SAMPLES = 100_000  # per arm per round: more is a typo, and the timer's buffers are sized by it


@dataclass(frozen=True)
class RunRequest:
    shapes: tuple[str, ...]
    arms: tuple[str, ...]
    ref: str | None = None
    rounds: int = 5
    samples: int = 30
    warmup: int = 5
    flush: str = "read"
    timer: str = "cupti"
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
    build_host: str = "revision"  # git builds: the arm's host module at the revision, or this tree's
    max_fixture_gb: float = 16.0  # shapes whose fixture takes more host memory to build are refused
    keep_going: bool = False  # arms failing the oracle are left out and the rest timed, not a stop

    @property
    def ref_arm(self) -> str:
        return self.ref or self.arms[0]


@dataclass(frozen=True)
class ArmPlan:
    """This run's own arms beside the registry: builds (ARM@NAME) and external arms."""

    factories: dict[str, ArmFactory] = field(default_factory=dict)
    build_arms: tuple[str, ...] = ()
    build_base: str | None = None  # the build the others' outputs are compared with


def plan_arms(req: RunRequest) -> tuple[RunRequest, ArmPlan]:
    """Resolve `--build` and `--arm` (files read, revisions pinned, names checked) and return
    the request with their arms appended to `arms` (unless named there already) and a `--ref`
    that names a build mapped to its arm."""
    builds = resolve_builds(req.builds, req.defines, req.build_arm, host=req.build_host)
    factories = {**build_arm_factories(builds), **external_arm_factories(req.external_arms)}
    names = list(req.arms) + [n for n in factories if n not in req.arms]
    by_build = {b.name: b.arm_name for b in builds}
    ref = by_build.get(req.ref, req.ref) if req.ref not in names else req.ref
    build_arms = tuple(b.arm_name for b in builds)
    base = ref if ref in build_arms else (build_arms[0] if build_arms else None)
    return replace(req, arms=tuple(names), ref=ref), ArmPlan(factories, build_arms, base)


def validate(req: RunRequest) -> None:
    """User mistakes in the request, as UserError (before any GPU work)."""
    if not req.arms:
        raise UserError("no arm given: name them with --arms (or add --build / --arm)")
    if not req.shapes:
        raise UserError("no shape given")
    if req.ref is not None and req.ref not in req.arms:
        raise UserError(f"--ref {req.ref!r} is not one of the arms ({', '.join(req.arms)})")
    if req.rounds < 1 or req.samples < 1 or req.warmup < 0:
        raise UserError("--rounds and --samples must be at least 1, --warmup at least 0")
    if req.rounds > MAX_ROUNDS or req.samples > MAX_SAMPLES or req.warmup > MAX_SAMPLES:
        raise UserError(f"--rounds must be at most {MAX_ROUNDS:,}, --samples and --warmup at most {MAX_SAMPLES:,} "
                        f"(per arm per round)")
    if req.flush not in FLUSH_MODES:
        raise UserError(f"unknown --flush {req.flush!r} (known: {', '.join(FLUSH_MODES)})")
    if req.timer not in TIMERS:
        raise UserError(f"unknown --timer {req.timer!r} (known: {', '.join(TIMERS)})")


@dataclass
class TimingBackend:
    """Everything device-specific the pipeline needs."""

    device: torch.device
    make_timer: Callable[[int], Timer]  # capacity: samples per round
    flush: Callable[[], None]
    flush_bytes: int
    sync: Callable[[], None]
    clocks: Callable[[int], S.ClockSample] | None = None
    gpu: S.GpuInfo | None = None
    markers: Markers = field(default_factory=NoMarkers)
    probe: Callable[[], tuple[Unit, int]] | None = None  # a cold read: (unit, bytes read)


def cuda_backend(req: RunRequest) -> TimingBackend:
    """The real backend: the current CUDA device, CUPTI or events, NVML clocks, NVTX."""
    if not torch.cuda.is_available():
        raise UserError("no CUDA device visible: `moebench run` needs a GPU (see `moebench doctor`)")
    from moebench.results.provenance import gpu_info
    from moebench.timing.clocks import ClockSampler
    from moebench.timing.engine import nvtx_markers_or_none

    if req.timer == "cupti":
        from moebench.timing.cupti_tracer import CuptiTracer, load_cupti
        load_cupti()  # fail fast, before fixtures and compiles
        # MOEBENCH_CUPTI_API_FILTER=0 keeps every API record (slower; a fallback if the
        # launch-only filter ever hides launches on some CUPTI version)
        filter_api = os.environ.get("MOEBENCH_CUPTI_API_FILTER", "1") != "0"
        make_timer = lambda capacity: CuptiTracer(filter_api=filter_api)  # noqa: E731
    else:
        from moebench.timing.events_timer import EventsTimer
        make_timer = EventsTimer
    device = torch.device("cuda", torch.cuda.current_device())
    clock = ClockSampler(uuid=str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or ""),
                         index=device.index)
    gpu = gpu_info(device, clock)
    flush = L2Flush(req.flush, gpu.l2_bytes, device)
    return TimingBackend(device=device, make_timer=make_timer, flush=flush, flush_bytes=flush.nbytes,
                         sync=lambda: torch.cuda.synchronize(device), clocks=clock.sample, gpu=gpu,
                         markers=nvtx_markers_or_none(), probe=lambda: read_probe(device, gpu.l2_bytes))


def read_probe(device: torch.device, l2_bytes: int) -> tuple[Unit, int]:
    """A cold read of a buffer far larger than L2 (1 GiB, or less if memory is short)."""
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(2**30, max(16 * l2_bytes, 2**28), free // 4) // 4 * 4
    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    out = torch.zeros((), dtype=torch.float32, device=device)
    return Unit("_probe", "read", run=lambda: torch.sum(buf, dim=0, out=out)), nbytes


def measure_read_bandwidth(backend: TimingBackend, timer: Timer, samples: int = 20) -> float | None:
    """Bytes/s of a cold read of a large buffer, timed by the run's own timer (median)."""
    if backend.probe is None:
        return None
    unit, nbytes = backend.probe()
    out = run_rounds([unit], EngineConfig(rounds=1, samples=samples, warmup=3), timer, flush=backend.flush,
                     sync=backend.sync, first_external_id=PROBE_ID_BASE)
    values = [s.value_ns for s in out.samples if s.events_ns is not None or len(s.kernels) == 1]
    if len(values) < samples // 2 or not all(v > 0 for v in values):
        return None
    return nbytes / (median(values) * 1e-9)


def resolve_specs(req: RunRequest):
    registry = ShapeRegistry(max_fixture_gb=req.max_fixture_gb)
    if req.shapes_file:
        registry = registry.with_shapes_file(req.shapes_file)
    return registry.resolve_many(list(req.shapes), balancedness=req.balancedness)


@dataclass
class Prepared:
    fixtures: list[S.FixtureInfo]
    arms: list[S.ArmInfo]
    parity: list[S.ParityInfo]
    units: list[Unit]
    declared: dict[tuple[str, str], tuple[S.DeclaredKernel, ...]]
    hbm_bytes: dict[str, int]
    keep_alive: list = field(default_factory=list)
    build_parity: list[S.BuildParity] = field(default_factory=list)
    excluded: set[tuple[str, str]] = field(default_factory=set)  # (shape, arm) failed the oracle: not timed


def prepare(req: RunRequest, device: torch.device, log: Callable[[str], None] = lambda m: None,
            plan: ArmPlan | None = None) -> Prepared:
    """Fixtures on `device`, every arm prepared and checked against the oracle. An arm
    that fails parity stops the run: it is never timed. Builds' outputs are then compared
    with the base build's, bit for bit."""
    plan = plan or ArmPlan()
    specs = resolve_specs(req)
    arms = make_arms(req.arms, req.arm_options, plan.factories)
    for arm in arms:
        why = arm.unavailable_reason(device)
        if why:
            raise UserError(f"arm {arm.name!r} cannot run here: {why}")
    p = Prepared([], [], [], [], {}, {})
    failures = []
    for spec in specs:
        host = build_fixture(spec)
        size = tensor_bytes(getattr(host, n) for n in TENSOR_FIELDS)
        with gpu_memory_guard(f"moving fixture {spec.name} to the GPU", size, device):
            fx = host.to(device)
        del host
        summary = fixture_summary(fx)
        p.fixtures.append(_fixture_info(summary))
        p.hbm_bytes[spec.name] = summary["floors"]["hbm_bytes"]
        with gpu_memory_guard(f"computing the oracle for {spec.name}", size, device):
            refs = References(fx)
        build_outputs: dict[str, torch.Tensor] = {}
        for arm in arms:
            log(f"{spec.name}: preparing {arm.name}")
            with gpu_memory_guard(f"preparing {arm.name} at {spec.name}", size, device):
                call = arm.prepare(fx)
            par = check_parity(call, refs, spec.name)
            p.parity.append(S.ParityInfo(spec.name, arm.name, _finite(par.rel_l2), _finite(par.max_abs),
                                         par.nonfinite, par.threshold, par.passed, par.oracle,
                                         None if par.rel_l2_exact is None else _finite(par.rel_l2_exact)))
            if not par.passed:
                failures.append(ParityFailure(spec.name, arm.name, par.reason()))
                continue
            decl = tuple(S.DeclaredKernel(k.label, k.pattern, k.count) for k in call.kernels)
            p.declared[(spec.name, arm.name)] = decl
            p.arms.append(S.ArmInfo(arm.name, arm.description, spec.name, decl, dict(call.identity)))
            p.units.append(Unit(spec.name, arm.name, call.run, call.reset))
            p.keep_alive.append(call)
            if arm.name in plan.build_arms:
                build_outputs[arm.name] = call.output.detach().clone()  # as parity's run left it
        p.build_parity.extend(_build_parity(spec.name, build_outputs, plan.build_base))
        del refs, build_outputs
    excluded = parity_exclusions(failures, req.keep_going, req.ref_arm)
    if excluded:
        log(excluded_line(failures))
        p.excluded = excluded
    return p


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
    floors = S.Floors(f["experts_routed"], f["weight_bytes"], f["activation_bytes"], f["output_bytes"],
                      f["hbm_bytes"], f["flops"])
    return S.FixtureInfo(s["name"], s["family"], s["M"], s["K"], s["E"], s["top_k"], s["N"], s["seed"],
                         s["balancedness"], s["fingerprint"], floors,
                         {k: float(v) for k, v in s["tokens_per_expert"].items()})


def time_units(req: RunRequest, backend: TimingBackend, units: list[Unit],
               on_unit_done=None) -> tuple[EngineOutput, float | None, dict]:
    """The timed rounds (and the bandwidth probe first, with the same timer)."""
    timer = backend.make_timer(max(len(units) * req.samples, PROBE_SAMPLES))
    try:
        bandwidth = measure_read_bandwidth(backend, timer, PROBE_SAMPLES) if req.measure_bandwidth else None
        out = run_rounds(units, EngineConfig(req.rounds, req.samples, req.warmup), timer, flush=backend.flush,
                         sync=backend.sync, clocks=backend.clocks, markers=backend.markers,
                         on_unit_done=on_unit_done)
    finally:
        timer.close()
    options = {"api_filter": getattr(timer, "api_filter", None), "api_records": out.api_records}
    return out, bandwidth, options


def assemble(req: RunRequest, backend: TimingBackend, prep: Prepared, out: EngineOutput,
             bandwidth: float | None, options: dict, started_at: str) -> S.RunResult:
    timer_name = req.timer
    audit = audit_samples(out.samples, prep.declared, out.kernels, out.dropped_by_round, timer_name)
    shapes = tuple(f.name for f in prep.fixtures) or req.shapes  # moebench.bench has no fixtures
    summaries, ratios = summarize(out.samples, shapes, req.arms, req.ref_arm, prep.hbm_bytes, bandwidth)
    gpu = backend.gpu
    if gpu is not None:
        gpu = replace(gpu, read_bandwidth_bytes_per_s=bandwidth)
    settings = S.Settings(shapes=shapes, arms=tuple(req.arms), ref=req.ref_arm, rounds=req.rounds,
                          samples=req.samples, warmup=req.warmup, flush=req.flush,
                          flush_bytes=backend.flush_bytes, timer=timer_name, balancedness=req.balancedness,
                          options={k: v for k, v in {**req.arm_options, **options, **_arm_sources(req)}.items()
                                   if v is not None})
    return S.RunResult(
        schema_version=S.SCHEMA_VERSION, provenance=provenance(req.command, started_at, gpu),
        settings=settings, fixtures=tuple(prep.fixtures), arms=tuple(prep.arms), parity=tuple(prep.parity),
        samples=tuple(out.samples), clocks=tuple(out.clocks), audit=audit, summaries=summaries, ratios=ratios,
        build_parity=tuple(prep.build_parity),
    )


def _arm_sources(req: RunRequest) -> dict:
    """`--build`, `--define`, `--build-arm` and `--arm` as given, when given."""
    given = {"builds": list(req.builds), "defines": list(req.defines), "build_arm": req.build_arm,
             "external_arms": list(req.external_arms)}
    return {k: v for k, v in given.items() if v}


def result_filename(result: S.RunResult) -> str:
    """`20261129T101500Z_A8-A128_triton-vs-triton-swapab.json`, plus the timer and flush
    when they are not the defaults."""
    s = result.settings
    stamp = re.sub(r"[-:]", "", result.provenance.started_at)
    parts = [stamp, "-".join(s.shapes), "-vs-".join(s.arms)]
    if s.timer != "cupti":
        parts.append(s.timer)
    if s.flush != "read":
        parts.append(f"flush-{s.flush}")
    return re.sub(r"[^A-Za-z0-9._-]", "_", "_".join(parts)) + ".json"


def with_default_arms(req: RunRequest, device: torch.device, log: Callable[[str], None]) -> RunRequest:
    """A request that names no arm (no --arms, --build or --arm) times every built-in arm that
    can run on `device`; one line says which were left out and why."""
    if req.arms or req.builds or req.external_arms:
        return req
    names, skipped = default_arms(device, req.arm_options)
    if skipped:
        log("arms left out: " + "; ".join(f"{n} ({why})" for n, why in skipped))
    if not names:
        raise UserError("no arm can run here: " + "; ".join(f"{n}: {why}" for n, why in skipped))
    return replace(req, arms=tuple(names))


def run(req: RunRequest, backend: TimingBackend | None = None, *, log: Callable[[str], None] = lambda m: None,
        progress_factory=None) -> tuple[S.RunResult, Path]:
    """The whole pipeline. Returns the result and where it was saved. Raises UserError for
    a bad request, RunFailed for a parity failure; an audit failure is in the result."""
    if backend is not None:
        req = with_default_arms(req, backend.device, log)
    elif torch.cuda.is_available():
        req = with_default_arms(req, torch.device("cuda", torch.cuda.current_device()), log)
    req, plan = plan_arms(req)
    if not req.arms and backend is None:
        raise UserError("no CUDA device visible: with no --arms, `moebench run` times every arm that can run "
                        "on this machine's GPU (see `moebench arms` and `moebench doctor`)")
    validate(req)
    ensure_writable_dir(req.out_dir)
    started_at = utc_now()
    if backend is None:
        resolve_specs(req)  # bad shape names before touching the GPU
        make_arms(req.arms, req.arm_options, plan.factories)
        with gpu_memory_guard("allocating the L2 flush buffer"):
            backend = cuda_backend(req)
    prep = prepare(req, backend.device, log, plan)
    total = req.rounds * len(prep.units) * req.samples
    if progress_factory is not None:
        with progress_factory(total) as advance:
            out, bandwidth, options = time_units(req, backend, prep.units,
                                                 on_unit_done=lambda r, u, n: advance(r, u, n))
    else:
        out, bandwidth, options = time_units(req, backend, prep.units)
    timed = {(u.shape, u.arm) for u in prep.units}
    if prep.excluded:  # --keep-going: an arm with no unit left is no arm of this run
        req = replace(req, arms=tuple(a for a in req.arms if any(arm == a for _, arm in timed)))
    result = assemble(req, backend, prep, out, bandwidth, options, started_at)
    path = save(result, reserve_path(Path(req.out_dir) / result_filename(result)))
    return result, path
