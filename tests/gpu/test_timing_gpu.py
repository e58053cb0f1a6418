"""The real timing stage on a GPU: CUPTI tracer, flush modes, events timer, the probe.

A tiny torch "arm" (two elementwise kernels) goes through the same engine and audit as
`moebench run`."""

from dataclasses import replace

import pytest
import torch

from moebench.errors import UserError
from moebench.timing.measure import TimingProtocol, cuda_backend, measure
from moebench.record.schema import DeclaredKernel
from moebench.timing.engine import Unit

pytestmark = pytest.mark.gpu

DECL = (DeclaredKernel("add", r"Functor\w*_add", 1), DeclaredKernel("mul", "MulFunctor", 1))


def tiny_unit(shape="T", arm="torch2", n=1 << 22):
    a = torch.ones(n, device="cuda")
    b = torch.ones(n, device="cuda")
    c = torch.empty_like(a)

    def run():
        torch.add(a, b, out=c)
        torch.mul(c, 2.0, out=c)
    return Unit(shape, arm, run, reset=lambda: c.zero_(), kernels=DECL)


def time_tiny(flush="read", timer="cupti", rounds=2, samples=10, n=1 << 22):
    """The tiny unit timed by the real backend, counting the flushes and resets that ran
    around its samples (their kernels must be in none of them)."""
    protocol = TimingProtocol(rounds, samples, 2, flush, timer, measure_bandwidth=False)
    backend = cuda_backend(protocol)
    ran = {"flush": 0, "reset": 0}
    real_flush = backend.flush

    def counted_flush():
        ran["flush"] += 1
        real_flush()
    backend = replace(backend, flush=counted_flush)
    units = []
    for arm in ("one", "two"):
        u = tiny_unit(arm=arm, n=n)
        real_reset = u.reset

        def counted_reset(real_reset=real_reset):
            ran["reset"] += 1
            real_reset()
        units.append(replace(u, reset=counted_reset))
    seen = []
    m = measure(units, protocol, backend, on_round_done=seen.append)
    assert seen and seen[-1].rounds_done == rounds  # the hook saw the finished measurement
    return backend, m, m.audit, ran


@pytest.mark.parametrize("flush", ["read", "write", "none"])
def test_cupti_samples_hold_exactly_their_kernels(flush):
    backend, out, audit, ran = time_tiny(flush)
    assert audit.passed, audit.findings[:3]
    assert audit.samples_total == 2 * 2 * 10 and audit.dropped_records == 0
    for s in out.samples:
        assert "_add" in s.kernels[0].name
        assert 0 < s.gpu_sum_ns <= s.gpu_span_ns
    # a reset (and, but for --flush none, a flush) ran before every sample; their kernels are in none
    assert ran["reset"] >= len(out.samples) and (flush == "none" or ran["flush"] >= len(out.samples))
    assert all(len(s.kernels) == 2 for s in out.samples)  # the add and the mul alone
    assert len(out.clocks) == 2
    assert backend.flush_bytes == (0 if flush == "none" else max(256 * 2**20, 2 * backend.gpu.l2_bytes))


