"""Arms that break one determinism property each, for tests of moebench.determinism.checks: the
oracle's output (deterministic on the CPU) with a planted last-bit change.

  PlantedRunNoise   flips the low bit of a few elements, different ones on every run
  PlantedBatchRows  flips the low bit of one column in 16, which the batch's token count chooses
  PlantedProcess    flips the low bit of elements drawn from a generator seeded by the process id
  PlantedClean      the oracle's output unchanged
  FakeTimedTriton   the stock Triton arm's call as it is (under the interpreter on the CPU)

Every call also launches one kernel on GPU, the fake device a CPU run's timing backend reads
(tests/helpers/run_fakes.py), so `moebench run` can time these arms and audit their samples.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from timing_fakes import FakeGpu

from moebench.fixtures import fixture_reference
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall

KERNELS = (KernelDecl("planted", r"planted", 1),)
GPU = FakeGpu()


def _flip_low_bit(out: torch.Tensor, mask: torch.Tensor) -> None:
    bits = out.view(torch.int16)
    bits[mask] ^= 1


class _Planted(Arm):
    description = "planted for tests"
    duration_ns = 3000

    def perturb(self, fx, out: torch.Tensor, run: int) -> None:
        pass

    def prepare(self, fx) -> PreparedCall:
        ref = fixture_reference(fx).to(torch.bfloat16)
        out = torch.empty_like(ref)
        runs = [0]

        def run() -> None:
            out.copy_(ref)
            self.perturb(fx, out, runs[0])
            runs[0] += 1
            GPU.launch("planted", self.duration_ns)
        return PreparedCall(self.name, run, out, KERNELS)


class PlantedClean(_Planted):
    name = "planted-clean"


class PlantedRunNoise(_Planted):
    name = "planted-run-noise"
    duration_ns = 2000

    def perturb(self, fx, out, run):
        if run == 0:
            return  # the first run equals the others' reference; later ones do not
        g = torch.Generator().manual_seed(run)
        _flip_low_bit(out, torch.rand(out.shape, generator=g) < 0.01)


class PlantedBatchRows(_Planted):
    name = "planted-batch-rows"

    def perturb(self, fx, out, run):
        columns = torch.arange(out.shape[1], device=out.device) % 16 == fx.M % 16  # one column in 16, chosen by the token count
        _flip_low_bit(out, columns.expand_as(out))


class PlantedProcess(_Planted):
    name = "planted-process"

    def perturb(self, fx, out, run):
        g = torch.Generator().manual_seed(os.getpid())
        _flip_low_bit(out, torch.rand(out.shape, generator=g) < 0.05)


class FakeTimedTriton(Arm):
    name = "fake-timed-triton"
    description = "the stock Triton arm's call, and one fake kernel for the fake timer"

    def prepare(self, fx) -> PreparedCall:
        from moebench.kernels.stock.arms import StockTritonArm
        call = StockTritonArm().prepare(fx)

        def run() -> None:
            call.run()
            GPU.launch("planted", 4000)
        return replace(call, arm=self.name, run=run, kernels=KERNELS)


class PlantedShortOfMemory(_Planted):
    """planted-clean whose fresh process finds no device memory the first N times it prepares:
    N is read from, and counted down in, the file MOEBENCH_PLANTED_OOM names (a card that others
    fill, then free)."""
    name = "planted-short-of-memory"

    def prepare(self, fx) -> PreparedCall:
        path = os.environ.get("MOEBENCH_PLANTED_OOM")
        if path and os.getpid() != int(os.environ.get("MOEBENCH_PLANTED_PARENT", "0")):
            with open(path) as f:
                left = int(f.read())
            if left > 0:
                with open(path, "w") as f:
                    f.write(str(left - 1))
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB (planted)")
        return super().prepare(fx)
