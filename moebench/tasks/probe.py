"""A single-kernel workload for checking the timer against Nsight Compute, and the reader
of ncu's CSV. `moebench probe` times the workload exactly as `moebench run` times an arm;
under ncu, `--timer none` just launches it.

It is one more front end of the measurement core (moebench.timing.measure): one unit, one round.
The workload is one torch elementwise kernel (`add`: c = a + b, fp32; `mul`: c = 2a), a
pure streaming kernel whose cold time is what the L2 flush and the timer decide; or one
kernel that only waits (`spin`: torch's spin kernel for `--us` microseconds of SM clock
cycles at the device's maximum SM clock; `empty`: the same kernel told to wait 0 cycles), whose
time no memory decides: timed by moebench and by ncu, they show the offset between the two
tools as a function of the kernel's length (scripts/h200.sh stage `ncu-offset`). `reduce` is
the fused arms' combine instruction alone (16-byte BF16x2 reductions, kernels/sm90_reduce_probe.cu):
its rate over a buffer that fits in L2 is the ceiling of an epilogue that reduce-adds.
`wgmma` and `wgmma-step` are the prefill kernels' tensor-core work alone (kernels/sm90_wgmma_probe.cu:
wgmma m64n128k32 e4m3 from shared memory, two warpgroups a CTA, one CTA an SM; `wgmma-step` with
the kernels' wait and block-scale promotion every K step): their rate is the ceiling of those
kernels' FLOPs on this GPU, beside the datasheet's peak. `gate-up-l2` is the prefill gate_up kernel
itself on a plan whose operands stay in L2 (GATE_UP_L2: every block reads one of 64 groups of
rows of 256 tokens, and one of 8 experts' weights): its rate is the kernel's without HBM.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from statistics import median

import torch

from moebench.choices import PROBE_OPS
from moebench.errors import UserError
from moebench.record.schema import Audit, DeclaredKernel, Sample
from moebench.timing.engine import Unit

OPS = PROBE_OPS  # op: (kernel pattern, tensors read, tensors written), defined where --help reads it
REDUCE_PASSES = 8  # sweeps of the reduce probe over its buffer
REDUCE_CTAS_PER_SM = 8  # its grid: 256-thread CTAs an SM
# `--sms N`: one CTA of 1024 threads on each of N SMs, held alone there by its shared memory (more
# than half of the 228 KB an sm_90 SM has; the kernel does not touch it)
REDUCE_ALONE_THREADS, REDUCE_ALONE_SMEM = 1024, 116 * 1024
WGMMA_OPS = ("wgmma", "wgmma-step")
WGMMA_STEPS = 8192  # K steps of 128 a CTA: a few ms at the dense peak
WGMMA_STEP_FLOPS = 2 * 4 * 2 * 64 * 128 * 32  # a CTA's K step: 2 warpgroups x 4 wgmma m64n128k32
FLOPS_OPS = WGMMA_OPS + ("gate-up-l2",)
# gate-up-l2's problem: family A's K and one requant group (I = 128), BLOCKS blocks of 64 slots
# (8 rounds of 132 SMs), their slots drawn from 64 groups of 64 (256 tokens at top_k 16) and their
# experts from 8: x's rows read 1.8 MB, w1 14.7 MB, all of it L2-resident on an H100/H200.
GATE_UP_L2 = dict(K=7168, I=128, E=8, top_k=16, blocks=1056, groups=64)
WAIT_OPS = ("spin", "empty")
TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
                 "second": 1e9, "s": 1e9}


def spin_cycles(us: float, sm_mhz: int | None) -> int:
    """SM clock cycles that last `us` microseconds at `sm_mhz`."""
    if sm_mhz is None or sm_mhz <= 0:
        raise UserError("--op spin needs the device's maximum SM clock, which NVML did not give (see `moebench doctor`)")
    if not 0 < us <= 100_000:
        raise UserError(f"--us must be above 0 and at most 100000 (microseconds), got {us:g}")
    return round(us * sm_mhz)


def probe_unit(op: str, mib: int, device: torch.device, cycles: int = 0,
               sms: int | None = None) -> tuple[Unit, DeclaredKernel, int]:
    """The workload as a Unit, its declared kernel, and the bytes it moves, or for FLOPS_OPS the
    FLOPs it runs (`cycles`: how long the spin kernel waits; `sms`: the reduce probe's SMs)."""
    if op not in OPS:
        raise UserError(f"unknown probe op {op!r} (known: {', '.join(OPS)})")
    if mib < 1:
        raise UserError("--mib must be at least 1")
    pattern, reads, writes = OPS[op]
    if op in WAIT_OPS:
        decl = DeclaredKernel(op, pattern, 1)
        wait = cycles if op == "spin" else 0
        return Unit("_probe", op, lambda: torch.cuda._sleep(wait), kernels=(decl,)), decl, 0
    if op == "reduce":
        return reduce_unit(mib, device, sms)
    if op in FLOPS_OPS:
        return flops_unit(op, device)
    n = mib * 2**20 // 4
    a = torch.ones(n, dtype=torch.float32, device=device)
    c = torch.empty_like(a)
    if op == "add":
        b = torch.ones_like(a)
        run = lambda: torch.add(a, b, out=c)  # noqa: E731
    else:
        run = lambda: torch.mul(a, 2.0, out=c)  # noqa: E731
    decl = DeclaredKernel(op, pattern, 1)
    return Unit("_probe", op, run, kernels=(decl,)), decl, (reads + writes) * n * 4


def reduce_unit(mib: int, device: torch.device, sms: int | None = None) -> tuple[Unit, DeclaredKernel, int]:
    """The reduce probe (kernels/sm90_reduce_probe.cu): REDUCE_PASSES sweeps of 16-byte BF16x2
    reductions over a `mib` MiB buffer, on every SM or on `sms` of them; the bytes are the
    reductions'."""
    import numpy as np

    from moebench.kernels.cuda.launch import bind_launch
    from moebench.kernels.cuda.nvrtc import compile_source
    from moebench.kernels.cuda.source import KernelSource
    every = torch.cuda.get_device_properties(device).multi_processor_count
    if sms is not None and not 1 <= sms <= every:
        raise UserError(f"--sms must be 1 to {every} (this GPU's SMs), got {sms}")
    module = compile_source(KernelSource.shipped("sm90_reduce_probe.cu"))
    kernel = module.kernel(OPS["reduce"][0], device.index)
    target = torch.full((mib * 2**20 // 2,), 0.5, dtype=torch.bfloat16, device=device)
    chunks = target.numel() // 8
    if sms is None:
        grid, block, smem = every * REDUCE_CTAS_PER_SM, 256, 0
    else:
        grid, block, smem = sms, REDUCE_ALONE_THREADS, REDUCE_ALONE_SMEM
    launch = bind_launch(kernel, (grid, 1, 1), (block, 1, 1), smem, np.uint64(target.data_ptr()), np.int64(chunks),
                         np.int32(REDUCE_PASSES))

    def run() -> None:
        _ = target
        launch()
    decl = DeclaredKernel("reduce", OPS["reduce"][0], 1)
    return Unit("_probe", "reduce", run, kernels=(decl,)), decl, REDUCE_PASSES * chunks * 16


def wgmma_unit(op: str, device: torch.device) -> tuple[Unit, DeclaredKernel, int]:
    """The wgmma probe (kernels/sm90_wgmma_probe.cu) on one CTA an SM, WGMMA_STEPS K steps each;
    the FLOPs it runs. Its tiles come from FP8 values of a seeded normal draw (finite, not zeros:
    the tensor cores' power, so the clock, depends on the operands)."""
    import numpy as np

    from moebench.kernels.cuda.launch import bind_launch, raise_shared_limit
    from moebench.kernels.cuda.nvrtc import compile_source
    from moebench.kernels.cuda.source import KernelSource
    module = compile_source(KernelSource.shipped("sm90_wgmma_probe.cu"))
    name = OPS[op][0]
    kernel = module.kernel(name, device.index)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tiles = torch.randn(64 * 128 + 256 * 128, generator=gen).to(torch.float8_e4m3fn).view(torch.uint8).to(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    sink = torch.empty(sms * 256, dtype=torch.float32, device=device)
    smem = tiles.numel() + 16 + 1024  # the .cu's PROBE_SMEM
    raise_shared_limit(kernel, smem, device.index)
    launch = bind_launch(kernel, (sms, 1, 1), (256, 1, 1), smem, np.uint64(tiles.data_ptr()),
                         np.uint64(sink.data_ptr()), np.int32(WGMMA_STEPS))

    def run() -> None:
        _ = (tiles, sink)
        launch()
    decl = DeclaredKernel(op, name, 1)
    return Unit("_probe", op, run, kernels=(decl,)), decl, sms * WGMMA_STEPS * WGMMA_STEP_FLOPS


def gate_up_l2_plan(blocks: int, groups: int, E: int, block_m: int = 64):
    """The route plan of gate-up-l2 (CPU tensors): block b lists slots (b % groups) * block_m +
    0..block_m-1 and expert b % E; num_slots = blocks * block_m, every block real, the buffers
    padded (sentinel slots, expert -1) to the capacity the plan checks ask of that many slots."""
    from moebench.fixtures.routing import RoutePlan, plan_capacity
    slots = blocks * block_m
    cap = plan_capacity(slots, E, block_m)
    b = torch.arange(blocks, dtype=torch.int32)
    sorted_ids = torch.full((cap,), slots, dtype=torch.int32)
    sorted_ids[:slots] = ((b % groups)[:, None] * block_m + torch.arange(block_m, dtype=torch.int32)).reshape(-1)
    expert_ids = torch.full((cap // block_m,), -1, dtype=torch.int32)
    expert_ids[:blocks] = b % E
    return RoutePlan(block_m, sorted_ids, expert_ids, torch.tensor([slots], dtype=torch.int32), slots)


def gate_up_l2_unit(device: torch.device) -> tuple[Unit, DeclaredKernel, int]:
    """The prefill gate_up kernel (fused_prefill) alone, on GATE_UP_L2's plan: its operands are
    in L2 after the first reads, so what is left of its time is the kernel's own. The slots are
    M * top_k rows of which the plan reads the first groups * 64 (the tokens they name, 256, are
    the x rows read); seeded normal FP8 operands, positive scales."""
    from moebench.kernels.cuda.fused_prefill import make_prefill_launch, prefill_weights
    c = GATE_UP_L2
    K, I, E, top_k, blocks = c["K"], c["I"], c["E"], c["top_k"], c["blocks"]
    plan = gate_up_l2_plan(blocks, c["groups"], E)
    M = plan.num_slots // top_k
    gen = torch.Generator(device="cpu").manual_seed(0)

    def fp8(*shape):
        return (0.5 * torch.randn(*shape, generator=gen)).to(torch.float8_e4m3fn).to(device)
    w1, w2 = fp8(E, 2 * I, K), fp8(E, K, I)
    w1_scale = torch.full((E, 2 * I // 128, K // 128), 1e-2, device=device)
    w2_scale = torch.full((E, K // 128, I // 128), 1e-2, device=device)
    x = torch.zeros(M, K, dtype=torch.float8_e4m3fn, device=device)
    x[: c["groups"] * 64 // top_k] = fp8(c["groups"] * 64 // top_k, K)
    x_scale = torch.full((M, K // 128), 1e-2, device=device)
    topk_weights = torch.full((M, top_k), 1.0 / top_k, device=device)
    launch, _, _, dims = make_prefill_launch(x, x_scale, prefill_weights(w1, w1_scale, w2, w2_scale), plan.to(device),
                                             topk_weights, blocks=blocks, overlap=False)
    gate_up = dims["launches"][0]

    def run() -> None:
        _ = launch  # (its tensors and descriptors)
        gate_up()
    decl = DeclaredKernel("gate_up", OPS["gate-up-l2"][0], 1)
    return Unit("_probe", "gate-up-l2", run, kernels=(decl,)), decl, blocks * 2 * 64 * 2 * I * K


def flops_unit(op: str, device: torch.device) -> tuple[Unit, DeclaredKernel, int]:
    """A probe whose rate is its FLOPs (FLOPS_OPS): the unit, its kernel and the FLOPs a sample runs."""
    return wgmma_unit(op, device) if op in WGMMA_OPS else gate_up_l2_unit(device)


@dataclass(frozen=True)
class ProbeResult:
    op: str
    bytes_moved: int
    samples: tuple[Sample, ...]
    audit: Audit
    timer: str
    audited: tuple[Sample, ...] = ()  # the samples the audit passed
    flops: int = 0  # (FLOPS_OPS) the FLOPs one sample runs

    @property
    def timed(self) -> bool:
        """False when the timer only launched the workload (for an outside profiler)."""
        return bool(self.samples)

    @property
    def values_ns(self) -> list[int]:
        return [s.value_ns for s in self.audited]

    @property
    def median_ns(self) -> float | None:
        vals = self.values_ns
        return float(median(vals)) if vals else None

    @property
    def kernel_names(self) -> list[str]:
        return sorted({k.name for s in self.samples for k in s.kernels})


def parse_ncu_csv(text: str, metric: str = "gpu__time_duration.sum", kernel_regex: str | None = None) -> list[float]:
    """Values (ns) of `metric` from `ncu --csv` output, one per profiled kernel, in order.
    Lines before the CSV header (ncu's ==PROF== chatter, the program's output) are skipped."""
    import re
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise UserError("no ncu CSV header (\"ID\",...) found; run ncu with --csv")
    values = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != metric:
            continue
        if kernel_regex and not re.search(kernel_regex, row.get("Kernel Name", "")):
            continue
        unit = (row.get("Metric Unit") or "nsecond").strip()
        if unit not in TIME_UNITS_NS:
            raise UserError(f"ncu metric unit {unit!r} is not a time unit")
        values.append(float(row["Metric Value"].replace(",", "")) * TIME_UNITS_NS[unit])
    if not values:
        raise UserError(f"no {metric} values in the ncu CSV")
    return values


def run_probe(op: str = "add", mib: int = 256, samples: int = 100, warmup: int = 10, flush: str = "read",
              timer: str = "cupti", backend=None, us: float = 20.0, sms: int | None = None) -> ProbeResult:
    """Time the workload like an arm: one round, `samples` cold samples, audited. Timer
    `none` only launches it. `sms`: the reduce probe on that many SMs, one CTA each."""
    from moebench.timing.measure import MAX_SAMPLES, TimingProtocol, check_protocol, cuda_backend, measure
    from moebench.timing.timers import CUDA_TIMERS

    protocol = TimingProtocol(rounds=1, samples=samples, warmup=warmup, flush=flush, timer=timer,
                              measure_bandwidth=False)
    if not (1 <= samples <= MAX_SAMPLES and 0 <= warmup <= MAX_SAMPLES):
        raise UserError(f"--samples must be 1 to {MAX_SAMPLES:,}, --warmup 0 to {MAX_SAMPLES:,}")
    check_protocol(protocol, timers=tuple(CUDA_TIMERS))
    if not 1 <= mib <= 65536:
        raise UserError(f"--mib must be 1 to 65536 (MiB per tensor), got {mib}")
    if sms is not None and op != "reduce":
        raise UserError("--sms applies only to --op reduce")
    if sms is not None and sms < 1:
        raise UserError(f"--sms must be at least 1, got {sms}")
    if not 0 <= us <= 1e6:  # NaN fails this too; a second of spinning is no probe
        raise UserError(f"--us must be 0 to 1,000,000 microseconds, got {us:g}")
    backend = backend if backend is not None else cuda_backend(protocol)
    cycles = spin_cycles(us, backend.gpu.max_sm_clock_mhz if backend.gpu else None) if op == "spin" else 0
    unit, _, amount = probe_unit(op, mib, backend.device, cycles, sms)
    nbytes, flops = (0, amount) if op in FLOPS_OPS else (amount, 0)
    m = measure([unit], protocol, backend)
    return ProbeResult(op, nbytes, m.samples, m.audit, m.timer, tuple(m.audited_samples), flops)


def run_read_floor(samples: int = 20, flush: str = "read", timer: str = "cupti", backend=None):
    """`probe --op read`: the run's read floor alone (moebench.timing.read_floor), every layout of the
    read kernel timed cold after the warm-up burst; the ReadFloor, or None when no layout's
    samples passed the audit. Timer `none` cannot read a floor."""
    from moebench.timing.measure import MAX_SAMPLES, TimingProtocol, check_protocol, cuda_backend, measured_read_floor
    from moebench.timing.timers import CUDA_TIMERS
    if timer == "none":
        raise UserError("--op read needs a timer (cupti or events): the floor is a measured rate")
    if not 2 <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be 2 to {MAX_SAMPLES:,} for --op read, got {samples}")
    protocol = TimingProtocol(rounds=1, samples=samples, warmup=0, flush=flush, timer=timer)
    check_protocol(protocol, timers=tuple(CUDA_TIMERS))
    backend = backend if backend is not None else cuda_backend(protocol)
    return measured_read_floor(backend, samples)


@dataclass(frozen=True)
class NcuComparison:
    kernels: int  # ncu's profiled kernels of the workload
    median_ns: float  # ncu's gpu__time_duration.sum, median
    ratio: float  # moebench's median / ncu's
    moebench_ns: float = 0.0  # moebench's median

    @property
    def offset_ns(self) -> float:
        """ncu's median minus moebench's (> 0: ncu reads longer)."""
        return self.median_ns - self.moebench_ns

    def table_row(self, what: str) -> str:
        """One row of the offset table: | workload | moebench µs | ncu µs | ncu − moebench ns | ratio |."""
        return (f"| {what} | {self.moebench_ns / 1e3:.3f} | {self.median_ns / 1e3:.3f} | {self.offset_ns:+.0f} | "
                f"{self.ratio:.4f} |")


def compare_with_ncu(res: ProbeResult, ncu_csv_text: str) -> NcuComparison:
    """The probe's median against ncu's durations of the same workload's kernel."""
    if res.median_ns is None:
        raise UserError("no audited samples to compare with ncu")
    ncu = parse_ncu_csv(ncu_csv_text, kernel_regex=OPS[res.op][0])
    ncu_median = float(median(ncu))
    return NcuComparison(len(ncu), ncu_median, res.median_ns / ncu_median, res.median_ns)
