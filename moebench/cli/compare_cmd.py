"""`moebench compare A.json B.json`: per shape and arm, is B faster, slower, the same or noisy?"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moebench.cli import cli
from moebench.cli.common import load_result, trust_stored_option
from moebench.results.compare import Thresholds, compare_results
from moebench.results.compare_view import COMPARE_FORMATS


class Fraction(click.ParamType):
    """A relative amount written as a percentage (`2%`) or a fraction (`0.02`)."""

    name = "percent"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            self.fail(f"{value!r} is not a percentage like 2% or a fraction like 0.02", param, ctx)
        if not text.endswith("%") and number >= 1:
            self.fail(f"{value!r} is ambiguous: write {text}% or {number / 100:g}", param, ctx)
        if not 0 < number < 1:
            self.fail(f"{value!r} must be between 0% and 100%", param, ctx)
        return number


@cli.command()
@click.argument("a_path", metavar="A.json", type=click.Path(dir_okay=False))
@click.argument("b_path", metavar="B.json", type=click.Path(dir_okay=False))
@click.option("--threshold", type=Fraction(), default="2%", show_default=True,
              help="A median change beyond this is faster or slower.")
@click.option("--max-spread", type=Fraction(), default=None,
              help="Round-to-round spread above which a change inside it is 'noisy' [default: the threshold].")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 if any arm got slower.")
@click.option("--format", "fmt", type=click.Choice(list(COMPARE_FORMATS)), default="table", show_default=True)
@trust_stored_option
def compare(a_path, b_path, threshold, max_spread, fail_on_regression, fmt, trust_stored):
    """Compare run B against run A, per shape and arm, with a verdict and its reason."""
    a, b = load_result(a_path, trust_stored), load_result(b_path, trust_stored)
    a_label, b_label = Path(a_path).name, Path(b_path).name
    if a_label == b_label:
        a_label, b_label = a_path, b_path
    comparison = compare_results(a, b, Thresholds(threshold, max_spread), a_label, b_label)
    COMPARE_FORMATS[fmt](comparison, sys.stdout)
    if fail_on_regression and comparison.regressions:
        slower = ", ".join(f"{r.shape}/{r.arm} {r.change:+.1%}" for r in comparison.regressions)
        click.echo(f"moebench: regression: {slower}", err=True)
        return 1
    return 0
