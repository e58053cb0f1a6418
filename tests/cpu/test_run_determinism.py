"""`moebench run --determinism` on the CPU: the verdicts `verify --determinism` computes, taken on
a timed run's own prepared calls before its rounds, kept in its RunResult and shown as the `det`
column of its tables and its Markdown; a run without the flag keeps none; a resumed run keeps
the file's; a sweep's cells carry theirs into the merged result.

The run times on the fake GPU (tests/helpers/run_fakes.py); the arms are the planted ones of
tests/helpers/determinism_planted.py and the stock Triton arm's call under the interpreter, each
launching one fake kernel a sample so the audit passes."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest
from rich.console import Console
from run_fakes import fake_backend

import determinism_planted as planted
from moebench.run import determinism as run_determinism
from moebench.run import runner
from moebench.determinism.checks import NOT_REMADE, check_arms, check_prepared
from moebench.fixtures import build_fixture
from moebench.kernels.registry import external_arm_factories, make_arms
from moebench.views.determinism_view import det_text
from moebench.analysis.load import load
from moebench.record.store import save
from moebench.views.tables import summary_table
from moebench.analysis.validate import problems
from moebench.run.runner import RunRequest, resume, run
from result_factory import make_result, run_cli

pytestmark = pytest.mark.usefixtures("interpreted_triton")

ARMS = {name: f"{name}=determinism_planted:{cls}" for name, cls in (
    ("planted-clean", "PlantedClean"), ("fake-timed-triton", "FakeTimedTriton"),
    ("planted-run-noise", "PlantedRunNoise"), ("planted-batch-rows", "PlantedBatchRows"))}
RUNS = 3
TIMING = ["--rounds", "2", "--samples", "3", "--warmup", "1", "--aa", "none"]


@pytest.fixture(scope="module")
def det_run(tmp_path_factory):
    """One `run --determinism` of every arm at T4: (exit code, stdout, stderr, saved result, its path)."""
    out = tmp_path_factory.mktemp("det-run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "cuda_backend", lambda protocol: fake_backend(planted.GPU))
        argv = ["run", "--shape", "T4", *(a for t in ARMS.values() for a in ("--arm", t)), *TIMING,
                "--determinism", "--determinism-runs", str(RUNS), "--out", str(out)]
        code, stdout, err = run_cli(argv)
    assert list(out.glob("*.json")), err
    (path,) = out.glob("*.json")
    return code, stdout, err, load(path), path


def by_arm(result):
    return {v.arm: v for v in result.determinism}


def summary_row(text: str, arm: str) -> str:
    """The summary table's line of `arm` (the one whose cells end in its det cell)."""
    (line,) = [ln for ln in text.splitlines() if re.search(rf"\b{re.escape(arm)}\b", ln) and " · " in ln]
    return line


# ------------------------------------------------------------------------------ the result


def test_a_run_with_determinism_keeps_a_verdict_per_timed_arm(det_run):
    code, _, err, result, _ = det_run
    assert code == 0, err
    assert result.audit.passed and {s.arm for s in result.summaries} == set(ARMS)  # timed as usual
    v = by_arm(result)
    assert list(v) == list(ARMS) and {x.shape for x in result.determinism} == {"T4"}
    assert all(x.run_to_run.runs == RUNS for x in result.determinism)
    assert v["planted-clean"].passed and v["fake-timed-triton"].passed  # the Triton call: bitwise, invariant, same hash
    assert v["fake-timed-triton"].identity == next(a.identity for a in result.arms if a.name == "fake-timed-triton")

    noise = v["planted-run-noise"]  # every run of it differs, so its batch rows do too
    assert not noise.deterministic and noise.run_to_run.differing_runs == RUNS - 1 and noise.run_to_run.elements > 0

    rows = v["planted-batch-rows"]
    assert rows.deterministic and not rows.batch_invariant
    assert [(b.m, b.batch) for b in rows.batch] == [(1, 4), (1, 8), (4, 8)]


def test_the_verdicts_are_verify_determinisms_on_the_same_arms(det_run):
    """The same checks, not a second implementation: verify's check_arms on the same fixture gives
    each arm whose output follows its inputs alone the run's verdict (the across-processes check
    aside, which the run's verdicts show passed)."""
    _, _, _, result, _ = det_run
    fx = build_fixture(registry_spec("T4"))
    names = ["planted-clean", "fake-timed-triton", "planted-batch-rows"]
    again = check_arms(fx, names, external=tuple(ARMS[n] for n in names), runs=RUNS, cross_process=False)
    for v in again:
        timed = by_arm(result)[v.arm]
        assert timed.cross_process.equal is True and replace(timed, cross_process=None) == v, v.arm


