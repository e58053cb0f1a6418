"""Launching NVRTC-built kernels on torch's current stream, and TMA descriptors.

Pointers go to kernels as integers (`data_ptr()`), scalars as numpy scalars of the
parameter's type, TMA descriptors as `tensor_map` returns them. Needs a GPU, unlike
moebench.kernels.cuda.nvrtc, which compiles without one.
"""

from __future__ import annotations

import functools

MAX_DEFAULT_SHARED_BYTES = 48 * 1024  # above this a kernel needs its dynamic limit raised


def device_index(device: int | None) -> int:
    if device is not None:
        return int(device)
    import torch
    return torch.cuda.current_device()


_STREAMS: dict[int, object] = {}


def current_stream():
    """torch's current stream as a cuda.core Stream."""
    import torch
    from cuda.core import Stream
    handle = int(torch.cuda.current_stream().cuda_stream)
    s = _STREAMS.get(handle)
    if s is None:
        s = Stream.from_handle(handle)
        _STREAMS[handle] = s
    return s


# Attribute values set on kernels: (id, device, attribute) -> (kernel, value). The entry holds its
# kernel, so a newer kernel cannot take the same id and be taken for one already set.
_KERNEL_ATTRS: dict[tuple[int, int, int], tuple[object, int]] = {}


@functools.lru_cache(maxsize=None)
def _attribute(name: str):
    """CUfunction_attribute `name` (looked up once: the launches check attributes every call)."""
    from cuda.bindings import driver
    return getattr(driver.CUfunction_attribute, name)


def _set_attribute(kernel, attr, value: int, device: int, what: str, *, at_least: bool = False) -> None:
    """Set a function attribute of `kernel` on `device`, unless it already holds `value` (or,
    with `at_least`, more)."""
    key = (id(kernel), device, int(attr))
    held = _KERNEL_ATTRS.get(key)
    if held is not None and held[0] is kernel and (held[1] >= value if at_least else held[1] == value):
        return
    from cuda.bindings import driver
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        (err,) = driver.cuKernelSetAttribute(attr, value, handle, driver.CUdevice(device))
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, value)
    if int(err) != 0:
        raise RuntimeError(f"could not set {what}: {err}")
    _KERNEL_ATTRS[key] = (kernel, value)


def raise_shared_limit(kernel, shared_bytes: int, device: int) -> None:
    _set_attribute(kernel, _attribute("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"),
                   shared_bytes, device, f"{shared_bytes} B of dynamic shared memory", at_least=True)


CLUSTER_POLICIES = {"default": 0, "spread": 1, "load-balancing": 2}


def set_cluster_policy(kernel, policy: str, device: int) -> None:
    """How the hardware places the kernel's clusters on SMs (CUclusterSchedulingPolicy):
    "default", "spread" or "load-balancing". A kernel attribute, read at each launch; set
    only where it changes."""
    _set_attribute(kernel, _attribute("CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE"),
                   CLUSTER_POLICIES[policy], device, f"the cluster scheduling policy {policy!r}")


def launch(kernel, grid, block, shared_bytes: int, *args, stream=None) -> None:
    """Launch on torch's current stream (or `stream`). Pointers go as ints (data_ptr()),
    scalars as numpy scalars of the kernel's parameter type, TMA descriptors as returned
    by `tensor_map`."""
    from cuda.core import LaunchConfig
    from cuda.core import launch as _launch
    if shared_bytes > MAX_DEFAULT_SHARED_BYTES:
        raise_shared_limit(kernel, shared_bytes, device_index(None))
    config = LaunchConfig(grid=grid, block=block, shmem_size=shared_bytes)
    _launch(stream if stream is not None else current_stream(), config, kernel, *args)

# ---------------------------------------------------------------------------- TMA

