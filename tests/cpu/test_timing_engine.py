"""The engine loop on the CPU: a fake GPU emits CUPTI-like records for every launch."""

from timing_fakes import FakeGpu, FakeTracer, fake_kernels

from moebench.record.schema import ClockSample, DeclaredKernel
from moebench.timing.audit import audit_intervals, audit_samples
from moebench.timing.engine import EngineConfig, Unit, run_rounds
from moebench.timing.timers import EventTimer, KernelRecordTimer

KERNEL_RECORDS = KernelRecordTimer(open_recorder=None)  # the tests open their fake recorders themselves


def units(gpu, shapes=("A8",)):
    out = []
    for shape in shapes:
        out.append(Unit(shape, "ref", fake_kernels(gpu, [("gemm1", 5000), ("gemm2", 3000)])))
        out.append(Unit(shape, "fast", fake_kernels(gpu, [("fused", 4000)]), reset=lambda: gpu.launch("zero", 100)))
    return out


DECL = {("A8", "ref"): (DeclaredKernel("g1", "gemm1", 1), DeclaredKernel("g2", "gemm2", 1)),
        ("A8", "fast"): (DeclaredKernel("f", "fused", 1),)}


class Markers:
    def __init__(self):
        self.depth, self.max_depth, self.names = 0, 0, []

    def push(self, m):
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        self.names.append(m)

    def pop(self):
        self.depth -= 1


def test_samples_order_and_kernels():
    gpu = FakeGpu()
    tracer = FakeTracer(gpu)
    syncs, clock_rounds, done = [], [], []
    markers = Markers()
    out = run_rounds(units(gpu), EngineConfig(rounds=3, samples=4, warmup=2), tracer, KERNEL_RECORDS,
                     flush=lambda: gpu.launch("flush_reduce", 2000), sync=lambda: syncs.append(1),
                     clocks=lambda r: clock_rounds.append(r) or ClockSample(r, 1980, 3201, 40, 300.0), markers=markers,
                     on_unit_done=lambda r, u, n: done.append((r, u.arm, n)))
    assert len(out.samples) == 3 * 2 * 4
    assert done == [(1, "ref", 4), (1, "fast", 4), (2, "fast", 4), (2, "ref", 4), (3, "ref", 4), (3, "fast", 4)]
    assert len(syncs) == 3 and tracer.rounds == 3 and clock_rounds == [1, 1, 2, 2, 3, 3]  # each round's start and end
    assert [c.round for c in out.clocks] == [1, 2, 3] and out.clocks[0].sm_mhz_start == 1980
    assert markers.depth == 0 and markers.max_depth == 3 and "round 2" in markers.names
    for s in out.samples:
        names = [k.name for k in s.kernels]
        assert names == (["gemm1", "gemm2"] if s.arm == "ref" else ["fused"])
    ref = [s for s in out.samples if s.arm == "ref"]
    assert ref[0].gpu_sum_ns == 8000 and ref[0].gpu_span_ns == 9000  # 1000 ns launch gap
    assert [s.index for s in out.samples[:4]] == [0, 1, 2, 3]
    assert len({s.external_id for s in out.samples}) == len(out.samples)
    # warm-ups and flushes ran but are in no sample; every kernel is kept for the audit
    assert gpu.launch_log.count("flush_reduce") == 3 * 2 * (4 + 2)
    assert len(out.kernels) == len(gpu.launch_log)
    audit = audit_samples(out.samples, DECL, out.kernels, out.dropped_by_round)
    assert audit.passed and audit.samples_passed == 24


def test_dropped_records_fail_the_round():
    gpu = FakeGpu()
    out = run_rounds(units(gpu), EngineConfig(rounds=2, samples=3, warmup=0), FakeTracer(gpu, drop_in_round=2),
                     KERNEL_RECORDS,
                     flush=lambda: gpu.launch("flush", 10))
    audit = audit_samples(out.samples, DECL, out.kernels, out.dropped_by_round)
    assert not audit.passed and audit.dropped_records == 3
    assert audit.samples_passed == 6 and audit.samples_total == 12
    assert audit.findings[0].round == 2 and "dropped" in audit.findings[0].reason


def test_events_timer_path_builds_event_samples():
    class Events:
        def __init__(self):
            self.ids = []

        def begin(self, i):
            self.ids.append(i)

        def end(self, i):
            pass

        def collect(self):
            from moebench.timing.records import RecordBatch
            b = RecordBatch(events_ns={i: 1000 + i for i in self.ids})
            self.ids = []
            return b

        def close(self):
            pass

    gpu = FakeGpu()
    out = run_rounds(units(gpu), EngineConfig(rounds=2, samples=2, warmup=1), Events(), EventTimer(None))
    assert all(s.events_ns and s.events_ns > 1000 and not s.kernels and s.external_id == 0 for s in out.samples)
    audit = audit_intervals(out.samples)
    assert audit.passed and audit.samples_passed == 8


def test_engine_config_checks():
    import pytest
    with pytest.raises(ValueError):
        EngineConfig(rounds=0)
