"""External arms: your own kernel as an arm, checked against the oracle and audited like ours.

Two ways in:

    moebench run --shape A8 --arms triton --arm mine=my_kernels.moe:prepare_mine
    # pyproject.toml of your package:
    [project.entry-points."moebench.arms"]
    mine = "my_kernels.moe:prepare_mine"

The contract of the factory (`module:attr`; the module is imported from the current
directory or sys.path):

    def prepare_mine(fx: moebench.fixtures.Fixture) -> PreparedCall | tuple | dict

It is called once per shape, untimed, with the fixture on the GPU (fx.x_fp8 [M,K] e4m3,
fx.x_scale [M,K/128] fp32, fx.w1 [E,N,K] / fx.w2 [E,K,I] e4m3 with fp32 128x128 block
scales fx.w1_scale / fx.w2_scale, fx.topk_ids / fx.topk_weights [M,top_k], fx.spec for
K, E, top_k, N). Do everything untimed there (layouts, plans, allocation, compilation,
warm-up) and return:

  * a `moebench.kernels.api.arm.PreparedCall`, or
  * `(run, output, kernels)` or `(run, output, kernels, reset)`, or
  * a dict with `run`, `output`, `kernels` and optionally `reset`, `identity`, `oracle`;

where `run()` launches only the timed work on torch's current stream, `output` is the
[M, K] tensor it writes (bf16), `kernels` lists what one call launches — each a
`KernelDecl(label, pattern, count)`, a regex string (count 1), or a (label, pattern, count)
tuple — `reset()` runs untimed before each sample (zero an accumulating output), and
`identity` is a JSON-able dict stored with the result. The factory may also be an `Arm`
subclass, used as is. The output is compared with the oracle before any timing and every
sample must contain exactly the declared kernels.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import re
import sys
from importlib import metadata
from typing import Callable

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.kernels.api.arm import Arm, ArmFactory, PreparedCall, as_kernel_decls

ENTRY_POINT_GROUP = "moebench.arms"
ARM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*")
TARGET_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def parse_external_arm(text: str) -> tuple[str, str]:
    """`NAME=module:factory` -> (name, target)."""
    name, sep, target = (p.strip() for p in text.partition("="))
    if not sep or not ARM_NAME_RE.fullmatch(name) or not TARGET_RE.fullmatch(target):
        raise UserError(f"--arm {text!r}: expected NAME=module:factory (e.g. mine=my_kernels.moe:prepare)")
    return name, target


def load_target(target: str, what: str):
    """Import `module:attr` (the current directory first on sys.path, as `python -m` does)."""
    module_name, _, attr = target.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 (any import failure is the user's to fix)
        raise UserError(f"{what}: cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{what}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{what}: {target} is not callable")
    return obj


def _module_identity(factory) -> dict:
    """Where the factory's code is, and the SHA-256 of its module file."""
    out = {"module": getattr(factory, "__module__", None), "qualname": getattr(factory, "__qualname__", None)}
    try:
        path = inspect.getsourcefile(factory)
    except TypeError:
        path = None
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            out["module_sha256"] = hashlib.sha256(f.read()).hexdigest()
        out["module_file"] = path
    return out


class ExternalArm(Arm):
    """An arm from a user's factory (see the module docstring for the contract)."""

    def __init__(self, name: str, target: str, factory: Callable[[Fixture], object]):
        self.name, self.target, self.factory = name, target, factory
        doc = (inspect.getdoc(factory) or "").strip().splitlines()
        self.description = f"external arm {target}" + (f": {doc[0]}" if doc else "")

    def prepare(self, fx: Fixture) -> PreparedCall:
        got = self.factory(fx)
        call = self._as_call(got, fx)
        identity = {"external": self.target, **_module_identity(self.factory), **dict(call.identity)}
        call.arm, call.identity = self.name, identity
        return call

    def _as_call(self, got, fx: Fixture) -> PreparedCall:
        where = f"arm {self.name!r} ({self.target})"
        if isinstance(got, PreparedCall):
            call = PreparedCall(self.name, got.run, got.output, as_kernel_decls(got.kernels, where), got.reset,
                                dict(got.identity), got.oracle)
        elif isinstance(got, dict):
            missing = [k for k in ("run", "output", "kernels") if k not in got]
            unknown = sorted(set(got) - {"run", "output", "kernels", "reset", "identity", "oracle"})
            if missing or unknown:
                raise UserError(f"{where}: the factory's dict " + (f"lacks {', '.join(missing)}" if missing
                                                                   else f"has unknown keys {', '.join(unknown)}"))
            call = PreparedCall(self.name, got["run"], got["output"], as_kernel_decls(got["kernels"], where),
                                got.get("reset"), dict(got.get("identity") or {}), got.get("oracle", "exact"))
        elif isinstance(got, tuple) and len(got) in (3, 4):
            call = PreparedCall(self.name, got[0], got[1], as_kernel_decls(got[2], where),
                                got[3] if len(got) == 4 else None)
        else:
            raise UserError(f"{where}: the factory returned {type(got).__name__}; expected a PreparedCall, "
                            "(run, output, kernels[, reset]) or a dict with run, output, kernels")
        if not callable(call.run) or (call.reset is not None and not callable(call.reset)):
            raise UserError(f"{where}: run (and reset, if given) must be callable")
        out = call.output
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (fx.M, fx.spec.K) or not out.is_floating_point():
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise UserError(f"{where}: output must be a floating [M, K] = [{fx.M}, {fx.spec.K}] tensor, got {shape}")
        return call


def external_arm_factory(name: str, target: str) -> ArmFactory:
    """A registry factory that imports the target when the arm is made (not before)."""
    def factory() -> Arm:
        obj = load_target(target, f"arm {name!r}")
        if isinstance(obj, type) and issubclass(obj, Arm):
            arm = obj()
            arm.name = name
            return arm
        return ExternalArm(name, target, obj)
    factory.external_target = target
    return factory


def register_entry_point_arms(registry: dict[str, ArmFactory]) -> list[str]:
    """Register every `moebench.arms` entry point not already known, lazily (the module is
    imported only when the arm is made). Returns the names registered now; a name that a
    built-in arm holds is skipped (the built-in wins)."""
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 (a broken distribution must not stop the built-in arms)
        return []
    added = []
    for ep in eps:
        if ep.name in registry or not ARM_NAME_RE.fullmatch(ep.name):
            continue
        registry[ep.name] = external_arm_factory(ep.name, ep.value)
        added.append(ep.name)
    return added
