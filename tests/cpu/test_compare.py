"""`moebench compare`: verdicts on pairs of stored results, refusals, exit codes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from moebench.errors import UserError
from moebench.analysis.compare import Rules, Verdict, compare_results
from moebench.analysis.verdicts import parse_rules
from moebench.analysis.load import load
from moebench.record.store import save
from result_factory import make_result, run_cli, with_schema_version

ROOT = Path(__file__).resolve().parents[2]
# Timed runs; a `verify --determinism` file holds verdicts and no samples (its own test below).
H200_RESULTS = sorted(p for p in (ROOT / "results" / "h200").glob("*.json") if not p.name.startswith("determinism-"))
H200_VERDICT_FILES = sorted((ROOT / "results" / "h200").glob("determinism-*.json"))


def verdicts(comparison) -> dict[tuple[str, str], Verdict]:
    return {(c.shape, c.arm): c.verdict for c in comparison.arms}


@pytest.fixture(scope="module")
def base():
    return make_result(seed=0)


@pytest.fixture
def saved(tmp_path):
    def save_as(name, result):
        return str(save(result, tmp_path / name))
    return save_as


# --- pairs of results ------------------------------------------------------------------

def test_same_against_same_is_same(base):
    again = make_result(seed=7)  # another run of the same fixtures: new noise, same times
    c = compare_results(base, again)
    assert set(verdicts(c).values()) == {Verdict.SAME}
    assert not c.regressions
    assert c.ratios and all(r.verdict is Verdict.SAME for r in c.ratios)


def test_a_result_against_itself_is_same_with_zero_change(base):
    c = compare_results(base, base)
    assert all(a.change == 0 and a.verdict is Verdict.SAME for a in c.arms)


def test_constructed_regression_is_slower(base):
    slow = make_result(seed=3, scale={"cuda-fused": 1.10})
    c = compare_results(base, slow)
    v = verdicts(c)
    assert v[("A8", "cuda-fused")] is Verdict.SLOWER and v[("A128", "cuda-fused")] is Verdict.SLOWER
    assert v[("A8", "triton")] is Verdict.SAME
    assert {(r.shape, r.arm) for r in c.regressions} == {("A8", "cuda-fused"), ("A128", "cuda-fused")}
    reg = c.regressions[0]
    assert reg.change == pytest.approx(0.10, abs=0.01)
    assert "+" in reg.reason and "beyond ±2.0%" in reg.reason
    ratio = next(r for r in c.ratios if r.shape == "A8")
    assert ratio.verdict is Verdict.SLOWER and ratio.change < -0.05


def test_faster(base):
    fast = make_result(seed=4, scale={("A8", "triton"): 0.9})
    v = verdicts(compare_results(base, fast))
    assert v[("A8", "triton")] is Verdict.FASTER
    assert v[("A128", "triton")] is Verdict.SAME


def test_noisy_rounds_cannot_call_a_small_change(base):
    noisy = make_result(seed=5, drift=0.05, scale={"cuda-fused": 1.03})
    c = compare_results(base, noisy)
    arm = next(a for a in c.arms if (a.shape, a.arm) == ("A8", "cuda-fused"))
    assert arm.verdict is Verdict.NOISY
    assert "spread" in arm.reason
    # Paired within each run, the drift cancels: the ratios still see the 3% change.
    ratio = next(r for r in c.ratios if r.shape == "A8")
    assert ratio.verdict is Verdict.SLOWER


def test_a_wider_threshold_turns_slower_into_same(base):
    slow = make_result(seed=3, scale={"cuda-fused": 1.10})
    assert not compare_results(base, slow, Rules(change=0.15)).regressions


def test_notes_say_the_runs_are_not_paired_and_what_differs(base):
    other = make_result(seed=1, shapes=("A8", "Q8"), samples=6, flush="write")
    c = compare_results(base, other, a_label="a.json", b_label="b.json")
    text = "\n".join(c.notes)
    assert "not paired" in text
    assert "flush read vs write" in text and "samples 8 vs 6" in text
    assert "only in a.json: A128/triton, A128/cuda-fused" in text
    assert "only in b.json: Q8/triton, Q8/cuda-fused" in text
    assert {a.shape for a in c.arms} == {"A8"}


def test_changed_build_identity_is_named(base):
    arms = tuple(replace(a, identity={**a.identity, "source_sha256": "0" * 64}) if a.name == "cuda-fused" else a
                 for a in base.arms)
    c = compare_results(base, replace(base, arms=arms))
    changed = {(a.shape, a.arm): a.identity_changed for a in c.arms}
    assert changed[("A8", "cuda-fused")] == ("source_sha256",)
    assert changed[("A8", "triton")] == ()


# --- refusals --------------------------------------------------------------------------

def test_refuses_an_unknown_schema_version_and_reads_across_known_ones(base):
    with pytest.raises(UserError, match="B has schema_version 99, this moebench reads 1, 2"):
        compare_results(base, with_schema_version(base, 99))
    old = compare_results(with_schema_version(base, 1), base)  # version 1 differs only in defaulted fields
    assert any("A is a schema 1 file" in n for n in old.notes)


def test_refuses_different_fixture_fingerprints(base):
    with pytest.raises(UserError, match="timed different inputs at A8: fixture fingerprints"):
        compare_results(base, make_result(fingerprint_salt="other-build-of-the-fixtures"))


def test_refuses_nothing_in_common(base):
    with pytest.raises(UserError, match="no shape and arm in common"):
        compare_results(base, make_result(shapes=("Q8",)))


# --- the command -----------------------------------------------------------------------

def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("moebench: error: ")
    return lines[0]


def test_cli_same_exits_0(base, saved):
    a, b = saved("a.json", base), saved("b.json", make_result(seed=9))
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression"])
    assert code == 0, err
    assert "same" in out and "slower" not in out


def test_cli_regression_exits_1_only_when_asked(base, saved):
    a, b = saved("a.json", base), saved("slow.json", make_result(seed=3, scale={"cuda-fused": 1.10}))
    code, out, err = run_cli(["compare", a, b])
    assert code == 0 and "slower" in out
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression"])
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("moebench: regression: A8/cuda-fused +") and ", A128/cuda-fused +" in err
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression", "--threshold", "15%"])
    assert code == 0, err


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_cli_formats(base, saved, fmt):
    a, b = saved("a.json", base), saved("slow.json", make_result(seed=3, scale={"cuda-fused": 1.10}))
    code, out, err = run_cli(["compare", a, b, "--format", fmt])
    assert code == 0, err
    if fmt == "json":
        data = json.loads(out)
        assert data["regressions"] == ["A8/cuda-fused", "A128/cuda-fused"]
        assert {a["verdict"] for a in data["arms"]} == {"same", "slower"}
    if fmt == "markdown":
        assert "| A8 | `cuda-fused` |" in out and "| slower |" in out and "**slower**" not in out
        assert "not paired" in out


@pytest.mark.parametrize("threshold, ok", [("2%", True), ("0.5%", True), ("0.02", True),
                                           ("5", False), ("abc", False), ("-1%", False), ("150%", False)])
def test_cli_threshold_parsing(base, saved, threshold, ok):
    a = saved("a.json", base)
    code, out, err = run_cli(["compare", a, a, "--threshold", threshold])
    if ok:
        assert code == 0, err
    else:
        assert code == 2
        assert "--threshold" in one_error_line(err)


def test_cli_refuses_fingerprint_mismatch_in_one_line(base, saved):
    a, b = saved("a.json", base), saved("b.json", make_result(fingerprint_salt="x"))
    code, out, err = run_cli(["compare", a, b])
    assert code == 2
    assert "fixture fingerprints" in one_error_line(err)
    assert out == ""


def test_cli_refuses_other_schema_version_in_one_line(base, saved, tmp_path):
    a = saved("a.json", base)
    data = json.loads(Path(a).read_text())
    data["schema_version"] = 99
    b = tmp_path / "future.json"
    b.write_text(json.dumps(data))
    code, out, err = run_cli(["compare", a, str(b)])
    assert code == 2
    assert "schema_version 99" in one_error_line(err)


@pytest.mark.parametrize("content, message", [
    ('{"schema_version": 1, "format": "moebench.RunResult", "provenance": ', "not JSON"),
    ("", "not JSON"),
    ('{"name": "some other tool", "results": [1, 2, 3]}', "not a moebench RunResult"),
    ("[1, 2, 3]", "not a moebench RunResult"),
    ('{"format": "moebench.RunResult", "schema_version": 1, "settings": {}}', "malformed RunResult"),
])
def test_cli_rejects_malformed_and_foreign_json(base, saved, tmp_path, content, message):
    a = saved("a.json", base)
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for argv in (["compare", a, str(bad)], ["compare", str(bad), a], ["report", str(bad)]):
        code, out, err = run_cli(argv)
        assert code == 2, argv
        assert message in one_error_line(err)


def test_cli_missing_file(saved, base, tmp_path):
    a = saved("a.json", base)
    code, out, err = run_cli(["compare", a, str(tmp_path / "nope.json")])
    assert code == 2
    assert "no such file" in one_error_line(err)


# --- committed H200 results ------------------------------------------------------------

def slowed_run(result, arm: str, factor: float):
    """`result` as if `arm`'s kernels had all taken `factor` times as long: its samples slowed,
    and the summaries and ratios recomputed from them (a file must agree with its samples).
    Each kernel starts as much later as the ones before it grew, the gaps kept, so a sample's
    busy time (the union of its kernels) grows by `factor` too instead of overlapping."""
    from moebench.record.schema import KernelRecord
    from moebench.analysis.stats import summarize

    def slow(sample):
        if sample.arm != arm:
            return sample
        if sample.events_ns is not None:
            return replace(sample, events_ns=round(sample.events_ns * factor))
        kernels, shift = [], 0
        for k in sample.kernels:
            longer = round((k.end_ns - k.start_ns) * factor)
            kernels.append(KernelRecord(k.name, k.start_ns + shift, k.start_ns + shift + longer))
            shift += longer - (k.end_ns - k.start_ns)
        return replace(sample, kernels=tuple(kernels))
    samples = tuple(slow(x) for x in result.samples)
    st = result.settings
    gpu = result.provenance.gpu
    summaries, ratios = summarize(samples, st.shapes, st.arms, st.ref, {f.name: f.floors.hbm_bytes for f in result.fixtures},
                                  gpu.read_bandwidth_bytes_per_s if gpu else None)
    return replace(result, samples=samples, summaries=summaries, ratios=ratios)


@pytest.mark.parametrize("path", H200_RESULTS or [pytest.param(
    None, marks=pytest.mark.skip(reason="no committed H200 results under results/h200/ yet"))],
    ids=lambda p: getattr(p, "name", "none"))
def test_committed_result_against_itself_and_a_constructed_regression(path, tmp_path):
    result = load(path)
    # Against itself nothing is faster or slower; an arm whose rounds spread (a real run can)
    # has an interval too wide for the band, or reaching its edge: noisy or ambiguous.
    self_verdicts = set(verdicts(compare_results(result, result)).values())
    assert self_verdicts <= {Verdict.SAME, Verdict.NOISY, Verdict.AMBIGUOUS} and Verdict.SAME in self_verdicts
    slow_arm = result.settings.arms[-1]
    slow_path = save(slowed_run(result, slow_arm, 1.10), tmp_path / "slowed.json")
    code, out, err = run_cli(["compare", str(path), str(slow_path), "--fail-on-regression"])
    assert code == 1
    assert f"/{slow_arm} +10.0%" in err


# --- audited samples only, and the gate ----------------------------------------------------

def with_rejected(result, arm: str, factor: float, rounds=(2,)):
    """`result` with `arm`'s samples in `rounds` taken `factor` times as long and rejected by
    the audit, as a run whose stray kernels landed in those samples would save them."""
    from moebench.record.schema import Audit, AuditFinding
    slowed = slowed_run(result, arm, factor)
    samples = tuple(s if s.arm != arm or s.round not in rounds else t
                    for s, t in zip(result.samples, slowed.samples))
    findings = tuple(AuditFinding(s.shape, s.arm, s.round, s.index, "foreign kernel inside the sample's window")
                     for s in samples if s.arm == arm and s.round in rounds)
    audit = Audit(samples_total=len(samples), samples_passed=len(samples) - len(findings), dropped_records=0,
                  findings=findings)
    return replace(result, samples=samples, audit=audit)


def test_samples_the_audit_rejected_do_not_enter(base):
    bad = with_rejected(make_result(seed=9), "cuda-fused", 3.0)
    c = compare_results(base, bad, a_label="a", b_label="b")
    fused = [a for a in c.arms if a.arm == "cuda-fused"]
    assert all(a.verdict is Verdict.SAME for a in fused)  # the 3x samples were rejected
    assert all(a.b_samples == 4 * 8 for a in fused) and all(a.a_samples == 5 * 8 for a in fused)
    assert any("b: audit failed" in n and "left out of every statistic" in n for n in c.notes)
    # Counted, the rejected round would have moved the arm's interval.
    trusted = compare_results(base, replace(bad, audit=replace(bad.audit, findings=(),
                                                               samples_passed=bad.audit.samples_total)))
    assert {a.verdict for a in trusted.arms if a.arm == "cuda-fused"} != {Verdict.SAME}


def test_a_run_with_audit_failures_closes_the_gate(base, saved):
    from moebench.analysis.compare import gate
    bad = with_rejected(make_result(seed=9), "cuda-fused", 1.0)  # samples unchanged, findings recorded
    c = compare_results(base, bad, a_label="a.json", b_label="b.json")
    assert not c.regressions
    assert gate(c).startswith("regression gate closed: b.json failed its audit (")
    assert gate(compare_results(base, make_result(seed=9))) is None
    a, b = saved("a.json", base), saved("b.json", bad)
    for argv in (["compare", a, b, "--fail-on-regression"], ["compare", b, a, "--fail-on-regression"]):
        code, out, err = run_cli(argv)
        assert code == 1
        assert len(err.strip().splitlines()) == 1
        assert "b.json failed its audit" in err and "cannot pass" in err
    code, out, err = run_cli(["compare", a, b])
    assert code == 0 and "audit failed" in out


# --- the noise floor ----------------------------------------------------------------------

def test_a_measured_noise_floor_widens_the_band(base):
    slow = make_result(seed=3, scale={"cuda-fused": 1.03})
    plain = verdicts(compare_results(base, slow))
    assert plain[("A8", "cuda-fused")] is Verdict.SLOWER
    floored = replace(slow, noise={"A8": {"cuda-fused": 0.05}})
    c = compare_results(base, floored, a_label="a", b_label="b")
    arm = next(x for x in c.arms if (x.shape, x.arm) == ("A8", "cuda-fused"))
    assert arm.verdict is Verdict.SAME and arm.threshold == 0.05
    assert "±5.0% (measured noise floor of b; the rule's is 2.0%)" in arm.reason
    other = next(x for x in c.arms if (x.shape, x.arm) == ("A128", "cuda-fused"))
    assert other.verdict is Verdict.SLOWER and other.threshold_source == "rule"
    ignored = compare_results(base, floored, parse_rules(["floor:ignore"]))
    assert verdicts(ignored)[("A8", "cuda-fused")] is Verdict.SLOWER
    with pytest.raises(UserError, match="floor:require: A carries no measured noise floor for triton at A8"):
        compare_results(base, floored, parse_rules(["floor:require"]))


def test_noise_floor_round_trips_and_older_files_read_without_one(base, tmp_path):
    path = save(replace(base, noise={"A8": {"cuda-fused": 0.013}}), tmp_path / "n.json")
    assert load(path).noise == {"A8": {"cuda-fused": 0.013}}
    data = json.loads(Path(path).read_text())
    del data["noise"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load(tmp_path / "old.json").noise == {}


def test_a_damaged_noise_floor_is_refused(base):
    with pytest.raises(UserError, match="noise floor of 1.5 at A8 is not a fraction"):
        compare_results(base, replace(base, noise={"A8": {"cuda-fused": 1.5}}))


# --- rules on the command line, and the views ----------------------------------------------

def test_cli_rules(base, saved):
    a, b = saved("a.json", base), saved("slow.json", make_result(seed=3, scale={"cuda-fused": 1.03}))
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression"])
    assert code == 1 and "A8/cuda-fused +3" in err
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression", "--rule", "median:5%"])
    assert code == 0, err
    code, out, err = run_cli(["compare", a, b, "--rule", "median:5%,ci:99", "--format", "json"])
    assert json.loads(out)["rules"] == {"change": 0.05, "confidence": 0.99, "alpha": 0.05, "floor": "measured",
                                        "test": "rows", "throttled": "auto"}


@pytest.mark.parametrize("rule, message", [("median:abc", "is not a percentage"), ("bogus:1", "unknown key"),
                                           ("ci:100", "below 100"), ("floor", "KEY:VALUE")])
def test_cli_bad_rule_is_one_line(base, saved, rule, message):
    a = saved("a.json", base)
    code, out, err = run_cli(["compare", a, a, "--rule", rule])
    assert code == 2
    line = one_error_line(err)
    assert "--rule" in line and message in line


def test_views_show_interval_p_and_reason(base, saved):
    a, b = saved("a.json", base), saved("slow.json", make_result(seed=3, scale={"cuda-fused": 1.10}))
    c = compare_results(load(a), load(b))
    arm = c.regressions[0]
    code, out, err = run_cli(["compare", a, b, "--format", "markdown"])
    row = next(line for line in out.splitlines() if line.startswith(f"| {arm.shape} | `cuda-fused` |"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[2] == f"{arm.a_median_ns / 1e3:,.2f} [{arm.a_ci_ns[0] / 1e3:,.2f}, {arm.a_ci_ns[1] / 1e3:,.2f}]"
    assert cells[4].startswith(f"{arm.change:+.1%} [") and cells[5] == f"{arm.p_value:.2g}"
    assert cells[6] == "slower" and cells[7].startswith("beyond ±2.0% (rule); p=")
    assert "rules median:floor ci:95 p:0.05 floor:measured test:rows" in out and "bootstrap" in out
    code, out, err = run_cli(["compare", a, b])
    assert "slower" in out and "beyond ±2.0%" in out and "95% CI" in out
    for x in c.arms:
        assert x.a_ci_ns[0] <= x.a_median_ns <= x.a_ci_ns[1] and x.change_ci[0] <= x.change <= x.change_ci[1]
        assert 0 < x.p_value <= 1


COMMITTED_PAIR = [ROOT / "results" / "h200" / name for name in
                  ("all-arms-before-fused-split.json.gz", "all-arms-after-fused-split.json.gz")]


@pytest.mark.skipif(not all(p.exists() for p in COMMITTED_PAIR), reason="committed H200 pair not present")
def test_committed_gz_pair_end_to_end(tmp_path):
    a, b = (str(p) for p in COMMITTED_PAIR)
    code, out, err = run_cli(["compare", a, b, "--fail-on-regression", "--format", "json"])
    data = json.loads(out)
    slower = [x for x in data["arms"] if x["verdict"] == "slower"]
    assert (code == 1) == bool(slower), err
    assert {x["verdict"] for x in data["arms"]} <= {v.value for v in Verdict}
    assert all(x["a_samples"] == 150 and x["b_samples"] == 150 for x in data["arms"])  # 5 rounds x 30, all audited
    slow_path = save(slowed_run(load(b), "cuda-fused", 1.10), tmp_path / "after-slowed.json.gz")
    code, out, err = run_cli(["compare", a, str(slow_path), "--fail-on-regression"])
    assert code == 1 and err.startswith("moebench: regression: ")
    for shape in ("A8", "A128", "Q8", "Q128"):
        assert f"{shape}/cuda-fused +" in err


@pytest.mark.parametrize("path", H200_VERDICT_FILES, ids=lambda p: p.name)
def test_a_file_of_verdicts_alone_is_not_compared(path):
    code, _out, err = run_cli(["compare", str(path), str(path)])
    assert code == 2 and err.count("\n") <= 1 and "no shape and arm in common with audited samples" in err
