"""`moebench report`: a saved RunResult as a table, Markdown, CSV or JSON, and plots."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import click

from moebench.atomic_write import atomic_write
from moebench.cli import cli
from moebench.cli.common import load_result, trust_stored_option
from moebench.errors import UserError
from moebench.results.formats import FORMATS


@cli.command()
@click.argument("result_path", metavar="RESULT.json", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="table", show_default=True,
              help="What to print.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Also write PNG and SVG plots into this folder.")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout (Markdown then links the "
                   "plots relative to it).")
@click.option("--prefix", default="", help="Prefix for plot file names (several results in one folder).")
@click.option("--ref", "ref", default=None, metavar="ARM",
              help="Take the ratios against this arm of the run instead of the run's reference "
                   "(recomputed from the samples: every arm ran in the same paired rounds).")
@trust_stored_option
def report(result_path, fmt, plot_dir, output, prefix, ref, trust_stored):
    """Print a saved run as a table, Markdown (for a pull request), CSV or JSON; plot it."""
    from moebench.results.index import ResultIndex
    from moebench.results.markdown import Image
    from moebench.stats import with_ref

    if prefix and (any(sep in prefix for sep in ("/", "\\")) or ".." in prefix):
        raise UserError(f"--prefix {prefix!r}: a prefix of file names, without a folder or '..'")
    result = load_result(result_path, trust_stored)
    if ref is not None:
        result = with_ref(result, ref)
    images = []
    if plot_dir is not None:
        from moebench.results.plots import write_plots
        try:
            plots = write_plots(ResultIndex(result), plot_dir, prefix=prefix)
        except OSError as err:
            raise UserError(f"cannot write plots into {plot_dir}: {err.strerror or err}") from None
        for plot in plots:
            png = plot.paths[0]
            # Links relative to the Markdown file when it has one, else as the folder was given.
            link = os.path.relpath(png, Path(output).parent) if output else png
            images.append(Image(plot.title, Path(link).as_posix()))
            click.echo(f"wrote {png} and .svg", err=True)
    if output is None:
        FORMATS[fmt](result, sys.stdout, images)
        return
    text = io.StringIO()
    FORMATS[fmt](result, text, images)
    try:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(output, text.getvalue().encode("utf-8"))
    except OSError as err:
        raise UserError(f"cannot write {output}: {err.strerror or err}") from None
    click.echo(f"wrote {output}", err=True)
