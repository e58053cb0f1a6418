"""`moebench run` as a composition of the stages:

    plan (moebench.run.plan)       the request checked, this run's own arms resolved
    prepare (moebench.run.prepare) fixtures on the device, arms prepared, parity vs the oracle
    determinism (moebench.run.determinism) with --determinism: the prepared calls' verdicts
    measure (moebench.timing.measure) paired rounds, every sample audited
    assemble (moebench.run.assemble) statistics over the audited samples, the RunResult
    save (moebench.run.partial)      after every round, marked incomplete until the last

`resume` finishes a saved partial run: the file's request planned and prepared again, held
to the file (moebench.run.resume), and only the remaining rounds timed (the file's parity and
determinism verdicts kept).
The device comes in one TimingBackend, so the whole run also goes on the CPU in tests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from moebench.analysis.load import load
from moebench.errors import UserError
from moebench.failures import RunFailed, gpu_memory_guard
from moebench.kernels.registry import make_arms
from moebench.record import schema as S
from moebench.record.provenance import package_sha256, utc_now
from moebench.record.store import ensure_writable_dir
from moebench.run.assemble import assemble, result_filename
from moebench.run.determinism import with_determinism
from moebench.run.noise import with_noise
from moebench.run.partial import PartialSaver, RunInterrupted, stop_signals
from moebench.run.plan import RunRequest, plan_arms, validate, validate_settings, with_default_arms, with_order_seed
from moebench.run.prepare import prepare
from moebench.run.resume import check_same, check_settings, earlier_measurement, request_plain, resumable_request
from moebench.timing.measure import Measurement, TimingBackend, cuda_backend, measure

__all__ = ["RunFailed", "RunInterrupted", "RunRequest", "TimingBackend", "planned", "result_filename", "resume",
           "run", "run_options"]


def planned(req: RunRequest, backend: TimingBackend | None, log: Callable[[str], None]):
    """The request with its arms decided (the defaults for the device, builds, variants and
    external arms appended), checked, with its arm plan. No GPU work."""
    device = backend.device if backend is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None)
    if device is not None:
        req = with_default_arms(req, device, log)
    req, plan = plan_arms(req)
    if not req.arms and device is None:
        validate_settings(req)  # the request's own mistakes first: a GPU would not mend them
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
    """The whole run. Returns the result and where it was saved (written after every round,
    marked incomplete until the last). Raises UserError for a bad request, RunFailed for a
    parity failure, RunInterrupted on SIGINT or SIGTERM; an audit failure is in the result."""
    asked = req = with_order_seed(req)
    req, plan = planned(req, backend, log)
    ensure_writable_dir(req.out_dir)
    started_at = utc_now()
    backend = backend or _device_backend(req, plan)
    prep = with_determinism(plan, prepare(req.workload, req.protocol, plan, backend.device, log), log)

    def make(m: Measurement, status: S.RunStatus) -> S.RunResult:
        return _with_floors(req, assemble(m, prep.subjects, gpu=backend.gpu, command=req.command,
                                          started_at=started_at, options=run_options(req), status=status))
    saver = PartialSaver(make, request_plain(asked), out_dir=req.out_dir)
    return _measured(req, prep.units, backend, saver, progress_factory), saver.path


def resume(path: str | Path, backend: TimingBackend | None = None, *, given: dict | None = None,
           log: Callable[[str], None] = lambda m: None, progress_factory=None) -> tuple[S.RunResult, Path]:
    """Finish the partial run saved at `path`, in place: the same request, checked to give the
    same fixtures, arms, GPU and settings as the file's (else one UserError line), then only
    the rounds after the file's. `given`: request fields named again, which must match."""
    path = Path(path)
    old = load(path)
    req, plan = planned(resumable_request(old, str(path), given), backend, log)
    backend = backend or _device_backend(req, plan)
    prep = prepare(req.workload, req.protocol, plan, backend.device, log)
    prep.made.clear()  # the file's verdicts are kept: nothing is checked again
    check_same(old, prep.subjects, backend.gpu, package_sha256(), str(path))
    subjects = replace(prep.subjects, parity=old.parity, build_parity=old.build_parity, determinism=old.determinism)
    before = earlier_measurement(old, req.protocol)

    def make(m: Measurement, status: S.RunStatus) -> S.RunResult:
        return _with_floors(req, assemble(m, subjects, gpu=old.provenance.gpu, command=old.provenance.command,
                                          started_at=old.provenance.started_at, options=run_options(req),
                                          status=status))
    saver = PartialSaver(make, old.status.request, path=path, resumed_at=(*old.status.resumed_at, old.rounds_done + 1),
                         check=lambda new: check_settings(old, new, str(path)))
    return _measured(req, prep.units, backend, saver, progress_factory, before), path


def _device_backend(req: RunRequest, plan) -> TimingBackend:
    make_arms(req.arms, req.arm_options, plan.factories)
    with gpu_memory_guard("allocating the L2 flush buffer"):
        return cuda_backend(req.protocol)


def _with_floors(req: RunRequest, result: S.RunResult) -> S.RunResult:
    """The noise floors (an A/A pair's, a --noise-from file's) go into the finished file only:
    a floor over some rounds is not the run's."""
    return with_noise(result, req.aa_arm, req.noise_from) if result.status.complete else result


def _measured(req: RunRequest, units, backend: TimingBackend, saver: PartialSaver, progress_factory,
              before: Measurement | None = None) -> S.RunResult:
    """Measure, saving after every round; a signal or an error leaves the last round's file
    with the reason."""
    protocol = req.protocol
    left = protocol.rounds - (before.rounds_done if before else 0)
    with stop_signals():
        try:
            with gpu_memory_guard("timing the rounds"):
                if progress_factory is not None:
                    with progress_factory(left * len(units) * protocol.samples) as advance:
                        m = measure(units, protocol, backend, on_unit_done=advance, on_round_done=saver,
                                    before=before)
                else:
                    m = measure(units, protocol, backend, on_round_done=saver, before=before)
            return saver.finish(m)
        except BaseException as err:
            raise saver.stopped(err) from None
