"""The one place GPU tests are gated: `@pytest.mark.gpu` tests skip without a CUDA device."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton decides at `import triton` whether its own library functions are interpreted:
    # set it before any test module imports triton, or interpreted kernels that call them fail.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def registry():
    from moebench.fixtures import ShapeRegistry
    return ShapeRegistry()
