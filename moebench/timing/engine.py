"""The timing loop: paired rounds of samples, each one cold, traced and tagged.

Per round, for each shape, for each arm in the round's order:
    warm-ups:  reset(); flush(); run()                                 (untimed)
    samples:   reset(); flush(); timer.begin(id); run(); timer.end(id)
then one device sync, `timer.collect()` (CUPTI records or event times), one clock
sample, and the round's samples are built from the records. Nothing in a sample syncs
or allocates beyond a few Python objects; the flush and reset run before the external id
is pushed, so their kernels are never part of a sample.

The loop knows nothing of CUDA: the timer, flush, sync, clocks and markers are passed in,
so tests drive it on the CPU with a fake timer that emits synthetic records.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

from moebench.results.schema import ClockSample, KernelRecord, Sample
from moebench.timing.records import RecordBatch, TaggedKernel, group_by_external_id, tag_kernels
from moebench.timing.schedule import round_order


class Timer(Protocol):
    name: str

    def begin(self, external_id: int) -> None: ...
    def end(self, external_id: int) -> None: ...
    def collect(self) -> RecordBatch: ...
    def close(self) -> None: ...


class Markers(Protocol):
    def push(self, message: str) -> None: ...
    def pop(self) -> None: ...


class NoMarkers:
    def push(self, message: str) -> None:
        pass

    def pop(self) -> None:
        pass


class NvtxMarkers:
    """NVTX ranges in the `moebench` domain, visible in nsys timelines."""

    def __init__(self):
        import nvtx
        self._domain = nvtx.get_domain("moebench")
        self._attrs: dict[str, object] = {}

    def push(self, message: str) -> None:
        attrs = self._attrs.get(message)
        if attrs is None:
            attrs = self._attrs[message] = self._domain.get_event_attributes(message=message)
        self._domain.push_range(attrs)

    def pop(self) -> None:
        self._domain.pop_range()


def nvtx_markers_or_none() -> Markers:
    try:
        return NvtxMarkers()
    except Exception:
        return NoMarkers()


@dataclass
class Unit:
    """One arm at one shape, prepared: what the loop times."""

    shape: str
    arm: str
    run: Callable[[], None]
    reset: Callable[[], None] | None = None


@dataclass(frozen=True)
class EngineConfig:
    rounds: int = 5
    samples: int = 30
    warmup: int = 5

    def __post_init__(self):
        if self.rounds < 1 or self.samples < 1 or self.warmup < 0:
            raise ValueError("rounds and samples must be >= 1, warmup >= 0")


@dataclass
class EngineOutput:
    samples: list[Sample] = field(default_factory=list)
    clocks: list[ClockSample] = field(default_factory=list)
    kernels: list[TaggedKernel] = field(default_factory=list)  # every kernel seen in the timed rounds
    dropped_by_round: dict[int, int] = field(default_factory=dict)
    api_records: int = 0


def _noop() -> None:
    return None


def run_rounds(units: Sequence[Unit], config: EngineConfig, timer: Timer, *,
               flush: Callable[[], None] = _noop, sync: Callable[[], None] = _noop,
               clocks: Callable[[int], ClockSample] | None = None, markers: Markers | None = None,
               on_unit_done: Callable[[int, Unit, int], None] | None = None,
               first_external_id: int = 1) -> EngineOutput:
    """Time every unit `config.samples` times per round. Units of one shape are paired:
    they run back to back, forward in odd rounds and reversed in even ones; shapes keep
    the order they first appear in `units`."""
    markers = markers or NoMarkers()
    shapes: dict[str, list[Unit]] = {}
    for u in units:
        shapes.setdefault(u.shape, []).append(u)
    out = EngineOutput()
    next_id = first_external_id
    n_samples, n_warmup = config.samples, config.warmup
    for r in range(1, config.rounds + 1):
        visits: list[tuple[int, Unit, int]] = []  # (external id, unit, index)
        markers.push(f"round {r}")
        for shape_units in shapes.values():
            for u in round_order(shape_units, r):
                run, reset = u.run, u.reset or _noop
                markers.push(f"{u.shape} {u.arm}")
                for _ in range(n_warmup):
                    reset()
                    flush()
                    run()
                for i in range(n_samples):
                    markers.push(f"sample {i}")
                    reset()
                    flush()
                    timer.begin(next_id)
                    run()
                    timer.end(next_id)
                    markers.pop()
                    visits.append((next_id, u, i))
                    next_id += 1
                markers.pop()
                if on_unit_done is not None:
                    on_unit_done(r, u, n_samples)
        markers.pop()
        sync()
        batch = timer.collect()
        if clocks is not None:
            out.clocks.append(clocks(r))
        _add_round(out, r, visits, batch, timer.name)
    return out


def _add_round(out: EngineOutput, r: int, visits, batch: RecordBatch, timer_name: str) -> None:
    out.dropped_by_round[r] = batch.dropped
    out.api_records += batch.api_records
    if timer_name == "events":
        for ext, u, i in visits:
            out.samples.append(Sample(u.shape, u.arm, r, i, 0, (), batch.events_ns.get(ext, 0)))
        return
    tagged = tag_kernels(batch)
    out.kernels.extend(tagged)
    groups = group_by_external_id(tagged)
    for ext, u, i in visits:
        kernels = tuple(KernelRecord(k.name, k.start_ns, k.end_ns) for k in groups.get(ext, ()))
        out.samples.append(Sample(u.shape, u.arm, r, i, ext, kernels))


@contextmanager
def closing(timer: Timer) -> Iterator[Timer]:
    try:
        yield timer
    finally:
        timer.close()
