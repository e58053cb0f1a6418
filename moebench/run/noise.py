"""The A/A noise floor: an arm against a second prepared copy of itself, in one paired run.

`moebench run --aa ARM` times ARM and `ARM#2`: the same arm prepared a second time on a copy
of the fixture's tensors, so the two read separately allocated inputs and weights (the
difference that made identical builds of one kernel differ by 1.3% on an H200). Paired in
the same rounds, their ratio would be exactly 1 if the measurement had no noise; how far it
can be from 1 is the floor below which no change of that arm at that shape can be told.

The floor of a shape is the largest distance from 1 that the paired ratio's bootstrap
interval admits (moebench.analysis.significance.noise_floor): max(|low - 1|, |high - 1|) of the 95%
interval of ARM-row / ARM#2-row, rounds drawn jointly. So it holds both a systematic offset
between the copies and the round-to-round scatter of their ratio. The result records it
under both labels in `RunResult.noise`; `compare` widens its SAME band to it.

`run --noise-from FILE` copies the floors a noise run measured into a new result, for the
arms and shapes the two have in common, so later runs of the arm carry the floor too.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

from moebench.analysis import significance as sig
from moebench.analysis.load import load
from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.fixtures.builder import TENSOR_FIELDS
from moebench.kernels.api.arm import Arm, ArmFactory, PreparedCall
from moebench.record.schema import RunResult, Sample

COPY_SUFFIX = "#2"
NOISE_CONFIDENCE = 0.95


def copy_label(arm: str) -> str:
    return f"{arm}{COPY_SUFFIX}"


def copied_fixture(fx: Fixture) -> Fixture:
    """The fixture with every tensor in a new allocation (same values, same fingerprint)."""
    return replace(fx, **{name: getattr(fx, name).clone() for name in TENSOR_FIELDS})


class SecondCopy(Arm):
    """An arm prepared again on its own copy of the fixture, under the label ARM#2."""

    def __init__(self, inner: Arm, label: str):
        self.inner = inner
        self.name = label
        self.description = f"{inner.description} [second copy of {inner.name}, separate allocations]"

    def unavailable_reason(self, device) -> str | None:
        return self.inner.unavailable_reason(device)

    def refuses(self, spec) -> str | None:
        return self.inner.refuses(spec)  # the same geometry limits as the arm it copies

    def prepare(self, fx: Fixture) -> PreparedCall:
        call = self.inner.prepare(copied_fixture(fx))
        call.arm = self.name
        call.identity = {**call.identity, "aa_copy_of": self.inner.name}
        return call


def copy_factory(base: ArmFactory, label: str) -> ArmFactory:
    """The factory of ARM#2: ARM's, taking the same options."""

    def factory(**options) -> Arm:
        return SecondCopy(base(**options), label)
    factory.__signature__ = inspect.signature(base)
    return factory


def measured_floors(samples: tuple[Sample, ...] | list[Sample], shapes, arm: str) -> dict[str, dict[str, float]]:
    """{shape: {ARM: floor, ARM#2: floor}} from a run's audited samples of the A/A pair.
    A shape where either copy has no audited round gets no floor."""
    copy = copy_label(arm)
    units = sig.rounds_of(samples)
    floors: dict[str, dict[str, float]] = {}
    for shape in shapes:
        a, b = units.get((shape, arm)), units.get((shape, copy))
        if not a or not b:
            continue
        shared = [r for r in a if r in b]
        if not shared:
            continue
        f = sig.noise_floor([a[r] for r in shared], [b[r] for r in shared], sig.generator(shape, arm, "noise"),
                            NOISE_CONFIDENCE)
        floors[shape] = {arm: f, copy: f}
    return floors


def check_noise_source(path: str, arms) -> None:
    """Before any GPU work: `path` is a result that carries a floor for one of `arms`."""
    source = _load_floors(path)
    if not any(arm in floors for floors in source.noise.values() for arm in arms):
        have = ", ".join(sorted({a for floors in source.noise.values() for a in floors}))
        raise UserError(f"--noise-from {path}: it has floors for {have}, none of this run's arms ({', '.join(arms)})")


def _load_floors(path: str) -> RunResult:
    if not Path(path).is_file():
        raise UserError(f"--noise-from {path}: no such file")
    source = load(path)
    if not source.noise:
        raise UserError(f"--noise-from {path}: the file carries no noise floor (make one with `moebench run --aa ARM`)")
    return source


def floors_from(path: str, result: RunResult) -> dict[str, dict[str, float]]:
    """The floors a saved noise run measured, for the shapes and arms of `result`. A file with
    no floors, or none that fits, is a UserError (the user named the wrong file)."""
    source = _load_floors(path)
    for shape in result.settings.shapes:
        a, b = _fingerprint(source, shape), _fingerprint(result, shape)
        if a is not None and b is not None and a != b:
            raise UserError(f"--noise-from {path}: its {shape} is another fixture (fingerprints differ)")
    copied = {shape: {arm: f for arm, f in source.noise[shape].items() if arm in result.settings.arms}
              for shape in result.settings.shapes if shape in source.noise}
    copied = {shape: arms for shape, arms in copied.items() if arms}
    if not copied:
        have = ", ".join(f"{s}/{a}" for s, arms in source.noise.items() for a in arms)
        raise UserError(f"--noise-from {path}: no floor for an arm and shape of this run (it has {have})")
    return copied


def _fingerprint(result: RunResult, shape: str) -> str | None:
    return next((f.fingerprint for f in result.fixtures if f.name == shape), None)


def with_noise(result: RunResult, aa_arm: str | None, noise_from: str | None) -> RunResult:
    """`result` with the floors it measured (an A/A pair) and those copied from a file; a
    measured floor wins over a copied one."""
    noise: dict[str, dict[str, float]] = {}
    if noise_from:
        for shape, arms in floors_from(noise_from, result).items():
            noise.setdefault(shape, {}).update(arms)
    if aa_arm:
        for shape, arms in measured_floors(sig.audited_samples(result), result.settings.shapes, aa_arm).items():
            noise.setdefault(shape, {}).update(arms)
    return replace(result, noise=noise) if noise else result
