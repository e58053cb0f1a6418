"""External arms for tests/cpu/test_external_arm.py: factories as a user would write them.

Each computes the oracle's output in prepare (untimed) and returns a run() that copies it
and launches fake kernels on GPU, the fake device the tests' timing backend reads.
"""

from __future__ import annotations

import torch
from timing_fakes import FakeGpu

from moebench.fixtures import fixture_reference
from moebench.kernels.api.arm import KernelDecl, PreparedCall

GPU = FakeGpu()


def prepare_copy(fx):
    """copies the oracle's output (a tuple return)"""
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)

    def run():
        out.copy_(ref)
        GPU.launch("my_moe_kernel", 4000)
    return run, out, ["my_moe_kernel"]


def prepare_dict(fx):
    """two kernels, a dict return with identity"""
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)

    def run():
        out.copy_(ref)
        GPU.launch("my_gemm", 1500)
        GPU.launch("my_gemm", 1500)
    return {"run": run, "output": out, "kernels": [("gemm", "my_gemm", 2)], "identity": {"version": "v2"}}


def prepare_call(fx):
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)

    def run():
        out.copy_(ref)
        GPU.launch("my_fused", 2000)
    return PreparedCall("whatever", run, out, (KernelDecl("fused", "my_fused"),), identity={"block": 8})


def prepare_broken(fx):
    """writes twice the right answer"""
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)

    def run():
        out.copy_(2 * ref)
        GPU.launch("my_moe_kernel", 4000)
    return run, out, ["my_moe_kernel"]


def prepare_wrong_shape(fx):
    out = torch.zeros(3, 3)
    return (lambda: None), out, ["k"]


def prepare_nothing(fx):
    return 42


SEEN_WEIGHTS: list[int] = []  # fx.w1.data_ptr() of every fixture prepare_jittery was given
JITTER = __import__("random").Random(7)


def prepare_jittery(fx):
    """copies the oracle's output; each call takes 4 us give or take 1%"""
    SEEN_WEIGHTS.append(fx.w1.data_ptr())
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)

    def run():
        out.copy_(ref)
        GPU.launch("my_moe_kernel", round(4000 * JITTER.uniform(0.99, 1.01)))
    return run, out, ["my_moe_kernel"]


def prepare_silent(fx):
    """copies the oracle's output and launches nothing"""
    ref = fixture_reference(fx)
    out = torch.empty_like(ref)
    return (lambda: out.copy_(ref)), out, ["my_moe_kernel"]
