"""A sweep sharded across the ranks of torch.distributed, one device a rank.

`torchrun --nproc-per-node N -m moebench sweep ...` starts N ranks (`sweep --gpus 0,1,...`
starts that torchrun itself). Every rank plans the same request and computes the same
assignment of cells to ranks (moebench.run.sweep_cells); each rank prepares, checks and times
its own cells on cuda:LOCAL_RANK with the one measurement core, so a cell's paired rounds
and ratios stay on one device. Objects travel through a gloo process group (CPU only; no
collective ever touches a GPU while one is timed).

A finished cell is saved at once as its own RunResult in `<result>.cells/`, so a rank that
dies loses only the cell it was on. At the end rank 0 gathers every rank's cells, fills in
from that folder what a failed rank had saved, merges, and writes one RunResult that names
the cells not finished; `sweep --resume FILE` runs those and merges them into FILE. When a
rank fails, torchrun stops the others with SIGTERM: rank 0 then skips the gather and writes
what the folder holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch

from moebench.analysis.load import load
from moebench.errors import UserError
from moebench.record import schema as S
from moebench.record.atomic import atomic_write
from moebench.record.provenance import utc_now
from moebench.record.store import ensure_writable_dir, reserve_path, save
from moebench.run.plan import RunRequest, plan_arms, validate, with_default_arms
from moebench.run.prepare import RunFailed
from moebench.run.sweep_cells import (Cell, Placement, assign, merge, request_from_plain, request_plain, run_cell,
                                      sweep_cells)
from moebench.timing.measure import TimingBackend, cuda_backend

GATHER_TIMEOUT = timedelta(hours=24)  # the gather waits for the slowest rank's cells


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> World:
        """The rank and world a launcher set, each a whole number, the rank inside the world."""
        values = {}
        for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            text = os.environ.get(name, default).strip()
            if not (text.isascii() and text.isdigit()) or len(text) > 6:
                raise UserError(f"environment {name}={text[:20]!r}: expected a whole number (as torchrun sets it)")
            values[name] = int(text)
        if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
            raise UserError(f"environment RANK={values['RANK']} WORLD_SIZE={values['WORLD_SIZE']}: "
                            f"the rank must be inside a world of at least 1")
        return cls(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def launched_by_torchrun() -> bool:
    """torchrun (or a launcher like it) set this process's rank and world."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


class Stopped(BaseException):
    """A signal stopped this rank (torchrun sends SIGTERM to the others when one fails). Like
    KeyboardInterrupt, not an Exception: code that wraps the errors it catches (the Triton
    interpreter does) lets it through."""


@dataclass(frozen=True)
class SweepOutcome:
    result: S.RunResult
    path: Path


def sharded_sweep(req: RunRequest, *, dry_run: bool = False, resume: str | None = None,
                  backend: TimingBackend | None = None,
                  log: Callable[[str], None] = lambda m: None) -> SweepOutcome | None:
    """This rank's part of a sharded sweep; on rank 0 the merged result and where it was
    saved, None on the others. `resume`: a sharded sweep's file, whose missing cells are run
    (with the file's own request) and merged into it. `backend`: the device to time on
    (default: this rank's GPU, cuda:LOCAL_RANK)."""
    world = World.from_env()
    base = resumable(resume) if resume else None
    if base is not None:
        req = replace(request_from_plain(base.sharding.request), command=req.command)
        dry_run = base.sharding.dry_run
    if dry_run:
        device, backend = _device(world, dry_run), None
    elif backend is not None:
        device = backend.device
    else:
        device = _device(world, dry_run)
        backend = cuda_backend(req.protocol)
    req = with_default_arms(req, device, log)
    req, plan = plan_arms(req)
    validate(req)
    ensure_writable_dir(req.out_dir)
    todo = tuple(c.shape for c in base.sharding.missing) if base is not None else req.shapes
    cells = sweep_cells(req.workload.with_shapes(todo))
    given = assign(cells, world.world_size)
    where = Placement(world.rank, device, backend, world.world_size)

    with _process_group(world), _stop_on_signal() as signals:
        path, started_at = _shared_names(world, req, resume, dry_run)
        folder = cells_folder(path)
        folder.mkdir(parents=True, exist_ok=True)
        _write_rank_file(folder, where, given[world.rank])
        done, failed, stopped = _run_cells(req, plan, given[world.rank], where, folder, signals, log)
        if world.rank != 0:
            try:
                if stopped is None:
                    _gather(world, {"done": [S.to_plain(r) for r in done],
                                    "failed": [S.to_plain(c) for c in failed]})
            except (Stopped, KeyboardInterrupt):
                stopped = Stopped("SIGTERM")
            if stopped is not None:
                raise SystemExit(128 + signal.SIGTERM)
            return None
        reports = {0: (done, failed)}
        if stopped is None and world.world_size > 1:
            try:
                reports.update(_gather(world, {}))
            except (Stopped, KeyboardInterrupt, RuntimeError) as err:  # a peer died during the gather
                stopped = err
        signals.raising = False  # from here on rank 0 writes what it has
        finished = _with_saved_cells(reports, folder, given)
        missing = _missing(given, finished, reports, stopped)
        parts = ([base] if base is not None else []) + [finished[c.shape] for c in cells if c.shape in finished]
        planned = base.sharding.request["shapes"] if base is not None else req.shapes
        result = merge(parts, planned=planned, missing=missing,
                       request=base.sharding.request if base is not None else request_plain(req),
                       world_size=max(world.world_size, base.sharding.world_size if base is not None else 1),
                       dist_backend="gloo" if world.world_size > 1 else "none", dry_run=dry_run,
                       command=base.provenance.command if base is not None else req.command,
                       started_at=base.provenance.started_at if base is not None else started_at,
                       gpu=backend.gpu if backend is not None else None)
        save(result, path)
        shutil.rmtree(folder, ignore_errors=True)  # every cell it held is in the result now
        return SweepOutcome(result, path)


