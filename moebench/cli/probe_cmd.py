"""`moebench probe`: time one single-kernel workload, e.g. to check the timer against ncu."""

from __future__ import annotations

from pathlib import Path

import click

from moebench.choices import FLUSH_MODES
from moebench.choices import PROBE_OPS as OPS
from moebench.timing.timers import CUDA_TIMERS, DEFAULT_TIMER


def flops_rate(flops: int, median_ns: float) -> str:
    """TFLOP/s of `flops` in `median_ns`, and its share of this GPU's datasheet dense FP8 peak."""
    import torch

    from moebench.record.device_peaks import fp8_dense_peak
    rate = flops / (median_ns * 1e-9)
    peak = fp8_dense_peak(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    share = f" ({100 * rate / peak.fp8_dense_flops_per_s:.1f}% of the dense FP8 peak, {peak.tflops:,.0f})" if peak else ""
    return f"{rate / 1e12:,.1f} TFLOP/s{share}"


def read_floor_lines(floor) -> list[str]:
    """The read floor's layouts, best first, then the floor and the datasheet beside it."""
    lines = [f"  {name:>9}: {rate / 1e12:.3f} TB/s" + ("  <- the floor" if name == floor.config else "")
             for name, rate in sorted(floor.configs.items(), key=lambda kv: -kv[1])]
    sheet = "no datasheet figure for this GPU" if floor.datasheet_bytes_per_s is None else \
        f"datasheet {floor.datasheet_bytes_per_s / 1e12:.2f} TB/s ({floor.datasheet_source}); " \
        f"measured {floor.of_datasheet:.1%} of it"
    return [f"read floor: {floor.bytes_per_s / 1e12:.3f} TB/s, layout {floor.config} (CTAs an SM x threads x "
            f"16-byte loads in flight a thread), {floor.samples} samples of {floor.nbytes / 2**30:.2f} GiB", *lines,
            sheet]


def _print_read_floor(floor, timer: str, flush: str) -> None:
    if floor is None:
        click.echo("moebench: error: no layout of the read kernel had half its samples pass the audit", err=True)
        raise click.exceptions.Exit(1)
    click.echo(f"timer {timer}, flush {flush}, after a warm-up burst:")
    for line in read_floor_lines(floor):
        click.echo(line)


@click.command("probe")
@click.option("--op", type=click.Choice(sorted([*OPS, "read"])), default="add", show_default=True,
              help="read: the run's HBM read floor alone (every layout of the read kernel, 1 GiB, cold; the "
                   "best is the floor, the datasheet beside it); "
                   "add: c = a + b; mul: c = 2a (fp32, one torch elementwise kernel); spin: a kernel that waits "
                   "--us microseconds of SM cycles; empty: the same kernel waiting 0 cycles; reduce: "
                   "8 sweeps of 16-byte BF16x2 reductions (red.global.add) over a --mib buffer, the fused "
                   "arms' combine instruction alone (its rate is the reductions' bytes); wgmma: the prefill "
                   "kernels' tensor instruction alone (wgmma m64n128k32 e4m3 from shared memory, one CTA an SM), "
                   "wgmma-step: the same with their wait and block-scale promotion every K step (the rate is "
                   "their FLOPs, beside the datasheet peak); gate-up-l2: the prefill gate_up kernel itself on a plan "
                   "whose operands stay in L2 (its rate without HBM).")
@click.option("--mib", type=int, default=256, show_default=True, help="Size of each tensor (add, mul).")
@click.option("--us", type=float, default=20.0, show_default=True,
              help="spin: how long the kernel waits, in µs at the maximum SM clock.")
@click.option("--sms", type=int, default=None, metavar="N",
              help="reduce: run on N SMs, one 1024-thread CTA each, instead of 8 CTAs on every SM (the "
                   "rate of N SMs tells one SM's limit from the GPU's).")
@click.option("--samples", type=int, default=100, show_default=True)
@click.option("--warmup", type=int, default=10, show_default=True)
@click.option("--flush", type=click.Choice(FLUSH_MODES), default="read", show_default=True)
@click.option("--timer", type=click.Choice(list(CUDA_TIMERS)), default=DEFAULT_TIMER, show_default=True,
              help="none: only launch (for ncu/nsys to measure).")
@click.option("--ncu-csv", type=click.Path(dir_okay=False, exists=True), default=None,
              help="ncu --csv output of the same workload: print its median and the difference.")
@click.option("--table-row", "table_row", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --ncu-csv: append the comparison to FILE as a Markdown table row.")
def probe(op, mib, us, sms, samples, warmup, flush, timer, ncu_csv, table_row):
    """Time one kernel exactly as `moebench run` times an arm (cold L2, audited)."""
    if table_row and not ncu_csv:
        raise click.UsageError("--table-row needs --ncu-csv")
    from moebench.tasks.probe import compare_with_ncu, run_probe, run_read_floor  # torch: not for --help
    if op == "read":
        if ncu_csv:
            raise click.UsageError("--ncu-csv applies to single-kernel ops, not --op read")
        _print_read_floor(run_read_floor(samples, flush, timer), timer, flush)
        return
    res = run_probe(op, mib, samples, warmup, flush, timer, us=us, sms=sms)
    what = {"spin": f"spin {us:g} µs", "empty": "empty kernel", "wgmma": "wgmma m64n128k32 e4m3",
            "wgmma-step": "wgmma m64n128k32 e4m3, waited and promoted a K step",
            "gate-up-l2": "prefill gate_up, operands in L2"}.get(op, f"{op} {mib} MiB")
    what += f" on {sms} SMs" if sms is not None else ""
    if not res.timed:
        click.echo(f"launched {what} {samples + warmup} times, flush {flush}, untimed")
        return
    med = res.median_ns
    a = res.audit
    if med is None:
        click.echo(f"moebench: error: audit failed: no sample of {op} passed ({a.samples_passed}/{a.samples_total})",
                   err=True)
        raise click.exceptions.Exit(1)
    per_sm = f" ({res.bytes_moved / (med * 1e-9) / sms / 1e9:.1f} GB/s an SM)" if sms is not None else ""
    rate = f"{res.bytes_moved / (med * 1e-9) / 1e12:.2f} TB/s{per_sm}; " if res.bytes_moved else ""
    if res.flops:
        rate = f"{flops_rate(res.flops, med)}; "
    click.echo(f"{what}: median {med / 1e3:.3f} us over {len(res.samples)} samples ({timer}, flush {flush}); "
               f"{rate}audit {a.samples_passed}/{a.samples_total}")
    click.echo(f"kernels: {', '.join(res.kernel_names) or '(not visible to this timer)'}")
    if ncu_csv:
        c = compare_with_ncu(res, Path(ncu_csv).read_text())
        click.echo(f"ncu gpu__time_duration.sum: median {c.median_ns / 1e3:.3f} us over {c.kernels} kernels; "
                   f"moebench/ncu = {c.ratio:.4f} ({100 * (c.ratio - 1):+.2f}%), ncu - moebench = {c.offset_ns:+.0f} ns")
        if table_row:
            with open(table_row, "a", encoding="utf-8") as f:
                f.write(c.table_row(what) + "\n")
    if not a.passed:
        raise click.exceptions.Exit(1)
