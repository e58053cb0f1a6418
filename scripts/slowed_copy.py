#!/usr/bin/env python3
"""A copy of the fused decode kernel made slower on purpose, to test what a run can tell apart.

    python scripts/slowed_copy.py DIR --cycles 900

writes DIR/sm90_fused_moe.cu (and the headers it includes) with every CTA of `moebench_fused_moe`
spinning CYCLES SM clocks at entry: the kernel's duration grows by about CYCLES / clock, the same
at every shape where it runs one wave. Timed as `--build slow=DIR/sm90_fused_moe.cu` beside the
shipped kernel, it is the known slowdown a run's verdict must call slower. Never a shipping switch:
the spin lives only in the copy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "moebench" / "kernels"
ENTRY = "    extern __shared__ __align__(128) u8 smem_base[];\n"


def slowed_source(text: str, cycles: int) -> str:
    """`text` (sm90_fused_moe.cu) with a spin of `cycles` clocks at the decode kernel's entry."""
    if text.count(ENTRY) != 1:
        raise ValueError("the decode kernel's entry was not found once: the source changed")
    spin = ("    { const long long spin_from = clock64();  // slowed copy: a known delay\n"
            f"      while (clock64() - spin_from < {cycles}ll) {{ }} }}\n")
    return text.replace(ENTRY, ENTRY + spin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--cycles", type=int, required=True)
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    args.dir.mkdir(parents=True, exist_ok=True)
    for header in KERNELS.glob("*.cuh"):
        shutil.copy(header, args.dir / header.name)
    source = (KERNELS / "sm90_fused_moe.cu").read_text()
    (args.dir / "sm90_fused_moe.cu").write_text(slowed_source(source, args.cycles))
    print(args.dir / "sm90_fused_moe.cu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
