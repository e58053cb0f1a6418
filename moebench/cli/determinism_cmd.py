"""`moebench verify --determinism`: the options, and the table of verdicts (logic in moebench.determinism.checks)."""

from __future__ import annotations

import click

from moebench.errors import UserError


def determinism_options(f):
    for opt in reversed([
        click.option("--determinism", is_flag=True,
                     help="Check determinism instead of parity: bitwise run to run, batch invariance "
                          "(rows of 1, 8 and M tokens alone and inside larger batches), across processes."),
        click.option("--runs", type=int, default=None, metavar="N",
                     help="With --determinism: runs of the same inputs (default 20)."),
        click.option("--out", type=click.Path(dir_okay=False), default=None,
                     help="Also write the checks (parity rows, or with --determinism the verdicts) as a "
                          "RunResult JSON (report reads it)."),
        click.option("--cross-process/--no-cross-process", default=True, show_default=True,
                     help="With --determinism: compare the output hash with a fresh process's."),
        click.option("--arm", "external_arms", multiple=True, metavar="NAME=module:factory",
                     help="With --determinism: an arm of your own (as `run --arm`), also made in the fresh process."),
    ]):
        f = opt(f)
    return f


def check_determinism_flags(determinism: bool, edge_cases: bool, out, external_arms, runs) -> None:
    if determinism:
        if edge_cases:
            raise UserError("--edge-cases checks parity; it does not combine with --determinism")
        return
    for flag, given in (("--runs", runs is not None), ("--arm", bool(external_arms))):
        if given:
            raise UserError(f"{flag} applies only with --determinism")


def write_checks(result, out) -> None:
    """`--out`: the checks' RunResult saved, one line on stderr."""
    if out is None or result is None:
        return
    from moebench.record.store import save
    try:
        save(result, out)
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror or err}") from None
    click.echo(f"wrote {out}", err=True)


def print_determinism(console, verdicts, result, device, interpret: bool, out) -> None:
    """The verdicts' table; the RunResult to `out` when given; exit 1 if an arm fails."""
    from moebench.views.determinism_view import determinism_table
    where = "CPU interpreter" if interpret else str(device)
    console.print(determinism_table(verdicts, where))
    write_checks(result, out)
    failed = [v for v in verdicts if not (v.deterministic and v.batch_invariant)]
    if failed:
        click.echo(f"{len(failed)} of {len(verdicts)} arms are not deterministic or not batch-invariant: "
                   + ", ".join(f"{v.arm} at {v.shape}" for v in failed), err=True)
        raise SystemExit(1)
