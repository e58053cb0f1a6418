"""`moebench` on a fake GPU in a process of its own, for the tests that stop a run with a
signal and resume it (tests/cpu/test_resume.py). Test-only: the shipping CLI never reads these.

    python tests/helpers/resume_child.py ARGS...      # as `moebench ARGS...`

The CUDA backend is replaced by a fake one whose kernel durations follow each sample's
external id, so a run resumed in another process times exactly what an uninterrupted run
does. RESUME_HOLD=PATH: at the start of round RESUME_HOLD_ROUND (default 3) the run touches
PATH and waits there for a signal. RESUME_SOURCE: the arms' source hash (a changed build).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch

# A shell that starts a job in the background without job control has it ignore SIGINT, and
# Python then installs no KeyboardInterrupt handler: the tests send SIGINT as a user's Ctrl-C.
signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing_fakes import FakeGpu, FakeTracer  # noqa: E402

import moebench.run.runner as runner  # noqa: E402
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall  # noqa: E402
from moebench.kernels.registry import ARMS, add_arm  # noqa: E402
from moebench.timing.measure import TimingBackend  # noqa: E402
from moebench.timing.read_floor import ReadProbe  # noqa: E402
from moebench.record.schema import ClockSample, GpuInfo  # noqa: E402
from moebench.timing.engine import Unit  # noqa: E402
from moebench.timing.records import RecordBatch  # noqa: E402
from moebench.timing.timers import KernelRecordTimer  # noqa: E402

GPU = FakeGpu()
FAKE_GPU = GpuInfo("fake GPU", 0, "GPU-fake-0", "9.0", 132, 60 * 2**20, 141 * 2**30, "fake", "fake")


def duration(base: int) -> int:
    """A kernel's duration: its base plus a part that follows the sample's external id."""
    return base + (37 * GPU.ext_stack[-1]) % 500 if GPU.ext_stack else base


class _ResumeArm(Arm):
    description = "oracle output copied by fake kernels of id-dependent durations"
    kernels: tuple = ()

    def prepare(self, fx):
        from moebench.fixtures import fixture_reference
        ref = fixture_reference(fx)
        out = torch.empty_like(ref)

        def run_():
            out.copy_(ref)
            for name, base in self.kernels:
                GPU.launch(name, duration(base))
        identity = {"source_sha256": os.environ.get("RESUME_SOURCE", "5" * 64)}
        return PreparedCall(self.name, run_, out, tuple(KernelDecl(n, n) for n, _ in self.kernels), identity=identity)


for _name, _kernels in (("resume-ref", (("fake_gemm1", 3000), ("fake_gemm2", 2000))),
                        ("resume-fast", (("fake_fused", 2500),))):
    if _name not in ARMS:
        add_arm(_name, type(_name, (_ResumeArm,), {"name": _name, "kernels": _kernels}))


class HoldMarkers:
    """NVTX-like markers that stop the run at the start of one round until a signal comes."""

    def __init__(self, path: str | None, at: int):
        self.path, self.at = path, at

    def push(self, message: str) -> None:
        if self.path and message == f"round {self.at}":
            Path(self.path).touch()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
            raise SystemExit("no signal came")

    def pop(self) -> None:
        pass


def open_tracer(capacity: int) -> FakeTracer:
    """A tracer that records from when it is opened, as CUPTI does (not the parity runs before)."""
    GPU.batch = RecordBatch()
    return FakeTracer(GPU)


def fake_backend(protocol) -> TimingBackend:
    def probe():
        return ReadProbe((Unit("_read_floor", "1x1x1", run=lambda: GPU.launch("read_kernel", 250_000)),), 1_000_000_000,
                         "fake read")
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(open_tracer),
                         flush=lambda: GPU.launch("flush_reduce", 50_000), flush_bytes=256 * 2**20,
                         sync=lambda: None, clocks=lambda r: ClockSample(r, 1980, 3201, 40 + r, 300.0),
                         gpu=FAKE_GPU, probe=probe,
                         markers=HoldMarkers(os.environ.get("RESUME_HOLD"), int(os.environ.get("RESUME_HOLD_ROUND", 3))))


if __name__ == "__main__":
    runner.cuda_backend = fake_backend
    from moebench.cli import main
    main(sys.argv[1:])
