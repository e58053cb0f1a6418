import pytest

from moebench.record.schema import KernelRecord, Sample
from moebench.analysis.stats import arm_median, arm_summary, ratio_summary, rows_by_round, summarize


def s(arm, r, i, ns, shape="A8"):
    return Sample(shape, arm, r, i, 1, (KernelRecord("k", 0, ns),))


def test_rows_are_round_medians_and_arm_is_median_of_rows():
    rows = rows_by_round([(1, 10), (1, 30), (1, 20), (2, 40), (2, 50), (3, 5)])
    assert rows == {1: 20.0, 2: 45.0, 3: 5.0}
    assert arm_median(rows) == 20.0


def test_arm_summary_fields():
    samples = [s("x", 1, 0, 1000), s("x", 1, 1, 3000), s("x", 2, 0, 2000), s("x", 2, 1, 2000)]
    a = arm_summary("A8", "x", samples, hbm_bytes=4_000_000, read_bandwidth_bytes_per_s=4e12)
    assert a.row_medians_ns == (2000.0, 2000.0) and a.median_ns == 2000.0
    assert a.hbm_bandwidth_bytes_per_s == pytest.approx(2e12) and a.fraction_of_read_bandwidth == pytest.approx(0.5)
    assert a.samples == 4 and a.span_median_ns == 2000.0
    assert arm_summary("A8", "x", samples, 1).fraction_of_read_bandwidth is None


def test_ratio_is_median_of_per_round_ratios_and_counts_wins():
    ref = {1: 100.0, 2: 100.0, 3: 100.0}
    arm = {1: 50.0, 2: 200.0, 3: 80.0}
    r = ratio_summary("A8", "ref", "arm", ref, arm)
    assert r.per_round == (2.0, 0.5, 1.25) and r.median == 1.25
    assert (r.low, r.high, r.rounds_won, r.rounds) == (0.5, 2.0, 2, 3)


def test_summarize_orders_and_leaves_ref_out_of_ratios():
    samples = [s(a, r, 0, ns, shape) for shape in ("A8", "Q8") for r in (1, 2)
               for a, ns in (("ref", 200), ("fast", 100), ("slow", 400))]
    summaries, ratios = summarize(samples, ["A8", "Q8"], ["ref", "fast", "slow"], "ref", {"A8": 1, "Q8": 1})
    assert [(x.shape, x.arm) for x in summaries] == [(sh, a) for sh in ("A8", "Q8") for a in ("ref", "fast", "slow")]
    assert [(x.shape, x.arm, x.median) for x in ratios] == [("A8", "fast", 2.0), ("A8", "slow", 0.5),
                                                             ("Q8", "fast", 2.0), ("Q8", "slow", 0.5)]


def test_events_values_are_used_when_present():
    e = [Sample("A8", "x", 1, i, 0, (), 1000 + i) for i in range(3)]
    a = arm_summary("A8", "x", e, 1)
    assert a.median_ns == 1001.0 and a.span_median_ns is None


def test_empty_inputs_raise():
    with pytest.raises(ValueError):
        arm_median({})
    with pytest.raises(ValueError):
        ratio_summary("A8", "a", "b", {1: 1.0}, {2: 1.0})


def _committed_results():
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "results" / "h200"
    return sorted([*root.rglob("*.json"), *root.rglob("*.json.gz")])  # experiments/ are compressed


@pytest.mark.parametrize("path", _committed_results(), ids=lambda p: p.name)
def test_committed_statistics_derive_from_committed_samples(path):
    """Every stored median, row and ratio of an H200 run is what the named functions give
    from the run's own stored samples: a reader can redo the numbers from the file."""
    from moebench.analysis.load import load
    r = load(path)
    summaries, ratios = summarize(r.samples, r.settings.shapes, r.settings.arms, r.settings.ref,
                                  {f.name: f.floors.hbm_bytes for f in r.fixtures} or
                                  {s: 0 for s in r.settings.shapes},
                                  r.provenance.gpu.read_bandwidth_bytes_per_s if r.provenance.gpu else None)
    assert [(s.shape, s.arm, s.median_ns, s.row_medians_ns) for s in summaries] == \
        [(s.shape, s.arm, s.median_ns, s.row_medians_ns) for s in r.summaries]
    assert [(x.shape, x.arm, x.median, x.per_round, x.rounds_won) for x in ratios] == \
        [(x.shape, x.arm, x.median, x.per_round, x.rounds_won) for x in r.ratios]
    assert r.audit.samples_total == len(r.samples) == r.audit.samples_passed
