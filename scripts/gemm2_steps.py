"""Experiment: how many K steps should one GEMM2 CTA of cuda-swapab stream?

GEMM2's K per tile is I = 128 (one step), so a CTA streams `target_steps` 64-row tiles.
Each variant is checked against the oracle, then all are timed as callables of one paired
run per shape through `moebench.bench` (same flush, CUPTI records, rounds and audit).

    python scripts/gemm2_steps.py OUT_DIR [SHAPE ...]
"""

from __future__ import annotations

import dataclasses
import sys

import moebench
from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.arm import make_arm
from moebench.kernels.parity import References, check_parity

STEPS = (8, 4, 16, 32)


def main(out_dir: str, shapes: list[str]) -> None:
    for shape in shapes:
        fx = build_fixture(ShapeRegistry().resolve(shape)).to("cuda")
        refs = References(fx)
        calls = {}
        for steps in STEPS:
            arm = make_arm("cuda-swapab")
            arm.config = dataclasses.replace(arm.config, target_steps=steps)
            call = arm.prepare(fx)
            parity = check_parity(call, refs, shape)
            print(f"{shape} steps={steps}: tiles/CTA {call.identity['grids']['tiles_per_cta']}, "
                  f"rel L2 {parity.rel_l2:.2e} {'ok' if parity.passed else 'FAIL'}", flush=True)
            if parity.passed:
                calls[f"steps{steps}"] = call
        result = moebench.bench({k: c.run for k, c in calls.items()},
                                kernels={k: c.kernels for k, c in calls.items()}, label=shape,
                                hbm_bytes=fx.floors().hbm_bytes, out_dir=out_dir)
        for r in result.ratios:
            s = next(x for x in result.summaries if x.arm == r.arm)
            print(f"{shape} {r.arm}: {s.median_ns / 1e3:.2f} us, steps8/{r.arm} = {r.median:.3f} "
                  f"({r.low:.3f}-{r.high:.3f}, {r.rounds_won}/{r.rounds})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["Q128", "A128", "Q8", "A8"])