def test_cold_read_is_slower_than_warm():
    # each unit's three tensors a quarter of this GPU's L2 (15 MiB on an H200, 12.5 on an H100): they
    # stay in it between the samples of a unit when nothing flushes (3 x 16 MiB did not on an H100's 50 MiB)
    n = torch.cuda.get_device_properties(0).L2_cache_size // (4 * 3 * 4)

    def median_sum(flush):
        _, out, audit, _ = time_tiny(flush, samples=20, n=n)
        assert audit.passed
        vals = sorted(s.gpu_sum_ns for s in out.samples)
        return vals[len(vals) // 2]
    assert median_sum("read") > median_sum("none")


def test_events_timer():
    _, out, audit, _ = time_tiny(timer="events")
    assert audit.passed and all(s.events_ns > 0 and not s.kernels for s in out.samples)


def test_tracer_restarts_in_one_process():
    for _ in range(2):
        _, _, audit, _ = time_tiny(rounds=1, samples=3)
        assert audit.passed


def test_read_bandwidth_probe_is_plausible():
    protocol = TimingProtocol(rounds=1, samples=1, warmup=0)
    backend = cuda_backend(protocol)
    m = measure([tiny_unit()], protocol, backend)
    bw = m.read_bandwidth_bytes_per_s
    assert bw is not None and 1e11 < bw < 2e13 and m.read_floor.bytes_per_s == bw


def test_the_read_floor_is_its_best_layout_beats_torch_sum_and_stays_under_the_datasheet():
    from moebench.tasks.probe import run_read_floor
    from moebench.timing.read_floor import READ_CONFIGS
    floor = run_read_floor(samples=20)
    assert floor is not None and set(floor.configs) == {c.name for c in READ_CONFIGS}
    assert floor.bytes_per_s == max(floor.configs.values()) == floor.configs[floor.config]
    # the read it replaces: torch.sum over the same GiB, timed by events, warm clocks
    buf = torch.zeros(floor.nbytes // 4, dtype=torch.float32, device="cuda")
    out = torch.zeros((), device="cuda")
    for _ in range(20):
        torch.sum(buf, dim=0, out=out)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        torch.sum(buf, dim=0, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    torch_sum = floor.nbytes / sorted(times)[len(times) // 2]
    assert floor.bytes_per_s > torch_sum
    if floor.datasheet_bytes_per_s:  # a read faster than the datasheet would be a timing error
        assert 0.8 * floor.datasheet_bytes_per_s < floor.bytes_per_s < floor.datasheet_bytes_per_s


@pytest.mark.parametrize("timer", ["cupti", "events", "none"])
def test_probe_single_kernel(timer):
    from moebench.tasks.probe import run_probe
    res = run_probe("add", mib=64, samples=20, warmup=2, timer=timer)
    if timer == "none":
        assert res.median_ns is None
        return
    assert res.audit.passed and res.median_ns > 0
    if timer == "cupti":
        assert len(res.kernel_names) == 1 and "_add" in res.kernel_names[0]


def test_spin_probes_last_about_as_long_as_asked():
    from moebench.tasks.probe import run_probe
    empty = run_probe("empty", samples=20, warmup=2)
    spin = {us: run_probe("spin", samples=20, warmup=2, us=us) for us in (2, 20, 200)}
    assert empty.audit.passed and all(r.audit.passed for r in spin.values())
    assert "spin_kernel" in spin[20].kernel_names[0]
    assert empty.median_ns < spin[2].median_ns < spin[20].median_ns < spin[200].median_ns
    # cycles counted at the maximum SM clock: at a lower clock the wait only grows
    assert 0.9 * 200_000 < spin[200].median_ns < 2.0 * 200_000


def test_reduce_probe_adds_and_reports_its_rate():
    import torch

    from moebench.tasks.probe import REDUCE_PASSES, probe_unit, run_probe
    unit, _, nbytes = probe_unit("reduce", 4, torch.device("cuda", 0))
    target = next(c.cell_contents for c in unit.run.__closure__ if isinstance(c.cell_contents, torch.Tensor))
    unit.run()
    torch.cuda.synchronize()
    assert nbytes == REDUCE_PASSES * 4 * 2**20 and bool((target == 0.5 + REDUCE_PASSES).all())
    res = run_probe("reduce", mib=16, samples=20, warmup=2)
    assert res.audit.passed and list(res.kernel_names) == ["moebench_probe_reduce"]
    assert 1e11 < res.bytes_moved / (res.median_ns * 1e-9) < 5e13
    # on 4 SMs, one 1024-thread CTA each: every element still takes every pass, and 4 SMs are slower
    unit, _, alone_bytes = probe_unit("reduce", 4, torch.device("cuda", 0), sms=4)
    target = next(c.cell_contents for c in unit.run.__closure__ if isinstance(c.cell_contents, torch.Tensor))
    unit.run()
    torch.cuda.synchronize()
    assert alone_bytes == nbytes and bool((target == 0.5 + REDUCE_PASSES).all())
    few = run_probe("reduce", mib=16, samples=20, warmup=2, sms=4)
    assert few.audit.passed and few.median_ns > res.median_ns
    with pytest.raises(UserError, match="--sms must be 1 to"):
        probe_unit("reduce", 4, torch.device("cuda", 0), sms=100_000)


def test_wgmma_probes_report_a_rate_below_the_peak():
    import torch

    from moebench.tasks.probe import WGMMA_STEP_FLOPS, WGMMA_STEPS, run_probe
    from moebench.record.device_peaks import fp8_dense_peak
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {op: run_probe(op, samples=10, warmup=2) for op in ("wgmma", "wgmma-step")}
    rate = {}
    for op, r in res.items():
        assert r.audit.passed and list(r.kernel_names) == [f"moebench_probe_{op.replace('-', '_')}"]
        assert r.flops == sms * WGMMA_STEPS * WGMMA_STEP_FLOPS
        rate[op] = r.flops / (r.median_ns * 1e-9)
    peak = fp8_dense_peak(torch.cuda.get_device_name())
    if peak is not None:
        assert 0.1 * peak.fp8_dense_flops_per_s < rate["wgmma"] < 1.05 * peak.fp8_dense_flops_per_s
    assert rate["wgmma-step"] < 1.05 * rate["wgmma"]  # the wait and the promotion add work, never remove it
    l2 = run_probe("gate-up-l2", samples=5, warmup=1)
    assert l2.audit.passed and l2.kernel_names == ["moebench_prefill_gate_up"]
    assert 0 < l2.flops / (l2.median_ns * 1e-9) < 1.05 * rate["wgmma"]  # the kernel's loads only add time


def test_variant_and_profile_on_the_gpu(tmp_path):
    """A variant of the stock arm (PDL off) timed beside it in one paired run, and the stock arm
    run untimed for a profiler, on the real backend."""
    from moebench.run.plan import RunRequest
    from moebench.tasks.profile import profile_arm
    from moebench.run.runner import run
    req = RunRequest(shapes=("Q8",), arms=("triton",), variants=("nopdl=triton:pdl=false",), rounds=2, samples=5,
                     warmup=1, out_dir=str(tmp_path), measure_bandwidth=False)
    result, _ = run(req)
    assert result.settings.arms == ("triton", "nopdl") and result.audit.passed
    assert {a.name: a.identity.get("variant") for a in result.arms}["nopdl"] == {"of": "triton",
                                                                               "settings": {"pdl": False}}
    p = profile_arm(RunRequest(shapes=("Q8",), arms=("triton",)), calls=3)
    assert p.parity[0].passed and p.calls == 3 and p.kernels
