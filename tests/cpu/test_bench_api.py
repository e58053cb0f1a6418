"""moebench.bench: arbitrary callables through the paired-round engine (fake backend, CPU)."""

from __future__ import annotations

import dataclasses

import pytest
from run_fakes import fake_backend
from timing_fakes import FakeGpu

import moebench
from moebench.errors import UserError
from moebench.analysis.load import load


def test_bench_is_the_package_function():
    from moebench.run.bench import bench
    assert moebench.bench is bench and callable(moebench.bench)


def test_bench_times_callables_and_returns_a_run_result(tmp_path):
    gpu = FakeGpu()
    calls = {"a": 0}

    def slow():
        calls["a"] += 1
        gpu.launch("gemm_a", 6000)

    def fast():
        gpu.launch("gemm_b", 2000)
        gpu.launch("epilogue_b", 1000)

    result = moebench.bench({"slow": slow, "fast": fast}, kernels={"slow": ["gemm_a"], "fast": None},
                            rounds=3, samples=4, warmup=2, label="mine", hbm_bytes=3_000_000,
                            backend=fake_backend(gpu), out_dir=str(tmp_path))
    assert calls["a"] == 3 * (4 + 2)
    assert result.settings.shapes == ("mine",) and result.settings.arms == ("slow", "fast")
    assert result.settings.ref == "slow" and result.audit.passed
    (ratio,) = result.ratios
    assert ratio.arm == "fast" and ratio.median == pytest.approx(2.0) and ratio.rounds_won == 3
    arms = {a.name: a for a in result.arms}
    assert [k.pattern for k in arms["fast"].kernels] == ["^epilogue_b$", "^gemm_b$"]
    assert "inferred" in arms["fast"].identity["kernels"] and "kernels" not in arms["slow"].identity
    assert result.summaries[0].hbm_bandwidth_bytes_per_s == pytest.approx(3_000_000 / 6e-6)
    assert result.fixtures == () and result.parity == ()
    (path,) = tmp_path.glob("*.json")
    # the file holds no fixture to derive a bandwidth from: read back, it is unknown, all else equal
    unknown = tuple(dataclasses.replace(s, hbm_bandwidth_bytes_per_s=None) for s in result.summaries)
    assert load(path) == dataclasses.replace(result, summaries=unknown)


def test_inferred_kernels_flag_samples_that_differ():
    gpu = FakeGpu()
    n = {"calls": 0}

    def sometimes_two():
        n["calls"] += 1
        gpu.launch("k", 1000)
        if n["calls"] % 5 == 0:
            gpu.launch("k_extra", 500)

    result = moebench.bench({"x": sometimes_two}, rounds=2, samples=5, warmup=0, backend=fake_backend(gpu))
    assert not result.audit.passed
    assert result.audit.samples_total == 10 and result.audit.samples_passed == 8
    assert all("unexpected 'k_extra'" in f.reason for f in result.audit.findings)


def test_a_callable_that_launches_nothing_fails_the_audit():
    result = moebench.bench({"idle": lambda: None}, rounds=1, samples=2, warmup=0,
                            backend=fake_backend(FakeGpu()))
    assert not result.audit.passed and "missing a kernel" in result.audit.findings[0].reason


@pytest.mark.parametrize("kwargs, needle", [
    (dict(ref="nope"), "--ref 'nope' is not one of the arms"),
    (dict(kernels={"zzz": ["k"]}), "name callables not given: zzz"),
    (dict(kernels={"a": []}), "declares no kernels"),
    (dict(kernels={"a": ["("]}), "is not a regex"),
    (dict(rounds=0), "--rounds"),
    (dict(label="a b"), "label"),
    (dict(reset={"a": [lambda: None, lambda: None]}), "reset of 'a' gives 2 callables for 1 copy"),
])
def test_bench_mistakes_raise_user_error(kwargs, needle):
    with pytest.raises(UserError, match=None) as exc:
        moebench.bench({"a": lambda: None}, backend=fake_backend(FakeGpu()), **kwargs)
    assert needle in str(exc.value)


def test_statistics_leave_out_the_samples_the_audit_rejected(tmp_path):
    gpu = FakeGpu()
    n = {"calls": 0}

    def slow_when_odd():
        n["calls"] += 1
        if n["calls"] % 2:
            gpu.launch("k", 1000)
        else:  # every other call also launches a stray kernel and takes far longer
            gpu.launch("k", 1000)
            gpu.launch("k_stray", 90_000)

    result = moebench.bench({"x": slow_when_odd}, kernels={"x": ["^k$"]}, rounds=2, samples=4, warmup=0,
                            backend=fake_backend(gpu), out_dir=str(tmp_path))
    assert result.audit.samples_passed == 4 and result.statistics_over == "audited samples"
    (s,) = result.summaries
    assert s.samples == 4 and s.median_ns == 1000  # the rejected 91 µs samples are not in the median
    (path,) = tmp_path.glob("*.json")
    assert load(path) == result  # the loader recomputes the same statistics from the same samples


def test_copies_of_a_call_are_timed_in_turn_by_round():
    from moebench.analysis.stats import placement_summaries
    gpu = FakeGpu()
    resets = []
    mine = [lambda ns=ns: gpu.launch("k", ns) for ns in (1000, 1300, 1100)]
    theirs = [lambda: gpu.launch("t", 2000)] * 3
    result = moebench.bench({"theirs": theirs, "mine": mine}, reset={"mine": [lambda k=k: resets.append(k)
                                                                               for k in range(3)]},
                            rounds=4, samples=2, warmup=0, backend=fake_backend(gpu))
    assert result.settings.placements == 3 and result.audit.passed
    assert {s.round: s.value_ns for s in result.samples if s.arm == "mine"} == {1: 1000, 2: 1300, 3: 1100, 4: 1000}
    assert resets == [0, 0, 1, 1, 2, 2, 0, 0]  # each copy's own reset, before each of its samples
    (_, p) = placement_summaries(result)
    assert p.medians_ns == (1000, 1300, 1100) and p.ratios == pytest.approx((2.0, 2000 / 1300, 2000 / 1100))


@pytest.mark.parametrize("callables, needle", [
    ({"a": [lambda: None, lambda: None], "b": lambda: None}, "same number of copies (a: 2, b: 1)"),
    ({"a": []}, "mapped to a callable or a list of callables"),
    ({"a": [lambda: None, 3]}, "mapped to a callable or a list of callables"),
    ({"a": [lambda: None] * 3}, "--placements 3 needs at least as many rounds (--rounds 2)"),
])
def test_copies_mistakes_raise_user_error(callables, needle):
    with pytest.raises(UserError) as exc:
        moebench.bench(callables, rounds=2, backend=fake_backend(FakeGpu()))
    assert needle in str(exc.value)
