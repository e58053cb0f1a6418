"""`moebench tune`: search the stock Triton path's configs per M on this GPU, cold L2 and
CUPTI-audited, and write the engines' JSON tables with their provenance."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from moebench.choices import ENGINE_BATCH_SIZES, FLUSH_MODES, TUNE_PASSES
from moebench.cli.common import balancedness_option, max_fixture_gb_option, shapes_file_option
from moebench.views.tables import make_console

BUDGET_SPENT = 3  # exit status of a tune its --budget stopped (state saved; rerun to continue)


@click.command("tune")
@click.option("--shape", "--family", "family", required=True, metavar="FAMILY",
              help="A family letter (A, Q) or MODEL/LAYOUT (deepseek-v3/ep8): the geometry to tune.")
@click.option("--ms", default=None, metavar="M[,M...]",
              help="Token counts to tune (the table's keys). Default: the engines' buckets "
                   + ",".join(map(str, ENGINE_BATCH_SIZES)) + ".")
@click.option("--out", "out_dir", default="results/tuned", show_default=True, type=click.Path(file_okay=False),
              help="Folder of the tables: OUT/configs/triton_<version>/, as SGLang reads them with "
                   "SGLANG_MOE_CONFIG_DIR=OUT; the state file and provenance sit beside them.")
@click.option("--budget", "budget_s", type=float, default=None, metavar="SECONDS",
              help="Stop cleanly after this much wall time: the finished Ms are written, the rest kept in the "
                   f"state file; the same command continues (exit {BUDGET_SPENT} when stopped).")
@click.option("--rounds", type=int, default=2, show_default=True, help="Paired rounds per candidate.")
@click.option("--samples", type=int, default=10, show_default=True,
              help="Cold, audited samples per candidate per round (the final check takes twice as many).")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed calls per candidate per round.")
@click.option("--check-rounds", type=int, default=6, show_default=True,
              help="Rounds of the final whole-path check of the tuned pair against the shipped pair.")
@click.option("--passes", type=int, default=TUNE_PASSES, show_default=True,
              help="Passes of moves from the shipped configs (each: BLOCK_SIZE_M, then each GEMM's own axes).")
@click.option("--flush", type=click.Choice(FLUSH_MODES), default="read", show_default=True,
              help="L2 flush before each sample (read: cold and clean).")
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="Programmatic dependent launch for the GEMMs, as the engines launch them on SM90.")
@shapes_file_option
@balancedness_option
@max_fixture_gb_option
def tune_command(family, ms, out_dir, budget_s, rounds, samples, warmup, check_rounds, passes, flush, pdl,
                 shapes_file, balancedness, max_fixture_gb):
    """Tune the stock Triton path's up and down GEMM configs per M (cold L2, CUPTI, audited)."""
    import torch  # not for --help

    from moebench.tasks.tune import TuneRequest, tune
    from moebench.tasks.tune_space import parse_ms
    req = TuneRequest(family=family, ms=parse_ms(ms, ENGINE_BATCH_SIZES), out_dir=out_dir, budget_s=budget_s,
                      rounds=rounds, samples=samples, warmup=warmup, check_rounds=check_rounds, passes=passes,
                      flush=flush, pdl=pdl, balancedness=balancedness, shapes_file=shapes_file,
                      max_fixture_gb=max_fixture_gb, command=("moebench", *sys.argv[1:]))
    console = make_console()
    outcome = tune(req, torch.device("cuda"), log=lambda m: console.print(Text(m, style="dim")))
    for path in outcome.tables:
        console.print(f"wrote {path}")
    if outcome.stopped:
        click.echo(f"moebench: the budget ran out: {len(outcome.finished)} of {len(req.ms)} M(s) tuned; the same "
                   f"command continues ({', '.join(map(str, outcome.left))} left)", err=True)
        raise click.exceptions.Exit(BUDGET_SPENT)
