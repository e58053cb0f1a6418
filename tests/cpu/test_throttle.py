"""The throttle policy on fabricated ClockSamples: a card capped in every round still gets
verdicts, marked; a run whose rounds differ in capping says which; compare drops capped rounds
only when both runs keep uncapped ones; the run's own table says what compare will do."""

from __future__ import annotations

from dataclasses import replace

import pytest
from result_factory import make_result

from moebench.errors import UserError
from moebench.analysis.compare import Verdict, compare_results
from moebench.views.compare_view import render_markdown, render_table
from moebench.record.schema import ClockSample
from moebench.views.tables import throttle_lines
from moebench.analysis.throttle import RunThrottle, plan, run_line
from moebench.analysis.verdicts import parse_rules


def capped(rounds, which, why=("sw_power_cap",)):
    """Clock samples of `rounds` rounds, the rounds in `which` power-capped (690 of 700 W)."""
    return tuple(ClockSample(r, 1755 if r in which else 1980, 2619, 60, 690.0 if r in which else 400.0,
                             sm_mhz_start=1980 if r not in which else 1755,
                             events=why if r in which else (), power_limit_w=700.0) for r in range(1, rounds + 1))


def with_clocks(result, which):
    return replace(result, clocks=capped(result.settings.rounds, which))


def test_the_plan_drops_only_when_both_runs_keep_unthrottled_rounds():
    five = (1, 2, 3, 4, 5)
    clean = RunThrottle("A", five, {})
    some = RunThrottle("B", five, {2: "clock events sw_power_cap", 4: "clock events sw_power_cap"})
    every = RunThrottle("B", five, {r: "clock events sw_power_cap" for r in five})
    p = plan("auto", clean, some)
    assert p.dropped == {"A": frozenset(), "B": frozenset({2, 4})} and p.mark == ""
    assert p.notes == ("B: rounds 2, 4 of 5 throttled: clock events sw_power_cap: left out of every statistic "
                       "here: both runs keep unthrottled rounds",)
    p = plan("auto", clean, every)
    assert p.dropped == {"A": frozenset(), "B": frozenset()}
    assert p.mark == "judged on throttled rounds of B"
    assert "every round (5) throttled" in p.notes[0] and "no unthrottled round in B" in p.notes[0]
    # both capped in some rounds, one of them in all: all rounds of both are judged
    p = plan("auto", RunThrottle("A", five, {1: "x"}), every)
    assert p.dropped == {"A": frozenset(), "B": frozenset()} and p.mark == "judged on throttled rounds of A and B"
    p = plan("keep", clean, some)
    assert p.dropped["B"] == frozenset() and p.mark == "judged on throttled rounds of B"
    assert plan("drop", clean, some).dropped["B"] == frozenset({2, 4})
    with pytest.raises(UserError, match="every round of B was throttled"):
        plan("drop", clean, every)
    assert plan("auto", clean, clean) == plan("drop", clean, clean)  # nothing flagged: nothing to do
    with pytest.raises(UserError, match="rule throttled: 'maybe'"):
        plan("maybe", clean, clean)


def test_a_card_capped_in_every_round_gets_marked_verdicts():
    a = with_clocks(make_result(shapes=("A8",), seed=1), set(range(1, 6)))
    b = with_clocks(make_result(shapes=("A8",), seed=2, scale={"cuda-fused": 1.10}), set(range(1, 6)))
    c = compare_results(a, b)  # before: "every round of A was throttled", no verdict at all
    fused = next(x for x in c.arms if x.arm == "cuda-fused")
    assert fused.verdict is Verdict.SLOWER and fused.mark == "judged on throttled rounds of A and B"
    assert fused.reason.endswith("; judged on throttled rounds of A and B")
    assert all(x.mark for x in c.arms) and all(r.mark for r in c.ratios)
    assert fused.b_samples == 5 * 8  # every round judged
    import io
    table, md = io.StringIO(), io.StringIO()
    render_table(c, table)
    render_markdown(c, md)
    assert "slower (throttled)" in table.getvalue() and "slower (throttled)" in md.getvalue()
    assert "**slower" not in md.getvalue()  # bold is for a win only
    assert any("A: every round (5) throttled: clock events sw_power_cap: kept and judged" in n for n in c.notes)


def test_rounds_that_differ_in_capping_are_named_and_dropped_only_when_both_sides_keep_some():
    a = make_result(shapes=("A8",), seed=1)
    b = with_clocks(make_result(shapes=("A8",), seed=2), {2, 5})
    c = compare_results(a, b)
    fused = next(x for x in c.arms if x.arm == "cuda-fused")
    assert fused.b_samples == 3 * 8 and fused.a_samples == 5 * 8 and fused.mark == ""
    assert any(n.startswith("B: rounds 2, 5 of 5 throttled: clock events sw_power_cap: left out") for n in c.notes)
    # against a run capped throughout, B's uncapped rounds would be judged against capped ones
    # only: every round of both is judged instead, and marked
    every = with_clocks(make_result(shapes=("A8",), seed=3), set(range(1, 6)))
    c = compare_results(every, b)
    fused = next(x for x in c.arms if x.arm == "cuda-fused")
    assert fused.b_samples == 5 * 8 and fused.mark == "judged on throttled rounds of A and B"
    kept = compare_results(a, b, parse_rules(["throttled:keep"]))
    assert next(x for x in kept.arms if x.arm == "cuda-fused").b_samples == 5 * 8


def test_the_run_table_says_which_rounds_and_what_compare_will_do():
    some = with_clocks(make_result(shapes=("A8",), seed=2), {2, 5})
    lines = throttle_lines(some)
    assert lines[0] == ("round 2 throttled: clock events sw_power_cap (SM 1755 MHz, memory 2619 MHz, 690/700 W)")
    assert lines[1].startswith("round 5 throttled")
    assert lines[2] == run_line(some)
    assert lines[2].startswith("rounds 2, 5 of 5 throttled: clock events sw_power_cap: compare leaves them out when")
    every = with_clocks(make_result(shapes=("A8",), seed=2), set(range(1, 6)))
    assert run_line(every).startswith("every round (5) throttled: clock events sw_power_cap: compare judges every round")
    assert run_line(make_result(shapes=("A8",))) is None and throttle_lines(make_result(shapes=("A8",))) == []
