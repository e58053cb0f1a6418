"""`moebench doctor`: what this machine has for moebench, one line each, OK or missing."""

from __future__ import annotations

import click

from moebench.cli import cli
from moebench.doctor import machine_checks


@cli.command()
def doctor():
    """Check GPU, driver, CUPTI, NVRTC, Triton and library versions."""
    checks, missing = machine_checks()
    for c in checks:
        click.echo(f"{c.status:8} {c.line}")
    if missing:
        raise click.exceptions.Exit(1)
