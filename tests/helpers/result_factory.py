"""Realistic synthetic RunResults for CPU tests of reports, plots and compare.

Times are drawn from a seeded generator around a base per (shape, arm), with a per-round
drift (what paired rounds cancel in a ratio) and per-sample jitter. Summaries and ratios
are filled the way DESIGN.md defines them (row = a round's median, arm = median of rows,
ratio = median over rounds of ref-row / arm-row), computed here independently of
moebench.analysis.stats so the two can be checked against each other.
"""

from __future__ import annotations

import hashlib
import random
import re
import statistics
from dataclasses import replace

from moebench.record.schema import (
    SCHEMA_VERSION, ArmInfo, ArmSummary, Audit, ClockSample, DeclaredKernel, FixtureInfo, Floors,
    GpuInfo, KernelRecord, ParityInfo, Provenance, RatioSummary, RunResult, Sample, Settings,
)

READ_BANDWIDTH = 4.3e12  # bytes/s, what a device-to-device read measured on the H200

# family letter -> (K, E, top_k, N)
FAMILIES = {"A": (7168, 257, 9, 256), "Q": (2048, 512, 10, 256), "T": (256, 8, 2, 256)}

# Kernels each arm launches per sample: (label, CUPTI name, share of the sample's time).
ARM_KERNELS = {
    "triton": (("gemm1", "fused_moe_kernel", 0.46), ("swiglu", "act_and_mul_kernel", 0.06),
               ("requant", "per_token_group_quant_fp8", 0.05), ("gemm2", "fused_moe_kernel", 0.38),
               ("combine", "moe_sum_kernel", 0.05)),
    "cuda-fused": (("fused", "sm90_fused_moe_w8a8", 1.0),),
}
ARM_KERNELS["sglang"] = ARM_KERNELS["triton"]  # the referee declares the same five kernels
GENERIC_KERNELS = (("gemm1", "gemm1_kernel", 0.55), ("gemm2", "gemm2_kernel", 0.45))

# Each arm's time over the fastest's.
ARM_SLOWDOWN = {"triton": 1.6, "sglang": 1.6, "cuda-fused": 1.0, "cuda-swapab": 1.25}


def base_time_ns(shape: str, arm: str) -> float:
    """The HBM floor at the measured read bandwidth, plus overhead, slowed by the arm."""
    floor_ns = fixture_info(shape).floors.hbm_bytes / READ_BANDWIDTH * 1e9
    return (1.15 * floor_ns + 12_000) * ARM_SLOWDOWN.get(arm, 1.3)


