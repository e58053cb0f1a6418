"""`--variant NAME=ARM:KEY=VALUE,...` and `moebench profile` on the CPU (fake arms, fake CUPTI)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from run_fakes import fake_backend
from timing_fakes import FakeGpu

from moebench.cli import main
from moebench.errors import UserError
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall
from moebench.kernels.registry import ARMS, add_arm
from moebench.run.plan import RunRequest
from moebench.run.prepare import RunFailed
from moebench.tasks.profile import profile_arm
from moebench.run.runner import run
from moebench.run.variants import parse_variant

GPU = FakeGpu()


class _Tiled(Arm):
    """Copies the oracle; its one kernel takes `tile * 100` ns (a constructor option)."""

    name = "fake-tiled"
    description = "oracle copy, time set by its tile"

    def __init__(self, tile: int = 40, wrong: bool = False):
        self.tile, self.wrong = tile, wrong

    def prepare(self, fx):
        from moebench.fixtures import fixture_reference
        ref = fixture_reference(fx)
        out = torch.empty_like(ref)

        def run_():
            out.copy_(ref * 2 if self.wrong else ref)
            GPU.launch("tiled_kernel", self.tile * 100)
        return PreparedCall(self.name, run_, out, (KernelDecl("tiled", "tiled_kernel"),), identity={"tile": self.tile})


@dataclasses.dataclass(frozen=True)
class _Config:
    steps: int = 8


class _Configured(Arm):
    """An arm whose settings are fields of a `config` dataclass: one kernel of `steps * 500` ns."""

    name = "fake-configured"
    description = "oracle copy, time set by its config"

    def __init__(self):
        self.config = _Config()

    def prepare(self, fx):
        from moebench.fixtures import fixture_reference
        ref = fixture_reference(fx)
        out = torch.empty_like(ref)
        steps = self.config.steps

        def run_():
            out.copy_(ref)
            GPU.launch("configured_kernel", steps * 500)
        return PreparedCall(self.name, run_, out, (KernelDecl("k", "configured_kernel"),), identity={"steps": steps})


if "fake-tiled" not in ARMS:
    add_arm("fake-tiled", _Tiled)
    add_arm("fake-configured", _Configured)


def req(tmp_path, **kw) -> RunRequest:
    base = dict(shapes=("T8",), arms=("fake-tiled",), rounds=2, samples=3, warmup=1, out_dir=str(tmp_path),
                measure_bandwidth=False)
    return RunRequest(**{**base, **kw})


def test_parse_variant_reads_names_families_and_typed_values():
    v = parse_variant("bm16=cuda-fused:block_m=16,fast=true,ratio=0.5,mode=x")
    assert (v.name, v.family) == ("bm16", "cuda-fused")
    assert dict(v.settings) == {"block_m": 16, "fast": True, "ratio": 0.5, "mode": "x"}


@pytest.mark.parametrize("text, needle", [
    ("bm16", "expected NAME=ARM:KEY=VALUE"),
    ("bm16=cuda-fused", "no settings"),
    ("bm16=cuda-fused:block_m", "is not KEY=VALUE"),
    ("bm16=cuda-fused:a=1,a=2", "a given twice"),
])
def test_parse_variant_mistakes(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_variant(text)


def test_variants_are_their_own_arms_in_one_paired_run(tmp_path):
    result, _ = run(req(tmp_path, variants=("t20=fake-tiled:tile=20", "s4=fake-configured:steps=4")),
                    fake_backend(GPU))
    assert result.settings.arms == ("fake-tiled", "t20", "s4") and result.audit.passed
    med = {s.arm: s.median_ns for s in result.summaries}
    assert med == {"fake-tiled": 4000, "t20": 2000, "s4": 2000}
    ratios = {r.arm: r.median for r in result.ratios}
    assert ratios["t20"] == pytest.approx(2.0) and ratios["s4"] == pytest.approx(2.0)
    ids = {a.name: a.identity for a in result.arms}
    assert ids["t20"]["tile"] == 20 and ids["t20"]["variant"] == {"of": "fake-tiled", "settings": {"tile": 20}}
    assert ids["s4"]["steps"] == 4 and ids["fake-tiled"] == {"tile": 40}
    assert result.settings.options["variants"] == ["t20=fake-tiled:tile=20", "s4=fake-configured:steps=4"]
    assert all(p.passed for p in result.parity) and {p.arm for p in result.parity} == {"fake-tiled", "t20", "s4"}


def test_a_variant_that_breaks_parity_is_not_timed(tmp_path):
    with pytest.raises(RunFailed, match="bad at T8"):
        run(req(tmp_path, variants=("bad=fake-tiled:wrong=true",)), fake_backend(GPU))


@pytest.mark.parametrize("variant, needle", [
    ("x=fake-tiled:size=3", "has no setting 'size'"),
    ("x=nope:tile=3", "unknown arm 'nope'"),
    ("fake-configured=fake-tiled:tile=3", "the name of an arm already"),
])
def test_variant_mistakes_are_user_errors(tmp_path, variant, needle):
    with pytest.raises(UserError, match=needle):
        run(req(tmp_path, variants=(variant,)), fake_backend(GPU))


def test_cli_variant_mistake_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--arms", "fake-tiled", "--variant", "x=fake-tiled:size=3", "--shape", "T8"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "has no setting 'size'" in err


def test_profile_launches_the_checked_call_untimed():
    gpu_log = len(GPU.launch_log)
    p = profile_arm(RunRequest(shapes=("T8",), arms=("fake-tiled",), warmup=1), calls=5, backend=fake_backend(GPU))
    launched = GPU.launch_log[gpu_log:]
    # one parity call, one warm-up, five profiled calls; each of the last six after a flush
    assert launched.count("tiled_kernel") == 1 + 1 + 5 and launched.count("flush_reduce") == 6
    assert (p.shape, p.arm, p.calls) == ("T8", "fake-tiled", 5) and p.kernels == ("tiled_kernel",)
    assert p.parity[0].passed


def test_profile_refuses_a_wrong_arm_and_two_arms():
    with pytest.raises(RunFailed, match="parity failed"):
        profile_arm(RunRequest(shapes=("T8",), arms=("bad",), variants=("bad=fake-tiled:wrong=true",)),
                    backend=fake_backend(GPU))
    with pytest.raises(UserError, match="exactly one arm"):
        profile_arm(RunRequest(shapes=("T8",), arms=("fake-tiled", "fake-configured")), backend=fake_backend(GPU))
