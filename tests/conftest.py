"""The one place GPU tests are gated: `@pytest.mark.gpu` tests skip without a CUDA device."""

import os

import pytest
import torch
from hypothesis import settings

# CI draws the same examples on every run, so a red CI names a bug, never an unlucky draw; a run
# by hand draws new ones each time (run the suite a few times after a change to the loader).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

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


@pytest.fixture(scope="module")
def compiled_triton():
    """The Triton kernels compiled for the GPU (not the interpreter) for a module's tests."""
    from moebench.kernels.stock.arms import interpreter_requested, kernels_module, use_interpreter
    was = interpreter_requested()
    use_interpreter(False)
    assert kernels_module().INTERPRETED is False
    yield
    use_interpreter(was)


@pytest.fixture(scope="module")
def interpreted_triton():
    """The Triton kernels run by the CPU interpreter for a module's tests."""
    from moebench.kernels.stock.arms import interpreter_requested, use_interpreter
    was = interpreter_requested()
    use_interpreter(True)
    yield
    use_interpreter(was)


@pytest.fixture
def sm90():
    """Skips where the fused CUDA kernels cannot run (they need an sm_90 GPU, cuda-core and NVRTC)."""
    from moebench.kernels.cuda.fused_arm import CudaFusedArm
    reason = CudaFusedArm().unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
