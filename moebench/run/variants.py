"""`--variant NAME=ARM:KEY=VALUE[,KEY=VALUE...]`: one arm family under another option set,
timed as its own labelled arm in the same paired run.

A setting is a keyword of the family's constructor (`cuda-fused:block_m=16`) or, for a family
whose arms carry a `config` dataclass (cuda-gemm, cuda-swapab), a field replaced in it
(`cuda-swapab:target_steps=16`). Values are read as integers, numbers, true/false, or text.
The variant is prepared, checked against the oracle and audited like any arm; its settings are
part of its identity in the result.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Mapping

from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.kernels.api.arm import Arm, ArmFactory, PreparedCall, RenamedArm

VARIANT_RE = re.compile(r"(?P<name>[A-Za-z0-9][\w.+-]*)=(?P<family>[\w.@+-]+)(?::(?P<body>.*))?")
KEY_RE = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    name: str  # the arm's label in the run
    family: str  # the arm it is made from
    settings: tuple[tuple[str, Any], ...]  # in the order given


def parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_variant(text: str) -> VariantSpec:
    m = VARIANT_RE.fullmatch(text.strip())
    if not m:
        raise UserError(f"--variant {text!r}: expected NAME=ARM:KEY=VALUE[,KEY=VALUE...], e.g. bm16=cuda-fused:block_m=16")
    settings: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in (m["body"] or "").split(","))):
        key, sep, value = (p.strip() for p in item.partition("="))
        if not sep or not KEY_RE.fullmatch(key) or not value:
            raise UserError(f"--variant {text!r}: setting {item!r} is not KEY=VALUE")
        if key in settings:
            raise UserError(f"--variant {text!r}: {key} given twice")
        settings[key] = parse_value(value)
    if not settings:
        raise UserError(f"--variant {text!r}: no settings (an arm under its own options is just --arms {m['family']})")
    return VariantSpec(m["name"], m["family"], tuple(settings.items()))


class VariantArm(RenamedArm):
    """A family's arm made with other settings, under the variant's own name."""

    def __init__(self, spec: VariantSpec, inner: Arm, config_keys: frozenset[str]):
        self.spec, self.inner = spec, inner
        self.name = spec.name
        shown = ",".join(f"{k}={v}" for k, v in spec.settings)
        self.description = f"{inner.description} [variant of {spec.family}: {shown}]"
        config = {k: v for k, v in spec.settings if k in config_keys}
        if config:
            try:
                inner.config = dataclasses.replace(inner.config, **config)
            except (TypeError, ValueError) as err:
                raise UserError(f"--variant {spec.name}: {err}") from None

    def prepare(self, fx: Fixture) -> PreparedCall:
        call = self.inner.prepare(fx)
        call.arm = self.name
        call.identity = {**call.identity, "variant": {"of": self.spec.family, "settings": dict(self.spec.settings)}}
        return call


def variant_factory(spec: VariantSpec, arms: Mapping[str, ArmFactory]) -> ArmFactory:
    """The factory of `spec`'s arm: it takes the family's other options (e.g. --triton-config)."""
    if spec.family not in arms:
        raise UserError(f"--variant {spec.name}: unknown arm {spec.family!r} (known: {', '.join(sorted(arms))})")
    base = arms[spec.family]
    params = inspect.signature(base).parameters
    config = getattr(base(), "config", None)
    config_keys = frozenset(f.name for f in dataclasses.fields(config)) if dataclasses.is_dataclass(config) else frozenset()
    unknown = [k for k, _ in spec.settings if k not in params and k not in config_keys]
    if unknown:
        known = sorted(set(params) | config_keys) or ["none"]
        raise UserError(f"--variant {spec.name}: {spec.family} has no setting {unknown[0]!r} (settings: {', '.join(known)})")
    given = {k: v for k, v in spec.settings if k in params}

    def factory(**options) -> Arm:
        try:
            inner = base(**{**options, **given})
        except TypeError as err:
            raise UserError(f"--variant {spec.name}: {err}") from None
        return VariantArm(spec, inner, config_keys)
    factory.__signature__ = inspect.Signature([p for n, p in params.items() if n not in given])
    return factory
