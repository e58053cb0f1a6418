"""Golden fingerprints: the same fixture bytes on every machine and torch version.

These were computed on the CPU development machine (torch 2.13); the suite passing on
another machine (the H200's torch 2.11 included) is the cross-machine check. A change
to the builder's draw order or quantization must change them on purpose.
"""

import pytest

from moebench.fixtures import build_fixture

GOLDEN = {
    "T8": "3a970128d01559e148a1c948c6484f95a403cc65d857c902b76e27a20833cac1",
    "A8": "6700cc33c8adb840026e451b4f9ec09fc79a0d21e433920c144b0f8ec5192252",
    "Q8": "936ab1d18ec00d9a09a5329190618e072532d5e043383c97d5ba20d401411dd6",
    "Q128": "0eb69bf22c7ffedbd345e312678b054b6f9905fb61bc8283aef5ff8b99132862",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_fingerprint(registry, name):
    assert build_fixture(registry.resolve(name)).fingerprint == GOLDEN[name]