def resumable(path: str) -> S.RunResult:
    base = load(path)
    if base.sharding is None:
        raise UserError(f"{path}: not a sharded sweep's result (nothing to resume)")
    if not base.sharding.missing:
        raise UserError(f"{path}: every cell finished; nothing to resume")
    return base


def _device(world: World, dry_run: bool) -> torch.device:
    if torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            raise UserError(f"rank {world.rank}: LOCAL_RANK {world.local_rank} but only "
                            f"{torch.cuda.device_count()} CUDA device(s) visible")
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    if not dry_run:
        raise UserError("no CUDA device visible: a sweep times on GPUs (--dry-run checks the cells on the CPU)")
    from moebench.kernels.stock.arms import use_interpreter
    use_interpreter(True)  # the Triton arms' kernels on the CPU
    return torch.device("cpu")


@contextmanager
def _process_group(world: World):
    if world.world_size == 1:
        yield
        return
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=world.rank, world_size=world.world_size, timeout=GATHER_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _shared_names(world: World, req: RunRequest, resume: str | None, dry_run: bool) -> tuple[Path, str]:
    """The result's path and the sweep's start, chosen on rank 0 and sent to every rank."""
    names = [None, None]
    if world.rank == 0:
        started_at = utc_now()
        path = Path(resume) if resume else reserve_path(Path(req.out_dir) / sweep_filename(req, started_at, dry_run))
        names = [str(path), started_at]
    if world.world_size > 1:
        import torch.distributed as dist
        dist.broadcast_object_list(names, src=0)
    return Path(names[0]), names[1]


def sweep_filename(req: RunRequest, started_at: str, dry_run: bool) -> str:
    """`20261129T101500Z_sweep_A1-A2-A4_triton-vs-cuda-fused.json` (`_dry-run` for a dry run)."""
    parts = [re.sub(r"[-:]", "", started_at), "sweep", "-".join(req.shapes), "-vs-".join(req.arms)]
    if dry_run:
        parts.append("dry-run")
    return re.sub(r"[^A-Za-z0-9._-]", "_", "_".join(parts)) + ".json"


