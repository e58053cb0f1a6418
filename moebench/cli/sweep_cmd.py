"""`moebench sweep --family A --m 1,2,4,...`: `moebench run` over one family at several M,
as one result (its report then plots duration and speedup against M)."""

from __future__ import annotations

import click

from moebench.cli import cli
from moebench.cli.run_cmd import run_command
from moebench.plan import sweep_shapes


# Every option of `moebench run` except --shape, which --family and --m replace.
RUN_OPTIONS = [p for p in run_command.params if p.name != "shapes"]


@cli.command("sweep", params=[
    click.Option(["--family"], required=True, help="Family letter, e.g. A or Q."),
    click.Option(["--m", "ms"], required=True, metavar="M[,M...]", help="Token counts, e.g. 1,2,4,8,16."),
    *RUN_OPTIONS,
])
@click.pass_context
def sweep(ctx, family, ms, **run_options):
    """Run one family at several M as one result (options as for `moebench run`)."""
    return ctx.invoke(run_command, shapes=(",".join(sweep_shapes(family, ms)),), **run_options)
