"""What an arm is: a way to compute a fixture's MoE output, prepared once, timed many times.

`Arm.prepare(fixture)` does everything untimed (input quantization, route plans, weight
layout changes, allocation, compilation) and returns a PreparedCall whose `run()`
launches only the timed work on PyTorch's current stream. Every arm alike is checked
against the oracle and audited against the kernels it declares.
"""

from __future__ import annotations

import inspect
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture


@dataclass(frozen=True)
class KernelDecl:
    """One kernel a sample must contain: `count` launches whose name matches `pattern`
    (re.search against the name CUPTI reports)."""

    label: str
    pattern: str
    count: int = 1

    def matches(self, kernel_name: str) -> bool:
        return re.search(self.pattern, kernel_name) is not None


@dataclass
class PreparedCall:
    arm: str
    run: Callable[[], None]  # launches only the timed kernels, on torch's current stream
    output: torch.Tensor  # [M, K] bf16, written by run()
    kernels: tuple[KernelDecl, ...]  # exactly what one sample must contain
    reset: Callable[[], None] | None = None  # untimed, before every sample (accumulating outputs)
    identity: dict = field(default_factory=dict)  # config and build hashes, JSON-able, stored in results
    oracle: str = "exact"  # the roundings parity is judged against (moebench.fixtures.oracle.ROUNDINGS)
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

    @abstractmethod
    def prepare(self, fx: Fixture) -> PreparedCall:
        """Untimed set-up for one fixture (on fx.device)."""

    def unavailable_reason(self, device: torch.device) -> str | None:
        """None if the arm can run on `device` here; else why not, in one line."""
        return None

    def default_skip_reason(self, device: torch.device) -> str | None:
        """Why a run with no --arms leaves this available arm out here (e.g. it would launch
        what another arm launches), or None to time it."""
        return None


ArmFactory = Callable[..., Arm]
ARMS: dict[str, ArmFactory] = {}


def register_arm(name: str):
    def wrap(factory: ArmFactory) -> ArmFactory:
        if name in ARMS:
            raise RuntimeError(f"arm {name!r} registered twice")
        ARMS[name] = factory
        return factory
    return wrap


def load_builtin_arms() -> dict[str, ArmFactory]:
    """Import the modules that register the built-in arms, add the installed `moebench.arms`
    entry points (lazily: each is imported when its arm is made); returns the registry."""
    import moebench.kernels.registry  # noqa: F401
    from moebench.kernels.external import register_entry_point_arms
    register_entry_point_arms(ARMS)
    return ARMS


def make_arm(name: str, **options) -> Arm:
    arms = load_builtin_arms()
    if name not in arms:
        raise UserError(f"unknown arm {name!r} (known: {', '.join(sorted(arms))})")
    return arms[name](**options)


def make_arms(names: list[str] | tuple[str, ...], options: dict | None = None,
              extra: dict[str, ArmFactory] | None = None) -> list[Arm]:
    """The arms `names`, each given the options its factory accepts (`--triton-config` goes to
    the Triton arms only). An option that no chosen arm accepts is a mistake, not ignored.
    `extra` holds this run's own arms (builds, `--arm`), beside the registry."""
    arms = {**load_builtin_arms(), **(extra or {})}
    for name in names:
        if name not in arms:
            raise UserError(f"unknown arm {name!r} (known: {', '.join(sorted(arms))})")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    accepts = {n: inspect.signature(arms[n]).parameters for n in names}
    for key in given:
        if not any(key in params for params in accepts.values()):
            flag = "--" + key.replace("_", "-")
            raise UserError(f"{flag} applies to none of the arms given ({', '.join(names)})")
    return [arms[n](**{k: v for k, v in given.items() if k in accepts[n]}) for n in names]


def default_arms(device: torch.device, options: dict | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """The built-in arms a run with no --arms times on `device`, in the registry's default order,
    and the ones it leaves out, each with why (one line)."""
    from moebench.kernels.registry import DEFAULT_ORDER
    arms = load_builtin_arms()
    given = {k: v for k, v in (options or {}).items() if v is not None}
    chosen, skipped = [], []
    for name in DEFAULT_ORDER:
        params = inspect.signature(arms[name]).parameters
        arm = arms[name](**{k: v for k, v in given.items() if k in params})
        why = arm.unavailable_reason(device) or arm.default_skip_reason(device)
        if why:
            skipped.append((name, why))
        else:
            chosen.append(name)
    return chosen, skipped


def parse_arm_list(text: str | list[str] | tuple[str, ...]) -> list[str]:
    items = [text] if isinstance(text, str) else list(text)
    names = [n.strip() for item in items for n in item.split(",") if n.strip()]
    if not names:
        raise UserError("no arm given")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"arm(s) given twice: {', '.join(dupes)}")
    return names
