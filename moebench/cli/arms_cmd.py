"""`moebench arms`: the registered arms and whether they can run here."""

from __future__ import annotations

import torch
from rich.table import Table

from moebench.cli import cli
from moebench.kernels.registry import load_builtin_arms
from moebench.results.tables import make_console


@cli.command()
def arms():
    """List the registered arms, what they time, and whether they can run on this machine."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t = Table(title=f"arms (availability on {device})", title_justify="left")
    for col in ("arm", "description", "available here"):
        t.add_column(col)
    for name, factory in sorted(load_builtin_arms().items()):
        arm = factory()
        reason = arm.unavailable_reason(device)
        t.add_row(name, getattr(arm, "description", ""), "[green]yes[/green]" if reason is None else reason)
    make_console().print(t)
