"""Run one arm a few times on one fixture, for a profiler (ncu, nsys) to capture.

    ncu -k regex:moebench_fused_moe --launch-skip 2 --launch-count 1 \\
        python3 scripts/profile_arm.py A128 cuda-fused 4

The fixture and call are the ones `moebench run` times (oracle-checked first); no flush,
no CUPTI tracer (the profiler does its own measuring).
"""

from __future__ import annotations

import sys

import torch

from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.registry import make_arm
from moebench.kernels.parity import References, check_parity


def main(shape: str, arm_name: str, calls: int) -> int:
    fx = build_fixture(ShapeRegistry().resolve(shape)).to("cuda")
    call = make_arm(arm_name).prepare(fx)
    parity = check_parity(call, References(fx), shape)
    print(f"{shape} {arm_name}: rel L2 {parity.rel_l2:.2e} {'ok' if parity.passed else 'FAIL'}", flush=True)
    for _ in range(calls):
        call.run()
    torch.cuda.synchronize()
    return 0 if parity.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4))
