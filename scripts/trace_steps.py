"""Step by step, by the SM's clock: the producer's start and GEMM2's first chunks of a traced call.

    python3 scripts/trace_steps.py TRACE.npz [TRACE.npz ...]

Reads the traces scripts/trace_fused.py saves and prints, for the busy CTAs of every call, the
p10 / p50 / p90 time (µs from the CTA's entry) of each stamp on the producer's path to its first
chunks and of the consumers' exchange and GEMM2. Times come from the clock64 twin of each stamp
(slot 128 + s), scaled by the CTA's own clock rate (clock against globaltimer from the producer's
start to its exit): the globaltimer alone ticks every 256 ns. Traces from before the twins existed
(96 slots) are refused.
"""

from __future__ import annotations

import sys

import numpy as np

CLOCK = 128  # slot of stamp s's clock64: CLOCK + s

START = [(0, "entry"), (91, "barriers initialised"), (92, "set-up passed"), (90, "producer starts"),
         (87, "first trip back"), (121, "early chunks out"), (113, "meta slot free"), (114, "tokens read"),
         (3, "meta copies out"), (96, "chunk 0 past its waits"), (64, "chunk 0 issued"),
         (65, "chunk 1 issued"), (66, "chunk 2 issued"), (67, "chunk 3 issued")]
END = [(10, "GEMM1 done"), (85, "sums read"), (86, "SwiGLU computed"), (11, "exchange done"),
       (83, "requant done"), (56, "chunk 8 seen"), (122, "chunk 8 mma done"), (125, "chunk 8 reduced"),
       (57, "chunk 9 seen"), (123, "chunk 9 mma done"), (126, "chunk 9 reduced"), (58, "chunk 10 seen"),
       (59, "chunk 11 seen"), (12, "GEMM2 done"), (6, "exit")]


def clock_times(call: np.ndarray) -> np.ndarray:
    """One call's trace [CTAs, 256] -> µs from each busy CTA's entry, by its clock; NaN where unstamped."""
    c = call[call[:, 7] > 0].astype(np.float64)
    rate = (c[:, CLOCK + 6] - c[:, CLOCK + 90]) / (c[:, 6] - c[:, 90])  # cycles a ns
    entry = c[:, CLOCK + 90] - (c[:, 90] - c[:, 0]) * rate
    us = (c[:, CLOCK:] - entry[:, None]) / rate[:, None] / 1e3
    return np.where(c[:, CLOCK:] > 0, us, np.nan)


def main(paths: list[str]) -> int:
    for path in paths:
        tr = np.load(path)["trace"]
        if tr.shape[2] < 2 * CLOCK:
            print(f"{path}: {tr.shape[2]} slots, no clock twins (traced before they existed)")
            return 1
        t = np.concatenate([clock_times(call) for call in tr])
        print(f"{path}: {len(tr)} calls, {len(t)} busy CTAs; µs from each CTA's entry, p10 p50 p90")
        for title, steps in (("producer's start", START), ("after GEMM1 (thread 0)", END)):
            print(f"  {title}")
            for slot, name in steps:
                v = t[:, slot]
                v = v[~np.isnan(v)]
                if v.size:
                    p10, p50, p90 = np.percentile(v, [10, 50, 90])
                    print(f"    {name:<24} {p10:7.2f} {p50:7.2f} {p90:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else print(__doc__) or 2)
