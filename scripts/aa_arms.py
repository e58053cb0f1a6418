"""External arms for the A/A proof (scripts/aa_proof.py): `cuda-fused` as it ships, and the
same call with an injected, measured slowdown. Not shipped kernels: the slowdown is one extra
kernel after the call, which ships nowhere.

    moebench run --shape A8 --arm fused=scripts.aa_arms:fused
    moebench run --shape A8 --arm fused=scripts.aa_arms:fused_slow     # the same label, ~3% slower

`fused_slow` times the prepared call cold (CUDA events around it after an L2 read flush, the
median of a few) and appends torch's spin kernel, told to wait so that its own duration is
SLOWDOWN of that time (AA_SLOWDOWN in the environment, default 0.03), the wait's rate taken
from long waits. The kernel's own start-up comes on top (a short call's injection is a little
more than asked; the identity records the cycles, and the proof's table reports the change
compare measured). The extra kernel is declared, so samples
are audited with it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from statistics import median

import torch

from moebench.kernels.api.arm import KernelDecl, PreparedCall
from moebench.kernels.registry import make_arm
from moebench.timing.flush import L2Flush

BASE_ARM = os.environ.get("AA_ARM", "cuda-fused")
SLOWDOWN = float(os.environ.get("AA_SLOWDOWN", "0.03"))
REPS = 21
SPIN_BATCH = 50


def fused(fx) -> PreparedCall:
    """The base arm's prepared call, unchanged."""
    call = make_arm(BASE_ARM).prepare(fx)
    call.identity = {**call.identity, "aa_base": BASE_ARM}
    return call


def _elapsed_ns(fn, flush=None) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e6)
    return float(median(times))


def _spin_ns(cycles: int) -> float:
    """One spin kernel's time, from a batch launched back to back."""
    return _elapsed_ns(lambda: [torch.cuda._sleep(cycles) for _ in range(SPIN_BATCH)]) / SPIN_BATCH


def fused_slow(fx) -> PreparedCall:
    """The base arm's call followed by a spin kernel of about SLOWDOWN of the call's cold time."""
    call = fused(fx)
    device = fx.device
    flush = L2Flush("read", torch.cuda.get_device_properties(device).L2_cache_size, device)

    def plain():
        if call.reset is not None:
            call.reset()
        call.run()
    base_ns = _elapsed_ns(plain, flush)
    target_ns = SLOWDOWN * base_ns
    zero_ns = _spin_ns(0)  # launch-bound in a batch: reported, not taken off
    ns_per_cycle = (_spin_ns(1_000_000) - _spin_ns(100_000)) / 900_000  # long waits: the clock's rate
    cycles = max(0, round(target_ns / ns_per_cycle)) if ns_per_cycle > 0 else 0
    flush.release()
    run = call.run

    def slowed() -> None:
        run()
        torch.cuda._sleep(cycles)
    injected = {"target": SLOWDOWN, "cycles": cycles, "base_ns": round(base_ns), "spin_zero_ns": round(zero_ns)}
    return replace(call, run=slowed, kernels=(*call.kernels, KernelDecl("injected", "spin_kernel", 1)),
                   identity={**call.identity, "injected": injected})
