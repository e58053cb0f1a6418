"""What an arm is: a way to compute a fixture's MoE output, prepared once, timed many times.

`Arm.prepare(fixture)` does everything untimed (input quantization, route plans, weight
layout changes, allocation, compilation) and returns a PreparedCall whose `run()`
launches only the timed work on PyTorch's current stream. Every arm alike is checked
against the oracle and audited against the kernels it declares.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, ShapeSpec
from moebench.record.schema import DeclaredKernel

KernelDecl = DeclaredKernel  # what an arm declares is what its result stores


@dataclass
class PreparedCall:
    arm: str
    run: Callable[[], None]  # launches only the timed kernels, on torch's current stream
    output: torch.Tensor  # [M, K] bf16, written by run()
    kernels: tuple[KernelDecl, ...]  # exactly what one sample must contain
    reset: Callable[[], None] | None = None  # untimed, before every sample (accumulating outputs)
    identity: dict = field(default_factory=dict)  # config and build hashes, JSON-able, stored in results
    oracle: str = "exact"  # where it rounds: an error model of moebench.fixtures.error_model.MODELS
    workspace: object = None  # what run() writes besides the output (intermediates), for checks

    @property
    def kernels_per_sample(self) -> int:
        return sum(k.count for k in self.kernels)


def as_kernel_decls(items, where: str = "kernels") -> tuple[KernelDecl, ...]:
    """KernelDecls from what users write: a KernelDecl, a regex string (count 1), or a
    (label, pattern[, count]) tuple. At least one; each pattern a valid regex."""
    if isinstance(items, (str, KernelDecl)):
        items = [items]
    out = []
    for item in items or ():
        if isinstance(item, KernelDecl):
            decl = item
        elif isinstance(item, str):
            decl = KernelDecl(item, item, 1)
        elif isinstance(item, (tuple, list)) and len(item) in (2, 3) and all(isinstance(x, str) for x in item[:2]):
            decl = KernelDecl(item[0], item[1], int(item[2]) if len(item) == 3 else 1)
        else:
            raise UserError(f"{where}: a kernel is a KernelDecl, a regex, or (label, pattern[, count]); got {item!r}")
        try:
            re.compile(decl.pattern)
        except re.error as err:
            raise UserError(f"{where}: kernel pattern {decl.pattern!r} is not a regex: {err}") from None
        if decl.count < 1:
            raise UserError(f"{where}: kernel {decl.label!r} count must be at least 1")
        out.append(decl)
    if not out:
        raise UserError(f"{where}: declares no kernels (a sample must contain at least one)")
    return tuple(out)


class Arm(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    # The CUDA file of moebench/kernels the arm compiles, if any. Such an arm takes `source=`
    # (a KernelSource) and compiles that instead: a `--build` is the arm given the build's source.
    source_file: ClassVar[str | None] = None
    # Other CUDA files it compiles, each with the keyword that takes a build of it, and the host
    # modules (dotted names) that launch them: a `--build` of one is the arm given that keyword.
    build_sources: ClassVar[dict[str, tuple[str, str]]] = {}
    # Modules (dotted names) besides its own whose code its launch runs (its policy, layout,
    # checks): a git build takes only the arm's module from its revision, so one of these that
    # differs there would launch the revision's kernel with this tree's arithmetic.
    host_helpers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def prepare(self, fx: Fixture) -> PreparedCall:
        """Untimed set-up for one fixture (on fx.device)."""

    def unavailable_reason(self, device: torch.device) -> str | None:
        """None if the arm can run on `device` here; else why not, in one line."""
        return None

    def refuses(self, spec: ShapeSpec) -> str | None:
        """Why this arm cannot serve `spec`'s geometry (K, E, top_k, I, M), in one line naming the
        limit, or None. Host arithmetic only: checked before any fixture is built or timed."""
        return None

    def default_skip_reason(self, device: torch.device) -> str | None:
        """Why a run with no --arms leaves this available arm out here (e.g. it would launch
        what another arm launches), or None to time it."""
        return None


class RenamedArm(Arm):
    """A family's arm under a name of its own (a `--build`, a `--variant`): where and on what
    geometry it runs are the family arm's (`inner`), said under this arm's name."""

    inner: Arm

    def unavailable_reason(self, device: torch.device) -> str | None:
        return self.inner.unavailable_reason(device)

    def refuses(self, spec: ShapeSpec) -> str | None:
        line = self.inner.refuses(spec)
        return None if line is None else self.renamed(line)

    def renamed(self, line: str) -> str:
        """The family arm's one line (`inner: why`) as this arm's."""
        own = f"{self.inner.name}: "
        return f"{self.name}: {line[len(own):] if line.startswith(own) else line}"


def geometry_refusals(arms, specs) -> dict[tuple[str, str], str]:
    """(shape, arm name) -> the line each arm refuses a shape's geometry with; a UserError when
    no arm can serve some shape (there would be nothing to run there)."""
    refused = {}
    for spec in specs:
        lines = {arm.name: arm.refuses(spec) for arm in arms}
        if arms and all(lines.values()):
            raise UserError(f"no arm can serve {spec.name}: " + "; ".join(lines.values()))
        refused.update({(spec.name, name): line for name, line in lines.items() if line})
    return refused


ArmFactory = Callable[..., Arm]
ARM_MARK = "__moebench_arm__"


def register_arm(name: str):
    """Mark a class (or factory) as the arm `name`; moebench.kernels.registry collects marked
    arms from the modules it is given, so defining an arm touches no global state (a module
    loaded privately, e.g. a build's host code at a revision, stays private)."""
    def mark(factory: ArmFactory) -> ArmFactory:  # a class takes the name as its `name`
        setattr(factory, ARM_MARK, name)
        if isinstance(factory, type) and "name" not in vars(factory):
            factory.name = name
        return factory
    return mark


def marked_arm_name(obj) -> str | None:
    """The name `register_arm` gave `obj` itself (not one it inherits), or None."""
    return getattr(obj, "__dict__", {}).get(ARM_MARK)
