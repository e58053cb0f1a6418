"""`moebench arms`: the registered arms and whether they can run here."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from moebench.tasks.doctor import arm_availability
from moebench.views.tables import make_console


@click.command()
def arms():
    """List the registered arms, what they time, and whether they can run on this machine."""
    device, rows = arm_availability()
    t = Table(title=f"arms (availability on {device})", title_justify="left")
    for col in ("arm", "description", "available here"):
        t.add_column(col)
    for name, description, reason in rows:
        t.add_row(name, description, Text("yes", style="green") if reason is None else reason)
    make_console().print(t)
