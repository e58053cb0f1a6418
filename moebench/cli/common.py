"""Options and helpers shared by several commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from moebench.fixtures import ShapeRegistry

shape_option = click.option("--shape", "shapes", multiple=True, metavar="S[,S...]",
                            help="Shape names such as A8, Q128 or deepseek-v3/ep8/M8 (repeat or comma-separate).")
shapes_file_option = click.option("--shapes-file", type=click.Path(dir_okay=False), default=None,
                                  help="TOML file of extra families ([families.X] tables).")
balancedness_option = click.option("--balancedness", type=float, default=0.8, show_default=True,
                                   help="Routing balance b: p = b*uniform + (1-b)*Zipf(1).")


max_fixture_gb_option = click.option(
    "--max-fixture-gb", type=float, default=16.0, show_default=True,
    help="Refuse shapes whose fixture takes more host memory than this to build.")


wide_option = click.option(
    "--wide", is_flag=True,
    help="Tables with every column (the default ones fit 100 columns: the floors' parts and sample counts left out).")


trust_stored_option = click.option(
    "--trust-stored", is_flag=True,
    help="Read a result whose stored summaries or audit disagree with its samples (with a warning).")


def load_result(path: str, trust_stored: bool):
    """A saved result; with `trust_stored`, one warning line per file that disagrees with itself."""
    from moebench.analysis.load import load
    from moebench.analysis.validate import problems
    result = load(path, trust_stored=trust_stored)
    if trust_stored:
        found = problems(result)
        if found:
            click.echo(f"moebench: warning: --trust-stored: {path}: disagrees with its own samples or ranges "
                       f"({len(found)} problem(s), first: {found[0]}); every number below is shown AS STORED, "
                       f"not checked", err=True)
    return result


def registry(shapes_file: str | None, max_fixture_gb: float = 16.0) -> ShapeRegistry:
    from moebench.fixtures import ShapeRegistry  # torch: not for --help
    reg = ShapeRegistry(max_fixture_gb=max_fixture_gb)
    return reg.with_shapes_file(shapes_file) if shapes_file else reg

triton_config_option = click.option(
    "--triton-config", default=None, metavar="auto|default|FILE",
    help="Triton arms' configs: auto (the engines' tuned tables for this GPU, the default), default "
         "(the engines' untuned default), or a JSON of per-M configs in the engines' format.")
tuned_option = click.option(
    "--tuned", default=None, metavar="DIR|FILE", type=click.Path(),
    help="Arm triton-tuned's tables: the folder `moebench tune --out DIR` wrote (or one of its table files).")
pdl_option = click.option(
    "--pdl/--no-pdl", default=None,
    help="Programmatic dependent launch for the stock and engine arms' GEMMs (default: as the engines, on SM90+).")
