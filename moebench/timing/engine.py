"""The timing loop: paired rounds of samples, each one cold, traced and tagged.

Per round, for each shape, for each arm in the round's order:
    warm-ups:  reset(); flush(); run()                                 (untimed)
    samples:   reset(); flush(); timer.begin(id); run(); timer.end(id)
then one device sync, `recorder.collect()` (CUPTI records or event times), the clocks of
the round (sampled at its start and its end: moebench.timing.clocks), and the timer strategy (timers.py) builds the round's samples from the records. Nothing in a sample syncs
or allocates beyond a few Python objects; the flush and reset run before the external id
is pushed, so their kernels are never part of a sample.

The loop knows nothing of CUDA: the recorder, timer strategy, flush, sync, clocks and markers
are passed in, so tests drive it on the CPU with a fake recorder that emits synthetic records.
`on_round_done` sees the output after every round (a place to save partial results); a run
resumed after round k starts at `first_round` k+1 with the external ids it would have had.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from moebench.record.schema import ClockSample, DeclaredKernel, Sample
from moebench.timing.clocks import over_round
from moebench.timing.records import TaggedKernel
from moebench.timing.schedule import copy_index, round_order
from moebench.timing.timers import Recorder, TimerStrategy


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


Call = tuple[Callable[[], None], "Callable[[], None] | None"]  # (run, reset) of one prepared copy


@dataclass
class Unit:
    """One arm at one shape, prepared: what the loop times. `others` are further copies of the
    same call, each on buffers of its own (`--placements`): round r runs copy (r - 1) mod n,
    `run` and `reset` being copy 0, so where a copy's memory lands spreads over the rounds."""

    shape: str
    arm: str
    run: Callable[[], None]
    reset: Callable[[], None] | None = None
    kernels: tuple[DeclaredKernel, ...] | None = None  # what a sample must hold (None: infer from the samples)
    others: tuple[Call, ...] = ()

    @classmethod
    def placed(cls, shape: str, arm: str, calls: Sequence[Call],
               kernels: tuple[DeclaredKernel, ...] | None = None) -> Unit:
        """The unit of the prepared copies `calls`, (run, reset) each, the first as `run`/`reset`."""
        (run, reset), *others = calls
        return cls(shape, arm, run, reset, kernels, tuple(others))

    @property
    def copies(self) -> tuple[Call, ...]:
        return ((self.run, self.reset), *self.others)

    @property
    def placements(self) -> int:
        return 1 + len(self.others)

    def call(self, round_: int, sample: int = 0, mode: str = "rounds") -> Call:
        """(run, reset) of the copy that sample `sample` of round `round_` (1-based) times
        (moebench.timing.schedule.copy_index)."""
        return self.copies[copy_index(round_, sample, self.placements, mode)]


@dataclass(frozen=True)
class EngineConfig:
    rounds: int = 5
    samples: int = 30
    warmup: int = 5
    first_round: int = 1  # a resumed run starts after its last saved round (rounds + 1: none left)
    order_seed: int | None = None  # None: forward on odd rounds, reversed on even; else drawn (schedule.py)
    placement_mode: str = "rounds"  # which copy a sample uses (schedule.copy_index)

    def __post_init__(self):
        if self.rounds < 1 or self.samples < 1 or self.warmup < 0:
            raise ValueError("rounds and samples must be >= 1, warmup >= 0")
        if not 1 <= self.first_round <= self.rounds + 1:
            raise ValueError("first_round must be in 1..rounds + 1")


@dataclass
class EngineOutput:
    samples: list[Sample] = field(default_factory=list)
    clocks: list[ClockSample] = field(default_factory=list)
    kernels: list[TaggedKernel] = field(default_factory=list)  # every kernel seen in the timed rounds
    dropped_by_round: dict[int, int] = field(default_factory=dict)
    api_records: int = 0


def _noop() -> None:
    return None


def run_rounds(units: Sequence[Unit], config: EngineConfig, recorder: Recorder, timer: TimerStrategy, *,
               flush: Callable[[], None] = _noop, sync: Callable[[], None] = _noop,
               clocks: Callable[[int], ClockSample] | None = None, markers: Markers | None = None,
               on_unit_done: Callable[[int, Unit, int], None] | None = None,
               on_round_done: Callable[[int, EngineOutput], None] | None = None,
               first_external_id: int = 1) -> EngineOutput:
    """Time every unit `config.samples` times per round, rounds `config.first_round` to
    `config.rounds`. Units of one shape are paired: they run back to back, forward in odd
    rounds and reversed in even ones; shapes keep the order they first appear in `units`.
    Round r's samples take the external ids they would in a run from round 1, and a unit with
    several placements runs the copy of each sample (Unit.call); `config.order_seed` draws the
    order of each pair of rounds (moebench.timing.schedule)."""
    markers = markers or NoMarkers()
    shapes: dict[str, list[Unit]] = {}
    for u in units:
        shapes.setdefault(u.shape, []).append(u)
    out = EngineOutput()
    n_samples, n_warmup = config.samples, config.warmup
    next_id = first_external_id + (config.first_round - 1) * len(units) * n_samples
    for r in range(config.first_round, config.rounds + 1):
        visits: list[tuple[int, Unit, int]] = []  # (external id, unit, index)
        start_clocks = clocks(r) if clocks is not None else None
        markers.push(f"round {r}")
        for shape_units in shapes.values():
            for u in round_order(shape_units, r, config.order_seed):
                calls = [u.call(r, i, config.placement_mode) for i in range(-n_warmup, n_samples)]
                markers.push(f"{u.shape} {u.arm}")
                for run, reset in calls[:n_warmup]:
                    (reset or _noop)()
                    flush()
                    run()
                for i, (run, reset) in enumerate(calls[n_warmup:]):
                    markers.push(f"sample {i}")
                    (reset or _noop)()
                    flush()
                    recorder.begin(next_id)
                    run()
                    recorder.end(next_id)
                    markers.pop()
                    visits.append((next_id, u, i))
                    next_id += 1
                markers.pop()
                if on_unit_done is not None:
                    on_unit_done(r, u, n_samples)
        markers.pop()
        sync()
        batch = recorder.collect()
        if clocks is not None:
            out.clocks.append(over_round(start_clocks, clocks(r)))
        records = timer.round_records(r, visits, batch)
        out.dropped_by_round[r] = batch.dropped
        out.api_records += batch.api_records
        out.samples.extend(records.samples)
        out.kernels.extend(records.kernels)
        if on_round_done is not None:
            on_round_done(r, out)
    return out
