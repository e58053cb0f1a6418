"""The measurement core: `measure(units, protocol, backend) -> Measurement`.

Every front end times through this one function: `run` and `sweep` (prepared arms on
fixtures), `moebench.bench` (any callables), `probe` (one streaming kernel), variants and
builds (arms like any other) and `profile` (the untimed strategy, for ncu and nsys).

    TimingProtocol  rounds, samples and warm-ups per unit per round, flush mode, timer name,
                    and whether to measure the device's read bandwidth first
    TimingBackend   the device pieces: timer strategy (chosen once), flush, sync, clocks,
                    markers, the read-floor probe; `cuda_backend` makes the real one, tests a fake
    Measurement     samples, every kernel's audit, clocks, the declared kernels, bandwidth

Under `protocol.sampler == "graph"` each unit's call is captured with the flush as a CUDA graph
and a sample is one replay (moebench.timing.graphs); the flush's kernels are taken out of it.

A unit that declares no kernels is audited against the kernel set most of its samples hold
(moebench.bench's callables); the Measurement says which were inferred.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from moebench.errors import UserError
from moebench.record.metrics import TimedMetric
from moebench.record.schema import Audit, ClockSample, DeclaredKernel, GpuInfo, ReadFloor, Sample
from moebench.timing.audit import audited, combined
from moebench.timing.engine import EngineConfig, EngineOutput, Markers, NoMarkers, Unit, run_rounds
from moebench.timing.flush import FLUSH_MODES, L2Flush
from moebench.timing.graphs import SAMPLERS, graph_timer, graph_units, learn_flush_kernels
from moebench.timing.read_floor import ReadProbe, best_read
from moebench.timing.schedule import PLACEMENT_MODES
from moebench.timing.timers import CUDA_TIMERS, DEFAULT_TIMER, RUN_TIMERS, TimerStrategy

PROBE_ID_BASE = 1 << 40  # external ids of the bandwidth probe, far from the run's
PROBE_SAMPLES = 20  # per layout of the read kernel
PROBE_WARMUP = 3  # per layout, after the probe's own warm-up burst
MAX_PROBE_UNITS = 8  # layouts the recorder is sized for
MAX_ROUNDS = 1_000
MAX_PLACEMENTS = 16  # each placement holds its own copy of every arm's buffers
MAX_SAMPLES = 100_000  # per unit per round: more is a typo, and the timer's buffers are sized by it
Key = tuple[str, str]  # (shape, arm)


@dataclass(frozen=True)
class TimingProtocol:
    rounds: int = 5
    samples: int = 30  # per unit per round
    warmup: int = 5  # per unit per round, untimed
    flush: str = "read"
    timer: str = DEFAULT_TIMER
    measure_bandwidth: bool = True
    sampler: str = "eager"  # "graph": each sample one replay of a CUDA graph of the flush and the call
    placements: int = 1  # copies of each call on buffers of their own (Unit.call)
    placement_mode: str = "rounds"  # which copy a sample uses: by round, or turning sample by sample
    order_seed: int | None = None  # the arms' order per pair of rounds (None: forward, then reversed)
    fit_placements: bool = False  # `placements` is a target memory may cut (not a --placements given)


def check_protocol(p: TimingProtocol, timers: Sequence[str] = RUN_TIMERS) -> None:
    """User mistakes in a protocol, as UserError."""
    if p.rounds < 1 or p.samples < 1 or p.warmup < 0:
        raise UserError("--rounds and --samples must be at least 1, --warmup at least 0")
    if p.rounds > MAX_ROUNDS or p.samples > MAX_SAMPLES or p.warmup > MAX_SAMPLES:
        raise UserError(f"--rounds must be at most {MAX_ROUNDS:,}, --samples and --warmup at most {MAX_SAMPLES:,} "
                        f"(per arm per round)")
    if p.flush not in FLUSH_MODES:
        raise UserError(f"unknown --flush {p.flush!r} (known: {', '.join(FLUSH_MODES)})")
    if p.timer not in timers:
        raise UserError(f"unknown --timer {p.timer!r} (known: {', '.join(timers)})")
    if p.sampler not in SAMPLERS:
        raise UserError(f"unknown sampler {p.sampler!r} (known: {', '.join(SAMPLERS)})")
    if not 1 <= p.placements <= MAX_PLACEMENTS:
        raise UserError(f"--placements must be 1 to {MAX_PLACEMENTS}, got {p.placements}")
    if p.placement_mode not in PLACEMENT_MODES:
        raise UserError(f"unknown placement mode {p.placement_mode!r} (known: {', '.join(PLACEMENT_MODES)})")
    if p.placement_mode == "rounds" and p.placements > p.rounds:
        raise UserError(f"--placements {p.placements} needs at least as many rounds (--rounds {p.rounds}): "
                        f"each round times one placement")
    if p.placement_mode == "samples" and p.placements > p.samples:
        raise UserError(f"--placements {p.placements} needs at least as many samples (--samples {p.samples}): "
                        f"each row turns through every placement")
    if p.sampler == "graph" and p.timer != DEFAULT_TIMER:
        raise UserError(f"--graph needs --timer {DEFAULT_TIMER}: an event pair around a replay would time the flush too")


@dataclass
class TimingBackend:
    """Everything device-specific a measurement needs."""

    device: torch.device
    timer: TimerStrategy
    flush: Callable[[], None]
    flush_bytes: int
    sync: Callable[[], None]
    clocks: Callable[[int], ClockSample] | None = None
    gpu: GpuInfo | None = None
    markers: Markers = field(default_factory=NoMarkers)
    probe: Callable[[], ReadProbe] | None = None  # the read floor's layouts (moebench.timing.read_floor)
    capture: Callable[[Callable[[], None]], Callable[[], None]] | None = None  # fn -> replay of its graph


def cuda_backend(protocol: TimingProtocol) -> TimingBackend:
    """The real backend: the current CUDA device, the protocol's timer, NVML clocks, NVTX."""
    if not torch.cuda.is_available():
        raise UserError("no CUDA device visible: timing needs a GPU (see `moebench doctor`)")
    from moebench.record.provenance import gpu_info
    from moebench.timing.clocks import ClockSampler
    from moebench.timing.engine import nvtx_markers_or_none
    from moebench.timing.graphs import capture_cuda_graph
    from moebench.timing.read_floor import read_probe

    timer = CUDA_TIMERS[protocol.timer]()  # chosen once; fails fast, before fixtures and compiles
    device = torch.device("cuda", torch.cuda.current_device())
    clock = ClockSampler(uuid=str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or ""),
                         index=device.index)
    gpu = gpu_info(device, clock)
    flush = L2Flush(protocol.flush, gpu.l2_bytes, device)
    return TimingBackend(device=device, timer=timer, flush=flush, flush_bytes=flush.nbytes,
                         sync=lambda: torch.cuda.synchronize(device), clocks=clock.sample, gpu=gpu,
                         markers=nvtx_markers_or_none(), probe=lambda: read_probe(device, gpu.l2_bytes),
                         capture=lambda fn: capture_cuda_graph(fn, device))


