"""A sweep as cells: one shape and the run's arm set each, prepared, checked and timed in its
own paired rounds on one device, then merged into one RunResult.

    sweep_cells   the request's shapes as cells, each with an estimated cost
    assign        cells to ranks: deterministic, balanced by cost
    run_cell      plan's arms on one shape: prepare, parity, the determinism checks when
                  asked, measure (or not, in a dry run), assemble; the result records the
                  cell (rank, host, device, bandwidth)
    merge         cells' results, and a partial sweep's file, into one RunResult that names
                  the cells not finished

A ratio is taken within one shape's rounds, so within one cell on one device: merging
cells never pairs samples of two devices. Who runs which cell, and how the results travel
between processes, is moebench.run.distributed's.
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from moebench.fixtures.builder import fixture_routes
from moebench.record import schema as S
from moebench.record.metrics import timed_metric
from moebench.record.provenance import provenance, utc_now
from moebench.run.assemble import assemble
from moebench.run.determinism import with_determinism
from moebench.run.plan import ArmPlan, RunRequest, Workload
from moebench.run.prepare import prepare
from moebench.run.runner import run_options
from moebench.timing.measure import Measurement, TimingBackend, measure

# FLOPs that cost as much as one byte read from HBM, about, on an FP8 Hopper GPU (dense FP8
# tensor peak over HBM bandwidth is a few hundred). It only orders cells for the sharding.
FLOPS_PER_BYTE = 300.0


@dataclass(frozen=True)
class Cell:
    shape: str
    cost: float  # estimated: the floor bytes, or FLOPs at FLOPS_PER_BYTE, whichever is more


def cell_cost(spec) -> float:
    """What a cell costs, estimated from its floors without building its weights: the FP8
    weights of the experts its routes reach, activations and output, against its FLOPs."""
    ids, _ = fixture_routes(spec)
    experts = int(torch.unique(ids).numel())
    M, K, N, I, top_k = spec.M, spec.K, spec.N, spec.I, spec.top_k
    hbm_bytes = experts * (N * K + K * I) + 3 * M * K
    flops = M * top_k * (2 * N * K + 2 * K * I)
    return float(max(hbm_bytes, flops / FLOPS_PER_BYTE))


def sweep_cells(work: Workload) -> list[Cell]:
    """The workload's shapes as cells, in its order."""
    return [Cell(spec.name, cell_cost(spec)) for spec in work.specs()]


def assign(cells: Sequence[Cell], world_size: int) -> dict[int, list[Cell]]:
    """Cells to ranks, the costliest first to the least loaded rank (ties: the lower rank);
    every rank computes the same assignment. Each rank's cells keep the sweep's order."""
    loads = [0.0] * world_size
    given: dict[int, list[Cell]] = {r: [] for r in range(world_size)}
    order = {c.shape: i for i, c in enumerate(cells)}
    for cell in sorted(cells, key=lambda c: (-c.cost, order[c.shape])):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        given[rank].append(cell)
        loads[rank] += cell.cost
    return {r: sorted(cs, key=lambda c: order[c.shape]) for r, cs in given.items()}


@dataclass(frozen=True)
class Placement:
    """Where a rank runs its cells."""

    rank: int
    device: torch.device
    backend: TimingBackend | None  # None: a dry run (nothing timed)
    world_size: int = 1
    host: str = dataclasses.field(default_factory=socket.gethostname)


def run_cell(req: RunRequest, plan: ArmPlan, cell: Cell, where: Placement, *,
             log: Callable[[str], None] = lambda m: None) -> S.RunResult:
    """One cell: the plan's arms prepared on the cell's fixture and checked against the oracle,
    then timed in paired rounds on `where.device` (a dry run stops after the checks). Raises
    RunFailed on a parity failure, as `moebench run` does."""
    started_at = utc_now()
    cell_req = replace(req, shapes=(cell.shape,))
    prep = with_determinism(plan, prepare(cell_req.workload, cell_req.protocol, plan, where.device, log), log)
    if where.backend is None:
        m, gpu = _unmeasured(req), None
    else:
        m, gpu = measure(prep.units, req.protocol, where.backend), where.backend.gpu
    result = assemble(m, prep.subjects, gpu=gpu, command=req.command, started_at=started_at,
                      options=run_options(req))
    info = S.CellInfo(cell.shape, where.rank, where.host, str(where.device), gpu.name if gpu else None,
                      gpu.uuid if gpu else None, m.read_bandwidth_bytes_per_s, cell.cost, started_at, utc_now(),
                      clocks=m.clocks, options=dict(result.settings.options), read_floor=m.read_floor)
    return replace(result, sharding=S.Sharding(where.world_size, "none", where.backend is None, {}, cells=(info,)))


