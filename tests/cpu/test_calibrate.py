"""`doctor --calibrate` on the CPU: the A/A/A arithmetic (spread, each copy's interval, the
difference this machine resolves), the clock and floor lines, the request it runs, and its one
line without a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
from result_factory import make_result, run_cli

from moebench.tasks.calibrate import (CopyRatio, calibration_lines, calibration_of, calibration_request, clock_summary,
                                copy_ratios, resolvable, spread)
from moebench.record.schema import ClockSample, ReadFloor

COPIES = ("cuda-fused@copy2", "cuda-fused@copy3")
ARMS = ("cuda-fused", *COPIES)
SAME = 1 / 1.3  # the factory slows an arm it does not know by 1.3x: the copies run as cuda-fused


def aaa(copy3: float = 1.0, jitter: float = 0.004, **kw):
    return make_result(shapes=("Q8",), arms=ARMS, scale={COPIES[0]: SAME, COPIES[1]: SAME * copy3},
                       jitter=jitter, **kw)


def test_spread_and_resolvable_are_the_copies_distance_from_one():
    ratios = [CopyRatio("Q8", "a", "b", 0.998, 0.995, 1.0012, 5), CopyRatio("Q8", "a", "c", 1.003, 1.001, 1.0051, 5)]
    assert spread(ratios) == pytest.approx(0.003)
    assert ratios[1].reach == pytest.approx(0.0051)
    assert resolvable(ratios) == pytest.approx(0.006)  # 0.51% rounded up to the next 0.1%
    assert resolvable([CopyRatio("Q8", "a", "b", 1.0, 0.998, 1.002, 5)]) == pytest.approx(0.002)  # exact: kept


def test_identical_copies_read_one_and_a_slow_copy_widens_what_is_resolvable():
    calm = copy_ratios(aaa(), "Q8", "cuda-fused", COPIES)
    assert [r.copy for r in calm] == list(COPIES) and all(r.rounds == 5 for r in calm)
    assert all(r.low <= r.median <= r.high for r in calm)
    assert spread(calm) < 0.01
    slow = copy_ratios(aaa(copy3=1.02), "Q8", "cuda-fused", COPIES)
    # ref / copy: a copy 2% slower reads 0.980x
    assert slow[1].median == pytest.approx(1 / 1.02, abs=0.005)
    assert spread(slow) == pytest.approx(0.02, abs=0.005) and resolvable(slow) >= spread(slow)
    assert resolvable(slow) > resolvable(calm)


def test_the_lines_end_with_the_resolvable_difference():
    r = aaa()
    floor = ReadFloor(3.17e12, "8x256x4", "m", 2**30, 20, {"8x256x4": 3.17e12, "2x512x8": 3.1e12}, 3.35e12, "sheet")
    clocks = tuple(ClockSample(i, 1980, 2619, 50, 420.0 + i, sm_mhz_start=1980, power_limit_w=700.0)
                   for i in range(1, 6))
    gpu = replace(r.provenance.gpu, read_floor=floor, read_bandwidth_bytes_per_s=floor.bytes_per_s)
    r = replace(r, clocks=clocks, provenance=replace(r.provenance, gpu=gpu))
    cal = calibration_of(r, "cuda-fused", COPIES)
    lines = calibration_lines(cal)
    assert lines[0].startswith("A/A/A: cuda-fused at Q8 and 2 identical copies (cuda-fused@copy2, cuda-fused@copy3)")
    assert lines[1].startswith("  cuda-fused / cuda-fused@copy2: ") and "95% interval, 5 rounds" in lines[1]
    assert lines[3].startswith("  spread: max |ratio - 1| = ")
    assert lines[4] == ("read floor: 3.170 TB/s measured (read kernel layout 8x256x4, best of 2); "
                        "datasheet 3.35 TB/s, 94.6% of it")
    assert lines[5] == ("clocks: SM 1980 MHz (max 1980), memory 2619 MHz (max 3201), power 421-425 W of a 700 W "
                        "limit, over 5 rounds; throttle reasons: none")
    assert lines[-1] == f"this machine resolves differences larger than {cal.resolvable:.1%} at Q8"


def test_the_clock_line_names_the_capped_rounds():
    clocks = tuple(ClockSample(i, 1755, 2619, 70, 699.0, sm_mhz_start=1755, events=("sw_power_cap",),
                               power_limit_w=700.0) for i in (1, 2, 3))
    assert clock_summary(clocks, None).endswith("throttle reasons: clock events sw_power_cap in rounds 1, 2, 3")


def test_the_request_times_the_arm_and_two_builds_of_its_own_source():
    from moebench.run.plan import RunRequest, plan_arms
    req, arm, copies = calibration_request(True, "Q8", "/tmp/x", ("moebench", "doctor", "--calibrate"))
    planned, plan = plan_arms(req)
    assert arm == "cuda-fused" and copies == (*COPIES, "cuda-fused#2") and planned.ref_arm == "cuda-fused"
    assert set(planned.arms) == {"cuda-fused", *copies} and planned.aa_arm == "cuda-fused"
    assert req.protocol == RunRequest(shapes=("Q8",), arms=("cuda-fused",)).protocol  # the default protocol
    req, arm, copies = calibration_request(False, "Q8", "/tmp/x", ())
    planned, _ = plan_arms(req)
    assert (arm, copies, planned.aa_arm, planned.arms) == ("triton", ("triton#2",), "triton", ("triton", "triton#2"))


def test_without_a_gpu_it_is_one_line():
    code, out, err = run_cli(["doctor", "--calibrate"])
    assert code == 2 and out == ""
    assert err.strip() == ("moebench: error: doctor --calibrate needs a GPU: no CUDA device visible "
                           "(`moebench doctor` says why)")
