"""A fake TimingBackend for CPU runs of the pipeline (builds, external arms, bench)."""

from __future__ import annotations

import torch
from timing_fakes import FakeGpu, FakeTracer

from moebench.timing.measure import TimingBackend
from moebench.timing.timers import KernelRecordTimer


def fake_backend(gpu: FakeGpu) -> TimingBackend:
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(lambda cap: FakeTracer(gpu)),
                         flush=lambda: gpu.launch("flush_reduce", 50_000), flush_bytes=256 * 2**20,
                         sync=lambda: None, capture=gpu.capture)
