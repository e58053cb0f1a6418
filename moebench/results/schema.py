"""RunResult: one run, everything needed to judge and redo it, as frozen records.

Saved as JSON with `schema_version`; `load` refuses any other version with one clear line.

Format history:
  1 (2026-11-29) first format: provenance, settings, fixtures, arms, parity, raw samples
    (CUPTI kernel records or event times), per-round clocks, audit, statistics.
    Later defaulted fields (older files read with the default): build_parity (`--build`);
    ArmSummary.sum_median_ns and the headline gpu_busy (the union of a sample's kernel
    intervals; equal to gpu_sum in every file written before PDL arms, whose kernels never
    overlap); RunResult.statistics_over: "audited samples" (summaries and ratios taken over the
    samples the audit passed), read as "all samples" for older files, whose statistics took
    every sample; RunResult.status (a run written after each round: complete or not, why not,
    how many rounds are in, and what `run --resume` needs to finish it), read as complete for
    older files.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
FORMAT = "moebench.RunResult"
AUDITED_SAMPLES = "audited samples"  # statistics over the samples the audit passed (every run now)
ALL_SAMPLES = "all samples"  # files written before: statistics over every sample
STATISTICS_OVER = (AUDITED_SAMPLES, ALL_SAMPLES)


@dataclass(frozen=True)
class KernelRecord:
    """One kernel of one sample, as CUPTI reported it (GPU timestamps, ns)."""

    name: str
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Sample:
    """One timed call of one arm. CUPTI samples carry their kernels; events samples carry
    only `events_ns`. The timed value of either is `value_ns`.

    Three CUPTI durations: gpu_sum adds the kernels' durations; gpu_busy is the length of the
    union of their intervals (the time the GPU spent on the call); gpu_span runs from the first
    start to the last end, gaps included. Without overlap busy equals sum; kernels launched with
    programmatic dependent launch (PDL) overlap their predecessor's tail, where sum counts the
    shared time twice."""

    shape: str
    arm: str
    round: int  # 1-based
    index: int  # 0-based within the round
    external_id: int  # CUPTI external correlation id pushed around the call (0 for events)
    kernels: tuple[KernelRecord, ...] = ()
    events_ns: int | None = None

    @property
    def gpu_sum_ns(self) -> int:
        return sum(k.duration_ns for k in self.kernels)

    @property
    def gpu_busy_ns(self) -> int:
        busy, end = 0, None
        for k in sorted(self.kernels, key=lambda k: k.start_ns):
            if end is None or k.start_ns >= end:
                busy += k.duration_ns
                end = k.end_ns
            elif k.end_ns > end:
                busy += k.end_ns - end
                end = k.end_ns
        return busy

    @property
    def gpu_span_ns(self) -> int:
        if not self.kernels:
            return 0
        return max(k.end_ns for k in self.kernels) - min(k.start_ns for k in self.kernels)

    @property
    def value_ns(self) -> int:
        """The headline time: gpu_busy for CUPTI samples, the event interval otherwise."""
        return self.events_ns if self.events_ns is not None else self.gpu_busy_ns


@dataclass(frozen=True)
class GpuInfo:
    name: str
    index: int
    uuid: str
    compute_capability: str  # "9.0"
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver: str
    cuda_runtime: str
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    read_bandwidth_bytes_per_s: float | None = None  # measured at the start of the run


@dataclass(frozen=True)
class Provenance:
    command: tuple[str, ...]  # argv that reproduces the run
    tool_version: str
    git_commit: str | None
    git_dirty: bool | None
    hostname: str
    started_at: str  # ISO 8601, UTC
    finished_at: str
    python: str
    libraries: dict[str, str]  # torch, triton, cuda-core, cupti-python, nvidia-ml-py, ...
    gpu: GpuInfo | None
    package_sha256: str | None = None  # over moebench's own source files: names the code without git


@dataclass(frozen=True)
class Settings:
    shapes: tuple[str, ...]
    arms: tuple[str, ...]  # in the order odd rounds run them
    ref: str
    rounds: int
    samples: int  # per arm per round
    warmup: int  # per arm per round
    flush: str  # "read" | "write" | "none"
    flush_bytes: int
    timer: str  # "cupti" | "events"
    balancedness: float
    options: dict[str, Any] = field(default_factory=dict)  # e.g. triton_config path


@dataclass(frozen=True)
class Floors:
    experts_routed: int
    weight_bytes: int
    activation_bytes: int
    output_bytes: int
    hbm_bytes: int
    flops: int


@dataclass(frozen=True)
class FixtureInfo:
    name: str
    family: str
    M: int
    K: int
    E: int
    top_k: int
    N: int
    seed: int
    balancedness: float
    fingerprint: str
    floors: Floors
    tokens_per_expert: dict[str, float] = field(default_factory=dict)  # min, median, max


@dataclass(frozen=True)
class DeclaredKernel:
    label: str
    pattern: str
    count: int


@dataclass(frozen=True)
class ArmInfo:
    name: str
    description: str
    shape: str
    kernels: tuple[DeclaredKernel, ...]
    identity: dict[str, Any] = field(default_factory=dict)  # config, source/binary hashes, flags


@dataclass(frozen=True)
class ParityInfo:
    shape: str
    arm: str
    rel_l2: float
    max_abs: float
    nonfinite: int
    threshold: float
    passed: bool
    oracle: str = "exact"  # the roundings the arm declared and was judged against
    rel_l2_exact: float | None = None  # against the exact oracle, when `oracle` is another


@dataclass(frozen=True)
class BuildParity:
    """One build's output against the base build's on the same fixture (`--build`)."""

    shape: str
    arm: str  # e.g. cuda-fused@new
    base: str  # the build it is compared with (the ref if it is a build, else the first)
    bitwise_equal: bool
    max_abs_diff: float  # -1: not finite
    mismatched: int  # output elements whose bits differ


@dataclass(frozen=True)
class ClockSample:
    round: int
    sm_mhz: int | None
    mem_mhz: int | None
    temperature_c: int | None
    power_w: float | None


@dataclass(frozen=True)
class AuditFinding:
    shape: str
    arm: str
    round: int
    index: int
    reason: str


@dataclass(frozen=True)
class Audit:
    samples_total: int
    samples_passed: int
    dropped_records: int
    findings: tuple[AuditFinding, ...] = ()

    @property
    def passed(self) -> bool:
        return self.samples_passed == self.samples_total and self.dropped_records == 0 and not self.findings


@dataclass(frozen=True)
class ArmSummary:
    """One arm at one shape: median of per-round medians (rows)."""

    shape: str
    arm: str
    median_ns: float
    row_medians_ns: tuple[float, ...]  # one per round
    min_ns: float
    max_ns: float
    samples: int
    span_median_ns: float | None  # gpu_span (CUPTI only)
    hbm_bandwidth_bytes_per_s: float  # floor bytes / median time
    fraction_of_read_bandwidth: float | None  # of the measured device read bandwidth
    sum_median_ns: float | None = None  # gpu_sum, median of rows (CUPTI only): > median_ns when kernels overlap


@dataclass(frozen=True)
class RatioSummary:
    """ref-row / arm-row per round, median over rounds; > 1 means the arm is faster."""

    shape: str
    ref: str
    arm: str
    median: float
    low: float
    high: float
    per_round: tuple[float, ...]
    rounds_won: int  # rounds where the arm's row beat the ref's
    rounds: int


@dataclass(frozen=True)
class RunStatus:
    """Whether the run finished. A run saves itself after every round, marked incomplete; an
    interrupted one keeps the reason; `moebench run --resume` finishes it from `request`."""

    complete: bool = True
    reason: str = ""  # why an incomplete run stopped ("" when complete)
    rounds_done: int | None = None  # rounds whose samples are in the file (None: all, older files)
    request: dict[str, Any] | None = None  # the request as asked, while incomplete: what a resume plans again
    resumed_at: tuple[int, ...] = ()  # the first round of each resumed stretch


@dataclass(frozen=True)
class RunResult:
    schema_version: int
    provenance: Provenance
    settings: Settings
    fixtures: tuple[FixtureInfo, ...]
    arms: tuple[ArmInfo, ...]
    parity: tuple[ParityInfo, ...]
    samples: tuple[Sample, ...]
    clocks: tuple[ClockSample, ...]
    audit: Audit
    summaries: tuple[ArmSummary, ...]
    ratios: tuple[RatioSummary, ...]
    format: str = FORMAT
    build_parity: tuple[BuildParity, ...] = ()
    statistics_over: str = ALL_SAMPLES  # which samples the summaries and ratios were taken over
    status: RunStatus = field(default_factory=RunStatus)

    @property
    def rounds_done(self) -> int:
        done = self.status.rounds_done
        return self.settings.rounds if done is None else done


# --- plain data <-> records ------------------------------------------------------------

def to_plain(obj: Any) -> Any:
    """Records to JSON-able dicts/lists, keeping only declared fields (no properties)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(cls: type, data: Any) -> Any:
    """Build `cls` (a record type, or a typing form over records) from `to_plain` output.
    Raises ValueError with a path on anything that does not fit."""
    return _build(cls, data, cls.__name__ if isinstance(cls, type) else "value")


def _build(tp: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _build(arg, data, path)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"{path}: unexpected null")
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list")
        (item, *_rest) = typing.get_args(tp)
        return tuple(_build(item, v, f"{path}[{i}]") for i, v in enumerate(data))
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object")
        args = typing.get_args(tp)
        value_tp = args[1] if args else Any
        return {k: _build(value_tp, v, f"{path}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _build(hints[f.name], data[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{path}: missing field {f.name!r}")
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"{path}: expected a number")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise ValueError(f"{path}: expected {tp.__name__}")
        return data
    raise ValueError(f"{path}: unsupported type {tp!r}")