def tensor_map(tensor, box_dim: tuple[int, ...], *, swizzle: str = "128B", l2_promotion: str = "256B"):
    """A tiled TMA descriptor over a CUDA tensor, encoded on the host.

    `box_dim` is in the tensor's own (row-major, outermost first) order, in elements, as
    cuda.core takes it; elements outside the tensor read as zero. FP8 tensors are described
    as uint8 (same bytes). The kernel receives it as a `const __grid_constant__` 128-byte,
    64-aligned struct (sm90_common.cuh: TmaDescriptor).
    """
    import torch
    StridedMemoryView, TensorMapL2Promotion, TensorMapSwizzle = _tensor_map_api()
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        tensor = tensor.view(torch.uint8)
    sw = {"none": TensorMapSwizzle.NONE, "32B": TensorMapSwizzle.SWIZZLE_32B,
          "64B": TensorMapSwizzle.SWIZZLE_64B, "128B": TensorMapSwizzle.SWIZZLE_128B}[swizzle]
    l2 = {"none": TensorMapL2Promotion.NONE, "64B": TensorMapL2Promotion.L2_64B,
          "128B": TensorMapL2Promotion.L2_128B, "256B": TensorMapL2Promotion.L2_256B}[l2_promotion]
    check_box(tuple(tensor.shape), tuple(tensor.stride()), tensor.element_size(), tuple(box_dim), swizzle)
    stream = int(torch.cuda.current_stream().cuda_stream)
    from_dlpack = getattr(StridedMemoryView, "from_dlpack", None)  # (the constructor is deprecated)
    view = from_dlpack(tensor, stream_ptr=stream) if from_dlpack else StridedMemoryView(tensor, stream_ptr=stream)
    return view.as_tensor_map(box_dim=tuple(box_dim), swizzle=sw, l2_promotion=l2)


def _tensor_map_api():
    """StridedMemoryView and the TMA enums, wherever this cuda-core version keeps them."""
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:  # older cuda-core
        from cuda.core import StridedMemoryView
    try:
        from cuda.core import TensorMapL2Promotion, TensorMapSwizzle
    except ImportError:
        from cuda.core._tensor_map import TensorMapL2Promotion, TensorMapSwizzle
    return StridedMemoryView, TensorMapL2Promotion, TensorMapSwizzle


SWIZZLE_BYTES = {"none": None, "32B": 32, "64B": 64, "128B": 128}


def check_box(shape: tuple[int, ...], strides: tuple[int, ...], elem_bytes: int,
              box_dim: tuple[int, ...], swizzle: str) -> None:
    """The driver's rules for a tiled box (shape, strides, box outermost first), checked
    on the host so a mistake reads as a sentence, not CUDA_ERROR_INVALID_VALUE."""
    if len(box_dim) != len(shape):
        raise ValueError(f"box {box_dim} has rank {len(box_dim)}, tensor has {len(shape)}")
    if not 1 <= len(shape) <= 5:
        raise ValueError(f"a tiled tensor map has rank 1..5, not {len(shape)}")
    if strides[-1] != 1:
        raise ValueError("the innermost dimension must be contiguous")
    for s in strides[:-1]:
        if (s * elem_bytes) % 16:
            raise ValueError(f"stride {s * elem_bytes} B is not a multiple of 16 B")
    for b in box_dim:
        if not 1 <= b <= 256:
            raise ValueError(f"box dimension {b} outside [1, 256]")
    inner = box_dim[-1] * elem_bytes
    if inner % 16:
        raise ValueError(f"box inner extent {inner} B is not a multiple of 16 B")
    limit = SWIZZLE_BYTES[swizzle]
    if limit is not None and inner > limit:
        raise ValueError(f"box inner extent {inner} B exceeds the {swizzle} swizzle span")


def bind_launch(kernel, grid, block, shared_bytes: int, *args, pdl: bool = False):
    """A callable that launches `kernel` with these arguments on torch's then-current stream:
    the launch configuration is built (and the shared-memory limit raised) once, here. `pdl`:
    with programmatic stream serialization, so the kernel may start before the one ahead of it
    on the stream has ended (before it reads that kernel's output it must `griddepcontrol.wait`,
    or wait on flags that kernel releases, as the prefill pair's overlap does)."""
    from cuda.core import LaunchConfig
    from cuda.core import launch as _launch
    if shared_bytes > MAX_DEFAULT_SHARED_BYTES:
        raise_shared_limit(kernel, shared_bytes, device_index(None))
    config = LaunchConfig(grid=grid, block=block, shmem_size=shared_bytes, programmatic_stream_serialization=pdl)

    def run() -> None:
        _launch(current_stream(), config, kernel, *args)
    return run
