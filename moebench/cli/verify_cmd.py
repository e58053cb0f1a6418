"""`moebench verify`: run arms once on fresh inputs and compare with the oracle."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from moebench.choices import REL_L2_THRESHOLD
from moebench.cli.common import (balancedness_option, max_fixture_gb_option, pdl_option, shape_option,
                                 shapes_file_option, triton_config_option, tuned_option)
from moebench.cli.determinism_cmd import check_determinism_flags, determinism_options, print_determinism, write_checks
from moebench.views.parity_view import parity_table
from moebench.views.tables import make_console


@click.command("verify")
@shape_option
@shapes_file_option
@balancedness_option
@click.option("--arms", "arms", multiple=True, metavar="A[,A...]", help="Arms to check (repeat or comma-separate).")
@click.option("--interpret", is_flag=True, help="Run Triton kernels on the CPU (TRITON_INTERPRET=1); slow, small shapes.")
@triton_config_option
@tuned_option
@pdl_option
@click.option("--seed", type=int, default=None, help="Seed of the fresh inputs (default: the shape's seed + 1).")
@click.option("--edge-cases", is_flag=True, help="Also check M=1, one expert set, empty experts, M=67.")
@click.option("--threshold", type=float, default=None,
              help="A fixed largest relative L2 error that passes, instead of each arm's error model "
                   f"(e.g. {REL_L2_THRESHOLD:g}).")
@max_fixture_gb_option
@click.option("--wide", is_flag=True, help="Every column of the parity table (magnitudes, NaN/Inf, threshold).")
@determinism_options
def verify_command(shapes, shapes_file, balancedness, arms, interpret, triton_config, tuned, pdl, seed, edge_cases, threshold,
                   max_fixture_gb, wide, determinism, runs, out, cross_process, external_arms):
    """Check arms against the torch oracle on inputs they were not tuned on; exit 1 on a failure.
    With no --arms, every built-in arm that can run here. With --determinism, check instead that
    each arm's output is the same bits run to run, inside larger batches and in a fresh process."""
    check_determinism_flags(determinism, edge_cases, out, external_arms, runs)
    from moebench.kernels.registry import parse_arm_list  # torch: not for --help
    from moebench.tasks.verify import VerifyRequest, verify, verify_determinism
    req = VerifyRequest(shapes=tuple(shapes), arms=tuple(parse_arm_list(list(arms))) if arms else None,
                        options={"triton_config": triton_config, "pdl": pdl, "tuned": tuned}, interpret=interpret, seed=seed,
                        edge_cases=edge_cases, threshold=threshold, balancedness=balancedness,
                        shapes_file=shapes_file, max_fixture_gb=max_fixture_gb, external_arms=tuple(external_arms))
    console = make_console()
    log = lambda m: console.print(Text(m, style="dim"))  # noqa: E731
    if determinism:
        verdicts, device, result = verify_determinism(req, runs=runs, cross_process=cross_process,
                                                      command=["moebench", *sys.argv[1:]], log=log)
        return print_determinism(console, verdicts, result, device, interpret, out)
    rows, device, result = verify(req, log=log, command=["moebench", *sys.argv[1:]])
    console.print(parity_table(rows, "CPU interpreter" if interpret else str(device), wide))
    write_checks(result, out)
    failed = [r for r in rows if not r.passed]
    if failed:
        click.echo(f"{len(failed)} of {len(rows)} checks failed", err=True)
        raise SystemExit(1)
