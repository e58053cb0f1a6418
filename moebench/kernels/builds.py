"""Builds: one CUDA arm family compiled from several sources and timed as arms of one run.

    moebench run --shape A8 --build new=moebench/kernels/cuda/sm90_fused_moe.cu --build main=git:main

build_specs parses and pins each `--build` to a KernelSource. Each build becomes the arm
`ARM@NAME` (`cuda-fused@new`): the family's arm made with `source=` the build's KernelSource,
so its compile goes through the same cache, keyed by that source. A kernel and its host
wrapper change together (launch shape, arguments, weight layout), so a git build also takes
the arm's Python module (e.g. fused_arm.py) as it is at the revision, loaded as a private
module object, when it exists there and differs from this tree's (`--build-host worktree`
keeps this tree's host code for every build); its arms are collected from that module, and
no registry sees them. The build's identity in the result holds the spec, the git revision
and commit, the source SHA-256, and the module compiled for it (binary SHA-256, flags, defines).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import sys
import types
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.kernels.api.arm import Arm, ArmFactory, PreparedCall, RenamedArm
from moebench.kernels.build_specs import (BuildSpec, ResolvedBuild, build_keyword, parse_build_spec,  # noqa: F401
                                          parse_define, read_at_revision, resolve_builds, resolve_revision, source_arms)
from moebench.kernels.registry import arms_in, load_builtin_arms

# ---------------------------------------------------------------------------- host code at a revision


class _TextLoader(importlib.abc.InspectLoader):
    """Loads a module from text held in memory (a file as it is at a git revision)."""

    def __init__(self, text: str, origin: str):
        self.text, self.origin = text, origin

    def get_source(self, fullname: str) -> str:
        return self.text

    def get_code(self, fullname: str):
        return compile(self.text, self.origin, "exec")


_HOSTS: dict[str, types.ModuleType] = {}  # host sha256 -> the module loaded from it


def load_host_module(b: ResolvedBuild) -> types.ModuleType:
    """The arm's module as it is at the build's revision: a private module object (its own
    name, in no registry), loaded once per text."""
    if b.host_sha256 not in _HOSTS:
        name = f"moebench.kernels._build_host_{b.host_sha256[:16]}"
        spec = importlib.util.spec_from_loader(name, _TextLoader(b.host_text, f"{b.host}@{b.commit[:12]}"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001
            del sys.modules[name]
            raise UserError(f"--build {b.spec}: {b.host} at {b.revision} does not load with this moebench "
                            f"({type(err).__name__}: {err}); --build-host worktree keeps this tree's") from None
        _HOSTS[b.host_sha256] = module
    return _HOSTS[b.host_sha256]


def host_arm(b: ResolvedBuild) -> ArmFactory:
    """The arm factory for build `b`: the family's, from the revision's module where pinned."""
    if not b.host:
        return load_builtin_arms()[b.arm]
    found = arms_in(load_host_module(b))
    if b.arm not in found:
        raise UserError(f"--build {b.spec}: {b.host} at {b.revision} registers no arm {b.arm!r}")
    return found[b.arm]


# ---------------------------------------------------------------------------- the arm

class BuildArm(RenamedArm):
    """The family's arm, made from one build's source."""

    def __init__(self, build: ResolvedBuild, inner: Arm):
        self.build, self.inner = build, inner
        self.name = build.arm_name
        where = f"git {build.revision} ({(build.commit or '')[:12]})" if build.revision else str(build.repo_path or build.path)
        self.description = f"{inner.description} [build {build.name}: {where}]"

    def prepare(self, fx: Fixture) -> PreparedCall:
        try:
            call = self.inner.prepare(fx)
        except UserError as err:  # the family arm's refusal, under this build's name
            raise UserError(self.renamed(str(err))) from None
        built = call.identity.get("build") if isinstance(call.identity, dict) else None
        if not isinstance(built, dict):
            raise RuntimeError(f"{self.name}: {self.inner.name} reports no build in its identity, so nothing "
                               f"shows it compiled the build's {self.build.source_name}")
        if built.get("source_sha256") != self.build.source_sha256:
            raise RuntimeError(f"{self.name}: the arm ran a module from source {str(built.get('source_sha256'))[:12]}, "
                               f"not the build's {self.build.source_sha256[:12]}")
        identity = {**call.identity, "build_spec": self.build.identity(),
                    "compiled": [{k: v for k, v in built.items() if k != "resources"}]}
        return replace(call, arm=self.name, identity=identity)


def build_arm_factories(builds: Sequence[ResolvedBuild]) -> dict[str, ArmFactory]:
    """`ARM@NAME` -> a factory taking the family arm's options."""
    out: dict[str, ArmFactory] = {}
    for b in builds:
        inner = host_arm(b)
        params = inspect.signature(inner).parameters
        where = f"{b.host} at {b.revision}" if b.host else f"arm {b.arm!r}"
        try:
            keyword = build_keyword(inner, b.source_name)
        except KeyError:
            raise UserError(f"--build {b.spec}: {where} compiles no {b.source_name}"
                            + ("; --build-host worktree keeps this tree's" if b.host else "")) from None
        if keyword not in params:
            raise UserError(f"--build {b.spec}: {where} takes no {keyword}= (its arm compiles only its own file)"
                            + ("; --build-host worktree keeps this tree's" if b.host else ""))

        def factory(__b=b, __inner=inner, __keyword=keyword, **options) -> Arm:
            return BuildArm(__b, __inner(**{__keyword: __b.source}, **options))
        # make_arms hands it the family's options (the source is the build's)
        factory.__signature__ = inspect.Signature([p for n, p in params.items() if n != keyword])
        out[b.arm_name] = factory
    return out


# ---------------------------------------------------------------------------- build parity

@dataclass(frozen=True)
class OutputDifference:
    bitwise_equal: bool
    max_abs_diff: float
    mismatched: int  # elements whose bits differ


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def compare_outputs(out: torch.Tensor, base: torch.Tensor) -> OutputDifference:
    """Two builds' outputs for the same inputs: equal bit for bit, or by how much they differ."""
    if out.shape != base.shape or out.dtype != base.dtype:
        return OutputDifference(False, float("inf"), out.numel())
    bits = _SAME_SIZE_INT[out.element_size()]
    mismatched = int((out.contiguous().view(bits) != base.contiguous().view(bits)).sum())
    diff = (out.float() - base.float()).abs()
    max_abs = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return OutputDifference(mismatched == 0, max_abs, mismatched)
