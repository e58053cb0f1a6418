"""`moebench run` end to end on the CPU (fake arms, fake CUPTI), and its one-line errors."""

import json

import pytest
import torch
from timing_fakes import FakeGpu, FakeTracer

from moebench.cli import main
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall
from moebench.kernels.registry import ARMS, add_arm
from moebench.timing.read_floor import ReadProbe
from moebench.analysis.load import load
from moebench.run.runner import RunFailed, RunRequest, TimingBackend, result_filename, run
from moebench.timing.engine import Unit
from moebench.timing.timers import KernelRecordTimer

GPU = FakeGpu()


class _FakeArm(Arm):
    description = "oracle output copied by fake kernels"
    kernels = (("fake_gemm1", 3000), ("fake_gemm2", 2000))
    broken = False

    def prepare(self, fx):
        from moebench.fixtures import fixture_reference
        ref = fixture_reference(fx)
        out = torch.empty_like(ref)
        decl = tuple(KernelDecl(n, n) for n, _ in self.kernels)

        def run_():
            out.copy_(ref if not self.broken else ref * 2)
            for name, dur in self.kernels:
                GPU.launch(name, dur)
        return PreparedCall(self.name, run_, out, decl, identity={"fake": True})


def _register():
    if "fake-ref" in ARMS:
        return
    for name, kernels, broken in (("fake-ref", _FakeArm.kernels, False), ("fake-fast", (("fake_fused", 2500),), False),
                                  ("fake-broken", _FakeArm.kernels, True), ("fake-extra", _FakeArm.kernels, False)):
        cls = type(name, (_FakeArm,), {"name": name, "kernels": kernels, "broken": broken})
        add_arm(name, cls)


_register()


def backend(flush="read", drop_in_round=None):
    def probe():
        return ReadProbe((Unit("_read_floor", "1x1x1", run=lambda: GPU.launch("read_kernel", 250_000)),), 1_000_000_000,
                         "fake read")
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(lambda cap: FakeTracer(GPU, drop_in_round)),
                         flush=(lambda: GPU.launch("flush_reduce", 50_000)) if flush != "none" else (lambda: None),
                         flush_bytes=256 * 2**20 if flush != "none" else 0, sync=lambda: None,
                         probe=probe)


def test_pipeline_writes_an_audited_result(tmp_path):
    req = RunRequest(shapes=("T8", "T16"), arms=("fake-ref", "fake-fast"), rounds=3, samples=4, warmup=1,
                     out_dir=str(tmp_path), command=("moebench", "run"))
    result, path = run(req, backend())
    assert path.parent == tmp_path and path.name == result_filename(result)
    assert "T8-T16_fake-ref-vs-fake-fast" in path.name
    back = load(path)
    assert back == result
    assert result.audit.passed and result.audit.samples_total == 3 * 2 * 2 * 4
    assert result.settings.timer == "cupti" and result.settings.flush == "read"
    assert [(s.shape, s.arm) for s in result.summaries] == [("T8", "fake-ref"), ("T8", "fake-fast"),
                                                            ("T16", "fake-ref"), ("T16", "fake-fast")]
    ratio = result.ratios[0]
    assert ratio.ref == "fake-ref" and ratio.median == pytest.approx(5000 / 2500) and ratio.rounds_won == 3
    assert result.summaries[0].median_ns == 5000 and result.summaries[0].span_median_ns == 6000
    assert result.provenance.gpu is None and result.fixtures[0].fingerprint
    assert all(p.passed for p in result.parity) and result.arms[0].identity == {"fake": True}
    json.loads(path.read_text())  # plain JSON


def test_parity_failure_refuses_to_time(tmp_path):
    req = RunRequest(shapes=("T8",), arms=("fake-ref", "fake-broken"), rounds=1, samples=1, warmup=0,
                     out_dir=str(tmp_path))
    with pytest.raises(RunFailed, match="fake-broken at T8"):
        run(req, backend())
    assert not list(tmp_path.iterdir())


