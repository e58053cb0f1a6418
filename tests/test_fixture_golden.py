"""Golden fingerprints: the same fixture bytes on every machine and torch version.

Computed with the v2 builder (every float drawn through moebench.fixtures.portable) on the CPU
development machine (AMD EPYC, AVX2, torch 2.13), and reproduced there with torch's kernels
forced to their scalar versions (ATEN_CPU_CAPABILITY=default). The suite passing on another
machine (the GPU hosts' AVX512 CPUs and their torch included) is the cross-machine check. A
change to the builder's draw order or quantization must change them on purpose.
"""

import json
import os
import subprocess
import sys

import pytest

import moebench
from moebench.fixtures import build_fixture

GOLDEN = {
    "T8": "0f8e2bfad940ca7bf7c2037e06ed3d760d90c8748bc349fc4f077a8f9eaa2ae8",
    "A8": "8a9bf4e0f5c8decc0c2980e57d3910bd0df23f48fa851c353a61c7aae7b2dece",
    "Q8": "9f2f009d99ed290b4f6239aec315f2503c7e3495d5b58fe429ab38317463b316",
    "Q128": "481ab4ef3283926712cf6a08a5b84beb2a31071c8823a85445ace102245a45da",
}

_CHILD = """
import json, sys
from moebench.fixtures import ShapeRegistry, build_fixture
import torch
reg = ShapeRegistry()
print(json.dumps({"isa": torch.backends.cpu.get_cpu_capability(),
                  "fingerprints": {n: build_fixture(reg.resolve(n)).fingerprint for n in sys.argv[1:]}}))
"""


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_fingerprint(registry, name):
    assert build_fixture(registry.resolve(name)).fingerprint == GOLDEN[name]


def test_scalar_kernels_build_the_same_bytes():
    """torch's scalar kernels (ATEN_CPU_CAPABILITY=default) against the vectorized ones this
    CPU dispatches to: the cross-ISA check one machine can make."""
    root = os.path.dirname(os.path.dirname(moebench.__file__))  # the child imports this copy
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _CHILD, *sorted(GOLDEN)], env=env, capture_output=True,
                         text=True, check=True).stdout
    child = json.loads(out.strip().splitlines()[-1])
    assert child["isa"] == "DEFAULT"
    assert child["fingerprints"] == GOLDEN
