"""Synthetic RunResults and record streams for CPU tests of timing, stats and results."""

from __future__ import annotations

from moebench.record.schema import (
    AUDITED_SAMPLES, SCHEMA_VERSION, ArmInfo, ArmSummary, Audit, AuditFinding, ClockSample, DeclaredKernel, FixtureInfo,
    Floors, GpuInfo, ParityInfo, Provenance, RatioSummary, RunResult, Sample, KernelRecord, Settings,
)


def make_result(timer: str = "cupti", failed: bool = False) -> RunResult:
    gpu = GpuInfo("NVIDIA H200", 0, "GPU-x", "9.0", 132, 60 * 2**20, 141 * 2**30, "580.159", "13.0",
                  1980, 3201, 4.0e12)
    prov = Provenance(("moebench", "run", "--shape", "A8"), "0.1.0", "abc123", False, "host",
                      "2026-11-29T00:00:00Z", "2026-11-29T00:00:30Z", "3.12.0", {"torch": "2.11.0"}, gpu)
    settings = Settings(("A8",), ("triton", "triton-swapab"), "triton", 2, 2, 1, "read", 256 * 2**20,
                        timer, 0.8)
    floors = Floors(57, 150_000_000, 100_000, 100_000, 150_200_000, 400_000_000)
    fx = FixtureInfo("A8", "A", 8, 7168, 257, 9, 256, 28101, 0.8, "f" * 64, floors,
                     {"min": 1.0, "median": 1.0, "max": 8.0})
    decl = (DeclaredKernel("gemm1", "gemm1", 1),)
    arms = tuple(ArmInfo(a, a, "A8", decl, {"config": "x"}) for a in settings.arms)
    parity = tuple(ParityInfo("A8", a, 1e-4, 0.01, 0, 1e-2, True) for a in settings.arms)
    samples = []
    for r in (1, 2):
        for a, base in (("triton", 100_000), ("triton-swapab", 80_000)):
            for i in range(2):
                ext = len(samples) + 1
                if timer == "cupti":
                    samples.append(Sample("A8", a, r, i, ext, (KernelRecord("gemm1", 1000 * ext, 1000 * ext + base + i),)))
                else:
                    samples.append(Sample("A8", a, r, i, 0, (), base + i))
    findings = (AuditFinding("A8", "triton", 1, 0, "2 kernels, expected 1"),) if failed else ()
    audit = Audit(len(samples), len(samples) - len(findings), 0, findings)
    # The stored statistics are what the samples give (a loaded file is checked against them).
    from moebench.analysis.stats import summarize
    passed = samples if not failed else samples[1:]
    summaries, ratios = summarize(passed, settings.shapes, settings.arms, settings.ref, {"A8": floors.hbm_bytes},
                                  gpu.read_bandwidth_bytes_per_s)
    clocks = (ClockSample(1, 1980, 3201, 40, 300.5), ClockSample(2, None, None, None, None))
    return RunResult(SCHEMA_VERSION, prov, settings, (fx,), arms, parity, tuple(samples), clocks, audit,
                     summaries, ratios, statistics_over=AUDITED_SAMPLES)


# --- a fake GPU and tracer: synthetic CUPTI record streams from the real engine loop ----

from moebench.timing.records import ExternalRec, KernelRec, RecordBatch  # noqa: E402


class FakeGpu:
    """Kernels run back to back on one stream; each launch gets a correlation id and, while
    an external id is pushed, an external-correlation record — like CUPTI with API tracing."""

    def __init__(self, gap_ns: int = 1000):
        self.now = 1_000_000
        self.gap_ns = gap_ns
        self.corr = 0
        self.ext_stack: list[int] = []
        self.batch = RecordBatch()
        self.launch_log: list[str] = []
        self.capturing: list[tuple[str, int]] | None = None

    def launch(self, name: str, duration_ns: int) -> None:
        if self.capturing is not None:  # a stream capture records the launch, runs nothing
            self.capturing.append((name, duration_ns))
            return
        self.corr += 1
        start = self.now + self.gap_ns
        self.now = start + duration_ns
        self.batch.kernels.append(KernelRec(name, start, self.now, self.corr))
        self.batch.api_records += 1
        if self.ext_stack:
            self.batch.externals.append(ExternalRec(self.corr, self.ext_stack[-1]))
        self.launch_log.append(name)


    def capture(self, fn):
        """Like a CUDA graph: `fn`'s launches recorded once; each replay is one graph launch,
        whose kernels all carry that launch's correlation id."""
        self.capturing = []
        try:
            fn()
            nodes = tuple(self.capturing)
        finally:
            self.capturing = None

        def replay():
            self.corr += 1
            self.batch.api_records += 1
            if self.ext_stack:
                self.batch.externals.append(ExternalRec(self.corr, self.ext_stack[-1]))
            for name, duration_ns in nodes:
                start = self.now + self.gap_ns // 10  # no host between a graph's kernels
                self.now = start + duration_ns
                self.batch.kernels.append(KernelRec(name, start, self.now, self.corr))
                self.launch_log.append(name)
        return replay


class FakeTracer:
    """CUPTI-like record batches from the FakeGpu, per round."""

    def __init__(self, gpu: FakeGpu, drop_in_round: int | None = None):
        self.gpu = gpu
        self.rounds = 0
        self.drop_in_round = drop_in_round
        self.closed = False

    def begin(self, external_id: int) -> None:
        self.gpu.ext_stack.append(external_id)

    def end(self, external_id: int) -> None:
        assert self.gpu.ext_stack.pop() == external_id

    def collect(self) -> RecordBatch:
        self.rounds += 1
        batch, self.gpu.batch = self.gpu.batch, RecordBatch()
        if self.drop_in_round == self.rounds:
            batch.dropped = 3
        return batch

    def close(self) -> None:
        self.closed = True


def fake_kernels(gpu: FakeGpu, names_durations):
    def run():
        for name, dur in names_durations:
            gpu.launch(name, dur)
    return run
