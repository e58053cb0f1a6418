"""moebench.determinism.checks on the CPU: the three checks on the stock Triton arms under the
interpreter (T shapes), each check catching the planted arm built to fail it and passing the
others (tests/helpers/determinism_planted.py), token sub-fixtures, bitwise differences, the verdicts in
a RunResult (saved, loaded, checked, reported), and `moebench verify --determinism`'s errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from moebench.determinism.checks import ENGINE_NOTES, batch_sizes, check_arms, difference, output_hash
from moebench.determinism.result import determinism_result
from moebench.fixtures import build_fixture, derive
from moebench.fixtures.tokens import append_tokens, take_tokens
from moebench.record.determinism import RunToRun
from moebench.analysis.load import load, loads
from moebench.record.store import dumps, save
from moebench.analysis.validate import problems
from result_factory import make_result, run_cli

pytestmark = pytest.mark.usefixtures("interpreted_triton")

PLANTED = {name: f"{name}=determinism_planted:{cls}" for name, cls in (
    ("planted-clean", "PlantedClean"), ("planted-run-noise", "PlantedRunNoise"),
    ("planted-batch-rows", "PlantedBatchRows"), ("planted-process", "PlantedProcess"))}


@pytest.fixture(scope="module")
def t4(registry):
    return build_fixture(registry.resolve("T4"))


@pytest.fixture(scope="module")
def planted_verdicts(t4):
    return {v.arm: v for v in check_arms(t4, list(PLANTED), external=tuple(PLANTED.values()), runs=4)}


# ------------------------------------------------------------------------------ the checks


def test_each_planted_arm_fails_its_own_check_only(planted_verdicts):
    v = planted_verdicts
    clean = v["planted-clean"]
    assert clean.run_to_run.bitwise and clean.batch_invariant and clean.cross_process.equal and clean.passed

    noise = v["planted-run-noise"]
    assert noise.run_to_run.differing_runs == 3 and noise.run_to_run.elements > 0
    assert 0 < noise.run_to_run.max_abs < 1e-2  # a last-bit flip
    assert noise.batch_invariant and noise.cross_process.equal
    assert not noise.deterministic and not noise.passed

    rows = v["planted-batch-rows"]
    assert rows.run_to_run.bitwise and rows.cross_process.equal and rows.deterministic
    assert not rows.batch_invariant and all(b.elements > 0 for b in rows.batch)

    proc = v["planted-process"]
    assert proc.run_to_run.bitwise and proc.batch_invariant
    assert proc.cross_process.equal is False and proc.cross_process.hash_there
    assert not proc.deterministic and not proc.passed


def test_batch_checks_cover_one_eight_and_m_inside_larger_batches(planted_verdicts, t4):
    got = [(b.m, b.batch) for b in planted_verdicts["planted-clean"].batch]
    assert got == [(1, 4), (1, 8), (4, 8)]  # T4: m = 1 and M, alone against the fixture and the grown batch
    assert batch_sizes(128) == [1, 8, 128] and batch_sizes(1) == [1]


@pytest.mark.parametrize("arm", ["triton", "triton-swapab", "triton-default"])
def test_stock_triton_arms_under_the_interpreter(t4, arm):
    (v,) = check_arms(t4, [arm], runs=2)
    assert v.arm == arm and v.note == ENGINE_NOTES[arm]
    assert v.run_to_run.runs == 2 and v.run_to_run.bitwise
    assert [b.m for b in v.batch] == [1, 1, 4] and v.batch_invariant
    assert v.cross_process.error is None and v.cross_process.equal is True
    assert v.passed
    assert v.identity  # the prepared config is recorded with the verdict


def test_a_fixture_not_built_from_its_spec_is_not_rebuilt_in_the_fresh_process(t4):
    (v,) = check_arms(derive(t4, 99), ["planted-clean"], external=(PLANTED["planted-clean"],), runs=2)
    assert v.cross_process.equal is None and "derived fixture" in v.cross_process.error
    assert v.deterministic and not v.passed


@pytest.mark.parametrize("short_times, equal", [(2, True), (3, None)])
def test_a_fresh_process_short_of_memory_is_tried_again_then_named(t4, tmp_path, monkeypatch, short_times, equal):
    # eight test workers on one card left the fresh process no memory: tried again after pauses,
    # and if it never gets any the check says so, rather than reading as a determinism failure
    import os
    import moebench.determinism.checks as det
    monkeypatch.setattr(det, "MEMORY_RETRY_PAUSES_S", (0.0, 0.0))
    counter = tmp_path / "oom"
    counter.write_text(str(short_times))
    monkeypatch.setenv("MOEBENCH_PLANTED_OOM", str(counter))
    monkeypatch.setenv("MOEBENCH_PLANTED_PARENT", str(os.getpid()))
    spec = "planted-short-of-memory=determinism_planted:PlantedShortOfMemory"
    (v,) = check_arms(t4, ["planted-short-of-memory"], external=(spec,), runs=2)
    assert v.cross_process.equal is equal and v.run_to_run.bitwise
    if equal is None:
        assert "out of device memory in the fresh process" in v.cross_process.error
        assert "(3 tries)" in v.cross_process.error and not v.passed
    assert counter.read_text() == str(max(short_times - 3, 0))


# ------------------------------------------------------------------------------ building blocks


def test_difference_is_bitwise():
    a = torch.tensor([1.0, 0.0, float("nan"), 2.0], dtype=torch.bfloat16)
    assert difference(a, a.clone()).bitwise  # NaN bits equal themselves
    b = a.clone()
    b[1] = -0.0
    d = difference(a, b)
    assert d.elements == 1 and d.max_abs == 0.0  # -0 is other bits with no size
    c = a.clone()
    c[3] = 2.0 + 2.0 ** -6
    assert difference(a, c).elements == 1 and difference(a, c).max_abs == pytest.approx(2.0 ** -6)
    inf = a.clone()
    inf[0] = float("inf")
    assert difference(a, inf).max_abs == -1.0  # no finite pair
    assert output_hash(a) == output_hash(a.clone()) != output_hash(c)


def test_token_subsets_keep_each_tokens_bits(t4):
    one = take_tokens(t4, 1)
    assert one.M == 1 and one.spec.M == 1 and one.w1 is t4.w1
    for name in ("x_fp8", "x_scale", "topk_ids", "topk_weights"):
        assert torch.equal(getattr(one, name).view(torch.uint8) if name == "x_fp8" else getattr(one, name),
                           getattr(t4, name)[:1].view(torch.uint8) if name == "x_fp8" else getattr(t4, name)[:1])
    grown = append_tokens(t4, derive(t4, 5, M=3))
    assert grown.M == 7 and torch.equal(grown.topk_ids[:4], t4.topk_ids)
    assert len({t4.fingerprint, one.fingerprint, grown.fingerprint}) == 3
    assert take_tokens(t4, 4) is t4
    with pytest.raises(ValueError):
        take_tokens(t4, 0)
    with pytest.raises(ValueError, match="share their weights"):
        append_tokens(t4, build_fixture(replace(t4.spec, seed=1)))


# ------------------------------------------------------------------------------ results


def test_verdicts_round_trip_through_a_result_file(tmp_path, planted_verdicts, t4):
    verdicts = list(planted_verdicts.values())
    result = determinism_result(verdicts, [t4], command=["moebench", "verify", "--determinism"],
                                started_at="2026-01-01T00:00:00Z", device=torch.device("cpu"))
    path = save(result, tmp_path / "det.json")
    back = load(path)
    assert back.determinism == result.determinism and not back.samples
    assert [v.passed for v in back.determinism] == [v.passed for v in verdicts]
    broken = json.loads(dumps(result))
    broken["determinism"][0]["run_to_run"]["differing_runs"] = 9
    assert any("determinism[T4 planted-clean].run_to_run" in p for p in problems(loads(json.dumps(broken))))


def test_results_without_verdicts_still_load():
    result = make_result()
    plain = json.loads(dumps(result))
    assert "determinism" in plain
    del plain["determinism"]
    assert loads(json.dumps(plain)).determinism == ()


def test_report_draws_the_verdicts(tmp_path, planted_verdicts, t4):
    result = determinism_result(list(planted_verdicts.values()), [t4], command=["moebench"],
                                started_at="2026-01-01T00:00:00Z", device=torch.device("cpu"))
    path = save(result, tmp_path / "det.json")
    code, out, err = run_cli(["report", str(path)])
    assert code == 0, err
    assert "planted-run-noise" in out and "3 of 3 later runs differ" in out and "different hash" in out
    code, md, err = run_cli(["report", str(path), "--format", "markdown"])
    assert code == 0, err
    assert "### moebench determinism: T4" in md and "| T4 (M=4) | planted-batch-rows |" in md
    assert "NOT batch-invariant" in md
    timed = make_result(shapes=("A8",))  # the verdicts as a timed run of its arms carries them
    timed = replace(timed, determinism=tuple(replace(v, shape="A8", arm=arm) for v, arm in
                                             zip(result.determinism, timed.settings.arms)))
    code, out, err = run_cli(["report", str(save(timed, tmp_path / "timed.json"))])
    assert code == 0, err
    assert "determinism and batch invariance" in out and "┃ det" in out


def test_run_to_run_record_reads_its_verdict():
    assert RunToRun(20, 0, 0, 0.0).bitwise and not RunToRun(20, 1, 5, 0.01).bitwise


# ------------------------------------------------------------------------------ command line


def test_verify_determinism_cli_writes_a_result_and_fails_on_a_planted_arm(tmp_path):
    out = tmp_path / "det.json"
    code, stdout, err = run_cli(["verify", "--determinism", "--interpret", "--shape", "T2", "--runs", "3",
                                 "--arm", PLANTED["planted-clean"], "--arm", PLANTED["planted-batch-rows"],
                                 "--out", str(out)])
    assert code == 1, err
    assert "planted-batch-rows at T2" in err and "planted-clean at" not in err
    assert "determinism and batch invariance (CPU interpreter)" in stdout
    saved = load(out)
    assert {v.arm: v.batch_invariant for v in saved.determinism} == {"planted-clean": True,
                                                                     "planted-batch-rows": False}
    assert saved.settings.timer == "none" and saved.settings.options["runs"] == 3


@pytest.mark.parametrize("argv,message", [
    (["--runs", "5"], "--runs applies only with --determinism"),
    (["--determinism", "--edge-cases"], "--edge-cases checks parity"),
    (["--determinism", "--runs", "1"], "--runs must be at least 2"),
    (["--determinism", "--arm", "nonsense"], "expected NAME=module:factory"),
])
def test_verify_determinism_user_errors_are_one_line(argv, message):
    code, _, err = run_cli(["verify", "--interpret", "--shape", "T2", "--arms", "triton", *argv])
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
