"""What a run measured, sample by sample: each timed call's kernels (or event time), each round's
clocks, and the audit's findings. Part of RunResult (moebench.record.schema re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass


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


CLOCK_MOVE_TOLERANCE = 0.03  # an SM clock that moved more than this within a round flags it


@dataclass(frozen=True)
class ClockSample:
    """NVML's view of one round: clocks, temperature and power at its end, the SM clock at
    its start, and the clock-event reasons (throttling) seen at either end."""

    round: int
    sm_mhz: int | None
    mem_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    sm_mhz_start: int | None = None
    events: tuple[str, ...] = ()  # e.g. "sw_power_cap", "hw_slowdown", "sw_thermal" (idle not counted)
    power_limit_w: float | None = None  # the enforced power limit at the round's end

    @property
    def throttled(self) -> str | None:
        """Why the round's clocks cannot be trusted to have held, or None."""
        if self.events:
            return "clock events " + ", ".join(self.events)
        a, b = self.sm_mhz_start, self.sm_mhz
        if a and b and abs(b - a) > CLOCK_MOVE_TOLERANCE * max(a, b):
            return f"SM clock moved {a} → {b} MHz within the round"
        return None


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
