"""The arm registry: built-in arms collected from their modules, `moebench.arms` entry points,
and arms added by name; and the run's choice of arms from it.

An arm module marks its arms with `register_arm` (moebench.kernels.api.arm) and does nothing else
at import; this module imports the built-in arm modules and collects what they mark. An arm module that cannot import its optional library must still import: it reports the
problem through `Arm.unavailable_reason`, not at import time.
"""

from __future__ import annotations

import functools
import inspect
import types

import torch

from moebench.errors import UserError
from moebench.kernels.api.arm import Arm, ArmFactory, marked_arm_name
from moebench.kernels.api.external import external_arm_factory, parse_external_arm, register_entry_point_arms
from moebench.kernels.cuda import arms as cuda_arms
from moebench.kernels.cuda import fused_arm
from moebench.kernels.peer import cublas_arm
from moebench.kernels.stock import arms as triton_arms
from moebench.kernels.stock import sglang_arm

BUILTIN_MODULES = (cuda_arms, triton_arms, fused_arm, sglang_arm, cublas_arm)

# The order a run with no --arms times the built-in arms in (the ref first).
DEFAULT_ORDER = ("triton", "sglang", "triton-default", "triton-swapab", "cuda-gemm", "cuda-swapab", "cuda-fused")

# Arms a run with no --arms times only when their option is given (`--tuned DIR`: triton-tuned).
OPTION_ARMS = {"tuned": "triton-tuned"}

ARMS: dict[str, ArmFactory] = {}  # every arm known in this process, by name


def arms_in(module: types.ModuleType) -> dict[str, ArmFactory]:
    """The arms `module` itself defines and marks (not ones it imports), by name."""
    out: dict[str, ArmFactory] = {}
    for obj in vars(module).values():
        name = marked_arm_name(obj)
        if name is None or getattr(obj, "__module__", None) != module.__name__:
            continue
        if name in out:
            raise RuntimeError(f"arm {name!r} marked twice in {module.__name__}")
        out[name] = obj
    return out


@functools.lru_cache(maxsize=None)
def builtin_arms() -> dict[str, ArmFactory]:
    out: dict[str, ArmFactory] = {}
    for module in BUILTIN_MODULES:
        for name, factory in arms_in(module).items():
            if name in out:
                raise RuntimeError(f"arm {name!r} registered twice")
            out[name] = factory
    return out


def add_arm(name: str, factory: ArmFactory) -> None:
    """Make `factory` known as the arm `name` in this process (a name is taken once)."""
    arms = load_builtin_arms()
    if name in arms:
        raise RuntimeError(f"arm {name!r} registered twice")
    arms[name] = factory


def add_module_arms(module: types.ModuleType) -> list[str]:
    """Make every arm `module` marks known; returns their names."""
    found = arms_in(module)
    for name, factory in found.items():
        add_arm(name, factory)
    return list(found)


def load_builtin_arms() -> dict[str, ArmFactory]:
    """The registry: the built-in arms, those added, and the installed `moebench.arms` entry
    points (lazily: each is imported when its arm is made)."""
    for name, factory in builtin_arms().items():
        ARMS.setdefault(name, factory)
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
    arms = load_builtin_arms()
    given = {k: v for k, v in (options or {}).items() if v is not None}
    chosen, skipped = [], []
    for name in (*DEFAULT_ORDER, *(arm for option, arm in OPTION_ARMS.items() if option in given)):
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


def external_arm_factories(texts) -> dict[str, ArmFactory]:
    """`--arm NAME=module:factory` items -> {name: factory}; names must be new."""
    known = load_builtin_arms()
    out: dict[str, ArmFactory] = {}
    for text in texts:
        name, target = parse_external_arm(text)
        if name in out:
            raise UserError(f"--arm: arm {name!r} given twice")
        if name in known:
            raise UserError(f"--arm {text!r}: {name!r} is already an arm; choose another name")
        out[name] = external_arm_factory(name, target)
    return out
