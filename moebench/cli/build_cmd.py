"""`moebench build`: compile CUDA sources through NVRTC (no GPU needed) and print what
ptxas reports per kernel: registers, shared memory, spills, wgmma whose asynchrony ptxas took; and
the build hash."""

from __future__ import annotations

import json

import click
from rich.table import Table

from moebench.tasks.build import compiled_modules
from moebench.views.tables import make_console


@click.command()
@click.option("--arm", "arm_names", multiple=True, metavar="A", help="Build this arm's CUDA module(s).")
@click.option("--source", "sources", multiple=True, metavar="F.cu",
              help="A .cu file (a path, or a name in moebench/kernels/). Default: all of them.")
@click.option("--define", "defines", multiple=True, metavar="K=V", help="Preprocessor define (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the build records as JSON.")
def build(arm_names, sources, defines, as_json):
    """Compile CUDA sources for sm_90a with NVRTC and report registers, shared memory, spills."""
    from moebench.kernels.cuda.nvrtc import parse_defines
    records = [(label, m) for label, m in compiled_modules(arm_names, sources, parse_defines(defines))]
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
        for kernel in sorted(m.entries):  # the cubin's kernels; their resources, where ptxas logged them
            r = b.resources.get(kernel)
            t.add_row(kernel, *((str(r.registers), str(r.shared_bytes), f"{r.spill_stores}/{r.spill_loads}",
                                 str(r.stack_bytes)) if r else ("—",) * 4))
        console.print(t)
        for kernel in sorted(k for k, r in b.resources.items() if r.wgmma_serialized):
            console.print(f"{kernel}: ptxas took its wgmma's asynchrony ({b.resources[kernel].wgmma_serialized})")
        if set(m.entries) - set(b.resources):
            console.print("— : NVRTC returned no ptxas log for these kernels; `moebench run` takes their "
                          "registers and local memory from the driver once they are loaded on a GPU")
        console.print(f"build hash {b.build_hash}  ({'cached' if m.cache_hit else 'compiled'})")
