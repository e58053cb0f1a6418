"""Timer strategies: how a sample is taken, what it becomes, and what can be checked of it.

A strategy is chosen once per measurement. It opens the recorder the engine drives around
each call (`begin(id)` / `end(id)` per sample, `collect()` per round), turns a round's
records into its own Sample records, audits them as far as it can see, and declares its
metric (moebench.record.metrics) for the views. Nothing downstream tests a timer's name.

    KernelRecordTimer  CUPTI kernel records: a sample is the kernels launched under its
                       external id; audited kernel by kernel (the reference timing)
    EventTimer         a CUDA event pair around the call: a sample is one interval; only its
                       sign can be audited
    Untimed            launches only, for ncu or nsys to measure; no samples kept

The recorders themselves are device code (cupti_tracer.py, events_timer.py); a strategy
takes a factory for one, so tests drive the same strategies with a fake recorder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from moebench.record.metrics import EVENT_INTERVALS, KERNEL_RECORDS, UNTIMED, TimedMetric
from moebench.record.schema import Audit, KernelRecord, Sample
from moebench.timing.audit import Declared, audit_intervals, audit_samples
from moebench.timing.records import RecordBatch, TaggedKernel, group_by_external_id, tag_kernels


class Recorder(Protocol):
    """What the engine drives: per sample begin/end, per round collect (after a sync)."""

    def begin(self, external_id: int) -> None: ...
    def end(self, external_id: int) -> None: ...
    def collect(self) -> RecordBatch: ...
    def close(self) -> None: ...


Visit = tuple  # (external id, unit, index within the round): what the engine timed, in order


@dataclass
class RoundRecords:
    """One round as its timer made it: the samples, and every kernel seen (for the audit)."""

    samples: list[Sample] = field(default_factory=list)
    kernels: list[TaggedKernel] = field(default_factory=list)


class TimerStrategy(Protocol):
    name: str  # stored in the result's settings
    metric: TimedMetric
    keeps_samples: bool

    def open(self, capacity: int) -> Recorder: ...
    def round_records(self, round_: int, visits: Sequence[Visit], batch: RecordBatch) -> RoundRecords: ...
    def audit(self, samples: Sequence[Sample], declared: Mapping[tuple[str, str], Sequence[Declared]],
              kernels: Sequence[TaggedKernel], dropped_by_round: Mapping[int, int]) -> Audit: ...
    def settings(self, recorder: Recorder, api_records: int) -> dict: ...


class _RecorderTimer:
    """A timer whose recorder the backend makes (CUPTI's tracer, CUDA events)."""

    keeps_samples = True

    def __init__(self, open_recorder: Callable[[int], Recorder]):
        self._open = open_recorder

    def open(self, capacity: int) -> Recorder:
        return self._open(capacity)


class KernelRecordTimer(_RecorderTimer):
    name = "cupti"
    metric = KERNEL_RECORDS

    def round_records(self, round_: int, visits: Sequence[Visit], batch: RecordBatch) -> RoundRecords:
        tagged = tag_kernels(batch)
        groups = group_by_external_id(tagged)
        samples = [Sample(u.shape, u.arm, round_, i, ext,
                          tuple(KernelRecord(k.name, k.start_ns, k.end_ns) for k in groups.get(ext, ())))
                   for ext, u, i in visits]
        return RoundRecords(samples, tagged)

    def audit(self, samples, declared, kernels, dropped_by_round) -> Audit:
        return audit_samples(samples, declared, kernels, dropped_by_round)

    def settings(self, recorder: Recorder, api_records: int) -> dict:
        return {"api_filter": getattr(recorder, "api_filter", None), "api_records": api_records}


class EventTimer(_RecorderTimer):
    name = "events"
    metric = EVENT_INTERVALS

    def round_records(self, round_: int, visits: Sequence[Visit], batch: RecordBatch) -> RoundRecords:
        return RoundRecords([Sample(u.shape, u.arm, round_, i, 0, (), batch.events_ns.get(ext, 0))
                             for ext, u, i in visits])

    def audit(self, samples, declared, kernels, dropped_by_round) -> Audit:
        return audit_intervals(samples, dropped_by_round)

    def settings(self, recorder: Recorder, api_records: int) -> dict:
        return {"api_records": api_records}


class Untimed:
    """Runs the schedule and keeps nothing: for an outside profiler (ncu, nsys)."""

    name = "none"
    metric = UNTIMED
    keeps_samples = False

    def open(self, capacity: int) -> Recorder:
        from moebench.timing.events_timer import NullTimer
        return NullTimer()

    def round_records(self, round_: int, visits: Sequence[Visit], batch: RecordBatch) -> RoundRecords:
        return RoundRecords()

    def audit(self, samples, declared, kernels, dropped_by_round) -> Audit:
        return Audit(0, 0, 0)

    def settings(self, recorder: Recorder, api_records: int) -> dict:
        return {}


def cupti_timer(filter_api: bool | None = None) -> KernelRecordTimer:
    """CUPTI kernel records on this process's CUDA device (fails fast when CUPTI cannot load).
    MOEBENCH_CUPTI_API_FILTER=0 keeps every API record (slower; a fallback if the launch-only
    filter ever hides launches on some CUPTI version)."""
    from moebench.timing.cupti_tracer import CuptiTracer, load_cupti
    load_cupti()
    if filter_api is None:
        filter_api = os.environ.get("MOEBENCH_CUPTI_API_FILTER", "1") != "0"
    return KernelRecordTimer(lambda capacity: CuptiTracer(filter_api=filter_api))


def events_timer() -> EventTimer:
    from moebench.timing.events_timer import EventsTimer
    return EventTimer(EventsTimer)


# name -> the strategy on this machine's CUDA device, made when chosen
CUDA_TIMERS: dict[str, Callable[[], TimerStrategy]] = {"cupti": cupti_timer, "events": events_timer, "none": Untimed}
DEFAULT_TIMER = "cupti"
RUN_TIMERS = ("cupti", "events")  # what a timed run may choose; "none" only launches (probe, profile)
