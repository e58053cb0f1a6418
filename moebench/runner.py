"""`moebench run` as a composition of the stages:

    plan (moebench.plan)       the request checked, this run's own arms resolved
    prepare (moebench.prepare) fixtures on the device, arms prepared, parity vs the oracle
    measure (moebench.measure) paired rounds, every sample audited
    assemble (moebench.assemble) statistics over the audited samples, the RunResult
    save (moebench.results.store)

The device comes in one TimingBackend, so the whole run also goes on the CPU in tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from moebench.assemble import assemble, result_filename
from moebench.errors import UserError
from moebench.failures import RunFailed, gpu_memory_guard
from moebench.kernels.registry import make_arms
from moebench.measure import TimingBackend, cuda_backend, measure
from moebench.noise import with_noise
from moebench.plan import RunRequest, plan_arms, resolve_specs, validate, with_default_arms
from moebench.prepare import prepare
from moebench.results import schema as S
from moebench.results.provenance import utc_now
from moebench.results.store import ensure_writable_dir, reserve_path, save

__all__ = ["RunFailed", "RunRequest", "TimingBackend", "planned", "result_filename", "run", "run_options"]


def planned(req: RunRequest, backend: TimingBackend | None, log: Callable[[str], None]):
    """The request with its arms decided (the defaults for the device, builds, variants and
    external arms appended), checked, with its arm plan. No GPU work."""
    device = backend.device if backend is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None)
    if device is not None:
        req = with_default_arms(req, device, log)
    req, plan = plan_arms(req)
    if not req.arms and device is None:
        raise UserError("no CUDA device visible: with no --arms, `moebench run` times every arm that can run "
                        "on this machine's GPU (see `moebench arms` and `moebench doctor`)")
    validate(req)
    return req, plan


def run_options(req: RunRequest) -> dict:
    """The request's own settings a result stores: arm options, and `--build`, `--define`,
    `--build-arm`, `--variant` and `--arm` as given, when given."""
    given = {"builds": list(req.builds), "defines": list(req.defines), "build_arm": req.build_arm,
             "variants": list(req.variants), "external_arms": list(req.external_arms), "aa": req.aa_arm,
             "noise_from": req.noise_from}
    return {**req.arm_options, **{k: v for k, v in given.items() if v}}


def run(req: RunRequest, backend: TimingBackend | None = None, *, log: Callable[[str], None] = lambda m: None,
        progress_factory=None) -> tuple[S.RunResult, Path]:
    """The whole run. Returns the result and where it was saved. Raises UserError for a bad
    request, RunFailed for a parity failure; an audit failure is in the result."""
    req, plan = planned(req, backend, log)
    ensure_writable_dir(req.out_dir)
    started_at = utc_now()
    if backend is None:
        resolve_specs(req)  # bad shape names before touching the GPU
        make_arms(req.arms, req.arm_options, plan.factories)
        with gpu_memory_guard("allocating the L2 flush buffer"):
            backend = cuda_backend(req.protocol)
    prep = prepare(req, plan, backend.device, log)
    protocol = req.protocol
    if progress_factory is not None:
        with progress_factory(protocol.rounds * len(prep.units) * protocol.samples) as advance:
            m = measure(prep.units, protocol, backend, on_unit_done=advance)
    else:
        m = measure(prep.units, protocol, backend)
    result = assemble(m, prep.subjects, gpu=backend.gpu, command=req.command, started_at=started_at,
                      options=run_options(req))
    result = with_noise(result, req.aa_arm, req.noise_from)
    path = save(result, reserve_path(Path(req.out_dir) / result_filename(result)))
    return result, path
