"""`moebench profile SHAPE ARM`: run one arm untimed after checking it, for ncu or nsys."""

from __future__ import annotations

import sys

import click

from moebench.choices import FLUSH_MODES
from moebench.cli.common import balancedness_option, pdl_option, shapes_file_option, triton_config_option
from moebench.errors import one_line
from moebench.failures import RunFailed


@click.command("profile")
@click.argument("shape")
@click.argument("arm")
@click.option("--calls", type=int, default=4, show_default=True, help="Untimed calls, after the warm-ups.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Calls before them.")
@click.option("--flush", type=click.Choice(FLUSH_MODES), default="none", show_default=True,
              help="L2 flush before each call (ncu --cache-control all flushes by itself).")
@click.option("--variant", "variants", multiple=True, metavar="NAME=ARM:KEY=VALUE[,...]",
              help="Profile a variant instead: ARM is then the variant's NAME.")
@shapes_file_option
@balancedness_option
@triton_config_option
@pdl_option
def profile(shape, arm, calls, warmup, flush, variants, shapes_file, balancedness, triton_config, pdl):
    """Check ARM against the oracle on SHAPE, then run it untimed (NVTX ranges when nvtx is
    installed), e.g.  ncu -k regex:moebench_fused_moe --launch-skip 2 --launch-count 1
    moebench profile A128 cuda-fused"""
    from moebench.run.plan import RunRequest  # torch: not for --help
    from moebench.tasks.profile import profile_arm
    req = RunRequest(shapes=(shape,), arms=(arm,), warmup=warmup, flush=flush, shapes_file=shapes_file,
                     balancedness=balancedness, command=("moebench", *sys.argv[1:]),
                     arm_options={"triton_config": triton_config, "pdl": pdl}, variants=tuple(variants))
    try:
        p = profile_arm(req, calls)
    except RunFailed as err:
        click.echo(f"moebench: error: {one_line(str(err))}", err=True)
        raise click.exceptions.Exit(err.exit_code) from None
    par = next(x for x in p.parity if x.arm == p.arm)
    click.echo(f"{p.shape} {p.arm}: rel L2 {par.rel_l2:.2e} ok; {p.calls} calls after {p.warmup} warm-ups, "
               f"flush {p.flush}, untimed; kernels {', '.join(p.kernels)}")
