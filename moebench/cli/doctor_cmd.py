"""`moebench doctor`: what this machine has for moebench, one line each: OK, WARN or ERROR;
`--calibrate`: what difference it can resolve (moebench.tasks.calibrate)."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--cpu", "cpu_only", is_flag=True,
              help="Check only what CPU use needs (torch, the Triton interpreter, NVRTC, the compile cache).")
@click.option("--calibrate", is_flag=True,
              help="About a minute on the GPU: an arm and identical copies of it timed together at "
                   "default settings (their spread), the read floor and the clocks; ends with the smallest "
                   "difference this machine resolves.")
@click.option("--shape", default="Q8", show_default=True, help="With --calibrate: the shape timed.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="With --calibrate: keep the run's result in this folder (else it is discarded).")
def doctor(cpu_only, calibrate, shape, out_dir):
    """Check the GPU, CUPTI, NVRTC, clocks and library versions; exit 1 on any ERROR."""
    if calibrate:
        if cpu_only:
            raise click.UsageError("--calibrate times on the GPU; it does not go with --cpu")
        from moebench.tasks.calibrate import calibrate as run_calibration
        from moebench.tasks.calibrate import calibration_lines
        cal = run_calibration(shape, out_dir, command=("moebench", *sys.argv[1:]),
                              log=lambda m: click.echo(m, err=True))
        for line in calibration_lines(cal):
            click.echo(line)
        return
    from moebench.tasks.doctor import exit_code, findings
    found = findings(cpu_only=cpu_only)
    for f in found:
        click.echo(f.line())
    code = exit_code(found)
    if code:
        raise click.exceptions.Exit(code)
