"""The GPU-only failures, injected on the CPU: each ends as one line. Out of GPU memory (with
the fixture's size), a kernel that faults in its oracle check (exit 1, the arm and shape named),
an arm failing the oracle (a stop, or left out with --keep-going), a failed audit (exit 1, the
result kept and marked)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_run_cli import _FakeArm, backend

from moebench.errors import UserError
from moebench.failures import (ParityFailure, RunFailed, audit_failure, gpu_memory_guard, is_kernel_fault,
                               is_out_of_memory, kernel_fault_guard, out_of_memory, parity_exclusions)
from moebench.kernels.registry import ARMS, add_arm
from moebench.views.formats import FORMATS
from moebench.analysis.load import load
from moebench.run.runner import RunRequest, run


def _one_line(text: str) -> None:
    assert text and "\n" not in text.strip(), text


class _OomArm(_FakeArm):
    name = "fake-oom"

    def prepare(self, fx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.8 GiB total)")


if "fake-oom" not in ARMS:
    add_arm("fake-oom", _OomArm)


class _FaultArm(_FakeArm):
    """A build whose kernel faults on its first call (what torch raises after the launch)."""
    name = "fake-fault"

    def prepare(self, fx):
        call = super().prepare(fx)

        def run():
            raise torch.AcceleratorError("CUDA error: an illegal instruction was encountered\n"
                                         "CUDA kernel errors might be asynchronously reported at some other API call")
        return dataclasses.replace(call, run=run)


if "fake-fault" not in ARMS:
    add_arm("fake-fault", _FaultArm)


def test_a_kernel_fault_is_recognized_and_nothing_else_is():
    assert is_kernel_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_kernel_fault(RuntimeError("CUDA error: misaligned address"))
    assert is_kernel_fault(RuntimeError("CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered"))
    assert not is_kernel_fault(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_kernel_fault(UserError("cuda-x: an illegal instruction in the name"))
    with pytest.raises(KeyError):
        with kernel_fault_guard("x"):
            raise KeyError("w1")


def _run_stops(arm: str, error: type, tmp_path) -> BaseException:
    """The one-line error a run of `arm` beside fake-ref at T8 stops with."""
    req = RunRequest(shapes=("T8",), arms=("fake-ref", arm), rounds=1, samples=1, warmup=0, out_dir=str(tmp_path))
    with pytest.raises(error) as err:
        run(req, backend())
    _one_line(str(err.value))
    return err.value


def test_a_run_whose_build_faults_says_which_arm_at_which_shape_in_one_line(tmp_path):
    err = _run_stops("fake-fault", RunFailed, tmp_path)
    text = str(err)
    assert text.startswith("fake-fault at T8: a kernel faulted (CUDA error: an illegal instruction was encountered)")
    assert "context is lost" in text and err.exit_code == 1


def test_out_of_memory_inside_the_guard_is_one_line_with_the_size():
    with pytest.raises(UserError) as err:
        with gpu_memory_guard("moving fixture A65536 to the GPU", 3_250_000_000):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB\nmore text")
    text = str(err.value)
    _one_line(text)
    assert "out of GPU memory moving fixture A65536 to the GPU" in text and "3.25 GB" in text
    assert "smaller M" in text


def test_the_guard_lets_every_other_error_through():
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with gpu_memory_guard("x", 1):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(KeyError):
        with gpu_memory_guard("x", 1):
            raise KeyError("w1")


def test_out_of_memory_is_recognized_in_its_forms():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"))
    assert not is_out_of_memory(RuntimeError("CUDA error: misaligned address"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocation's error type
    text = str(out_of_memory("building X", None, 2 * 10**9, 140 * 10**9))
    assert "2.00 GB of 140.00 GB free" in text and "tensors" not in text


def test_a_run_whose_arm_runs_out_of_memory_says_which_arm_at_which_shape_and_the_size(tmp_path):
    text = str(_run_stops("fake-oom", UserError, tmp_path))
    assert "out of GPU memory preparing fake-oom at T8" in text and "the fixture's tensors take 0.00 GB" in text


def test_parity_exclusions_stop_without_keep_going_and_leave_out_with_it():
    failed = [ParityFailure("A8", "cuda-x", "rel L2 0.5 > 0.01")]
    with pytest.raises(RunFailed, match=r"cuda-x at A8: rel L2 0.5 > 0.01 \(--keep-going times the other arms\)"):
        parity_exclusions(failed, keep_going=False, ref="triton")
    assert parity_exclusions(failed, keep_going=True, ref="triton") == {("A8", "cuda-x")}
    with pytest.raises(RunFailed, match="reference arm 'cuda-x' failed parity"):
        parity_exclusions(failed, keep_going=True, ref="cuda-x")
    assert parity_exclusions([], keep_going=False, ref="triton") == set()


def test_keep_going_times_the_other_arms_and_reports_the_failing_one(tmp_path):
    req = RunRequest(shapes=("T8", "T16"), arms=("fake-ref", "fake-broken", "fake-fast"), rounds=2, samples=3,
                     warmup=0, out_dir=str(tmp_path), keep_going=True)
    logged = []
    result, path = run(req, backend(), log=logged.append)
    assert result.settings.arms == ("fake-ref", "fake-fast")
    assert {s.arm for s in result.samples} == {"fake-ref", "fake-fast"}
    failed = [p for p in result.parity if not p.passed]
    assert {(p.shape, p.arm) for p in failed} == {("T8", "fake-broken"), ("T16", "fake-broken")}
    assert any("left out of timing, failed the oracle: fake-broken at T8" in m for m in logged)
    back = load(path)  # consistent with its own samples
    assert back == result and result.audit.passed
    import io
    for fmt in ("table", "markdown"):
        text = io.StringIO()
        FORMATS[fmt](back, text, [])
        assert "fake-fast" in text.getvalue()


def test_the_cli_exits_1_on_a_parity_failure_and_0_with_keep_going(tmp_path, monkeypatch, capsys):
    import moebench.run.runner as runner  # `moebench run` imports the pipeline when it runs
    from moebench.cli import main
    real = runner.run
    monkeypatch.setattr(runner, "run", lambda req, **kw: real(req, backend(), **kw))
    argv = ["run", "--shape", "T8", "--arms", "fake-ref,fake-broken,fake-fast", "--rounds", "1", "--samples", "2",
            "--warmup", "0", "--aa", "none", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as code:
        main(argv)
    err = capsys.readouterr().err
    assert code.value.code == 1 and "parity failed, not timing: fake-broken at T8" in err and "--keep-going" in err
    _one_line(err)
    assert not list(tmp_path.glob("*.json"))
    with pytest.raises(SystemExit) as code:
        main(argv + ["--keep-going"])
    assert code.value.code == 0
    (saved,) = tmp_path.glob("*.json")
    assert load(saved).settings.arms == ("fake-ref", "fake-fast")


def test_the_cli_exits_1_on_a_failed_audit_and_keeps_the_result_marked(tmp_path, monkeypatch, capsys):
    import moebench.run.runner as runner  # `moebench run` imports the pipeline when it runs
    from moebench.cli import main
    real = runner.run
    monkeypatch.setattr(runner, "run", lambda req, **kw: real(req, backend(drop_in_round=2), **kw))
    with pytest.raises(SystemExit) as code:
        main(["run", "--shape", "T8", "--arms", "fake-ref", "--rounds", "2", "--samples", "2", "--warmup", "0",
              "--aa", "none", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    (saved,) = tmp_path.glob("*.json")
    assert code.value.code == 1
    assert f"audit failed: 2/4 samples passed, 3 records dropped; kept in {saved} and marked audit failed" in err
    _one_line(err)
    kept = load(saved)
    assert not kept.audit.passed and kept.audit.dropped_records == 3


def test_the_audit_line_names_counts_and_first_findings():
    from result_factory import make_result
    r = make_result()
    from dataclasses import replace
    bad = replace(r, audit=replace(r.audit, samples_passed=r.audit.samples_total - 1))
    line = audit_failure(bad, "results/x.json", ["A8 triton round 1 sample 0: 4 kernels, declared 5"])
    _one_line(line)
    assert line.startswith(f"audit failed: {r.audit.samples_total - 1}/{r.audit.samples_total} samples passed")
    assert "kept in results/x.json" in line and "first findings: A8 triton round 1 sample 0" in line


# A fresh process: blocks that earlier tests leave in this process's allocator (segments that a
# live tensor keeps, graph pools) would serve the fixture, and the run would not run out.


