"""`moebench profile SHAPE ARM`: the arm's timed call, run untimed for ncu or nsys to measure.

The same plan, preparation and parity check as `moebench run`, then one measurement with the
untimed strategy: `calls` calls (after `warmup` more), each inside NVTX ranges ("round 1",
"SHAPE ARM", "sample i") when the nvtx package is installed, with the flush the user chose
(none by default: ncu's `--cache-control all` flushes for itself). No CUPTI tracer is active,
so the profiler has the device's counters to itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from moebench.errors import UserError
from moebench.kernels.registry import make_arms
from moebench.record.schema import ParityInfo
from moebench.run.plan import RunRequest, plan_arms, validate
from moebench.run.prepare import prepare
from moebench.timing.measure import MAX_SAMPLES, TimingBackend, cuda_backend, measure
from moebench.timing.timers import Untimed


@dataclass(frozen=True)
class Profiled:
    shape: str
    arm: str
    calls: int
    warmup: int
    flush: str
    parity: tuple[ParityInfo, ...]
    kernels: tuple[str, ...]  # the patterns a call's kernels match (for ncu -k regex:...)


def profile_arm(req: RunRequest, calls: int = 4, backend: TimingBackend | None = None,
                log: Callable[[str], None] = lambda m: None) -> Profiled:
    """Prepare and check `req`'s one arm on its one shape, then launch it `calls` times untimed."""
    if len(req.shapes) != 1:
        raise UserError("profile: give exactly one shape")
    if not 1 <= calls <= MAX_SAMPLES:
        raise UserError(f"--calls must be 1 to {MAX_SAMPLES:,}")
    req = replace(req, rounds=1, samples=calls, timer="none", measure_bandwidth=False)
    req, plan = plan_arms(req)
    if len(req.arms) != 1:
        raise UserError(f"profile: give exactly one arm (got {', '.join(req.arms) or 'none'})")
    validate(req, timers=("none",))  # shapes too, before any GPU work
    make_arms(req.arms, req.arm_options, plan.factories)  # an unknown arm or option named before the device
    backend = replace(backend, timer=Untimed()) if backend is not None else cuda_backend(req.protocol)
    prep = prepare(req.workload, req.protocol, plan, backend.device, log)
    measure(prep.units, req.protocol, backend)
    (info,) = prep.subjects.arm_infos
    return Profiled(info.shape, info.name, calls, req.warmup, req.flush, prep.subjects.parity,
                    tuple(k.pattern for k in info.kernels))

