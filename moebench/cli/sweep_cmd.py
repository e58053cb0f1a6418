"""`moebench sweep --family A --m 1,2,4,...`: `moebench run` over one family at several M,
as one result (its report then plots duration and speedup against M).

Under torchrun (or with `--gpus`, which starts it), with `--dry-run` or `--resume`, the
sweep is sharded into cells, one shape each, across the ranks (moebench.run.distributed)."""

from __future__ import annotations

from dataclasses import replace

import click
from click.core import ParameterSource
from rich.text import Text

from moebench.cli.run_cmd import run_command, run_request
from moebench.errors import UserError
from moebench.views.tables import make_console, print_tables

# Every option of `moebench run` except --shape, which --family and --m replace.
RUN_OPTIONS = [p for p in run_command.params if p.name not in ("shapes", "resume", "resume_path")]


@click.command("sweep", params=[
    click.Option(["--family"], default=None, help="Family letter, e.g. A or Q, or MODEL/LAYOUT, e.g. deepseek-v3/ep8."),
    click.Option(["--m", "--ms", "ms"], default=None, metavar="M[,M...]",
                 help="Token counts, e.g. 1,2,4,8,16 (--ms under torchrun, whose parser takes --m for its own)."),
    click.Option(["--gpus"], default=None, metavar="I[,I...]",
                 help="Shard the sweep's cells across these GPUs: starts torchrun with one rank per GPU."),
    click.Option(["--dry-run"], is_flag=True,
                 help="Fixtures, route plans and oracle checks of every cell, nothing timed (on a machine "
                      "without a GPU the Triton arms run in the interpreter)."),
    click.Option(["--resume"], default=None, metavar="FILE", type=click.Path(dir_okay=False),
                 help="Run the cells a sharded sweep's FILE lists as missing, with its settings, and merge them in."),
    *RUN_OPTIONS,
])
@click.pass_context
def sweep(ctx, family, ms, gpus, dry_run, resume, **run_options):
    """Run one family at several M as one result (options as for `moebench run`)."""
    from moebench.run import distributed  # torch: not for --help
    from moebench.run.plan import sweep_shapes
    argv = (ctx.obj or {}).get("argv", [])
    if resume:
        given = [p.opts[0] for p in ctx.command.params if p.name not in ("resume", "gpus")
                 and ctx.get_parameter_source(p.name) != ParameterSource.DEFAULT]
        if given:
            raise UserError(f"--resume takes the sweep's settings from {resume}; leave out {', '.join(given)}")
    elif not family or not ms:
        raise UserError("sweep needs --family and --m (or --resume FILE)")
    shapes = (",".join(sweep_shapes(family, ms)),) if not resume else ()
    if gpus is not None:
        if resume:
            dry_run = distributed.resumable(resume).sharding.dry_run
        raise click.exceptions.Exit(distributed.launch(gpus, argv, dry_run=dry_run))
    if not (dry_run or resume or distributed.launched_by_torchrun()):
        return ctx.invoke(run_command, shapes=shapes, **run_options)
    wide = run_options.pop("wide")
    req = replace(run_request(shapes=shapes, **run_options), command=("moebench", *argv))
    console = make_console(wide=wide)
    outcome = distributed.sharded_sweep(req, dry_run=dry_run, resume=resume,
                                        log=lambda m: console.print(Text(m, style="dim")))
    if outcome is None:  # not rank 0
        return
    result, path = outcome.result, outcome.path
    console.print(distributed_cells_table(result))
    if result.summaries:
        print_tables(result, console, wide=wide)
    console.print(f"saved {path}")
    missing = result.sharding.missing
    if missing:
        click.echo(f"moebench: error: {len(missing)} cell(s) not finished: "
                   + "; ".join(f"{c.shape} (rank {c.rank}: {c.reason})" for c in missing)
                   + f"; `moebench sweep --resume {path}` runs them", err=True)
        raise click.exceptions.Exit(1)
    if not result.audit.passed:
        click.echo("moebench: error: audit failed (see the tables above)", err=True)
        raise click.exceptions.Exit(1)


def distributed_cells_table(result):
    from rich.table import Table
    sh = result.sharding
    t = Table(title=f"cells ({sh.world_size} rank(s){', dry run' if sh.dry_run else ''})", title_justify="left")
    for col in ("shape", "rank", "host", "device", "GPU", "read GB/s", "result"):
        t.add_column(col, no_wrap=True)
    rows = [(c.shape, str(c.rank), c.host, c.device, c.gpu_name or "—",
             "—" if c.read_bandwidth_bytes_per_s is None else f"{c.read_bandwidth_bytes_per_s / 1e9:.0f}",
             "checked" if sh.dry_run else "timed") for c in sh.cells]
    rows += [(c.shape, str(c.rank), "", "", "", "", Text.assemble(("missing", "red"), f" {c.reason}"))
             for c in sh.missing]
    for row in rows:
        t.add_row(*row)
    return t
