"""`moebench build`: compile CUDA sources through NVRTC (no GPU needed) and print what
ptxas reports per kernel: registers, shared memory, spills; and the build hash."""

from __future__ import annotations

import json

from pathlib import Path

import click
from rich.table import Table

from moebench.cli import cli
from moebench.errors import UserError
from moebench.results.tables import make_console


def _modules(arm_names, sources, defines):
    from moebench.kernels import cuda_build
    from moebench.kernels.registry import make_arm
    if arm_names and (sources or defines):
        raise UserError("--arm builds the arm's own configuration; give --source/--define without it")
    if arm_names:
        for name in arm_names:
            arm = make_arm(name)
            if not hasattr(arm, "build"):
                raise UserError(f"arm {name!r} has no CUDA build")
            yield name, arm.build()
        return
    for src in sources:
        _check_source(src, cuda_build.KERNELS_DIR)
    paths = list(sources) or sorted(p.name for p in cuda_build.KERNELS_DIR.glob("*.cu"))
    for src in paths:
        try:
            yield src, cuda_build.compile_source(Path(src), defines=defines)
        except FileNotFoundError as err:
            raise UserError(str(err)) from None
        except cuda_build.CudaBuildError as err:
            raise UserError(err.one_line()) from None


def _check_source(src: str, kernels_dir: Path) -> None:
    """A --source is a readable .cu or .cuh text file (or the name of one of moebench's)."""
    path = Path(src)
    if not path.exists() and (kernels_dir / path).is_file():
        path = kernels_dir / path
    if path.is_dir():
        raise UserError(f"--source {src}: a folder, not a CUDA source file")
    if not path.is_file():
        raise UserError(f"--source {src}: no such file")
    if path.suffix not in (".cu", ".cuh"):
        raise UserError(f"--source {src}: expected a .cu or .cuh file")
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as err:
        raise UserError(f"--source {src}: not a readable text file ({type(err).__name__})") from None


@cli.command()
@click.option("--arm", "arm_names", multiple=True, metavar="A", help="Build this arm's CUDA module(s).")
@click.option("--source", "sources", multiple=True, metavar="F.cu",
              help="A .cu file (a path, or a name in moebench/kernels/). Default: all of them.")
@click.option("--define", "defines", multiple=True, metavar="K=V", help="Preprocessor define (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the build records as JSON.")
def build(arm_names, sources, defines, as_json):
    """Compile CUDA sources for sm_90a with NVRTC and report registers, shared memory, spills."""
    from moebench.kernels.cuda_build import parse_defines
    records = [(label, m) for label, m in _modules(arm_names, sources, parse_defines(defines))]
    if as_json:
        click.echo(json.dumps([{"label": label, "cache_hit": m.cache_hit, **m.build.to_dict()}
                               for label, m in records], indent=2))
        return
    console = make_console()
    for label, m in records:
        b = m.build
        defs = " ".join(f"{k}={v}" for k, v in b.defines) or "none"
        t = Table(title=f"{label}: {b.name} ({b.arch}, NVRTC {b.nvrtc_version}, defines {defs})",
                  title_justify="left")
        for col in ("kernel", "registers", "static smem B", "spill st/ld B", "stack B"):
            t.add_column(col, justify="left" if col == "kernel" else "right")
        for kernel, r in sorted(b.resources.items()):
            t.add_row(kernel, str(r.registers), str(r.shared_bytes), f"{r.spill_stores}/{r.spill_loads}",
                      str(r.stack_bytes))
        console.print(t)
        console.print(f"build hash {b.build_hash}  ({'cached' if m.cache_hit else 'compiled'})")
