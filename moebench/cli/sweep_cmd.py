"""`moebench sweep --family A --m 1,2,4,...`: `moebench run` over one family at several M,
as one result (its report then plots duration and speedup against M)."""

from __future__ import annotations

import click

from moebench.cli import cli
from moebench.cli.run_cmd import run_command
from moebench.errors import UserError


def sweep_shapes(family: str, ms_text: str) -> tuple[str, ...]:
    """`A` and `1,2,4` -> (`A1`, `A2`, `A4`); the run resolves and checks the names."""
    family = family.strip()
    if len(family) != 1 or not family.isalpha():
        raise UserError(f"--family: expected one family letter like A or Q, got {family!r}")
    items = [m.strip() for m in ms_text.split(",") if m.strip()]
    if not items or not all(m.isdigit() and int(m) > 0 for m in items):
        raise UserError(f"--m: expected positive token counts like 1,2,4,8, got {ms_text!r}")
    ms = [int(m) for m in items]
    dupes = sorted({m for m in ms if ms.count(m) > 1})
    if dupes:
        raise UserError(f"--m: M given twice: {', '.join(map(str, dupes))}")
    return tuple(f"{family.upper()}{m}" for m in ms)


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
