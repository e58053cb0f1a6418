"""Arms that break one determinism property each, for tests of moebench.determinism: the
oracle's output (deterministic on the CPU) with a planted last-bit change.

  PlantedRunNoise   flips the low bit of a few elements, different ones on every run
  PlantedBatchRows  scales every row by a factor that follows the batch's token count
  PlantedProcess    flips the low bit of elements drawn from a generator seeded by the process id
  PlantedClean      the oracle's output unchanged
"""

from __future__ import annotations

import os

import torch

from moebench.fixtures import fixture_reference
from moebench.kernels.arm import Arm, KernelDecl, PreparedCall

KERNELS = (KernelDecl("planted", r"planted", 1),)


def _flip_low_bit(out: torch.Tensor, mask: torch.Tensor) -> None:
    bits = out.view(torch.int16)
    bits[mask] ^= 1


class _Planted(Arm):
    description = "planted for tests"

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
        return PreparedCall(self.name, run, out, KERNELS)


class PlantedClean(_Planted):
    name = "planted-clean"


class PlantedRunNoise(_Planted):
    name = "planted-run-noise"

    def perturb(self, fx, out, run):
        if run == 0:
            return  # the first run equals the others' reference; later ones do not
        g = torch.Generator().manual_seed(run)
        _flip_low_bit(out, torch.rand(out.shape, generator=g) < 0.01)


class PlantedBatchRows(_Planted):
    name = "planted-batch-rows"

    def perturb(self, fx, out, run):
        out.copy_((out.float() * (1.0 + fx.M * 2.0 ** -7)).to(out.dtype))


class PlantedProcess(_Planted):
    name = "planted-process"

    def perturb(self, fx, out, run):
        g = torch.Generator().manual_seed(os.getpid())
        _flip_low_bit(out, torch.rand(out.shape, generator=g) < 0.05)
