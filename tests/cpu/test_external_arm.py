"""External arms (`--arm NAME=module:factory`, `moebench.arms` entry points) through the
oracle check, the fake timing backend and the result file, on the CPU."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import external_arm_example as example
from run_fakes import fake_backend

from moebench.run import runner
from moebench.cli import main
from moebench.errors import UserError
from moebench.kernels import registry as arm_module
from moebench.kernels.registry import make_arms
from moebench.kernels.api.external import parse_external_arm, register_entry_point_arms
from moebench.analysis.load import load
from moebench.run.runner import RunFailed, RunRequest, run

TESTS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture
def fake_gpu(monkeypatch):
    """`moebench run` on the CPU: the runner's device backend replaced by the fake one."""
    monkeypatch.setattr(runner, "cuda_backend", lambda req: fake_backend(example.GPU))
    monkeypatch.chdir(TESTS)  # the factory modules import from the current directory
    return example.GPU


def cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err.strip()


def test_external_arms_pass_the_oracle_and_make_a_result_file(fake_gpu, tmp_path, capsys):
    code, out, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_copy",
                         "--arm", "two=external_arm_example:prepare_dict", "--arm",
                         "call=external_arm_example:prepare_call", "--rounds", "2", "--samples", "3",
                         "--warmup", "1", "--aa", "none", "--out", str(tmp_path))
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    result = load(path)
    assert result.settings.arms == ("mine", "two", "call") and result.settings.ref == "mine"
    assert all(p.passed and p.rel_l2 == 0 for p in result.parity)
    assert result.audit.passed and result.audit.samples_total == 2 * 3 * 3
    ids = {a.name: a.identity for a in result.arms}
    assert ids["mine"]["external"] == "external_arm_example:prepare_copy"
    assert ids["mine"]["module_sha256"] and ids["two"]["version"] == "v2" and ids["call"]["block"] == 8
    decl = {a.name: a.kernels for a in result.arms}
    assert decl["two"][0].count == 2 and decl["mine"][0].pattern == "my_moe_kernel"
    ratios = {r.arm: r.median for r in result.ratios}
    assert ratios["two"] == pytest.approx(4000 / 3000) and ratios["call"] == pytest.approx(2.0)
    assert result.settings.options["external_arms"][0] == "mine=external_arm_example:prepare_copy"
    assert "copies the oracle" in next(a.description for a in result.arms if a.name == "mine")


def test_a_broken_external_arm_fails_parity_exit_1(fake_gpu, tmp_path, capsys):
    code, _, err = cli(capsys, "run", "--shape", "T8", "--arm", "bad=external_arm_example:prepare_broken",
                       "--rounds", "1", "--samples", "1", "--out", str(tmp_path))
    assert code == 1 and "parity failed" in err and "bad at T8" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("spec, needle", [
    ("mine", "expected NAME=module:factory"),
    ("mine=no_colon", "expected NAME=module:factory"),
    ("mine=no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("mine=external_arm_example:nope", "has no 'nope'"),
    ("triton=external_arm_example:prepare_copy", "already an arm"),
    ("w=external_arm_example:prepare_wrong_shape", "output must be a floating [M, K] = [8, 256]"),
    ("w=external_arm_example:prepare_nothing", "returned int"),
])
def test_external_arm_mistakes_are_one_line_exit_2(fake_gpu, tmp_path, capsys, spec, needle):
    code, _, err = cli(capsys, "run", "--shape", "T8", "--arm", spec, "--rounds", "1", "--samples", "1",
                       "--out", str(tmp_path))
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_parse_external_arm():
    assert parse_external_arm("a.b-1=pkg.mod:make.arm") == ("a.b-1", "pkg.mod:make.arm")
    with pytest.raises(UserError):
        parse_external_arm("=m:f")


def test_entry_point_arms_register_lazily_and_run(monkeypatch, tmp_path):
    monkeypatch.setattr(arm_module, "ARMS", dict(arm_module.ARMS))
    eps = [metadata.EntryPoint(name="ep-copy", value="external_arm_example:prepare_copy", group="moebench.arms"),
           metadata.EntryPoint(name="triton", value="external_arm_example:prepare_broken", group="moebench.arms")]
    calls = []

    def entry_points(**kw):
        calls.append(kw)
        return [ep for ep in eps if ep.group == kw.get("group")]
    monkeypatch.setattr(metadata, "entry_points", entry_points)
    registry = arm_module.load_builtin_arms()
    assert calls and calls[0] == {"group": "moebench.arms"}
    assert registry["ep-copy"].external_target == "external_arm_example:prepare_copy"
    assert registry["triton"].__module__ != "moebench.kernels.api.external"  # the built-in keeps its name
    assert register_entry_point_arms(registry) == []  # already there: nothing added twice
    (arm,) = make_arms(["ep-copy"])
    assert arm.name == "ep-copy"
    req = RunRequest(shapes=("T8",), arms=("ep-copy",), rounds=2, samples=2, warmup=0, out_dir=str(tmp_path),
                     measure_bandwidth=False)
    result, path = run(req, fake_backend(example.GPU))
    assert result.audit.passed and result.parity[0].passed and path.exists()
    assert result.arms[0].identity["external"] == "external_arm_example:prepare_copy"


def test_broken_entry_point_arm_refuses_to_time(monkeypatch, tmp_path):
    monkeypatch.setattr(arm_module, "ARMS", dict(arm_module.ARMS))
    ep = metadata.EntryPoint(name="ep-bad", value="external_arm_example:prepare_broken", group="moebench.arms")
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [ep])
    req = RunRequest(shapes=("T8",), arms=("ep-bad",), rounds=1, samples=1, warmup=0, out_dir=str(tmp_path))
    with pytest.raises(RunFailed, match="ep-bad at T8"):
        run(req, fake_backend(example.GPU))