def cell_filename(shape: str) -> str:
    """A finished cell's file in the run's folder: the shape's name, a model shape's slashes
    (`deepseek-v3/ep8/M8`) made underscores so that it is one file."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", shape) + ".json"


def cells_folder(path: Path) -> Path:
    """Where the ranks save each finished cell of the sweep whose result goes to `path`."""
    name = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(name + ".cells")


def _write_rank_file(folder: Path, where: Placement, cells: list[Cell]) -> None:
    """Which process runs which cells: for a person (or a test) watching a sweep."""
    info = {"rank": where.rank, "pid": os.getpid(), "host": where.host, "device": str(where.device),
            "cells": [c.shape for c in cells]}
    atomic_write(folder / f"rank-{where.rank}.json", json.dumps(info).encode())


def _run_cells(req, plan, cells: list[Cell], where: Placement, folder: Path, signals: _Signals, log):
    """This rank's cells in order, each saved as soon as it finishes. A parity failure fails
    that cell only; a signal stops the rank (returned, with the cells finished before it)."""
    done, failed, stopped = [], [], None
    try:
        for cell in cells:
            log(f"rank {where.rank}: {cell.shape} on {where.device}")
            try:
                result = run_cell(req, plan, cell, where, log=log)
            except RunFailed as err:
                failed.append(S.MissingCell(cell.shape, where.rank, str(err)))
                continue
            save(result, folder / cell_filename(cell.shape))
            done.append(result)
    except (Stopped, KeyboardInterrupt) as err:
        stopped = err
    except Exception:
        if signals.received is None:
            raise
        stopped = Stopped(signals.received)  # the signal's exception, wrapped by code it went through
    return done, failed, stopped


class _Signals:
    """SIGTERM as Stopped while `raising`; afterwards only noted, so that rank 0's writing of
    what it has is not cut short (torchrun waits 30 s before SIGKILL)."""

    def __init__(self):
        self.raising = True
        self.received: str | None = None

    def __call__(self, signum, frame):
        self.received = signal.Signals(signum).name
        if self.raising:
            raise Stopped(self.received)


@contextmanager
def _stop_on_signal():
    handler = _Signals()
    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGTERM, before)


def _gather(world: World, payload: dict) -> dict[int, tuple[list, list]]:
    """Every rank's cells on rank 0 (by rank), as records."""
    import torch.distributed as dist
    out = [None] * world.world_size if world.rank == 0 else None
    dist.gather_object(payload, out, dst=0)
    if world.rank != 0:
        return {}
    return {r: ([S.from_plain(S.RunResult, d) for d in p["done"]],
                [S.from_plain(S.MissingCell, c) for c in p["failed"]]) for r, p in enumerate(out) if r != 0}


def _with_saved_cells(reports: dict, folder: Path, given: dict[int, list[Cell]]) -> dict[str, S.RunResult]:
    """Cells by shape: those the ranks reported, and those a rank that never reported saved."""
    finished = {r.settings.shapes[0]: r for done, _ in reports.values() for r in done}
    for rank, cells in given.items():
        for cell in cells:
            saved = folder / cell_filename(cell.shape)
            if cell.shape not in finished and saved.exists():
                try:
                    finished[cell.shape] = load(saved)
                except UserError:
                    pass  # a cell cut short is not finished
    return finished


def _missing(given, finished, reports, stopped) -> list[S.MissingCell]:
    failed = {c.shape: c for _, fs in reports.values() for c in fs}
    out = []
    for rank, cells in given.items():
        for cell in cells:
            if cell.shape in finished:
                continue
            if cell.shape in failed:
                out.append(failed[cell.shape])
            elif rank == 0:
                out.append(S.MissingCell(cell.shape, 0, f"rank 0 was stopped ({stopped}) before it finished"))
            else:
                out.append(S.MissingCell(cell.shape, rank, f"rank {rank} did not finish it (the rank failed "
                                                           f"or was stopped)"))
    return out


def launch(gpus: str, argv: list[str], *, dry_run: bool) -> int:
    """`sweep --gpus 0,1,...`: torchrun (torch.distributed.run) with one rank per listed GPU,
    each rank seeing only its own (CUDA_VISIBLE_DEVICES), running this sweep without --gpus."""
    ids = _gpu_ids(gpus)
    if not dry_run:
        if not torch.cuda.is_available():
            raise UserError("--gpus: no CUDA device visible (--dry-run checks the cells on the CPU)")
        if max(ids) >= torch.cuda.device_count():
            raise UserError(f"--gpus {gpus}: only {torch.cuda.device_count()} CUDA device(s) visible")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}
    return subprocess.call(launch_command(len(ids), argv), env=env)


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line of `moebench ARGV`, with --gpus taken out and --m spelled
    --ms (torchrun's parser reads `--m` anywhere as an ambiguous prefix of its own options)."""
    args = [re.sub(r"^--m(?==|$)", "--ms", a) for a in without_option(argv, "--gpus")]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "moebench", *args]


def without_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def _gpu_ids(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise UserError(f"--gpus: expected GPU indices like 0,1,2,3, got {text!r}")
    ids = [int(t) for t in items]
    if len(set(ids)) != len(ids):
        raise UserError(f"--gpus: a GPU given twice in {text!r}")
    return ids
