"""Runs that survive their own end: a run stopped by SIGINT, SIGTERM, SIGKILL or an exception
leaves a readable partial result, and `moebench run --resume` finishes it to what an
uninterrupted run gives. The signal tests run `moebench` on a fake GPU in a subprocess
(tests/helpers/resume_child.py), whose kernel durations follow the samples' external ids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from timing_fakes import FakeTracer

from moebench.errors import UserError
from moebench.timing.measure import TimingBackend
from moebench.timing.read_floor import ReadProbe
from moebench.run.partial import IN_PROGRESS
from moebench.record import schema as S
from moebench.analysis.load import load
from moebench.record.store import save
from moebench.analysis.validate import problems
from moebench.run.runner import RunRequest, resume, run
from moebench.timing.engine import NoMarkers, Unit
from moebench.timing.timers import KernelRecordTimer

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parents[1] / "helpers" / "resume_child.py"
ROUNDS = 5
RUN_ARGS = ["run", "--arms", "resume-ref,resume-fast", "--shape", "T8,T16", "--rounds", str(ROUNDS),
            "--samples", "3", "--warmup", "1", "--order-seed", "11", "--aa", "none"]


def child(args, *, hold: Path | None = None, hold_round: int = 3, cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    env.pop("RESUME_SOURCE", None)
    if hold is not None:
        env.update(RESUME_HOLD=str(hold), RESUME_HOLD_ROUND=str(hold_round))
    return subprocess.Popen([sys.executable, str(CHILD), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err.strip()


def only_file(folder: Path) -> Path:
    files = list(folder.glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def stopped_run(tmp: Path, sig: int, hold_round: int = 3, extra=()) -> tuple[int, str, Path]:
    """A run held at the start of `hold_round` and sent `sig`: (exit code, stderr, its file)."""
    hold = tmp / "held"
    proc = child([*RUN_ARGS, *extra, "--out", str(tmp / "out")], hold=hold, hold_round=hold_round, cwd=tmp)
    deadline = time.monotonic() + 240
    while not hold.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its hold"
        time.sleep(0.05)
    proc.send_signal(sig)
    code, _, err = finished(proc)
    return code, err, only_file(tmp / "out")


def sample_key(s: S.Sample):
    """Everything of a sample a second process reproduces (its GPU clock readings aside)."""
    return (s.shape, s.arm, s.round, s.index, s.external_id, s.value_ns, s.gpu_span_ns,
            tuple((k.name, k.duration_ns) for k in s.kernels))


def assert_same_run(done: S.RunResult, whole: S.RunResult) -> None:
    for field in ("settings", "fixtures", "arms", "parity", "build_parity", "clocks", "audit", "summaries",
                  "ratios", "statistics_over"):
        assert getattr(done, field) == getattr(whole, field), field
    assert [sample_key(s) for s in done.samples] == [sample_key(s) for s in whole.samples]
    assert done.provenance.command[1:4] == ("run", "--arms", "resume-ref,resume-fast")
    assert done.status.complete and done.status.rounds_done == ROUNDS and done.status.request is None


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> S.RunResult:
    """The same run, uninterrupted."""
    tmp = tmp_path_factory.mktemp("whole")
    code, _, err = finished(child([*RUN_ARGS, "--out", str(tmp / "out")], cwd=tmp))
    assert code == 0, err
    result = load(only_file(tmp / "out"))
    values = {s.value_ns for s in result.samples}
    assert len(values) > 10 and min(values) > 0  # durations vary with the sample
    return result


@pytest.mark.parametrize("sig, hold_round, code", [
    (signal.SIGINT, 3, 130),
    (signal.SIGTERM, 3, 143),
    (signal.SIGKILL, 4, -signal.SIGKILL),
    (signal.SIGTERM, 1, 143),  # before any round: the file holds the settings and the bandwidth
])
def test_a_stopped_run_leaves_a_partial_file_that_resume_completes(tmp_path, whole, sig, hold_round, code):
    got, err, path = stopped_run(tmp_path, sig, hold_round)
    assert got == code, err
    partial = load(path)  # readable, and consistent with itself
    done_rounds = hold_round - 1
    st = partial.status
    assert not st.complete and st.rounds_done == done_rounds and st.request["rounds"] == ROUNDS
    assert {s.round for s in partial.samples} == set(range(1, done_rounds + 1))
    assert len(partial.samples) == done_rounds * 4 * 3 and partial.audit.samples_total == len(partial.samples)
    assert partial.provenance.gpu.read_bandwidth_bytes_per_s == whole.provenance.gpu.read_bandwidth_bytes_per_s
    assert [sample_key(s) for s in partial.samples] == [sample_key(s) for s in whole.samples[:len(partial.samples)]]
    if sig == signal.SIGKILL:
        assert st.reason == IN_PROGRESS and err == ""
    else:
        name = signal.Signals(sig).name
        assert st.reason == f"interrupted by {name}"
        assert len(err.splitlines()) == 1 and f"interrupted by {name}" in err and f"--resume {path}" in err
        assert f"{done_rounds} of {ROUNDS} rounds kept" in err
    if done_rounds:
        assert partial.summaries and all(len(x.row_medians_ns) == done_rounds for x in partial.summaries)

    from moebench.views.report import make_report
    for fmt, needle in (("markdown", "**Incomplete:** "), ("table", "INCOMPLETE: ")):
        assert f"{needle}{done_rounds} of {ROUNDS} rounds done, {st.reason}" in make_report(partial, fmt).text

    rc, out, err = finished(child(["run", "--resume", str(path)], cwd=tmp_path))
    assert rc == 0, err
    assert f"saved {path}" in out.replace("\n", "")
    done = load(path)
    assert_same_run(done, whole)
    assert done.status.resumed_at == (hold_round,)
    assert done.provenance.started_at == partial.provenance.started_at
    assert list(path.parent.iterdir()) == [path]  # finished in place, no temporary left


def test_resume_refuses_other_settings_fixtures_and_builds_in_one_line(tmp_path, monkeypatch, capsys):
    shapes = tmp_path / "shapes.toml"
    shapes.write_text("[families.X]\nK = 256\nE = 8\ntop_k = 2\nN = 256\n")
    code, _, path = stopped_run(tmp_path, signal.SIGINT, 2, ("--shape", "X8", "--shapes-file", str(shapes)))
    assert code == 130 and load(path).settings.shapes == ("T8", "T16", "X8")
    before = path.read_bytes()

    import resume_child

    import moebench.run.runner as runner
    from moebench.cli import main
    monkeypatch.setattr(runner, "cuda_backend", resume_child.fake_backend)

    def refused(args, needle):
        with pytest.raises(SystemExit) as exc:
            main(["run", "--resume", str(path), *args])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("moebench: error:"), err
        assert needle in err, err
        assert path.read_bytes() == before  # the file is left as it was

    refused(["--rounds", "7"], "was run with rounds = 5, not 7")
    refused(["--out", str(tmp_path)], "--out does not apply")
    monkeypatch.setenv("RESUME_SOURCE", "6" * 64)
    refused([], "arm resume-ref at T8 is not the file's: identity.source_sha256: '5555")
    monkeypatch.delenv("RESUME_SOURCE")
    shapes.write_text("[families.X]\nK = 128\nE = 8\ntop_k = 2\nN = 256\n")
    refused([], "fixture X8 is not the file's: K: 256 in the file, 128 now")


# --- in-process: an exception, the library API, old files --------------------------------

class Crash:
    """Markers that raise at the start of one round, like a failure in the middle of a run."""

    def __init__(self, at: int):
        self.at = at

    def push(self, message: str) -> None:
        if message == f"round {self.at}":
            raise RuntimeError("the device fell off the bus")

    def pop(self) -> None:
        pass


def backend(markers=None) -> TimingBackend:
    import resume_child  # registers the resume arms; its durations follow the external ids

    def open_tracer(cap):
        resume_child.GPU.batch = type(resume_child.GPU.batch)()
        return FakeTracer(resume_child.GPU)
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(open_tracer),
                         flush=lambda: resume_child.GPU.launch("flush_reduce", 50_000), flush_bytes=256 * 2**20,
                         sync=lambda: None, clocks=lambda r: S.ClockSample(r, 1980, 3201, 40 + r, 300.0),
                         gpu=resume_child.FAKE_GPU, markers=markers or NoMarkers(),
                         probe=lambda: ReadProbe((Unit("_read_floor", "1x1x1", run=lambda: resume_child.GPU.launch("r", 250_000)),),
                                                         10**9, "fake read"))


def request(tmp_path, rounds=4) -> RunRequest:
    return RunRequest(shapes=("T8",), arms=("resume-ref", "resume-fast"), rounds=rounds, samples=2, warmup=0,
                      out_dir=str(tmp_path / "out"), command=("moebench", "run"), order_seed=11)


def test_an_exception_mid_run_keeps_the_rounds_done_and_says_why(tmp_path):
    with pytest.raises(RuntimeError, match="fell off the bus") as exc:
        run(request(tmp_path), backend(Crash(3)))
    path = only_file(tmp_path / "out")
    assert any(f"--resume {path}" in note for note in exc.value.__notes__)
    partial = load(path)
    assert partial.status.reason == "crashed: RuntimeError: the device fell off the bus"
    assert partial.rounds_done == 2 and {s.round for s in partial.samples} == {1, 2}
    done, where = resume(path, backend())
    whole, _ = run(request(tmp_path / "whole"), backend())
    assert where == path and load(path) == done
    for field in ("settings", "arms", "fixtures", "audit", "summaries", "ratios", "clocks"):
        assert getattr(done, field) == getattr(whole, field), field
    assert [sample_key(s) for s in done.samples] == [sample_key(s) for s in whole.samples]
    # rounds keep their numbers and their odd/even order
    order = [(s.round, s.arm) for s in done.samples if s.index == 0]
    assert order == [(r, a) for r in range(1, 5) for a in (("resume-ref", "resume-fast") if r % 2
                                                          else ("resume-fast", "resume-ref"))]


def test_a_complete_or_foreign_file_is_not_resumed(tmp_path):
    from result_factory import make_result
    path = save(make_result(), tmp_path / "old.json")
    with pytest.raises(UserError, match="the run is complete"):
        resume(path, backend())
    older = S.RunStatus(complete=False, rounds_done=make_result().settings.rounds)
    with pytest.raises(UserError, match="holds no request"):
        resume(save(replace(make_result(), status=older), tmp_path / "r.json"), backend())


def test_compare_refuses_an_incomplete_run(tmp_path):
    from result_factory import make_result

    from moebench.analysis.compare import compare_results
    a = make_result()
    b = replace(a, status=S.RunStatus(complete=False, reason="interrupted by SIGINT", rounds_done=2, request={}))
    with pytest.raises(UserError, match=rf"B is incomplete \(2 of {a.settings.rounds} rounds, interrupted by SIGINT\)"):
        compare_results(a, b)
    assert compare_results(a, a).arms


def test_the_loader_reads_old_files_as_complete_and_checks_partial_ones():
    from result_factory import make_result
    committed = sorted((ROOT / "results").rglob("*.json"))[:3]
    for path in committed:
        r = load(path)
        assert r.status.complete and r.rounds_done == r.settings.rounds
    r = make_result()
    n = r.settings.rounds
    assert problems(r) == [] and n > 1 and {s.round for s in r.samples} == set(range(1, n + 1))
    one_round = replace(r, status=S.RunStatus(complete=False, reason="x", rounds_done=1, request={}))
    assert any("round or index outside the settings (1 rounds" in p for p in problems(one_round))
    assert problems(replace(r, status=S.RunStatus(complete=True, rounds_done=1)))[0] == \
        f"status: complete, but 1 of {n} rounds done"
    assert problems(replace(r, status=S.RunStatus(complete=False, rounds_done=n + 1)))[0] == \
        f"status.rounds_done {n + 1} is outside 0-{n}"


def test_the_engine_resumes_a_round_with_its_number_order_and_ids():
    from test_timing_engine import KERNEL_RECORDS, units
    from timing_fakes import FakeGpu

    from moebench.timing.engine import EngineConfig, run_rounds

    def rounds(first):
        gpu = FakeGpu()
        return run_rounds(units(gpu), EngineConfig(4, 3, 1, first_round=first), FakeTracer(gpu), KERNEL_RECORDS)
    whole, later = rounds(1), rounds(3)
    tail = [s for s in whole.samples if s.round >= 3]
    assert [(s.round, s.arm, s.index, s.external_id) for s in later.samples] == \
        [(s.round, s.arm, s.index, s.external_id) for s in tail]
    assert [s.arm for s in later.samples if s.index == 0] == ["ref", "fast", "fast", "ref"]  # odd, then even
    assert rounds(5).samples == [] and sorted(later.dropped_by_round) == [3, 4]
    with pytest.raises(ValueError):
        EngineConfig(4, 3, 1, first_round=6)


def test_two_stretches_audit_as_one_audit_of_all_rounds():
    from test_timing_engine import DECL, KERNEL_RECORDS, units
    from timing_fakes import FakeGpu

    from moebench.timing.audit import audit_samples, combined
    from moebench.timing.engine import EngineConfig, run_rounds
    gpu = FakeGpu()
    out = run_rounds(units(gpu), EngineConfig(4, 3, 0), FakeTracer(gpu, drop_in_round=3), KERNEL_RECORDS)
    broken = [replace(s, kernels=s.kernels[:1]) if s.arm == "ref" and s.index == 1 else s for s in out.samples]
    drops = out.dropped_by_round
    whole = audit_samples(broken, DECL, out.kernels, drops)
    first = [s for s in broken if s.round <= 2]
    parts = combined(audit_samples(first, DECL, out.kernels, {r: n for r, n in drops.items() if r <= 2}),
                     audit_samples(broken[len(first):], DECL, out.kernels, {r: n for r, n in drops.items() if r > 2}))
    assert parts == whole and not whole.passed and whole.dropped_records == 3
    assert whole.findings[0].index == -1 and len(whole.findings) == 1 + 4


class OutOfMemory(Crash):
    """Markers that run the device out of memory at the start of one round."""

    def push(self, message: str) -> None:
        if message == f"round {self.at}":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_out_of_memory_mid_run_is_one_line_and_keeps_the_rounds(tmp_path):
    with pytest.raises(UserError) as exc:
        run(request(tmp_path), backend(OutOfMemory(3)))
    path = only_file(tmp_path / "out")
    text = str(exc.value)
    assert len(text.splitlines()) == 1 and text.startswith("out of GPU memory timing the rounds"), text
    assert f"2 of 4 rounds kept in {path}" in text and f"--resume {path}" in text
    partial = load(path)
    assert not partial.status.complete and partial.rounds_done == 2
    assert partial.status.reason.startswith("crashed: UserError: out of GPU memory")
    done, _ = resume(path, backend())
    assert done.status.complete and done.rounds_done == 4 and done.status.resumed_at == (3,)


def test_noise_floors_are_written_when_the_run_is_complete_and_a_resume_keeps_the_aa_arm(
        tmp_path, monkeypatch, capsys):
    aa = replace(request(tmp_path), aa_arm="resume-fast")
    with pytest.raises(RuntimeError):
        run(aa, backend(Crash(3)))
    path = only_file(tmp_path / "out")
    partial = load(path)
    assert "resume-fast#2" in partial.settings.arms and partial.noise == {}  # a floor over 2 of 4 rounds is not kept

    import resume_child

    import moebench.run.runner as runner
    from moebench.cli import main
    monkeypatch.setattr(runner, "cuda_backend", resume_child.fake_backend)
    before = path.read_bytes()
    for args, needle in ((["--graph"], "was run with sampler = 'eager', not 'graph'"),
                         (["--aa", "resume-ref"], "was run with aa_arm = 'resume-fast', not 'resume-ref'")):
        with pytest.raises(SystemExit) as exc:
            main(["run", "--resume", str(path), *args])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err
        assert path.read_bytes() == before

    done, _ = resume(path, backend())
    whole, _ = run(replace(aa, out_dir=str(tmp_path / "whole")), backend())
    assert done.noise and set(done.noise) == {"T8"} and done.noise == whole.noise
