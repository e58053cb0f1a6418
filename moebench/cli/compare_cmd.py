"""`moebench compare A.json B.json`: per shape and arm, is B faster, slower, the same, noisy or
ambiguous, by the rules given?"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moebench.analysis.verdicts import RULES_HELP, Rules, parse_fraction, parse_rules
from moebench.choices import COMPARE_FORMAT_NAMES
from moebench.cli.common import load_result, trust_stored_option, wide_option
from moebench.errors import UserError


class Fraction(click.ParamType):
    """A relative amount written as a percentage (`2%`) or a fraction (`0.02`)."""

    name = "percent"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return parse_fraction(str(value))
        except UserError as err:
            self.fail(str(err), param, ctx)


class Rule(click.ParamType):
    """One or more `KEY:VALUE` verdict rules, checked as they are read."""

    name = "rule"

    def convert(self, value, param, ctx):
        try:
            parse_rules([value])
        except UserError as err:
            self.fail(str(err), param, ctx)
        return value


@click.command()
@click.argument("a_path", metavar="A.json", type=click.Path(dir_okay=False))
@click.argument("b_path", metavar="B.json", type=click.Path(dir_okay=False))
@click.option("--rule", "rules", type=Rule(), multiple=True, metavar="KEY:VALUE", help=RULES_HELP)
@click.option("--threshold", type=Fraction(), default=None,
              help="The same as --rule median:X [default: the two runs' measured noise floors combined; 2% where a run has none].")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 if any arm got slower, or if either run has audit failures.")
@click.option("--format", "fmt", type=click.Choice(list(COMPARE_FORMAT_NAMES)), default="table", show_default=True)
@wide_option
@trust_stored_option
def compare(a_path, b_path, rules, threshold, fail_on_regression, fmt, wide, trust_stored):
    """Compare run B against run A, per shape and arm, from the audited samples of each: medians
    with bootstrap intervals, a rank test, and a verdict with its reason: faster or slower (the
    change's interval lies beyond the band and the test agrees), same (within it), noisy (the
    interval is wider than the band) or ambiguous (it straddles an edge of the band)."""
    from moebench.analysis.compare import compare_results, gate  # numpy: not for --help
    from moebench.views.compare_view import COMPARE_FORMATS
    if threshold is not None and any(item.strip().startswith("median:") for r in rules for item in r.split(",")):
        raise click.UsageError("--threshold X is --rule median:X: give one of them, not both")
    base = Rules() if threshold is None else Rules(change=threshold)
    judged_by = parse_rules(rules, base)
    a, b = load_result(a_path, trust_stored), load_result(b_path, trust_stored)
    a_label, b_label = Path(a_path).name, Path(b_path).name
    if a_label == b_label:
        a_label, b_label = a_path, b_path
    comparison = compare_results(a, b, judged_by, a_label, b_label)
    COMPARE_FORMATS[fmt](comparison, sys.stdout, wide=wide)
    closed = gate(comparison) if fail_on_regression else None
    if closed:
        click.echo(f"moebench: {closed}", err=True)
        return 1
    return 0
