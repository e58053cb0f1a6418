"""`moebench run`: time arms against each other on shapes, save a RunResult, print tables."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from moebench.choices import (DEFAULT_PLACEMENT_MODE, DEFAULT_PLACEMENTS, DEFAULT_ROUNDS, DEFAULT_SAMPLES,
                              DETERMINISM_RUNS, FLUSH_MODES, ORDERS, REF_AA)
from moebench.cli.common import (balancedness_option, max_fixture_gb_option, pdl_option, shape_option,
                                 shapes_file_option, triton_config_option, tuned_option, wide_option)
from moebench.errors import UserError, one_line
from moebench.failures import audit_failure
from moebench.timing.schedule import PLACEMENT_MODES
from moebench.views.tables import findings_lines, make_console, print_tables

if TYPE_CHECKING:
    from moebench.run.runner import RunRequest

from moebench.timing.timers import DEFAULT_TIMER, RUN_TIMERS

DEFAULT_SHAPES = ("A8", "A128", "Q8", "Q128")


@contextmanager
def _progress(console: Console, total: int):
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task("timing", total=total)

        def advance(round_, unit, n):
            bar.update(task, advance=n, description=f"round {round_} {unit.shape} {unit.arm}")
        yield advance


@click.command("run")
@shape_option
@shapes_file_option
@balancedness_option
@click.option("--arms", "arms", multiple=True, metavar="A[,A...]",
              help="Arms to time, in the order odd rounds run them (builds, variants and --arm arms follow); "
                   "default: every built-in arm that can run here.")
@click.option("--build", "builds", multiple=True, metavar="NAME=PATH|NAME=git:REV[:PATH]",
              help="Time the arm family of a CUDA source built from this file (or the file at a git "
                   "revision of the repository you are in) as arm ARM@NAME; repeat to compare builds.")
@click.option("--build-arm", default=None, metavar="ARM",
              help="The arm the --build sources are for, when the file name does not say (cuda-gemm, cuda-swapab).")
@click.option("--build-host", type=click.Choice(["revision", "worktree"]), default="revision", show_default=True,
              help="Git builds: the arm's Python host code as it is at the revision (when it differs), or this tree's.")
@click.option("--define", "defines", multiple=True, metavar="NAME:KEY=VALUE",
              help="A preprocessor define for build NAME only.")
@click.option("--variant", "variants", multiple=True, metavar="NAME=ARM:KEY=VALUE[,KEY=VALUE...]",
              help="ARM under other settings (constructor options, or fields of its config), timed as arm NAME "
                   "in the same paired rounds, e.g. bm16=cuda-fused:block_m=16; repeat for more.")
@click.option("--arm", "external_arms", multiple=True, metavar="NAME=module:factory",
              help="Your own arm: factory(fixture) returns the prepared call (README: bring your own arm).")
@click.option("--ref", default=None, help="Arm (or build name) the ratios are taken against (default: the first).")
@click.option("--rounds", type=int, default=DEFAULT_ROUNDS, show_default=True)
@click.option("--samples", type=int, default=DEFAULT_SAMPLES, show_default=True, help="Per arm per round.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Per arm per round, untimed.")
@click.option("--flush", type=click.Choice(FLUSH_MODES), default="read", show_default=True,
              help="L2 flush before each sample: read (cold, clean), write (cold, dirty), none.")
@click.option("--timer", type=click.Choice(RUN_TIMERS), default=DEFAULT_TIMER, show_default=True,
              help="CUPTI kernel records, or CUDA events (labelled so in the result).")
@click.option("--graph", is_flag=True,
              help="Each sample one replay of a CUDA graph of the flush and the call (the decode path: no host "
                   "gaps between kernels); kernels still from CUPTI, audited.")
@click.option("--placements", type=int, default=None, metavar="P",
              help=f"Prepare every arm P times, each copy (with its own copy of the fixture) on buffers of its "
                   f"own, so where buffers land in memory is spread over the samples, not a bias of one arm. "
                   f"Default: {DEFAULT_PLACEMENTS}, fewer where memory is short (the result says how many).")
@click.option("--placement-mode", type=click.Choice(PLACEMENT_MODES), default=DEFAULT_PLACEMENT_MODE,
              show_default=True,
              help="samples: every row turns through the copies sample by sample; rounds: round r times copy "
                   "(r - 1) mod P (needs --rounds >= P; the tables give each placement's median).")
@click.option("--order", type=click.Choice(ORDERS), default="shuffled", show_default=True,
              help="Arm order per round: shuffled (each odd round drawn from the order seed, the next round its "
                   "reverse) or alternating (the given order on odd rounds, reversed on even).")
@click.option("--order-seed", type=click.IntRange(min=0, max=2**63 - 1), default=None, metavar="N",
              help="Seed of the shuffled order (default: drawn, and recorded in the result).")
@click.option("--aa", "aa_arm", default=REF_AA, show_default=True, metavar="ARM|ref|none",
              help="The run's noise floor: ARM is timed beside ARM#2, a second copy prepared on separately "
                   "allocated inputs, and their ratio bounds what this run can resolve (ratios inside it read "
                   "'same'; compare widens its SAME band to it). ref: the reference arm's; none: no floor.")
@click.option("--noise-from", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Copy the noise floors a `--aa` run measured into this result (arms and shapes in common).")
@triton_config_option
@tuned_option
@pdl_option
@max_fixture_gb_option
@click.option("--keep-going", is_flag=True,
              help="Time the other arms when some fail the oracle (those are left out and reported); "
                   "without it such a failure stops the run before timing, exit 1.")
@click.option("--determinism", is_flag=True,
              help="Before timing, check each timed arm's determinism on its prepared call, as `verify "
                   "--determinism` does (bitwise run to run, batch invariance, across processes); the result "
                   "keeps the verdicts and its tables show them (column det).")
@click.option("--determinism-runs", type=int, default=None, metavar="N",
              help=f"With --determinism: runs of the same inputs (default {DETERMINISM_RUNS}).")
@click.option("--cross-process/--no-cross-process", default=None,
              help="With --determinism: compare the output hash with a fresh process's (default: on).")
@click.option("--out", "out_dir", default="results", show_default=True, type=click.Path(file_okay=False),
              help="Folder the RunResult JSON is written to (after every round, marked incomplete until the last).")
@click.option("--resume", "resume_path", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Finish the incomplete run saved in FILE, in place, with its own settings (any option given "
                   "beside it must be the file's): the remaining rounds only.")
@wide_option
@click.pass_context
def run_command(ctx, shapes, shapes_file, balancedness, arms, builds, build_arm, build_host, defines, variants,
                external_arms, ref, rounds, samples, warmup, flush, timer, graph, placements, placement_mode, order, order_seed, aa_arm,
                noise_from,
                triton_config, tuned, pdl, max_fixture_gb, keep_going, determinism, determinism_runs, cross_process,
                out_dir, resume_path, wide):
    """Time arms on shapes in paired rounds; audit every sample; save and print the result."""
    from moebench.run.runner import RunFailed, RunInterrupted, resume, run  # torch: not for --help
    console = make_console(wide=wide)
    req = run_request(shapes, shapes_file, balancedness, arms, builds, build_arm, build_host, defines, variants,
                      external_arms, ref, rounds, samples, warmup, flush, timer, triton_config, pdl, max_fixture_gb,
                      out_dir, graph=graph, placements=placements, placement_mode=placement_mode, order=order,
                      order_seed=order_seed, aa_arm=aa_arm, noise_from=noise_from,
                      keep_going=keep_going, tuned=tuned,
                      determinism=determinism, determinism_runs=determinism_runs, cross_process=cross_process)
    log, progress = lambda m: console.print(Text(m, style="dim")), lambda total: _progress(console, total)
    try:
        if resume_path is not None:
            result, path = resume(resume_path, given=_given(ctx, req), log=log, progress_factory=progress)
        else:
            result, path = run(req, log=log, progress_factory=progress)
    except (RunFailed, RunInterrupted) as err:
        click.echo(f"moebench: {'error: ' if isinstance(err, RunFailed) else ''}{one_line(str(err))}", err=True)
        raise click.exceptions.Exit(err.exit_code) from None
    print_tables(result, console, wide=wide)
    console.print(f"saved {path}")
    if not result.audit.passed:
        click.echo(f"moebench: error: {audit_failure(result, path, findings_lines(result, 3))}", err=True)
        raise click.exceptions.Exit(1)


def run_request(shapes, shapes_file, balancedness, arms, builds, build_arm, build_host, defines, variants,
                external_arms, ref, rounds, samples, warmup, flush, timer, triton_config, pdl, max_fixture_gb,
                out_dir, graph: bool = False, determinism: bool = False, determinism_runs: int | None = None,
                cross_process: bool | None = None, tuned: str | None = None, **more) -> RunRequest:
    """The RunRequest of `moebench run`'s options (also `sweep`'s); `more`: further RunRequest
    fields (the A/A arm, a noise file, the placements)."""
    from moebench.kernels.registry import parse_arm_list
    from moebench.run.runner import RunRequest
    more.update(_determinism_fields(determinism, determinism_runs, cross_process))
    return RunRequest(shapes=tuple(s for item in (shapes or DEFAULT_SHAPES) for s in item.split(",") if s.strip()),
                      arms=tuple(parse_arm_list(list(arms))) if arms else (), ref=ref, rounds=rounds, samples=samples,
                      warmup=warmup, flush=flush, timer=timer, out_dir=out_dir, balancedness=balancedness,
                      shapes_file=shapes_file, command=("moebench", *sys.argv[1:]),
                      arm_options={"triton_config": triton_config, "pdl": pdl, "tuned": tuned},
                      builds=tuple(builds),
                      build_arm=build_arm, build_host=build_host, defines=tuple(defines), variants=tuple(variants),
                      external_arms=tuple(external_arms), max_fixture_gb=max_fixture_gb,
                      sampler="graph" if graph else "eager", **more)


def _determinism_fields(determinism: bool, runs: int | None, cross_process: bool | None) -> dict:
    """The request's determinism fields; the options that only qualify --determinism refused without it."""
    if not determinism:
        for flag, given in (("--determinism-runs", runs is not None),
                            ("--cross-process/--no-cross-process", cross_process is not None)):
            if given:
                raise UserError(f"{flag} applies only with --determinism")
        return {}
    return {"determinism": True, "determinism_runs": DETERMINISM_RUNS if runs is None else runs,
            "cross_process": cross_process is not False}


def _given(ctx: click.Context, req: RunRequest) -> dict:
    """The request fields named on the command line beside --resume (arm options by key)."""
    from click.core import ParameterSource
    named = {k for k in ctx.params if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE} - {"resume_path", "wide"}
    if "out_dir" in named:
        raise UserError("--resume finishes FILE where it is: --out does not apply")
    named = {"sampler" if k == "graph" else k for k in named}  # --graph is the request's sampler
    return {k: req.arm_options[k] if k in req.arm_options else getattr(req, k) for k in named}