def registry_spec(name):
    from moebench.fixtures import ShapeRegistry
    return ShapeRegistry().resolve(name)


def test_check_prepared_runs_the_call_it_is_given():
    fx = build_fixture(registry_spec("T4"))
    (arm,) = make_arms(["planted-clean"], extra=external_arm_factories((ARMS["planted-clean"],)))
    call = arm.prepare(fx)
    ran, inner = [], call.run
    call.run = lambda: (ran.append(1), inner())
    v, digest = check_prepared(arm, fx, call, runs=RUNS)
    assert len(ran) == RUNS and v.run_to_run.runs == RUNS and v.cross_process is None and len(digest) == 64


# ------------------------------------------------------------------------------ the views


def test_the_summary_table_has_a_det_column(det_run):
    _, stdout, _, result, _ = det_run
    assert "determinism and batch invariance" in stdout  # the verdicts' own table
    assert re.search(r"┃\s*det\s*┃", stdout)
    wide = terminal_text(summary_table(result))
    assert "bitwise · invariant" in summary_row(wide, "planted-clean")
    assert "bitwise · invariant" in summary_row(wide, "fake-timed-triton")
    assert re.search(r"differs \([\d,]+ elems, max Δ [\d.e-]+\) · ", summary_row(wide, "planted-run-noise"))
    assert "bitwise · varies with batch" in summary_row(wide, "planted-batch-rows")


def terminal_text(table) -> str:
    console = Console(file=io.StringIO(), width=400)
    console.print(table)
    return console.file.getvalue()


def test_report_and_markdown_show_the_column(det_run):
    _, _, _, result, path = det_run
    code, out, err = run_cli(["report", str(path)])
    assert code == 0, err
    assert re.search(r"┃\s*det\s*┃", out) and "differs (" in out
    code, md, err = run_cli(["report", str(path), "--format", "markdown"])
    assert code == 0, err
    header = next(ln for ln in md.splitlines() if ln.startswith("| shape | arm | median µs"))
    assert header.rstrip(" |").endswith("det")
    noise = next(ln for ln in md.splitlines() if ln.startswith("| T4 | `planted-run-noise`"))
    assert noise.rstrip(" |").endswith(det_text(by_arm(result)["planted-run-noise"]))
    assert "| T4 | `planted-batch-rows`" in md and "bitwise · varies with batch |" in md
    assert "### Determinism" in md and "NOT deterministic" in md  # the verdicts' table follows


def test_det_cells_say_which_check_failed():
    from moebench.record.determinism import CrossProcess, DeterminismVerdict, RunToRun
    base = DeterminismVerdict("a", "T4", 4, RunToRun(5, 0, 0, 0.0), (), CrossProcess("x", "x"))
    assert det_text(base) == "bitwise · invariant"
    assert det_text(replace(base, cross_process=CrossProcess("x", "y"))) == "differs across processes · invariant"
    assert det_text(replace(base, run_to_run=RunToRun(5, 4, 1234, -1.0))) == "differs (1,234 elems, not finite) · invariant"
    assert det_text(None) == "—"


# ------------------------------------------------------------------------------ without, resumed, merged


def test_a_run_without_the_flag_keeps_no_verdicts_and_no_column(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "cuda_backend", lambda protocol: fake_backend(planted.GPU))
    checked = []
    monkeypatch.setattr(run_determinism, "check_prepared", lambda *a, **k: checked.append(a))
    code, stdout, err = run_cli(["run", "--shape", "T4", "--arm", ARMS["planted-clean"], "--arm",
                                 ARMS["planted-run-noise"], *TIMING, "--out", str(tmp_path)])
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    assert load(path).determinism == () and not checked
    assert re.search(r"┃ × floor ┃\n", stdout) and not re.search(r"┃\s*det\s*┃", stdout) and "determinism and batch invariance" not in stdout
    code, md, _ = run_cli(["report", str(path), "--format", "markdown"])
    assert code == 0 and " det |" not in md


class Crash:
    """Markers that raise at the start of one round (a run stopped part way)."""

    def push(self, message: str) -> None:
        if message == "round 2":
            raise RuntimeError("stopped for the test")

    def pop(self) -> None:
        pass