@dataclass(frozen=True)
class Measurement:
    """What one measurement produced: every sample as its timer made it, the audit of each,
    the clocks per round, and what each unit was audited against."""

    protocol: TimingProtocol
    timer: str
    metric: TimedMetric
    flush_bytes: int
    samples: tuple[Sample, ...]
    audit: Audit
    clocks: tuple[ClockSample, ...]
    declared: dict[Key, tuple[DeclaredKernel, ...]]
    inferred: frozenset[Key]  # units whose kernels were inferred from their samples
    read_bandwidth_bytes_per_s: float | None = None
    read_floor: ReadFloor | None = None  # how the bandwidth was read (None when it was not, or a resumed run's file had none)
    timer_settings: dict = field(default_factory=dict)  # e.g. the CUPTI API filter, records seen
    rounds_done: int = 0  # the last round whose samples are in (protocol.rounds when finished)
    api_records: int = 0  # API records the timer saw in the timed rounds

    @property
    def audited_samples(self) -> list[Sample]:
        """The samples the audit passed: the only ones statistics are taken over."""
        return audited(self.samples, self.audit)


def measure(units: Sequence[Unit], protocol: TimingProtocol, backend: TimingBackend, *,
            on_unit_done: Callable[[int, Unit, int], None] | None = None,
            on_round_done: Callable[[Measurement], None] | None = None,
            before: Measurement | None = None) -> Measurement:
    """Time `units` in paired rounds under `protocol` (the bandwidth probe first, by the same
    timer), then audit every sample against its unit's declared kernels.

    `on_round_done` gets the measurement so far: once before the first round (the bandwidth
    alone) and after each round, every sample audited. `before` is the measurement of the
    rounds a resumed run already has: only the rounds after it are timed, its bandwidth is
    kept, and what comes back (to the hook too) is the whole run's."""
    timer = backend.timer
    recorder = timer.open(max(len(units) * protocol.samples, PROBE_SAMPLES * MAX_PROBE_UNITS))
    first_round = 1 if before is None else before.rounds_done + 1

    floor = None if before is None else before.read_floor
    bandwidth = None if before is None else before.read_bandwidth_bytes_per_s

    def so_far(out: EngineOutput) -> Measurement:
        return _measurement(units, protocol, backend, timer, recorder, out, bandwidth, floor, before)

    def saved(r: int, out: EngineOutput) -> None:
        on_round_done(so_far(out))

    try:
        if before is None and protocol.measure_bandwidth:
            floor = read_floor(backend, recorder)
            bandwidth = floor.bytes_per_s if floor is not None else None
        timed, flush = units, backend.flush
        if protocol.sampler == "graph":  # the flush goes into each unit's graph, ahead of the call
            timer = graph_timer(timer, learn_flush_kernels(backend, recorder))
            timed, flush = graph_units(units, backend), _no_flush
        if on_round_done is not None:
            on_round_done(so_far(EngineOutput()))
        config = EngineConfig(protocol.rounds, protocol.samples, protocol.warmup, first_round,
                              order_seed=protocol.order_seed, placement_mode=protocol.placement_mode)
        out = run_rounds(timed, config, recorder, timer, flush=flush, sync=backend.sync, clocks=backend.clocks,
                         markers=backend.markers, on_unit_done=on_unit_done,
                         on_round_done=saved if on_round_done is not None else None)
    finally:
        recorder.close()
    return so_far(out)