def _unmeasured(req: RunRequest) -> Measurement:
    """A dry run's measurement: nothing timed."""
    p = req.protocol
    return Measurement(protocol=p, timer=p.timer, metric=timed_metric(p.timer), flush_bytes=0, samples=(),
                       audit=S.Audit(0, 0, 0), clocks=(), declared={}, inferred=frozenset())


def merge(parts: Sequence[S.RunResult], *, planned: Sequence[str], missing: Sequence[S.MissingCell],
          request: dict, world_size: int, dist_backend: str, dry_run: bool, command: Sequence[str],
          started_at: str, gpu: S.GpuInfo | None) -> S.RunResult:
    """One RunResult of `parts` (cells' results, or a partial sweep's file and the cells that
    finish it), shapes in `planned` order. Each part's statistics stay as its cell computed
    them (over its own device's bandwidth); the options all cells agree on are the run's, the
    rest stay with each cell."""
    order = {shape: i for i, shape in enumerate(planned)}
    # every cell with all its settings' options (a merged part keeps the common ones in its settings)
    cells = sorted(((replace(c, options={**p.settings.options, **c.options})) for p in parts for c in p.sharding.cells),
                   key=lambda c: order[c.shape])
    done = [c.shape for c in cells]

    def gathered(field: str):
        items = [x for p in parts for x in getattr(p, field)]
        return tuple(sorted(items, key=lambda x: order[getattr(x, "shape", None) or x.name]))  # stable

    first = parts[0].settings if parts else None
    options = _common_options([c.options for c in cells]) if cells else {}
    cells = [replace(c, options={k: v for k, v in c.options.items() if k not in options}) for c in cells]
    if first is None:  # no cell finished: the settings from the request
        req = request_from_plain(request)
        p = req.protocol
        first = S.Settings(shapes=(), arms=req.arms, ref=req.ref_arm, rounds=p.rounds, samples=p.samples,
                           warmup=p.warmup, flush=p.flush, flush_bytes=0, timer=p.timer,
                           balancedness=req.balancedness, sampler=p.sampler, placements=p.placements)
    settings = replace(first, shapes=tuple(done), options=options)
    audits = [p.audit for p in parts]
    audit = S.Audit(sum(a.samples_total for a in audits), sum(a.samples_passed for a in audits),
                    sum(a.dropped_records for a in audits), tuple(f for a in audits for f in a.findings))
    gpu = replace(gpu, read_bandwidth_bytes_per_s=None, read_floor=None) if gpu is not None else None  # each cell has its own
    missing = tuple(sorted(missing, key=lambda c: order[c.shape]))
    return S.RunResult(
        schema_version=S.SCHEMA_VERSION, provenance=provenance(command, started_at, gpu), settings=settings,
        fixtures=gathered("fixtures"), arms=gathered("arms"), parity=gathered("parity"),
        samples=gathered("samples"), clocks=(), audit=audit, summaries=gathered("summaries"),
        ratios=gathered("ratios"), build_parity=gathered("build_parity"), statistics_over=S.AUDITED_SAMPLES,
        determinism=gathered("determinism"),
        sharding=S.Sharding(world_size, dist_backend, dry_run, request, tuple(cells), missing))


def _common_options(per_cell: list[dict]) -> dict:
    first = per_cell[0]
    return {k: v for k, v in first.items() if all(k in o and o[k] == v for o in per_cell[1:])}


def request_plain(req: RunRequest) -> dict:
    """The request as JSON-able data (tuples as lists), for a result to keep."""
    return S.to_plain(req)


def request_from_plain(data: dict) -> RunRequest:
    """The request a sweep's file kept, its lists back as tuples."""
    fields = {f.name: f for f in dataclasses.fields(RunRequest)}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
    return RunRequest(**kwargs)