def test_a_partial_run_keeps_its_verdicts_and_a_resume_does_not_check_again(tmp_path, monkeypatch):
    req = RunRequest(shapes=("T4",), arms=(), external_arms=(ARMS["planted-clean"], ARMS["planted-batch-rows"]),
                     rounds=3, samples=2, warmup=0, out_dir=str(tmp_path), measure_bandwidth=False,
                     determinism=True, determinism_runs=2, cross_process=False, command=("moebench", "run"))
    with pytest.raises(RuntimeError, match="stopped for the test"):
        run(req, replace(fake_backend(planted.GPU), markers=Crash()))
    (path,) = tmp_path.glob("*.json")
    partial = load(path)
    assert not partial.status.complete and partial.rounds_done == 1
    assert [(v.arm, v.batch_invariant, v.cross_process) for v in partial.determinism] == [
        ("planted-clean", True, None), ("planted-batch-rows", False, None)]  # --no-cross-process: not checked
    monkeypatch.setattr(run_determinism, "check_prepared", lambda *a, **k: pytest.fail("checked again"))
    done, _ = resume(path, fake_backend(planted.GPU))
    assert done.status.complete and done.determinism == partial.determinism


def test_arms_a_fresh_process_cannot_make_say_so(tmp_path, monkeypatch):
    """An A/A copy (like a build or a variant) is this run's own arm: its across-processes check
    records why it did not run; the arm it copies is made again there."""
    monkeypatch.setattr(runner, "cuda_backend", lambda protocol: fake_backend(planted.GPU))
    code, _, err = run_cli(["run", "--shape", "T4", "--arm", ARMS["planted-clean"], "--aa", "planted-clean",
                            "--rounds", "1", "--samples", "2", "--warmup", "0", "--determinism", "--determinism-runs",
                            "2", "--out", str(tmp_path)])
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    v = by_arm(load(path))
    assert v["planted-clean#2"].cross_process.error == NOT_REMADE and v["planted-clean#2"].cross_process.equal is None
    assert v["planted-clean"].cross_process.equal is True and v["planted-clean#2"].deterministic


def test_a_sweeps_merged_result_keeps_each_cells_verdicts(det_run):
    from moebench.run.sweep_cells import merge
    _, _, _, result, _ = det_run
    cells = []
    for shape in ("T4", "T8"):
        part = replace(result, determinism=tuple(replace(v, shape=shape) for v in result.determinism))
        cells.append(replace(part, sharding=make_sharded(shape)))
    merged = merge(cells, planned=["T4", "T8"], missing=[], request={}, world_size=2, dist_backend="gloo",
                   dry_run=False, command=["moebench", "sweep"], started_at="2026-01-01T00:00:00Z", gpu=None)
    assert [(v.shape, v.arm) for v in merged.determinism] == [(s, a) for s in ("T4", "T8") for a in ARMS]


def make_sharded(shape):
    from moebench.record import schema as S
    return S.Sharding(2, "gloo", False, {}, cells=(S.CellInfo(shape, 0, "host", "cpu", None, None, None, 1.0,
                                                              "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"),))


# ------------------------------------------------------------------------------ files and errors


def test_a_verdict_of_an_arm_the_run_did_not_time_is_a_problem(det_run, tmp_path):
    _, _, _, result, _ = det_run
    assert problems(result) == []
    stray = replace(result, determinism=(replace(result.determinism[0], arm="not-timed"),))
    assert problems(stray) == ["determinism[T4 not-timed]: shape or arm not in the settings"]


def test_compare_reads_two_runs_that_carry_verdicts(det_run, tmp_path):
    _, _, _, result, _ = det_run
    a, b = make_result(seed=0), make_result(seed=4)
    with_verdicts = [replace(r, determinism=tuple(replace(v, shape=s, arm=arm) for s in r.settings.shapes
                                                  for v, arm in zip(result.determinism, r.settings.arms)))
                     for r in (a, b)]
    paths = [str(save(r, tmp_path / f"{i}.json")) for i, r in enumerate(with_verdicts)]
    for fmt in ("table", "markdown", "json"):
        code, out, err = run_cli(["compare", *paths, "--format", fmt])
        assert code == 0, err
        assert "cuda-fused" in out


@pytest.mark.parametrize("argv, message", [
    (["--determinism-runs", "5"], "--determinism-runs applies only with --determinism"),
    (["--no-cross-process"], "--cross-process/--no-cross-process applies only with --determinism"),
    (["--determinism", "--determinism-runs", "1"], "--determinism-runs must be at least 2"),
])
def test_run_determinism_user_errors_are_one_line(argv, message):
    code, _, err = run_cli(["run", "--shape", "T4", "--arms", "triton", *argv])
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