def test_audit_failure_is_kept_in_the_result(tmp_path):
    req = RunRequest(shapes=("T8",), arms=("fake-ref",), rounds=2, samples=2, warmup=0, out_dir=str(tmp_path),
                     measure_bandwidth=False)
    result, _ = run(req, backend(drop_in_round=2))
    assert not result.audit.passed and result.audit.dropped_records == 3


def test_filename_marks_non_default_timer_and_flush(tmp_path):
    req = RunRequest(shapes=("T8",), arms=("fake-ref",), rounds=1, samples=1, warmup=0, out_dir=str(tmp_path),
                     flush="none", measure_bandwidth=False)
    result, path = run(req, backend(flush="none"))
    assert path.name.endswith("_flush-none.json") and result.settings.flush_bytes == 0


def cli_error(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return exc.value.code, err


@pytest.mark.parametrize("argv, needle", [
    (["run", "--arms", "fake-ref", "--flush", "hot"], "--flush"),
    (["run", "--arms", "fake-ref", "--timer", "tsc"], "--timer"),
    (["run", "--arms", "nope"], "unknown arm 'nope'"),
    (["run", "--arms", "fake-ref,fake-ref"], "given twice"),
    (["run", "--arms", "fake-ref", "--ref", "fake-fast"], "--ref 'fake-fast' is not one of the arms"),
    (["run", "--arms", "fake-ref", "--rounds", "0"], "--rounds"),
    (["run", "--arms", "fake-ref", "--shape", "Z9"], "unknown shape family"),
    (["run"], "--arms"),
])
def test_cli_user_errors_are_one_line_exit_2(capsys, argv, needle):
    code, err = cli_error(capsys, *argv)
    assert code == 2 and needle in err and err.startswith("moebench: error:")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cli_without_gpu_says_so(capsys):
    code, err = cli_error(capsys, "run", "--arms", "fake-ref", "--shape", "T8")
    assert code == 2 and "no CUDA device" in err
    code, err = cli_error(capsys, "probe")
    assert code == 2 and "no CUDA device" in err


def test_ncu_csv_parsing():
    from moebench.tasks.probe import parse_ncu_csv
    text = '\n'.join([
        "==PROF== Connected to process 1",
        '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",'
        '"gpu__time_duration.sum","usecond","52.10"',
        '"1","1","void at::native::reduce_kernel<512>","gpu__time_duration.sum","nsecond","70,000"',
        '"2","1","void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",'
        '"gpu__time_duration.sum","nsecond","52,300"',
    ])
    assert parse_ncu_csv(text, kernel_regex="CUDAFunctor_add") == [52100.0, 52300.0]
    assert len(parse_ncu_csv(text)) == 3
    from moebench.errors import UserError
    with pytest.raises(UserError):
        parse_ncu_csv("no csv here")


def test_flush_sizes():
    from moebench.errors import UserError
    from moebench.timing.flush import L2Flush, flush_bytes_for
    assert flush_bytes_for(60 * 2**20, "read") == 256 * 2**20
    assert flush_bytes_for(200 * 2**20, "write") == 400 * 2**20
    assert flush_bytes_for(60 * 2**20, "none") == 0
    with pytest.raises(UserError):
        flush_bytes_for(1, "hot")
    f = L2Flush("read", 1, "cpu")  # runs on the CPU too: one op into a preallocated scalar
    f()
    assert f.nbytes == 256 * 2**20
    f.release()


def test_an_unwritable_out_folder_is_refused_before_any_work(tmp_path):
    from moebench.errors import UserError
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    req = RunRequest(shapes=("T8",), arms=("fake-ref",), rounds=1, samples=1, warmup=0,
                     out_dir=str(blocker / "results"), measure_bandwidth=False)
    launched = len(GPU.launch_log)
    with pytest.raises(UserError, match="cannot write results into"):
        run(req, backend())
    assert len(GPU.launch_log) == launched  # nothing ran


def test_two_runs_started_in_the_same_second_keep_both_results(tmp_path, monkeypatch):
    import moebench.run.runner as runner
    monkeypatch.setattr(runner, "utc_now", lambda: "2026-12-01T12:00:00Z")
    req = RunRequest(shapes=("T8",), arms=("fake-ref",), rounds=1, samples=1, warmup=0, out_dir=str(tmp_path),
                     measure_bandwidth=False)
    (_, first), (_, second) = run(req, backend()), run(req, backend())
    assert first != second and first.exists() and second.exists()
    assert second.name == first.name.replace(".json", "_2.json")
    assert load(first).provenance.started_at == load(second).provenance.started_at


def test_shapes_are_sized_before_anything_is_allocated(capsys):
    code, err = cli_error(capsys, "fixtures", "--shape", "A1048576")
    assert "needs about 121.8 GB of host memory" in err and "A65536 fits" in err and "--max-fixture-gb" in err
    code, err = cli_error(capsys, "run", "--arms", "fake-ref", "--shape", "A1048576")
    assert "host memory" in err
    code, err = cli_error(capsys, "fixtures", "--shape", "T8", "--max-fixture-gb", "0")
    assert "--max-fixture-gb must be a positive number" in err
    code, err = cli_error(capsys, "fixtures", "--shape", "T\uff18")  # a full-width digit
    assert "bad shape name" in err


def test_report_write_mistakes_are_one_line(tmp_path, capsys):
    from result_factory import make_result

    from moebench.record.store import save
    path = save(make_result(), tmp_path / "r.json")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for argv, needle in ((["--plot", str(blocker / "img")], "cannot write plots into"),
                         (["-o", str(blocker / "r.md")], "cannot write"),
                         (["--plot", str(tmp_path / "img"), "--prefix", "../x"], "--prefix")):
        code, err = cli_error(capsys, "report", str(path), *argv)
        assert code == 2 and needle in err and err.count("\n") == 0, err
    out = tmp_path / "deep" / "r.md"  # no folder tree is made for a report
    code, err = cli_error(capsys, "report", str(path), "--format", "markdown", "-o", str(out))
    assert code == 2 and "is not an existing folder" in err and not out.parent.exists()
    out.parent.mkdir()
    assert main_ok(["report", str(path), "--format", "markdown", "-o", str(out)])
    assert out.read_text().startswith("### moebench") and not list(out.parent.glob(".*.tmp"))


def main_ok(argv) -> bool:
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code in (0, None)
    return True


class _UnbuildableArm(_FakeArm):
    """An arm whose kernel source NVRTC rejects, as a broken `--build` does."""

    def prepare(self, fx):
        from moebench.kernels.cuda.nvrtc import CudaBuildError
        raise CudaBuildError("NVRTC failed to compile bad.cu for sm_90a: NVRTC_ERROR_COMPILATION\n"
                             "bad.cu(1): error: expected a declaration\n  this is not CUDA;\n  ^\n")


if "fake-unbuildable" not in ARMS:
    add_arm("fake-unbuildable", type("fake-unbuildable", (_UnbuildableArm,), {"name": "fake-unbuildable"}))


def test_a_source_nvrtc_rejects_stops_the_run_in_one_line_with_its_log_saved(tmp_path, monkeypatch):
    from moebench.errors import UserError
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    req = RunRequest(shapes=("T8",), arms=("fake-ref", "fake-unbuildable"), rounds=1, samples=2, warmup=0,
                     out_dir=str(tmp_path / "out"))
    with pytest.raises(UserError) as err:
        run(req, backend())
    text = str(err.value)
    assert "\n" not in text and text.startswith("fake-unbuildable at T8: NVRTC failed to compile bad.cu")
    assert "error: expected a declaration" in text and "full log: " in text
    log = text.split("full log: ")[1]
    assert "this is not CUDA" in open(log).read()
