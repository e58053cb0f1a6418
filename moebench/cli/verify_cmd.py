"""`moebench verify`: run arms once on fresh inputs and compare with the oracle."""

from __future__ import annotations

import click
import torch
from rich.table import Table

from moebench.cli import cli
from moebench.cli.common import (balancedness_option, max_fixture_gb_option, pdl_option, registry, shape_option,
                                 shapes_file_option, triton_config_option)
from moebench.cli.determinism_cmd import check_determinism_flags, determinism_options, verify_determinism
from moebench.errors import UserError
from moebench.fixtures import build_fixture
from moebench.kernels.arm import default_arms, parse_arm_list
from moebench.kernels.parity import REL_L2_THRESHOLD
from moebench.kernels.triton_arms import use_interpreter
from moebench.kernels.verify import verify_arms
from moebench.results.tables import make_console


@cli.command()
@shape_option
@shapes_file_option
@balancedness_option
@click.option("--arms", "arms", multiple=True, metavar="A[,A...]", help="Arms to check (repeat or comma-separate).")
@click.option("--interpret", is_flag=True, help="Run Triton kernels on the CPU (TRITON_INTERPRET=1); slow, small shapes.")
@triton_config_option
@pdl_option
@click.option("--seed", type=int, default=None, help="Seed of the fresh inputs (default: the shape's seed + 1).")
@click.option("--edge-cases", is_flag=True, help="Also check M=1, one expert set, empty experts, M=67.")
@click.option("--threshold", type=float, default=REL_L2_THRESHOLD, show_default=True,
              help="Largest relative L2 error that passes.")
@max_fixture_gb_option
@determinism_options
def verify(shapes, shapes_file, balancedness, arms, interpret, triton_config, pdl, seed, edge_cases, threshold,
           max_fixture_gb, determinism, runs, out, cross_process, external_arms):
    """Check arms against the torch oracle on inputs they were not tuned on; exit 1 on a failure.
    With no --arms, every built-in arm that can run here. With --determinism, check instead that
    each arm's output is the same bits run to run, inside larger batches and in a fresh process."""
    options = {"triton_config": triton_config, "pdl": pdl}
    check_determinism_flags(determinism, edge_cases, out, external_arms, runs)
    names = parse_arm_list(list(arms)) if arms else None
    specs = registry(shapes_file, max_fixture_gb).resolve_many(list(shapes) or [], balancedness=balancedness)
    if not threshold > 0:
        raise UserError(f"--threshold must be positive, got {threshold}")
    if interpret:
        use_interpreter(True)
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        raise UserError("no CUDA device here; --interpret runs the Triton kernels on the CPU")
    console = make_console()
    if names is None and determinism and external_arms:
        names = []  # only the --arm arms
    if names is None:
        names, skipped = default_arms(device, options)
        if skipped:
            console.print("[dim]arms left out: " + "; ".join(f"{n} ({why})" for n, why in skipped) + "[/]")
        if not names:
            raise UserError("no arm can run here")
    if determinism:
        return verify_determinism(specs, names, device, console, options=options, seed=seed, runs=runs, out=out,
                                  cross_process=cross_process, external_arms=external_arms, interpret=interpret)
    rows = []
    for spec in specs:
        fx = build_fixture(spec).to(device)
        rows += verify_arms(fx, names, options=options, seed=seed,
                            with_edge_cases=edge_cases, threshold=threshold)
    console.print(_parity_table(rows, device, interpret))
    failed = [r for r in rows if not r.passed]
    if failed:
        click.echo(f"{len(failed)} of {len(rows)} checks failed", err=True)
        raise SystemExit(1)


def _parity_table(rows, device, interpret) -> Table:
    where = "CPU interpreter" if interpret else str(device)
    t = Table(title=f"parity against the oracle ({where})", title_justify="left")
    for col in ("shape", "arm", "oracle"):
        t.add_column(col, no_wrap=True)
    for col in ("rel L2", "max abs err", "ref max abs", "NaN/Inf", "threshold", "rel L2 vs exact"):
        t.add_column(col, justify="right")
    t.add_column("result")
    for r in rows:
        result = "[green]ok[/green]" if r.passed else f"[red]FAIL[/red] {r.reason()}"
        exact = "—" if r.rel_l2_exact is None else f"{r.rel_l2_exact:.2e}"
        t.add_row(r.shape, r.arm, r.oracle, f"{r.rel_l2:.2e}", f"{r.max_abs:.2e}", f"{r.ref_max_abs:.2e}",
                  str(r.nonfinite), f"{r.threshold:g}", exact, result)
    return t