def fixture_info(shape: str, balancedness: float = 0.8, salt: str = "") -> FixtureInfo:
    family, M = shape[0], int(shape[1:])
    K, E, top_k, N = FAMILIES[family]
    I = N // 2
    experts = min(E, 8 + 6 * M)
    weight = experts * (N * K + K * I + 4 * ((N // 128) * (K // 128) + (K // 128) * (I // 128)))
    activation = M * K + 4 * M * (K // 128) + 8 * M * top_k
    output = 2 * M * K
    floors = Floors(experts_routed=experts, weight_bytes=weight, activation_bytes=activation,
                    output_bytes=output, hbm_bytes=weight + activation + output,
                    flops=M * top_k * (2 * N * K + 2 * K * I))
    digest = hashlib.sha256(f"{shape}{salt}".encode()).hexdigest()
    return FixtureInfo(name=shape, family=family, M=M, K=K, E=E, top_k=top_k, N=N,
                       seed=int(digest[:6], 16), balancedness=balancedness, fingerprint=digest,
                       floors=floors, tokens_per_expert={"min": 1.0, "median": 2.0, "max": float(M)})


def make_result(shapes=("A8", "A128"), arms=("triton", "cuda-fused"), *, rounds: int = 5,
                samples: int = 8, warmup: int = 2, seed: int = 0, scale: dict | None = None,
                jitter: float = 0.004, drift: float = 0.002, timer: str = "cupti",
                flush: str = "read", fingerprint_salt: str = "",
                read_bandwidth: float | None = READ_BANDWIDTH) -> RunResult:
    """A RunResult as a run of `shapes` x `arms` would save it.

    `scale` multiplies times: keys are arm names or (shape, arm) pairs (a constructed
    regression is `scale={"cuda-fused": 1.10}`). `drift` is the per-round spread of all
    arms together (paired rounds cancel it), `jitter` the per-sample spread.
    """
    rng = random.Random(seed)
    scale = scale or {}
    ref = arms[0]
    out_samples: list[Sample] = []
    rows: dict[tuple[str, str], list[float]] = {}
    values: dict[tuple[str, str], list[int]] = {}
    spans: dict[tuple[str, str], list[int]] = {}
    clock_ns = 10**12
    ext = 0
    for r in range(1, rounds + 1):
        round_factor = 1.0 + rng.gauss(0.0, drift)
        order = arms if r % 2 else tuple(reversed(arms))
        for shape in shapes:
            for arm in order:
                factor = scale.get((shape, arm), scale.get(arm, 1.0))
                base = base_time_ns(shape, arm) * factor * round_factor
                kernels_spec = ARM_KERNELS.get(arm, GENERIC_KERNELS)
                round_values = []
                for i in range(samples):
                    ext += 1
                    total = base * (1.0 + abs(rng.gauss(0.0, jitter)))
                    kernels, t = [], clock_ns
                    for _label, name, share in kernels_spec:
                        dur = max(1, round(total * share))
                        kernels.append(KernelRecord(name=name, start_ns=t, end_ns=t + dur))
                        t += dur + 1500  # launch gap: counts in gpu_span, not in gpu_sum
                    clock_ns = t + 200_000
                    if timer == "events":
                        s = Sample(shape, arm, r, i, 0, events_ns=round(total) + 3000)
                    else:
                        s = Sample(shape, arm, r, i, ext, kernels=tuple(kernels))
                    out_samples.append(s)
                    round_values.append(s.value_ns)
                    values.setdefault((shape, arm), []).append(s.value_ns)
                    spans.setdefault((shape, arm), []).append(s.gpu_span_ns)
                rows.setdefault((shape, arm), []).append(float(statistics.median(round_values)))

    fixtures = tuple(fixture_info(s, salt=fingerprint_salt) for s in shapes)
    floors = {f.name: f.floors for f in fixtures}
    summaries = []
    for shape in shapes:
        for arm in arms:
            row = rows[(shape, arm)]
            median = float(statistics.median(row))
            bw = floors[shape].hbm_bytes / (median * 1e-9)
            summaries.append(ArmSummary(
                shape=shape, arm=arm, median_ns=median, row_medians_ns=tuple(row),
                min_ns=min(row), max_ns=max(row),
                samples=len(values[(shape, arm)]),
                span_median_ns=float(statistics.median(spans[(shape, arm)])) if timer == "cupti" else None,
                hbm_bandwidth_bytes_per_s=bw,
                fraction_of_read_bandwidth=bw / read_bandwidth if read_bandwidth else None))
    ratios = []
    for shape in shapes:
        for arm in arms[1:]:
            per_round = tuple(a / b for a, b in zip(rows[(shape, ref)], rows[(shape, arm)]))
            ratios.append(RatioSummary(
                shape=shape, ref=ref, arm=arm, median=float(statistics.median(per_round)),
                low=min(per_round), high=max(per_round), per_round=per_round,
                rounds_won=sum(1 for x in per_round if x > 1.0), rounds=rounds))

    arm_infos = tuple(
        ArmInfo(name=arm, description=f"{arm} path", shape=shape,
                kernels=tuple(DeclaredKernel(label, re.escape(name), 1)
                              for label, name, _ in ARM_KERNELS.get(arm, GENERIC_KERNELS)),
                identity={"config": {"BLOCK_M": 64, "BLOCK_N": 128}, "source_sha256":
                          hashlib.sha256(arm.encode()).hexdigest()})
        for shape in shapes for arm in arms)
    parity = tuple(ParityInfo(shape=shape, arm=arm, rel_l2=2.1e-3, max_abs=0.03, nonfinite=0,
                              threshold=1e-2, passed=True) for shape in shapes for arm in arms)
    gpu = GpuInfo(name="NVIDIA H200", index=0, uuid="GPU-00000000-0000-0000-0000-000000000000",
                  compute_capability="9.0", sm_count=132, l2_bytes=60 * 2**20,
                  memory_bytes=143_771_369_472, driver="580.159", cuda_runtime="13.0",
                  max_sm_clock_mhz=1980, max_mem_clock_mhz=3201,
                  read_bandwidth_bytes_per_s=read_bandwidth)
    argv = ["moebench", "run", "--shape", ",".join(shapes), "--arms", ",".join(arms),
            "--rounds", str(rounds), "--samples", str(samples)]
    provenance = Provenance(
        command=tuple(argv), tool_version="0.1.0", git_commit="7902512" + "0" * 33, git_dirty=False,
        hostname="h200-test", started_at="2026-11-29T18:00:00Z", finished_at="2026-11-29T18:02:00Z",
        python="3.12.3", libraries={"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda-core": "1.2.0"},
        gpu=gpu)
    settings = Settings(shapes=tuple(shapes), arms=tuple(arms), ref=ref, rounds=rounds,
                        samples=samples, warmup=warmup, flush=flush, flush_bytes=2 * 60 * 2**20 * 2,
                        timer=timer, balancedness=0.8)
    clocks = tuple(ClockSample(round=r, sm_mhz=1980, mem_mhz=3201, temperature_c=40 + r,
                               power_w=300.0 + r) for r in range(1, rounds + 1))
    total = len(out_samples)
    return RunResult(schema_version=SCHEMA_VERSION, provenance=provenance, settings=settings,
                     fixtures=fixtures, arms=arm_infos, parity=parity, samples=tuple(out_samples),
                     clocks=clocks, audit=Audit(samples_total=total, samples_passed=total, dropped_records=0),
                     summaries=tuple(summaries), ratios=tuple(ratios))


def sweep_result(family: str = "A", ms=(1, 2, 4, 8, 16, 32, 64, 128), **kwargs) -> RunResult:
    """One family at several M, as `moebench sweep --family A --m 1,2,4,...` saves it."""
    return make_result(shapes=tuple(f"{family}{m}" for m in ms), **kwargs)


def with_schema_version(result: RunResult, version: int) -> RunResult:
    return replace(result, schema_version=version)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """Run `moebench ARGV` in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from moebench.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return code, out.getvalue(), err.getvalue()
