"""A small cuda-fused launch for compute-sanitizer: one kernel, then an oracle check.

    compute-sanitizer --tool memcheck  python3 scripts/sanitize_fused.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_fused.py

The shape is small but walks every path of the kernel: K=2048 by default (at clusters of 4,
12 chunks a CTA through a 2-deep ring, so every buffer is reused), two requant groups
(N=512), block_m 16 (two n-tiles), blocks with padding slots, and garbage past the padded
total in both plan buffers. Exit status 0 only when the output matches the oracle.
`--deterministic` sanitizes cuda-fused-det's two kernels (the workspace stores, the combine);
`--zero kernel` a launch that writes its output (NaN-poisoned first) and zeroes it itself (the
ZERO_OUT build), `--zero launch` one behind the zeroing kernel.

Racecheck runs at `--K 1024` (at the default K it does not finish in minutes): with
`--stages 6` each CTA's 6 chunks (clusters of 4) sit in the ring without reuse; with the
default 2 stages every stage is refilled; `--max-clusters 1` walks all 12 items on one
cluster, which adds the item-to-item reuses (meta slots, afull, GEMM2's ring reads, the work
queue). All three report 0 hazards on the H200 (docs/kernels.md, cuda-fused, "Inside the
kernel").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moebench.fixtures import build_fixture, fixture_reference, route_plan  # noqa: E402
from moebench.fixtures.shapes import Family, ShapeSpec  # noqa: E402
from moebench.kernels.cuda.fused_arm import (CudaFusedArm, make_fused_launch,  # noqa: E402
                                        prepare_fused_weights)
from moebench.kernels.api.parity import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, default=12)
    ap.add_argument("--block-m", type=int, default=16)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--cluster", type=int, default=4, help="CTAs a work item (4, the default, 8, or 1: one CTA an item)")
    ap.add_argument("--K", type=int, default=2048, help="hidden size (a multiple of 128)")
    ap.add_argument("--max-clusters", type=int, default=None,
                    help="cap the persistent grid (fewer clusters walk more items each)")
    ap.add_argument("--zero", choices=("kernel", "launch"), default=None,
                    help="write the output (NaN-poisoned first), zeroed by the kernel itself or by the zeroing kernel")
    ap.add_argument("--deterministic", action="store_true",
                    help="the DETERMINISTIC build (cuda-fused-det): workspace rows, then the combine under PDL")
    return run(ap.parse_args())


def run(args) -> int:
    reason = CudaFusedArm().unavailable_reason(torch.device("cuda"))
    if reason:
        print(f"sanitize_fused: {reason}", file=sys.stderr)
        return 2
    family = Family("S", "sanitizer shape", K=args.K, E=6, top_k=3, N=512, routed_scale=1.0, shared_expert=False)
    fx = build_fixture(ShapeSpec(f"S{args.M}", family, args.M, seed=31)).to("cuda")
    weights = prepare_fused_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale, args.cluster)
    plan = route_plan(fx.topk_ids, family.E, args.block_m)
    total, blocks = plan.padded_total, plan.num_blocks
    plan.sorted_token_ids[total:] = torch.arange(plan.sorted_token_ids.numel() - total, dtype=torch.int32) % plan.num_slots
    plan.expert_ids[blocks:] = torch.arange(plan.expert_ids.numel() - blocks, dtype=torch.int32) % family.E
    plan = plan.to("cuda")

    launch, out, module, dims = make_fused_launch(fx.x_fp8, fx.x_scale, weights, plan, fx.topk_weights,
                                                  stages=args.stages, max_clusters=args.max_clusters,
                                                  deterministic=args.deterministic, zero_out=args.zero is not None,
                                                  zero=args.zero)
    if args.zero is not None:
        out.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    p = compare("cuda-fused-det" if args.deterministic else "cuda-fused", fx.spec.name, out, fixture_reference(fx))
    res = module.resources("moebench_fused_moe")
    print(f"sanitize_fused: M={args.M} K={family.K} N={family.N} E={family.E} top_k={family.top_k} "
          f"block_m={dims['block_m']} cluster={dims['cluster']} stages={dims['stages']} grid={dims['grid']} smem={dims['shared_bytes']} B "
          f"zeroing={dims['zeroing']} "
          f"regs={res.registers}: rel_l2={p.rel_l2:.3g} {'ok' if p.passed else 'FAILED: ' + p.reason()}")
    return 0 if p.passed else 1


if __name__ == "__main__":
    sys.exit(main())
