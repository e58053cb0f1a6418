"""`moebench verify --determinism`: the options, and the table of verdicts (logic in moebench.determinism)."""

from __future__ import annotations

import sys

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
                     help="With --determinism: also write the verdicts as a RunResult JSON (report reads it)."),
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
    for flag, given in (("--runs", runs is not None), ("--out", out is not None), ("--arm", bool(external_arms))):
        if given:
            raise UserError(f"{flag} applies only with --determinism")


def verify_determinism(specs, names, device, console, *, options, seed, runs, out, cross_process,
                       external_arms, interpret) -> None:
    from moebench.determinism import DEFAULT_RUNS, check_arms
    from moebench.determinism_result import determinism_result
    from moebench.fixtures import build_fixture
    from moebench.kernels.external import parse_external_arm
    from moebench.results.determinism_view import determinism_table
    from moebench.results.provenance import utc_now
    from moebench.results.store import save
    runs = DEFAULT_RUNS if runs is None else runs
    if runs < 2:
        raise UserError(f"--runs must be at least 2, got {runs}")
    names = list(names) + [parse_external_arm(t)[0] for t in external_arms]
    started_at = utc_now()
    verdicts, fixtures = [], []
    for spec in specs:
        fx = build_fixture(spec).to(device)
        fixtures.append(fx)
        verdicts += check_arms(fx, names, options=options, external=tuple(external_arms), runs=runs,
                               cross_process=cross_process, seed=seed)
    where = "CPU interpreter" if interpret else str(device)
    console.print(determinism_table(verdicts, where))
    if out is not None:
        result = determinism_result(verdicts, fixtures, command=["moebench", *sys.argv[1:]], started_at=started_at,
                                    device=device, options={**options, "runs": runs})
        try:
            save(result, out)
        except OSError as err:
            raise UserError(f"cannot write {out}: {err.strerror or err}") from None
        click.echo(f"wrote {out}", err=True)
    failed = [v for v in verdicts if not (v.deterministic and v.batch_invariant)]
    if failed:
        click.echo(f"{len(failed)} of {len(verdicts)} arms are not deterministic or not batch-invariant: "
                   + ", ".join(f"{v.arm} at {v.shape}" for v in failed), err=True)
        raise SystemExit(1)
