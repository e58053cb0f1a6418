"""The one place GPU tests are gated: `@pytest.mark.gpu` tests skip without a CUDA device."""

import pytest
import torch


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
