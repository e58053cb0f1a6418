"""`moebench doctor`: what this machine has for moebench, one line each: OK, WARN or ERROR."""

from __future__ import annotations

import click

from moebench.cli import cli


@cli.command()
@click.option("--cpu", "cpu_only", is_flag=True,
              help="Check only what CPU use needs (torch, the Triton interpreter, NVRTC, the compile cache).")
def doctor(cpu_only):
    """Check the GPU, CUPTI, NVRTC, clocks and library versions; exit 1 on any ERROR."""
    from moebench.doctor import exit_code, findings
    found = findings(cpu_only=cpu_only)
    for f in found:
        click.echo(f.line())
    code = exit_code(found)
    if code:
        raise click.exceptions.Exit(code)
