"""Experiment: how many K steps should one GEMM2 CTA of cuda-swapab stream?

GEMM2's K per tile is I = 128 (one step), so a CTA streams `target_steps` 64-row tiles.
Each variant is checked against the oracle, then all are timed as callables of one paired
run per shape through `moebench.bench` (same flush, CUPTI records, rounds and audit).

    python scripts/gemm2_steps.py OUT_DIR [SHAPE ...]
"""

from __future__ import annotations

import sys

from arm_variants import make_variant, time_variants

STEPS = (8, 4, 16, 32)


def main(out_dir: str, shapes: list[str]) -> None:
    for shape in shapes:
        arms = {f"steps{s}": make_variant("cuda-swapab", {"target_steps": s}) for s in STEPS}
        time_variants(shape, arms, out_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["Q128", "A128", "Q8", "A8"])
