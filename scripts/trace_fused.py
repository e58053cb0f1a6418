"""Where a cuda-fused call spends its time: per-CTA phase timestamps from inside the kernel.

    python3 scripts/trace_fused.py OUT_DIR [--shape A8,A128,Q8,Q128] [--calls 5] [--define KEY=VALUE ...] [--arm-arg KEY=INT ...]

Builds the arm's kernel with MOEBENCH_TRACE set to a device buffer (sm90_fused_moe.cu,
"Phase timestamps"), checks it against the oracle, then runs `--calls` cold calls (the L2
read-flushed before each, as `moebench run` does) and saves every CTA's timestamps as
OUT_DIR/trace-SHAPE.npz (int64 [calls, CTAs, SLOTS]: globaltimer ns, and from slot 128 the
SM clock at the same stamps). It prints, per shape, the phases'
medians and spreads over CTAs. A diagnostic, not a timer: the stores add a few instructions
to the traced build, and the spans are globaltimer (ns) readings, not CUPTI durations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moebench.fixtures import ShapeRegistry, build_fixture  # noqa: E402
from moebench.kernels import fused_arm  # noqa: E402
from moebench.kernels.cuda_build import parse_defines, source_override  # noqa: E402
from moebench.kernels.parity import References, check_parity  # noqa: E402
from moebench.timing.flush import L2Flush  # noqa: E402

SLOTS = 256  # TRACE_SLOTS in the .cu (128 + s: the clock64 twin of stamp s)
ITEMS = 8   # items traced per CTA


def phases(tr: np.ndarray) -> dict[str, np.ndarray]:
    """One call's trace [CTAs, SLOTS] -> named per-CTA times (µs from the earliest entry)."""
    busy = tr[:, 7] > 0
    t0 = tr[:, 0].min()
    us = (tr.astype(np.float64) - t0) / 1e3
    out = {"entry": us[:, 0], "first chunks issued": us[:, 2], "first meta out": us[:, 3],
           "producer done": us[:, 4], "consumers done": us[:, 5], "exit": us[:, 6]}
    items = tr[:, 7]
    for n in range(ITEMS):
        has = items > n
        if not has.any():
            break
        b = 8 + 5 * n
        for k, name in enumerate(("meta", "first chunk", "gemm1 done", "exchange done", "gemm2 done")):
            v = np.where(has, us[:, b + k], np.nan)
            out[f"item{n} {name}"] = v
    out["busy"] = busy
    return out


def summary(tr: np.ndarray) -> list[str]:
    p = phases(tr)
    busy = p["busy"]
    lines = [f"  CTAs {len(busy)}, busy {int(busy.sum())}, span {p['exit'].max():.2f} µs, "
             f"SMs {len(np.unique(tr[:, 1]))}"]

    def row(name, v):
        v = v[~np.isnan(v)]
        if v.size:
            q = np.percentile(v, [0, 10, 50, 90, 100])
            lines.append(f"  {name:<22} " + " ".join(f"{x:8.2f}" for x in q))

    lines.append(f"  {'phase (µs)':<22} " + " ".join(f"{h:>8}" for h in ("min", "p10", "p50", "p90", "max")))
    for name in ("entry", "first meta out", "first chunks issued"):
        row(name, np.where(busy, p[name], np.nan))
    for n in range(ITEMS):
        if f"item{n} meta" not in p:
            break
        for k in ("meta", "first chunk", "gemm1 done", "exchange done", "gemm2 done"):
            row(f"item{n} {k}", p[f"item{n} {k}"])
        row(f"item{n} gemm1 time", p[f"item{n} gemm1 done"] - p[f"item{n} first chunk"])
        row(f"item{n} exchange wait", p[f"item{n} exchange done"] - p[f"item{n} gemm1 done"])
        row(f"item{n} gemm2 time", p[f"item{n} gemm2 done"] - p[f"item{n} exchange done"])
    for name in ("producer done", "consumers done", "exit"):
        row(name, np.where(busy, p[name], np.nan))
    t0 = tr[:, 0].min()
    for slot, name in ((91, "s barriers initialised"), (92, "s set-up passed"), (90, "s producer starts"),
                       (87, "s first trip back"), (89, "s slot ids back")):
        v = tr[busy, slot]
        if (v > 0).any():
            row(name, (v[v > 0] - t0) / 1e3)
    for slot, name in ((10, "x gemm1 done"), (80, "x sums shared"), (81, "x cluster joined"), (84, "x bytes expected"), (85, "x sums read"),
                       (86, "x swiglu computed"), (82, "x swiglu sent"),
                       (11, "x exchange done"), (83, "x requant done")):
        v = tr[busy, slot]
        if (v > 0).any():
            row(name, (v[v > 0] - t0) / 1e3)
    for j in range(16):  # item 0's chunks: issued (producer), seen landed (consumers)
        iss, lan = tr[busy, 64 + j], tr[busy, 48 + j]
        ok = (iss > 0) & (lan > 0)
        if ok.any():
            row(f"chunk {j} issued", (iss[ok] - t0) / 1e3)
            row(f"chunk {j} landed", (lan[ok] - t0) / 1e3)
            row(f"chunk {j} latency", (lan[ok] - iss[ok]) / 1e3)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="A8,A128,Q8,Q128")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--define", action="append", default=[], metavar="KEY=VALUE",
                    help="a define added to the traced build (an experiment's switch)")
    ap.add_argument("--arm-arg", action="append", default=[], metavar="KEY=INT",
                    help="a CudaFusedArm argument (stages, per_sm, block_m, cluster, max_clusters)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    buf = torch.zeros(4096 * SLOTS, dtype=torch.int64, device=dev)
    flush = L2Flush("read", torch.cuda.get_device_properties(dev).L2_cache_size, dev)
    override = fused_arm.source_with_defines(("MOEBENCH_TRACE", f"{buf.data_ptr():#x}ULL"),
                                             *parse_defines(args.define).items())
    arm_args = {k: int(v) for k, v in (a.split("=", 1) for a in args.arm_arg)}
    rc = 0
    with source_override(override) as used:
        for shape in args.shape.split(","):
            fx = build_fixture(ShapeRegistry().resolve(shape)).to(dev)
            call = fused_arm.CudaFusedArm(**arm_args).prepare(fx)
            assert used, "the traced build did not go through the override"
            parity = check_parity(call, References(fx), shape)
            ctas = call.identity["grid"][0]
            traces = []
            for _ in range(args.calls):
                buf.zero_()
                call.reset()
                flush()
                call.run()
                torch.cuda.synchronize()
                traces.append(buf[: ctas * SLOTS].view(ctas, SLOTS).cpu().numpy())
            tr = np.stack(traces)
            np.savez_compressed(args.out / f"trace-{shape}.npz", trace=tr,
                                identity=np.array(repr({k: v for k, v in call.identity.items() if k != "build"})))
            idn = call.identity
            print(f"{shape}: rel L2 {parity.rel_l2:.2e} {'ok' if parity.passed else 'FAIL'}; clusters {idn['clusters']} "
                  f"x {idn['cluster']}, {idn['ctas_per_sm']}/SM, {idn['stages']} stages, items {idn['items']}, "
                  f"spans over calls " + " ".join(f"{(t[:, 6].max() - t[:, 0].min()) / 1e3:.2f}" for t in tr))
            print("\n".join(summary(tr[len(tr) // 2])))
            rc |= not parity.passed
    return rc


if __name__ == "__main__":
    sys.exit(main())