def _measurement(units: Sequence[Unit], protocol: TimingProtocol, backend: TimingBackend, timer: TimerStrategy,
                 recorder, out: EngineOutput, bandwidth: float | None, floor: ReadFloor | None,
                 before: Measurement | None) -> Measurement:
    """The Measurement of the rounds in `out`, after those of `before`, by `timer` (the graph
    sampler's when --graph)."""
    declared, inferred = _declared(units, out.samples)
    audit = timer.audit(out.samples, declared, out.kernels, out.dropped_by_round)
    samples, clocks, api_records = tuple(out.samples), tuple(out.clocks), out.api_records
    if before is not None:
        samples, clocks, api_records = before.samples + samples, before.clocks + clocks, before.api_records + api_records
        audit = combined(before.audit, audit)
    last = max(out.dropped_by_round, default=0 if before is None else before.rounds_done)
    return Measurement(protocol=protocol, timer=timer.name, metric=timer.metric, flush_bytes=backend.flush_bytes,
                       samples=samples, audit=audit, clocks=clocks, declared=declared, inferred=inferred,
                       read_bandwidth_bytes_per_s=bandwidth, read_floor=floor, timer_settings=timer.settings(recorder, api_records),
                       rounds_done=last, api_records=api_records)


def _no_flush() -> None:
    return None


def _declared(units: Sequence[Unit], samples: Sequence[Sample]) -> tuple[dict[Key, tuple], frozenset[Key]]:
    declared, inferred = {}, set()
    for u in units:
        key = (u.shape, u.arm)
        if u.kernels is not None:
            declared[key] = tuple(u.kernels)
        else:
            declared[key] = inferred_kernels([s for s in samples if (s.shape, s.arm) == key])
            inferred.add(key)
    return declared, frozenset(inferred)


def inferred_kernels(samples: Sequence[Sample]) -> tuple[DeclaredKernel, ...]:
    """The kernel set most samples hold, as exact-name declarations. A unit that launched
    nothing gets a declaration no sample meets, so the audit says so instead of passing."""
    sets = Counter(tuple(sorted(k.name for k in s.kernels)) for s in samples)
    common = sets.most_common(1)[0][0] if sets else ()
    if not common:
        return (DeclaredKernel("a kernel", r".", 1),)
    return tuple(DeclaredKernel(name, f"^{re.escape(name)}$", n) for name, n in sorted(Counter(common).items()))


def measured_read_floor(backend: TimingBackend, samples: int = PROBE_SAMPLES) -> ReadFloor | None:
    """The read floor alone, on a recorder of its own (`probe --op read`, `doctor --calibrate`)."""
    recorder = backend.timer.open(samples * MAX_PROBE_UNITS)
    try:
        return read_floor(backend, recorder, samples)
    finally:
        recorder.close()


def read_floor(backend: TimingBackend, recorder, samples: int = PROBE_SAMPLES) -> ReadFloor | None:
    """The best cold read of the probe's layouts (moebench.timing.read_floor), timed by the run's own
    timer after the probe's warm-up burst: each layout `samples` audited samples; None when
    the timer keeps no samples or no layout had half of its samples pass the audit."""
    if backend.probe is None or not backend.timer.keeps_samples:
        return None
    probe = backend.probe()
    if len(probe.units) > MAX_PROBE_UNITS:
        raise ValueError(f"a read probe of {len(probe.units)} layouts: the recorder holds {MAX_PROBE_UNITS}")
    if probe.warm is not None:
        probe.warm()
        backend.sync()
        recorder.collect()  # the burst's kernels are no sample's
    timer = backend.timer
    out = run_rounds(list(probe.units), EngineConfig(rounds=1, samples=samples, warmup=PROBE_WARMUP), recorder,
                     timer, flush=backend.flush, sync=backend.sync, first_external_id=PROBE_ID_BASE)
    declared, _ = _declared(probe.units, out.samples)
    audit = timer.audit(out.samples, declared, out.kernels, out.dropped_by_round)
    values: dict[str, list[int]] = {u.arm: [] for u in probe.units}
    for s in audited(out.samples, audit):
        values[s.arm].append(s.value_ns)
    return best_read(values, probe.nbytes, backend.gpu.name if backend.gpu else None, samples, probe.method)
