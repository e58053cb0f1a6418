"""Measurement truth on the CPU: the A/A noise floor (`run --aa`, `--noise-from`), graph
sampling on the fake timer (`--graph`), and throttled rounds left out of compare."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import pytest
import external_arm_example as example
from result_factory import make_result
from run_fakes import fake_backend
from timing_fakes import FakeGpu, FakeTracer

from moebench.run import runner

from moebench.analysis import significance as sig
from moebench.cli import main
from moebench.errors import UserError
from moebench.timing.measure import TimingBackend, TimingProtocol, measure
from moebench.run.noise import copied_fixture
from moebench.analysis.compare import compare_results
from moebench.record.schema import ClockSample, DeclaredKernel
from moebench.analysis.load import load
from moebench.record.store import save
from moebench.analysis.verdicts import Verdict, parse_rules
from moebench.timing.clocks import event_names, over_round
from moebench.timing.engine import Unit
from moebench.timing.graphs import strip_flush
from moebench.timing.records import TaggedKernel
from moebench.timing.timers import KernelRecordTimer

TESTS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(runner, "cuda_backend", lambda req: fake_backend(example.GPU))
    monkeypatch.chdir(TESTS)
    return example.GPU


def cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err.strip()


def only_result(folder: Path):
    (path,) = folder.glob("*.json")
    return path, load(path)


# --- the A/A noise floor -------------------------------------------------------------------

def test_noise_floor_holds_an_offset_and_the_scatter():
    rng = np.random.default_rng(1)
    same = [1000 + rng.normal(0, 2, 30) for _ in range(8)]
    twin = [1000 + rng.normal(0, 2, 30) for _ in range(8)]
    off = [v * 1.013 for v in twin]  # a copy 1.3% slower every round
    quiet = sig.noise_floor(same, twin, sig.generator("q"))
    offset = sig.noise_floor(same, off, sig.generator("o"))
    assert 0 < quiet < 0.005
    assert 0.013 < offset < 0.02  # the offset and the interval's half-width beyond it


def test_copied_fixture_is_a_new_allocation_of_the_same_values():
    from moebench.fixtures import build_fixture
    from moebench.fixtures.shapes import ShapeRegistry
    fx = build_fixture(ShapeRegistry().resolve("T8"))
    copy = copied_fixture(fx)
    assert copy.fingerprint == fx.fingerprint and copy.spec == fx.spec
    assert copy.w1.data_ptr() != fx.w1.data_ptr()
    assert copy.w1.view(torch.uint8).equal(fx.w1.view(torch.uint8))


def test_run_aa_times_a_second_copy_and_records_its_floor(fake_gpu, tmp_path, capsys):
    example.SEEN_WEIGHTS.clear()
    code, out, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_jittery",
                         "--aa", "mine", "--rounds", "4", "--samples", "6", "--warmup", "1", "--out", str(tmp_path))
    assert code == 0, err
    _, result = only_result(tmp_path)
    assert result.settings.arms == ("mine", "mine#2") and result.settings.ref == "mine"
    assert len(set(example.SEEN_WEIGHTS)) == 2  # two prepare() calls on two weight allocations
    copy = next(a for a in result.arms if a.name == "mine#2")
    assert copy.identity["aa_copy_of"] == "mine" and "second copy" in copy.description
    floors = result.noise["T8"]
    assert set(floors) == {"mine", "mine#2"} and floors["mine"] == floors["mine#2"]
    units = sig.rounds_of(sig.audited_samples(result))
    rounds = sorted(units[("T8", "mine")])
    expect = sig.noise_floor([units[("T8", "mine")][r] for r in rounds], [units[("T8", "mine#2")][r] for r in rounds],
                             sig.generator("T8", "mine", "noise"))
    assert floors["mine"] == pytest.approx(expect) and 0 < floors["mine"] < 0.02
    assert "noise floor (A/A) T8: mine" in out
    assert result.settings.options["aa"] == "mine"


def test_noise_from_copies_the_floor_and_compare_uses_it(fake_gpu, tmp_path, capsys):
    spec = ("--shape", "T8", "--arm", "mine=external_arm_example:prepare_jittery", "--rounds", "3",
            "--samples", "5", "--warmup", "0")
    assert cli(capsys, "run", *spec, "--aa", "mine", "--out", str(tmp_path / "aa"))[0] == 0
    noise_path, noise_run = only_result(tmp_path / "aa")
    assert cli(capsys, "run", *spec, "--noise-from", str(noise_path), "--out", str(tmp_path / "b"))[0] == 0
    _, later = only_result(tmp_path / "b")
    assert later.settings.arms == ("mine",)
    assert later.noise == {"T8": {"mine": noise_run.noise["T8"]["mine"]}}
    c = compare_results(later, replace(later, noise={"T8": {"mine": 0.5}}))
    assert c.arms[0].threshold == pytest.approx(0.5, abs=1e-3) and "measured noise floor" in c.arms[0].threshold_source


@pytest.mark.parametrize("extra, needle", [
    (("--aa", "nope"), "--aa 'nope': unknown arm"),
    (("--noise-from", "missing.json"), "--noise-from missing.json: no such file"),
])
def test_aa_mistakes_are_one_line_exit_2(fake_gpu, tmp_path, capsys, extra, needle):
    code, _, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_copy", *extra,
                       "--rounds", "1", "--samples", "1", "--out", str(tmp_path))
    assert code == 2 and needle in err and "\n" not in err


def test_noise_from_a_file_without_floors_is_refused(fake_gpu, tmp_path, capsys):
    plain = save(make_result(shapes=("A8",), arms=("triton",)), tmp_path / "plain.json")
    code, _, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_copy",
                       "--noise-from", str(plain), "--rounds", "1", "--samples", "1", "--out", str(tmp_path / "o"))
    assert code == 2 and "carries no noise floor" in err


# --- graph sampling on the fake timer --------------------------------------------------------

def test_graph_run_replays_flush_and_call_and_keeps_only_the_arms_kernels(fake_gpu, tmp_path, capsys):
    args = ("run", "--shape", "T8", "--arm", "two=external_arm_example:prepare_dict", "--rounds", "2",
            "--samples", "4", "--warmup", "1", "--aa", "none")
    assert cli(capsys, *args, "--out", str(tmp_path / "eager"))[0] == 0
    code, out, err = cli(capsys, *args, "--graph", "--out", str(tmp_path / "graph"))
    assert code == 0, err
    (eager_path, eager), (graph_path, graph) = only_result(tmp_path / "eager"), only_result(tmp_path / "graph")
    assert graph.settings.sampler == "graph" and eager.settings.sampler == "eager"
    assert graph_path.name.endswith("_graph.json") and "sampler: CUDA graph replays" in " ".join(out.split())
    assert graph.settings.options["graph_flush_kernels"] == ["flush_reduce"]
    assert graph.audit.passed and graph.audit.samples_total == 2 * 4
    assert all([k.name for k in s.kernels] == ["my_gemm", "my_gemm"] for s in graph.samples)
    # the fake graph has no host gap between its kernels: span shrinks to the kernels' time
    g, e = graph.summaries[0], eager.summaries[0]
    assert g.median_ns == e.median_ns == 3000 and g.span_median_ns < e.span_median_ns
    assert load(graph_path).settings.sampler == "graph"


def graph_backend(gpu: FakeGpu, capture=None) -> TimingBackend:
    b = fake_backend(gpu)
    return replace(b, capture=capture or gpu.capture)


def test_graph_samples_of_an_arm_that_launches_nothing_fail_the_audit():
    gpu = FakeGpu()
    unit = Unit("T8", "silent", run=lambda: None, kernels=(DeclaredKernel("k", "my_kernel"),))
    m = measure([unit], TimingProtocol(rounds=1, samples=3, warmup=0, sampler="graph", measure_bandwidth=False),
                graph_backend(gpu))
    assert m.audit.samples_passed == 0
    assert "unexpected 'flush_reduce'" in m.audit.findings[0].reason  # the flush is never taken as the call


def test_a_call_that_cannot_be_captured_is_one_line_naming_the_arm():
    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    unit = Unit("A8", "syncing-arm", run=lambda: None)
    with pytest.raises(UserError, match=r"--graph: arm syncing-arm at A8 cannot be captured in a CUDA graph "
                                        r"\(RuntimeError: operation not permitted when stream is capturing\)") as e:
        measure([unit], TimingProtocol(rounds=1, samples=1, sampler="graph", measure_bandwidth=False),
                graph_backend(FakeGpu(), refuse))
    assert "\n" not in str(e.value)


def test_graph_needs_the_kernel_record_timer(fake_gpu, tmp_path, capsys):
    code, _, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_copy", "--graph",
                       "--timer", "events", "--rounds", "1", "--samples", "1", "--out", str(tmp_path))
    assert code == 2 and "--graph needs --timer cupti" in err


def test_strip_flush_untags_only_a_leading_flush():
    from moebench.record.schema import KernelRecord, Sample
    flush, call = KernelRecord("flush_reduce", 0, 10), KernelRecord("gemm", 12, 30)
    late = KernelRecord("flush_reduce", 40, 50)
    samples = [Sample("T8", "a", 1, 0, 5, (flush, call)), Sample("T8", "a", 1, 1, 6, (KernelRecord("gemm", 32, 38), late))]
    tagged = [TaggedKernel("flush_reduce", 0, 10, 5), TaggedKernel("gemm", 12, 30, 5),
              TaggedKernel("gemm", 32, 38, 6), TaggedKernel("flush_reduce", 40, 50, 6)]
    kept, retagged = strip_flush(samples, tagged, ("flush_reduce",))
    assert kept[0].kernels == (call,) and kept[1].kernels == samples[1].kernels  # not leading: kept, for the audit
    assert [t.external_id for t in retagged] == [0, 5, 6, 6]
    assert strip_flush(samples, tagged, ()) == (samples, tagged)


def test_graph_timer_on_the_engine_loop_ties_every_replayed_kernel_to_its_sample():
    gpu = FakeGpu()
    run = lambda: (gpu.launch("gemm1", 3000), gpu.launch("gemm2", 2000))  # noqa: E731
    unit = Unit("T8", "pair", run=run, kernels=(DeclaredKernel("g1", "gemm1"), DeclaredKernel("g2", "gemm2")))
    backend = TimingBackend(device=__import__("torch").device("cpu"), timer=KernelRecordTimer(lambda c: FakeTracer(gpu)),
                            flush=lambda: gpu.launch("flush_reduce", 50_000), flush_bytes=1, sync=lambda: None,
                            capture=gpu.capture)
    m = measure([unit], TimingProtocol(rounds=2, samples=3, warmup=1, sampler="graph", measure_bandwidth=False),
                backend)
    assert m.audit.passed and len(m.samples) == 6
    assert all(s.gpu_sum_ns == 5000 for s in m.samples)
    # one graph launch per warm-up and sample: every kernel of a replay shares its correlation id
    assert gpu.launch_log.count("flush_reduce") == 1 + 2 * (1 + 3)  # the naming flush, then one per replay


# --- throttled rounds ----------------------------------------------------------------------

def test_clock_events_and_a_moving_clock_flag_a_round():
    assert event_names(0x1 | 0x2 | 0x100) == ()  # idle and settings are not events
    assert event_names(0x4 | 0x40) == ("sw_power_cap", "hw_thermal")
    steady = over_round(ClockSample(1, 1980, 3201, 40, 300.0), ClockSample(1, 1965, 3201, 41, 310.0))
    assert steady.sm_mhz_start == 1980 and steady.throttled is None  # 15 MHz: within the tolerance
    dropped = over_round(ClockSample(2, 1980, 3201, 40, 300.0), ClockSample(2, 1755, 3201, 60, 700.0))
    assert dropped.throttled == "SM clock moved 1980 → 1755 MHz within the round"
    capped = over_round(ClockSample(3, 1980, 3201, 40, 300.0, events=("sw_power_cap",)),
                        ClockSample(3, 1980, 3201, 40, 300.0))
    assert capped.throttled == "clock events sw_power_cap"
    assert ClockSample(4, None, None, None, None).throttled is None  # no NVML: nothing to flag


def test_throttled_rounds_recorded_by_a_run(fake_gpu, tmp_path, capsys, monkeypatch):
    readings = iter([1980, 1980, 1980, 1500, 1980, 1980])  # start, end of each of 3 rounds

    def backend(req):
        b = fake_backend(example.GPU)
        return replace(b, clocks=lambda r: ClockSample(r, next(readings), 3201, 40, 300.0))
    monkeypatch.setattr(runner, "cuda_backend", backend)
    code, out, err = cli(capsys, "run", "--shape", "T8", "--arm", "mine=external_arm_example:prepare_copy",
                         "--rounds", "3", "--samples", "2", "--warmup", "0", "--out", str(tmp_path))
    assert code == 0, err
    _, result = only_result(tmp_path)
    assert [c.throttled is not None for c in result.clocks] == [False, True, False]
    assert "round 2 throttled: SM clock moved 1980 → 1500 MHz" in out


def test_compare_leaves_throttled_rounds_out_unless_kept():
    base = make_result(shapes=("A8",), seed=1)
    slow = make_result(shapes=("A8",), seed=2)
    # B's round 3 ran 30% slow under a power cap; every other round is B as A
    samples = tuple(replace(s, kernels=tuple(replace(k, end_ns=k.start_ns + int(1.3 * k.duration_ns)) for k in s.kernels))
                    if s.round == 3 else s for s in slow.samples)
    clocks = tuple(ClockSample(r, 1980, 3201, 40, 300.0, sm_mhz_start=1980,
                               events=("sw_power_cap",) if r == 3 else ()) for r in range(1, 6))
    capped = replace(slow, samples=samples, clocks=clocks)
    dropped = compare_results(base, capped)
    kept = compare_results(base, capped, parse_rules(["throttled:keep"]))
    arm = lambda c: next(x for x in c.arms if x.arm == "cuda-fused")  # noqa: E731
    assert arm(dropped).b_samples == 4 * arm(kept).b_samples // 5
    assert any("B: round 3 of 5 throttled: clock events sw_power_cap: left out" in n for n in dropped.notes)
    assert any("kept and judged (throttled:keep)" in n for n in kept.notes)
    assert arm(dropped).verdict is Verdict.SAME and not arm(dropped).mark
    every = replace(capped, clocks=tuple(replace(c, events=("hw_slowdown",)) for c in clocks))
    with pytest.raises(UserError, match="every round of B was throttled .*--rule throttled:auto"):
        compare_results(base, every, parse_rules(["throttled:drop"]))


# --- the ncu offset probes -------------------------------------------------------------------

def test_spin_cycles_and_their_mistakes():
    from moebench.tasks.probe import spin_cycles
    assert spin_cycles(20, 1980) == 39_600 and spin_cycles(0.5, 1980) == 990
    with pytest.raises(UserError, match="maximum SM clock"):
        spin_cycles(2, None)
    with pytest.raises(UserError, match="--us must be above 0"):
        spin_cycles(0, 1980)


def test_the_offset_table_row_from_both_tools():
    from moebench.tasks.probe import ProbeResult, compare_with_ncu
    from moebench.record.schema import Audit, KernelRecord, Sample
    samples = tuple(Sample("_probe", "spin", 1, i, i + 1, (KernelRecord("spin_kernel(long)", 0, 20_000 + i),))
                    for i in range(5))
    res = ProbeResult("spin", 0, samples, Audit(5, 5, 0), "cupti", samples)
    text = "\n".join(['"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'] +
                     [f'"{i}","1","at::cuda::spin_kernel(long)","gpu__time_duration.sum","usecond","{v}"'
                      for i, v in enumerate(("21.00", "21.10", "20.90"))])
    c = compare_with_ncu(res, text)
    assert c.kernels == 3 and c.median_ns == 21_000 and c.moebench_ns == 20_002
    assert c.offset_ns == pytest.approx(998)
    assert c.table_row("spin 20 µs") == "| spin 20 µs | 20.002 | 21.000 | +998 | 0.9525 |"


def test_the_reduce_probe_is_the_combine_instruction_alone(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    import re
    import subprocess

    from moebench.tasks.probe import OPS
    from moebench.kernels.cuda import nvrtc as cuda_build
    from moebench.kernels.cuda.source import KernelSource
    from test_fused_host import _cuobjdump
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    m = cuda_build.compile_source(KernelSource.shipped("sm90_reduce_probe.cu"))
    r = m.resources(OPS["reduce"][0])
    assert r.spill_stores == 0 and r.stack_bytes == 0
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    (tmp_path / "p.cubin").write_bytes(m.cubin)
    sass = subprocess.run([tool, "-sass", str(tmp_path / "p.cubin")], capture_output=True, text=True, check=True).stdout
    memory = re.findall(r"\b(LDG|STG|REDG|ATOMG|RED)\S*", sass)
    assert memory and set(memory) == {"REDG"}  # reductions, and no other global access


def test_the_wgmma_probe_is_the_prefill_instruction_alone(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    import re
    import subprocess

    from moebench.tasks.probe import OPS, WGMMA_OPS, WGMMA_STEP_FLOPS
    from moebench.kernels.cuda import nvrtc as cuda_build
    from moebench.kernels.cuda.source import KernelSource
    from test_fused_host import _cuobjdump
    assert WGMMA_STEP_FLOPS == 2 * 4 * (2 * 64 * 128 * 32)  # a CTA's K step: 2 warpgroups x 4 m64n128k32
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    m = cuda_build.compile_source(KernelSource.shipped("sm90_wgmma_probe.cu"))
    for op in WGMMA_OPS:
        r = m.resources(OPS[op][0])
        assert r.spill_stores == 0 and r.stack_bytes == 0
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    (tmp_path / "p.cubin").write_bytes(m.cubin)
    for op in WGMMA_OPS:
        sass = subprocess.run([tool, "-sass", "-fun", OPS[op][0], str(tmp_path / "p.cubin")], capture_output=True,
                              text=True, check=True).stdout
        assert "QGMMA.64x128x32.F32.E4M3.E4M3" in sass  # the prefill kernels' instruction
        memory = set(re.findall(r"\b(LDG|STG|REDG|ATOMG|RED|LDL|STL)(?=[\s.])", sass))
        assert memory == {"LDG", "STG"}  # the tiles' fill and the sink: nothing in the loop waits on L2 or HBM
        promotion = len(re.findall(r"\bFFMA\b", sass)) >= 64  # 64 sums a thread, times the scales
        assert promotion == (op == "wgmma-step")


def test_the_gate_up_l2_plan_reads_few_rows_of_few_experts():
    from moebench.tasks.probe import GATE_UP_L2, gate_up_l2_plan
    from moebench.kernels.cuda.fused_checks import check_plan
    c = GATE_UP_L2
    plan = gate_up_l2_plan(c["blocks"], c["groups"], c["E"])
    blocks, slots = plan.num_blocks, plan.num_slots
    assert blocks == c["blocks"] and slots == blocks * 64
    check_plan(plan, slots, c["E"], 64)  # the launcher's checks pass
    real = plan.sorted_token_ids[:slots].reshape(blocks, 64)
    assert int(real.min()) == 0 and int(real.max()) == c["groups"] * 64 - 1  # 64 groups of 64 slots
    assert int((real // c["top_k"]).unique().numel()) == c["groups"] * 64 // c["top_k"] == 256  # x rows read
    assert bool((plan.sorted_token_ids[slots:] == slots).all())  # the rest sentinel
    assert plan.expert_ids[:blocks].unique().tolist() == list(range(c["E"])) and bool((plan.expert_ids[blocks:] == -1).all())
    # 8 rounds of a 132-SM grid, one item a block (one requant group)
    assert blocks == 8 * 132


def test_probe_prints_a_flops_rate_against_the_datasheet_peak(monkeypatch):
    import torch

    from moebench.cli.probe_cmd import flops_rate
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert flops_rate(989_500_000_000, 1_000_000) == "989.5 TFLOP/s (50.0% of the dense FP8 peak, 1,979)"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Board")
    assert flops_rate(989_500_000_000, 1_000_000) == "989.5 TFLOP/s"


def test_probe_table_row_needs_the_ncu_csv(capsys):
    code, _, err = cli(capsys, "probe", "--op", "empty", "--table-row", "t.md")
    assert code == 2 and "--table-row needs --ncu-csv" in err
