"""A user's mistakes and damaged files end in one clear line, never a traceback or a silently
wrong answer: shapes files, damaged results given to `compare` and `report --ref`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from result_factory import make_result, run_cli

from moebench.errors import UserError
from moebench.fixtures import ShapeRegistry
from moebench.record.store import save
from moebench.analysis.stats import with_ref


def _shapes(tmp_path, body: str):
    path = tmp_path / "shapes.toml"
    path.write_text(body)
    return path


def test_a_built_in_family_is_redefined_only_when_asked(tmp_path):
    body = "[families.A]\nK = 256\nE = 8\ntop_k = 2\nN = 256\n"
    with pytest.raises(UserError, match="redefines the built-in family 'A'.*override = true"):
        ShapeRegistry().with_shapes_file(_shapes(tmp_path, body))
    reg = ShapeRegistry().with_shapes_file(_shapes(tmp_path, body + "override = true\n"))
    assert reg.resolve("A8").K == 256


@pytest.mark.parametrize("value", ["inf", "nan", "-1.0", "0.0"])
def test_routed_scale_must_be_positive_and_finite(tmp_path, value):
    body = f"[families.X]\nK = 256\nE = 8\ntop_k = 2\nN = 256\nrouted_scale = {value}\n"
    with pytest.raises(UserError, match="routed_scale must be a positive finite number"):
        ShapeRegistry().with_shapes_file(_shapes(tmp_path, body))


def test_a_shapes_file_family_too_large_to_build_is_refused_at_resolve(tmp_path):
    body = "[families.X]\nK = 1099511627776\nE = 8\ntop_k = 2\nN = 256\n"
    reg = ShapeRegistry().with_shapes_file(_shapes(tmp_path, body))
    with pytest.raises(UserError, match="GB of host memory"):
        reg.resolve("X1")


def test_compare_refuses_a_zero_median_in_one_line(tmp_path):
    a = make_result(seed=1)
    damaged = replace(a, summaries=(replace(a.summaries[0], median_ns=0.0), *a.summaries[1:]))
    pa, pb = save(a, tmp_path / "a.json"), save(damaged, tmp_path / "b.json")
    code, out, err = run_cli(["compare", str(pa), str(pb)])
    assert code == 2 and "disagrees with its own samples" in err and err.strip().count("\n") == 0
    # Read as stored, the damaged median is never used: compare judges the samples.
    code, out, err = run_cli(["compare", str(pa), str(pb), "--trust-stored"])
    assert code == 0 and "warning" in err and "same" in out
    # A sample that is no time is refused in one line.
    s0 = a.samples[0]
    zero = replace(a, samples=(replace(s0, kernels=tuple(replace(k, end_ns=k.start_ns) for k in s0.kernels)),
                               *a.samples[1:]))
    pz = save(zero, tmp_path / "z.json")
    code, out, err = run_cli(["compare", str(pa), str(pz), "--trust-stored"])
    assert code == 2 and "is not a time" in err and err.strip().count("\n") == 1  # the warning, the error


def _mutations():
    r = make_result(arms=("triton", "cuda-fused"), rounds=3, samples=4)
    s0 = r.samples[0]
    k0 = s0.kernels[0]
    yield "no samples", replace(r, samples=()), "samples_total"
    yield "unknown arm", replace(r, samples=(replace(s0, arm="nosuch"), *r.samples[1:])), "not in the settings"
    yield "round 99", replace(r, samples=(replace(s0, round=99), *r.samples[1:])), "round or index outside"
    yield "negative duration", replace(r, samples=(replace(s0, kernels=(replace(k0, end_ns=k0.start_ns - 5),
                                                                          *s0.kernels[1:])), *r.samples[1:])), \
        "declared kernels"
    yield "rounds 0", replace(r, settings=replace(r.settings, rounds=0)), "rounds 0"
    yield "ref nosuch", replace(r, settings=replace(r.settings, ref="nosuch")), "settings.ref"
    f0 = r.fixtures[0]
    yield "zero floor", replace(r, fixtures=(replace(f0, floors=replace(f0.floors, hbm_bytes=0)), *r.fixtures[1:])), \
        "must be positive"
    yield "edited median", replace(r, summaries=(replace(r.summaries[0], median_ns=r.summaries[0].median_ns * 0.9),
                                                 *r.summaries[1:])), "median_ns"
    yield "edited ratio", replace(r, ratios=(replace(r.ratios[0], median=2.0), *r.ratios[1:])), "ratios["


@pytest.mark.parametrize("label, mutated, needle", list(_mutations()), ids=[m[0] for m in _mutations()])
def test_a_result_that_disagrees_with_its_samples_is_refused_naming_the_field(tmp_path, label, mutated, needle):
    path = save(mutated, tmp_path / "r.json")
    code, out, err = run_cli(["report", str(path)])
    assert code == 2 and "disagrees with its own samples" in err and needle in err, err
    assert err.strip().count("\n") == 0
    code, out, err = run_cli(["report", str(path), "--trust-stored", "--format", "summary"])
    assert "warning" in err and needle in err


def test_ratios_against_another_arm_need_no_fixture_records():
    result = make_result(arms=("triton", "cuda-fused", "cuda-swapab"))
    bare = replace(result, fixtures=())
    again = with_ref(bare, "cuda-fused")
    assert {r.arm for r in again.ratios} == {"triton", "cuda-swapab"}
    assert all(r.ref == "cuda-fused" for r in again.ratios)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--shape", "T8", "--arms", "triton", "--samples", "100000000"], "--samples and --warmup at most"),
    (["run", "--shape", "T8", "--arms", "triton", "--rounds", "5000"], "--rounds must be at most"),
    (["probe", "--mib", "0"], "--mib must be 1 to 65536"),
    (["probe", "--samples", "0"], "--samples must be 1 to"),
    (["probe", "--op", "reduce", "--sms", "0"], "--sms must be at least 1"),
    (["probe", "--op", "add", "--sms", "4"], "--sms applies only to --op reduce"),
])
def test_counts_out_of_range_are_one_line_before_any_gpu_work(argv, needle):
    code, _, err = run_cli(argv)
    assert code == 2 and needle in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("argv, needle", [
    (["run", "--shape", "A8", "--rounds", "0"], "--rounds and --samples must be at least 1"),
    (["run", "--shape", "Z8"], "unknown shape family 'Z'"),
    (["sweep", "--family", "Z", "--m", "1"], "unknown shape family 'Z'"),
    (["run", "--shape", "A8", "--determinism", "--determinism-runs", "1"], "--determinism-runs must be at least 2"),
    (["run", "--shape", "A8"], "no CUDA device visible: with no --arms"),
])
def test_without_arms_or_a_gpu_the_request_s_own_mistake_is_named_first(argv, needle, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli(argv)
    assert code == 2 and needle in err and err.strip().count("\n") == 0, err


def test_build_sources_that_are_not_cuda_files_are_named_as_such(tmp_path):
    folder, toml, binary = tmp_path / "dir", tmp_path / "x.toml", tmp_path / "bin.cu"
    folder.mkdir()
    toml.write_text("[x]\na = 1\n")
    binary.write_bytes(bytes(range(128, 256)))
    for path, needle in ((folder, "a folder"), (toml, "expected a .cu or .cuh file"),
                         (binary, "not a readable text file"), (tmp_path / "none.cu", "no such file")):
        code, _, err = run_cli(["build", "--source", str(path)])
        assert code == 2 and needle in err and err.strip().count("\n") == 0, err


def test_a_broken_build_shows_its_first_error_and_saves_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(int* p) { p[0] = undefined_name; }\n')
    code, _, err = run_cli(["build", "--source", str(bad)])
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "bad.cu" in err and "undefined_name" in err and "full log: " in err
    log = err.strip().split("full log: ")[1]
    assert "undefined_name" in open(log).read()


def test_a_git_build_outside_a_repository_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--shape", "T8", "--build", "a=git:HEAD"])
    assert code == 2 and "is not in a git repository" in err


def test_report_into_a_pipe_writes_through_it_and_leaves_it_a_pipe(tmp_path):
    """`report -o /dev/null` or a FIFO: the atomic rename would put a regular file in its place."""
    import os
    import stat
    import threading
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    path = save(make_result(rounds=2, samples=2), tmp_path / "r.json")
    code, out, err = run_cli(["report", str(path), "--format", "csv", "-o", str(pipe)])
    reader.join(timeout=30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and got and got[0].startswith(b"kind,shape,arm")
