"""What `moebench tune` writes: the state file's key, the engines' tables of the finished Ms,
and the provenance beside them (GPU, Triton, timing regime, moebench, dates, per-M outcome).

Provenance format history:
  moebench-tune-provenance-1: the first.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from moebench.kernels.stock.engine_config import parse_entry
from moebench.kernels.stock.tuned_tables import table_name, write_table
from moebench.record import VERSION
from moebench.record.atomic import atomic_write
from moebench.tasks.tune_space import ENGINE_GRID, OWN_AXES

PROVENANCE_FORMAT = "moebench-tune-provenance-1"


def state_key(req, spec, dev, kernel_sha256: str) -> dict:
    """What a state file's measurements hold for: a rerun with another key starts elsewhere."""
    f = spec.family
    return {"geometry": {"family": f.model and f"{f.model}/{f.layout}" or f.letter, "E": f.E, "K": f.K,
                         "I": f.I, "top_k": f.top_k, "balancedness": req.balancedness},
            "device_name": dev.name, "capability": list(dev.capability), "triton": dev.triton_version,
            "kernel_source_sha256": kernel_sha256, "timing": timing_regime(req), "passes": req.passes,
            "pdl": req.pdl}


def timing_regime(req) -> dict:
    p = req.protocol
    return {"sampler": p.sampler, "flush": p.flush, "timer": p.timer, "rounds": p.rounds, "samples": p.samples,
            "warmup": p.warmup, "statistic": "median of a candidate's audited samples, each GEMM alone",
            "check": {"rounds": req.check_rounds, "samples": req.check_protocol.samples,
                      "rule": "tuned pair kept where the median over rounds of shipped/tuned (whole path) > 1"}}


def _gpu(device: torch.device, gpu=None) -> dict:
    if gpu is not None:
        return asdict(gpu)
    if device.type != "cuda":
        return {"name": "cpu (Triton interpreter)"}
    from moebench.record.provenance import gpu_info
    return asdict(gpu_info(device))


def provenance_doc(req, state, spec, dev, device: torch.device, stopped: str | None, gpu=None) -> dict:
    from moebench.record.provenance import git_state, library_versions, package_sha256, utc_now
    commit, dirty = git_state()
    finished = state.finished()
    return {
        "format": PROVENANCE_FORMAT, "moebench": VERSION, "git_commit": commit, "git_dirty": dirty,
        "package_sha256": package_sha256(), "command": list(req.command), "finished_at": utc_now(),
        "gpu": _gpu(device, gpu), "device_name": dev.name, "triton": dev.triton_version,
        "libraries": library_versions(), "geometry": state.key["geometry"], "timing": timing_regime(req),
        "search": {"start": "the engine's shipped configs at each M", "passes": req.passes,
                   "moves": ["BLOCK_SIZE_M (both GEMMs)", *OWN_AXES], "engine_grid": ENGINE_GRID},
        "ms": sorted(finished), "stopped": stopped,
        "entries": {str(m): o for m, o in finished.items()},
    }


def write_outputs(req, state, folder: Path, stem: str, spec, dev, device: torch.device,
                  stopped: str | None = None, gpu=None) -> tuple[Path, ...]:
    """The up and down tables of every finished M, and the provenance; nothing when none is finished."""
    finished = state.finished()
    if not finished:
        return ()
    up = {m: parse_entry(o["up"], f"tuned M={m}") for m, o in finished.items()}
    down = {m: parse_entry(o["down"], f"tuned M={m}") for m, o in finished.items()}
    paths = (write_table(folder / table_name(spec.E, spec.I, dev.name), up),
             write_table(folder / table_name(spec.E, spec.I, dev.name, down=True), down))
    prov = folder / f"{stem}.provenance.json"
    atomic_write(prov, (json.dumps(provenance_doc(req, state, spec, dev, device, stopped, gpu), indent=1) + "\n").encode())
    return (*paths, prov)
