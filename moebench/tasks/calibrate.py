"""`moebench doctor --calibrate`: what difference this machine can resolve, before a user trusts
a 2% result on it.

About a minute on the GPU: one run of the default protocol at one short shape (Q8) timing an arm
and identical copies of it together: `cuda-fused`, two `--build`s of its own shipped source and
the A/A copy every run times of its reference (on a GPU it cannot run on: `triton` and its A/A copy). Identical code
should read 1.000x; how far its copies' paired ratios and their intervals stray from 1 is the
difference this machine cannot tell from nothing. Beside it: the run's read floor (measured, the
layout that won, the datasheet, the share of it) and the clocks the rounds ran at.

The arithmetic is pure and tested on the CPU: `copy_ratios` (each copy's paired ratio against the
arm and its bootstrap interval, from a result's audited samples), `spread` (the largest
|ratio - 1|), `resolvable` (the farthest any copy's interval reaches from 1, rounded up to 0.1%:
a difference larger than that is more than identical code showed), `clock_summary` and the lines
printed. `calibrate` is the GPU part: a request (`calibration_request`) through the run pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from moebench.analysis import significance as sig
from moebench.errors import UserError
from moebench.record.schema import ClockSample, GpuInfo, ReadFloor, RunResult

CONFIDENCE = 0.95
DEFAULT_SHAPE = "Q8"
FUSED, FALLBACK = "cuda-fused", "triton"
COPY_NAMES = ("copy2", "copy3")  # the two --build copies of cuda-fused's source
RESOLUTION_STEP = 0.001  # the resolvable difference is rounded up to this


@dataclass(frozen=True)
class CopyRatio:
    """One identical copy against the arm: ref-row / copy-row, median over rounds, and its interval."""

    shape: str
    ref: str
    copy: str
    median: float
    low: float
    high: float
    rounds: int

    @property
    def reach(self) -> float:
        """How far from 1 the interval goes: identical code cannot be told apart closer than this."""
        return max(abs(self.low - 1), abs(self.high - 1), abs(self.median - 1))


def copy_ratios(result: RunResult, shape: str, ref: str, copies: Sequence[str]) -> list[CopyRatio]:
    """Each copy's paired ratio against `ref` at `shape`, from the audited samples, with its
    CONFIDENCE bootstrap interval (rounds drawn jointly, samples within them)."""
    units = sig.rounds_of(sig.audited_samples(result))
    out = []
    for copy in copies:
        a, b = units.get((shape, ref)), units.get((shape, copy))
        shared = [r for r in (a or {}) if r in (b or {})]
        if not shared:
            raise UserError(f"calibration: {copy} and {ref} at {shape} share no audited round")
        ref_rows, copy_rows = [a[r] for r in shared], [b[r] for r in shared]
        draws = sig.bootstrap_paired_ratio(ref_rows, copy_rows, sig.generator(shape, ref, copy, "calibrate"))
        low, high = sig.interval(draws, CONFIDENCE)
        out.append(CopyRatio(shape, ref, copy, sig.paired_ratio(ref_rows, copy_rows), low, high, len(shared)))
    return out


def spread(ratios: Sequence[CopyRatio]) -> float:
    """The A/A/A spread: the largest |ratio - 1| among the copies."""
    return max(abs(r.median - 1) for r in ratios)


def resolvable(ratios: Sequence[CopyRatio]) -> float:
    """The smallest difference this machine resolves: the farthest any copy's interval reaches
    from 1, rounded up to RESOLUTION_STEP (a difference beyond it is more than identical code showed)."""
    reach = max(r.reach for r in ratios)
    return math.ceil(round(reach / RESOLUTION_STEP, 6)) * RESOLUTION_STEP


def _span(values: Sequence[float | int | None], unit: str, fmt: str = "{:.0f}") -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "?"
    lo, hi = min(known), max(known)
    return (fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}") + f" {unit}"


def clock_summary(clocks: Sequence[ClockSample], gpu: GpuInfo | None) -> str:
    """The rounds' clocks and power at their ends, the limits, and the throttle reasons seen."""
    top_sm = f" (max {gpu.max_sm_clock_mhz})" if gpu and gpu.max_sm_clock_mhz else ""
    top_mem = f" (max {gpu.max_mem_clock_mhz})" if gpu and gpu.max_mem_clock_mhz else ""
    limit = _span([c.power_limit_w for c in clocks], "W")
    reasons = {}
    for c in clocks:
        if c.throttled:
            reasons.setdefault(c.throttled, []).append(c.round)
    throttle = "; ".join(f"{why} in round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                         for why, rs in reasons.items()) or "none"
    return (f"SM {_span([c.sm_mhz for c in clocks], 'MHz')}{top_sm}, memory {_span([c.mem_mhz for c in clocks], 'MHz')}"
            f"{top_mem}, power {_span([c.power_w for c in clocks], 'W')} of a {limit} limit, "
            f"over {len(clocks)} rounds; throttle reasons: {throttle}")


def floor_line(floor: ReadFloor | None, bandwidth: float | None) -> str:
    if floor is None:
        return "read floor: not measured" if bandwidth is None else f"read floor: {bandwidth / 1e12:.2f} TB/s"
    sheet = "no datasheet figure for this GPU" if floor.datasheet_bytes_per_s is None else \
        f"datasheet {floor.datasheet_bytes_per_s / 1e12:.2f} TB/s, {floor.of_datasheet:.1%} of it"
    return (f"read floor: {floor.bytes_per_s / 1e12:.3f} TB/s measured (read kernel layout {floor.config}, "
            f"best of {len(floor.configs)}); {sheet}")


@dataclass(frozen=True)
class Calibration:
    arm: str
    shape: str
    ratios: tuple[CopyRatio, ...]
    floor: ReadFloor | None
    bandwidth: float | None
    clocks: tuple[ClockSample, ...]
    gpu: GpuInfo | None
    protocol: str  # how the run timed (its settings, in words)
    saved: str | None = None  # where the run's result was kept

    @property
    def resolvable(self) -> float:
        return resolvable(self.ratios)

    @property
    def spread(self) -> float:
        return spread(self.ratios)


def calibration_of(result: RunResult, arm: str, copies: Sequence[str], saved: str | None = None) -> Calibration:
    """The calibration a finished run of the arm and its copies gives."""
    shape = result.settings.shapes[0]
    s = result.settings
    protocol = f"{s.rounds} rounds x {s.samples} samples (+{s.warmup} warm-up), flush {s.flush}, timer {s.timer}"
    gpu = result.provenance.gpu
    return Calibration(arm, shape, tuple(copy_ratios(result, shape, arm, copies)),
                       gpu.read_floor if gpu else None, gpu.read_bandwidth_bytes_per_s if gpu else None,
                       result.clocks, gpu, protocol, saved)


def calibration_lines(cal: Calibration) -> list[str]:
    copies = ", ".join(r.copy for r in cal.ratios)
    lines = [f"A/A/A: {cal.arm} at {cal.shape} and {len(cal.ratios)} identical copies ({copies}), timed together "
             f"at default settings ({cal.protocol})"]
    lines += [f"  {r.ref} / {r.copy}: {r.median:.4f}x [{r.low:.4f}, {r.high:.4f}] ({CONFIDENCE:.0%} interval, "
              f"{r.rounds} rounds)" for r in cal.ratios]
    lines.append(f"  spread: max |ratio - 1| = {cal.spread:.2%}; the intervals reach {max(r.reach for r in cal.ratios):.2%}")
    lines.append(floor_line(cal.floor, cal.bandwidth))
    lines.append(f"clocks: {clock_summary(cal.clocks, cal.gpu)}")
    if cal.saved:
        lines.append(f"run saved: {cal.saved}")
    lines.append(f"this machine resolves differences larger than {cal.resolvable:.1%} at {cal.shape}")
    return lines


def calibration_request(fused_runs_here: bool, shape: str, out_dir: str, command: tuple[str, ...]):
    """The run, as `moebench run` makes it by default (the reference's A/A copy ARM#2 included):
    cuda-fused and two --build copies of its shipped source, or (where cuda-fused cannot run)
    triton. Returns (request, arm, copy labels): the builds and ARM#2."""
    from moebench.kernels.cuda.source import KERNELS_DIR
    from moebench.run.noise import copy_label
    from moebench.run.plan import REF_AA, RunRequest
    if fused_runs_here:
        source = str(KERNELS_DIR / "sm90_fused_moe.cu")
        req = RunRequest(shapes=(shape,), arms=(FUSED,), ref=FUSED, out_dir=out_dir, command=command,
                         builds=tuple(f"{name}={source}" for name in COPY_NAMES), aa_arm=REF_AA)
        return req, FUSED, (*(f"{FUSED}@{name}" for name in COPY_NAMES), copy_label(FUSED))
    req = RunRequest(shapes=(shape,), arms=(FALLBACK,), ref=FALLBACK, out_dir=out_dir, command=command,
                     aa_arm=REF_AA)
    return req, FALLBACK, (copy_label(FALLBACK),)


def calibrate(shape: str = DEFAULT_SHAPE, out_dir: str | None = None, command: tuple[str, ...] = (),
              log=lambda m: None) -> Calibration:
    """The GPU part: one run of the calibration request through the run pipeline."""
    import tempfile

    import torch
    if not torch.cuda.is_available():
        raise UserError("doctor --calibrate needs a GPU: no CUDA device visible (`moebench doctor` says why)")
    from moebench.kernels.registry import load_builtin_arms
    from moebench.run.runner import run
    device = torch.device("cuda", torch.cuda.current_device())
    fused_ok = load_builtin_arms()[FUSED]().unavailable_reason(device) is None
    with tempfile.TemporaryDirectory(prefix="moebench-calibrate-") as scratch:
        req, arm, copies = calibration_request(fused_ok, shape, out_dir or scratch, command)
        result, path = run(req, log=log)
        return calibration_of(result, arm, copies, str(path) if out_dir else None)
