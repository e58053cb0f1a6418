"""`moebench report`: a saved RunResult as a table, Markdown, CSV or JSON, and plots."""

from __future__ import annotations

import sys

import click

from moebench.cli.common import load_result, trust_stored_option, wide_option
from moebench.views.formats import FORMATS
from moebench.views.report import make_report


@click.command()
@click.argument("result_path", metavar="RESULT.json", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="table", show_default=True,
              help="What to print.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Also write PNG and SVG plots into this folder (made if its parent exists; "
                   "a file name such as out.png is refused).")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout (Markdown then links the "
                   "plots relative to it).")
@click.option("--prefix", default="", help="Prefix for plot file names (several results in one folder).")
@click.option("--ref", "ref", default=None, metavar="ARM",
              help="Take the ratios against this arm of the run instead of the run's reference "
                   "(recomputed from the samples: every arm ran in the same paired rounds).")
@wide_option
@trust_stored_option
def report(result_path, fmt, plot_dir, output, prefix, ref, wide, trust_stored):
    """Print a saved run as a table, Markdown, a pull-request paste (pr), CSV or JSON; plot it."""
    report = make_report(load_result(result_path, trust_stored), fmt, plot_dir, output, prefix, ref,
                         stream=sys.stdout, wide=wide)
    for path in report.written:
        click.echo(f"wrote {path}", err=True)
