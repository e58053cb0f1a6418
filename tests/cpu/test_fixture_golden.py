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
    "T8": "84affda9db610080a5db404f77dc2e7718d77b62c5984b63e9e21c3ad0362df2",
    "A8": "bd3a6007f0997fa19f5d04482157ce37a7d660d8c4b9df2bd7336bc18d521937",
    "Q8": "5814dd8fbd05d513a58e6acf7bb8d4ea74e5cf3df578d05c9672dcfae2bbe877",
    "Q128": "2a90013db20bfe3a0133a264b12443212429f55ae83e4d1e585bae87ae426330",
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
