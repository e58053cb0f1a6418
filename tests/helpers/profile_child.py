"""One arm's prepared call under torch.profiler, in a process of its own, for
tests/gpu/test_triton_gpu.py. Test-only.

    python tests/helpers/profile_child.py ARM SHAPE   # prints the kernels, aten ops and kernels_per_sample as JSON

torch.profiler's CUDA activity starts Kineto, which keeps CUPTI's one subscriber slot for the rest
of its process: in the test process every later CUPTI tracer (moebench's timer) would be refused.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.registry import make_arm


def main(arm: str, shape: str) -> None:
    call = make_arm(arm).prepare(build_fixture(ShapeRegistry().resolve(shape)).to("cuda"))
    call.run()  # compiled and warm before the profiled call
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call.run()
        torch.cuda.synchronize()
    events = list(prof.events())
    print(json.dumps({
        "kernels": [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA],
        "aten": [e.name for e in events if e.name.startswith("aten::")],
        "kernels_per_sample": call.kernels_per_sample,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:3])
