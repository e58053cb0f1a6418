"""Graph sampling (`--graph`): each sample is one replay of a CUDA graph of the flush and the call.

Decode runs in CUDA graphs in every serving engine: the kernels of one call are launched by
one graph launch, with no host between them. Under `--graph` every unit is captured once,
after its eager warm-ups, as a graph of [fenced L2 flush, run()], and a sample is
reset (eager, untimed) · begin(id) · replay · end(id).

How the kernels of a replay are found. CUPTI gives a kernel launched from a graph the
correlation id of the graph launch (cudaGraphLaunch / cuGraphLaunch, kept by the tracer's
launch filter), and the external id pushed around the replay is tied to that launch like any
other, so every kernel of the graph carries the sample's id, the flush's included. The flush
is taken out by what it is: before the rounds, the flush runs once eagerly under its own id,
which names its kernels; a graph sample whose first kernels (in start order) are exactly
those has them removed and tagged as untagged work. The fence in the graph (the call waits
on the flush's event) keeps them first; were it broken, a flush kernel inside the call's
window is foreign work to the audit, and a sample that does not start with them keeps them
and fails the audit as holding undeclared kernels. Nothing is dropped silently.

The flush in the graph leaves L2 as cold as the eager flush: a GPU test replays a small read
with the flush in its graph twice and checks the second replay is no faster.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from moebench.errors import UserError
from moebench.record.schema import Sample
from moebench.timing.engine import Unit
from moebench.timing.records import RecordBatch, TaggedKernel, tag_kernels
from moebench.timing.timers import RoundRecords, TimerStrategy, Visit

SAMPLERS = ("eager", "graph")
FLUSH_PROBE_ID = (1 << 40) - 1  # the external id of the one eager flush that names its kernels
CAPTURE_WARMUPS = 2  # eager calls on the capture's side stream first, as torch asks


def learn_flush_kernels(backend, recorder) -> tuple[str, ...]:
    """The names of the flush's kernels, in order: one eager flush under its own id."""
    backend.sync()
    recorder.collect()  # whatever came before
    recorder.begin(FLUSH_PROBE_ID)
    backend.flush()
    recorder.end(FLUSH_PROBE_ID)
    backend.sync()
    return tuple(k.name for k in tag_kernels(recorder.collect()) if k.external_id == FLUSH_PROBE_ID)


def graph_units(units: Sequence[Unit], backend) -> list[Unit]:
    """Each unit with its run() replaced by the replay of a graph of [flush, run()], one graph a
    placement. A call that
    cannot be captured (a host sync or allocation inside it) is a UserError naming the arm."""
    if backend.capture is None:
        raise UserError("--graph: this timing backend cannot capture CUDA graphs")
    flush = backend.flush
    out = []
    for u in units:
        replays = [(_captured(u, run, flush, backend), reset) for run, reset in u.copies]
        out.append(Unit.placed(u.shape, u.arm, replays, u.kernels))
    return out


def _captured(u: Unit, run, flush, backend):
    """The replay of a graph of [flush, run()], or a UserError naming the arm."""
    def flushed_call() -> None:
        flush()
        run()
    try:
        return backend.capture(flushed_call)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 (whatever the capture raised is the arm's to fix)
        first = (str(err).strip().splitlines() or [""])[0][:160]
        raise UserError(f"--graph: arm {u.arm} at {u.shape} cannot be captured in a CUDA graph "
                        f"({type(err).__name__}: {first}); time it eagerly (without --graph)") from None


def strip_flush(samples: Sequence[Sample], tagged: Sequence[TaggedKernel],
                flush_kernels: tuple[str, ...]) -> tuple[list[Sample], list[TaggedKernel]]:
    """Samples without the flush's leading kernels, and the round's kernels with those kernels
    untagged (external id 0), so that the audit sees them as work outside every sample."""
    n = len(flush_kernels)
    if n == 0:
        return list(samples), list(tagged)
    removed: set[tuple[int, str, int, int]] = set()
    kept = []
    for s in samples:
        head = s.kernels[:n]
        if len(s.kernels) > n and tuple(k.name for k in head) == flush_kernels:
            removed.update((s.external_id, k.name, k.start_ns, k.end_ns) for k in head)
            s = Sample(s.shape, s.arm, s.round, s.index, s.external_id, s.kernels[n:], s.events_ns)
        kept.append(s)
    retagged = [t._replace(external_id=0) if (t.external_id, t.name, t.start_ns, t.end_ns) in removed else t
                for t in tagged]
    return kept, retagged


class GraphSampledTimer:
    """A kernel-record timer whose samples are graph replays: the same records, the same audit,
    the flush's kernels taken out of each sample (`strip_flush`)."""

    def __init__(self, inner: TimerStrategy, flush_kernels: tuple[str, ...]):
        self.inner = inner
        self.flush_kernels = flush_kernels
        self.name = inner.name
        self.metric = inner.metric
        self.keeps_samples = inner.keeps_samples

    def open(self, capacity: int):
        return self.inner.open(capacity)

    def round_records(self, round_: int, visits: Sequence[Visit], batch: RecordBatch) -> RoundRecords:
        records = self.inner.round_records(round_, visits, batch)
        samples, kernels = strip_flush(records.samples, records.kernels, self.flush_kernels)
        return RoundRecords(samples, kernels)

    def audit(self, samples, declared: Mapping, kernels, dropped_by_round):
        return self.inner.audit(samples, declared, kernels, dropped_by_round)

    def settings(self, recorder, api_records: int) -> dict:
        return {**self.inner.settings(recorder, api_records), "graph_flush_kernels": list(self.flush_kernels)}


def graph_timer(inner: TimerStrategy, flush_kernels: tuple[str, ...]) -> GraphSampledTimer:
    return GraphSampledTimer(inner, flush_kernels)


def capture_cuda_graph(fn: Callable[[], None], device) -> Callable[[], None]:
    """Capture `fn` (warmed up first on a side stream, as torch asks) and return the graph's
    replay, launched on torch's current stream."""
    import torch

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(CAPTURE_WARMUPS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph.replay
