"""RunResult: one run, everything needed to judge and redo it, as frozen records.

Saved as JSON with `schema_version`; `load` refuses any other version with one clear line.

The format's versions and the fields each added: docs/results-format.md.

These records are the types of every stage that makes them, not copies: the fixtures' Floors,
the arms' DeclaredKernel (moebench.kernels.api.arm.KernelDecl), parity's ParityInfo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from moebench.record.determinism import DeterminismVerdict
from moebench.record.plain import from_plain, to_plain  # noqa: F401  (the records' converters, used as S.*)
from moebench.record.samples import Sample  # (a run's samples and their audit, used as S.*)
from moebench.record.samples import CLOCK_MOVE_TOLERANCE, Audit, AuditFinding, ClockSample, KernelRecord  # noqa: F401

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # what `load` accepts: 1 differs only in fields 2 added with defaults
FORMAT = "moebench.RunResult"
AUDITED_SAMPLES = "audited samples"  # statistics over the samples the audit passed (every run now)
ALL_SAMPLES = "all samples"  # files written before: statistics over every sample
STATISTICS_OVER = (AUDITED_SAMPLES, ALL_SAMPLES)


@dataclass(frozen=True)
class ReadFloor:
    """The best cold read the card did in this run (moebench.timing.read_floor): the HBM floor's rate."""

    bytes_per_s: float  # the winning layout's: bytes read over the median of its audited samples
    config: str  # the winning layout: CTAs an SM x threads x 16-byte loads in flight a thread
    method: str  # the kernel and how it reads
    nbytes: int  # bytes one sample reads
    samples: int  # the winner's audited samples
    configs: dict[str, float] = field(default_factory=dict)  # every layout timed: its rate (bytes/s)
    datasheet_bytes_per_s: float | None = None  # the board's HBM bandwidth as its datasheet gives it
    datasheet_source: str = ""

    @property
    def of_datasheet(self) -> float | None:
        """The measured rate as a fraction of the datasheet's."""
        return self.bytes_per_s / self.datasheet_bytes_per_s if self.datasheet_bytes_per_s else None


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
    read_bandwidth_bytes_per_s: float | None = None  # measured at the start of the run (read_floor's rate)
    read_floor: ReadFloor | None = None  # how it was read (None: files of version 1, a torch.sum)


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
    sampler: str = "eager"  # "eager": launched call by call; "graph": one CUDA graph replay per sample
    placements: int = 1  # prepared copies of each call asked for (or the default's target)
    placement_mode: str = "rounds"  # "rounds": round r timed copy (r - 1) mod P; "samples": turned per sample
    placements_by_shape: dict[str, int] = field(default_factory=dict)  # copies made per shape (empty: `placements`)
    order_seed: int | None = None  # the arms' order was drawn from it per pair of rounds (None: alternating)

    def placements_at(self, shape: str) -> int:
        return self.placements_by_shape.get(shape, self.placements)


@dataclass(frozen=True)
class Floors:
    """What a fixture must cost at the least: bytes that cross HBM once, and FLOPs."""

    experts_routed: int
    weight_bytes: int  # FP8 weights and FP32 block scales of the experts actually routed
    activation_bytes: int  # FP8 activations, their scales, routing ids and weights
    output_bytes: int  # BF16 output
    hbm_bytes: int  # the three above
    flops: int  # 2*N*K + 2*K*I per token slot

    def hbm_floor_us(self, bandwidth_bytes_per_s: float) -> float:
        return self.hbm_bytes / bandwidth_bytes_per_s * 1e6


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
    # a registry shape's model (as published), layout (`ep8`) and config (`<hub repo> config.json`)
    model: str = ""
    layout: str = ""
    config: str = ""


@dataclass(frozen=True)
class DeclaredKernel:
    """One kernel a sample must contain: `count` launches whose name matches `pattern`
    (re.search against the name CUPTI reports)."""

    label: str
    pattern: str
    count: int = 1

    def matches(self, kernel_name: str) -> bool:
        return re.search(self.pattern, kernel_name) is not None


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
    ref_max_abs: float | None = None  # the oracle's largest magnitude, for scale
    # judged by the arm's error model (moebench.fixtures.error_model) unless a fixed threshold was
    # asked for: the residual energy over the model's allowance at its worst place (<= 1 passes),
    # that place, and the relative L2 the model expects of a correct kernel (`threshold` is then
    # the relative L2 the model allows over the whole output)
    model_excess: float | None = None
    model_where: str | None = None
    expected_rel_l2: float | None = None

    def reason(self) -> str:
        if self.nonfinite:
            return f"{self.nonfinite} output elements unwritten or not finite"
        if self.model_excess is not None:
            if self.model_excess > 1.0:
                return (f"residual {self.model_excess:.3g}x its error model's allowance at {self.model_where} "
                        f"(relative L2 {self.rel_l2:.3g}; a correct kernel expects {self.expected_rel_l2:.3g})")
            return "ok"
        if self.rel_l2 > self.threshold:
            return f"relative L2 error {self.rel_l2:.3g} > {self.threshold:g}"
        return "ok"


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
    hbm_bandwidth_bytes_per_s: float | None  # floor bytes / median time (None: no fixture, read as unknown)
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
class CellInfo:
    """One cell of a sharded sweep: one shape and the run's arm set, prepared, checked and
    timed in its own paired rounds on one device. Its ratios never mix devices."""

    shape: str
    rank: int
    host: str
    device: str  # as the rank saw it: "cuda:0" (its LOCAL_RANK) or "cpu"
    gpu_name: str | None
    gpu_uuid: str | None
    read_bandwidth_bytes_per_s: float | None  # measured on this cell's device before its rounds
    cost_estimate: float  # what the sharding balanced (moebench.run.sweep_cells.cell_cost)
    started_at: str
    finished_at: str
    clocks: tuple[ClockSample, ...] = ()  # this cell's rounds
    options: dict[str, Any] = field(default_factory=dict)  # the cell's own timer settings
    read_floor: ReadFloor | None = None  # how this cell's read bandwidth was read


@dataclass(frozen=True)
class MissingCell:
    """A cell of a sharded sweep with no result in the file: `sweep --resume` runs it."""

    shape: str
    rank: int  # the rank it was given to
    reason: str


@dataclass(frozen=True)
class Sharding:
    world_size: int
    dist_backend: str  # the torch.distributed backend the ranks gathered through ("gloo"), or "none"
    dry_run: bool  # fixtures, route plans and oracle checks only: no samples
    request: dict[str, Any]  # the sweep's RunRequest as plain data, for `sweep --resume`
    cells: tuple[CellInfo, ...] = ()  # finished, in the sweep's shape order
    missing: tuple[MissingCell, ...] = ()


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
    # {shape: {arm: floor}}: the |A/A - 1| an arm shows against a second prepared copy of itself
    # (a fraction); `compare` widens its SAME band to it. Empty where the run measured none.
    noise: dict[str, dict[str, float]] = field(default_factory=dict)
    determinism: tuple[DeterminismVerdict, ...] = ()
    sharding: Sharding | None = None  # a sweep sharded across ranks (moebench.run.distributed)
    status: RunStatus = field(default_factory=RunStatus)

    @property
    def rounds_done(self) -> int:
        done = self.status.rounds_done
        return self.settings.rounds if done is None else done

