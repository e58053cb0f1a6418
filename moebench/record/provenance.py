"""Where a run came from: git state, library versions, the GPU. Read-only queries.

The device's read bandwidth is not looked up but measured by the runner with the run's
own timer (the best layout of a purpose-built read kernel, moebench.timing.read_floor) and stored in
GpuInfo.read_bandwidth_bytes_per_s, with how it was read in GpuInfo.read_floor.
"""

from __future__ import annotations

import hashlib
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from moebench.record import VERSION

LIBRARIES = ("torch", "triton", "cuda-core", "cuda-bindings", "cupti-python", "nvidia-cuda-cupti",
             "nvidia-cuda-nvrtc", "nvidia-ml-py", "nvtx", "numpy", "rich", "click")
REPO_ROOT = Path(__file__).resolve().parents[2]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_state(root: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout moebench runs from; (None, None) outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None, None
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return commit, dirty


PACKAGE_DIR = Path(__file__).resolve().parents[1]
PACKAGE_SUFFIXES = (".py", ".cu", ".cuh")


def package_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the relative paths and bytes of moebench's source files: identifies the
    code that ran even where the checkout has no git (a copied working tree, a wheel)."""
    h = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*") if p.suffix in PACKAGE_SUFFIXES and p.is_file()):
        h.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def library_versions(names=LIBRARIES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch
        if torch.version.cuda:
            versions["torch.cuda"] = torch.version.cuda
    except Exception:
        pass
    return versions


def gpu_info(device, clocks=None):
    """GpuInfo of a torch CUDA device; `clocks` (a ClockSampler) adds driver and max clocks."""
    import torch

    from moebench.record.schema import GpuInfo
    index = device.index if device.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index)
    uuid = str(getattr(p, "uuid", "") or "")
    driver = clocks.driver_version() if clocks is not None else None
    max_sm, max_mem = clocks.max_clocks_mhz() if clocks is not None else (None, None)
    return GpuInfo(
        name=p.name, index=index, uuid=uuid, compute_capability=f"{p.major}.{p.minor}",
        sm_count=p.multi_processor_count, l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        memory_bytes=int(p.total_memory), driver=driver or "unknown",
        cuda_runtime=torch.version.cuda or "unknown", max_sm_clock_mhz=max_sm, max_mem_clock_mhz=max_mem,
    )


def provenance(command, started_at: str, gpu=None):
    from moebench.record.schema import Provenance
    commit, dirty = git_state()
    return Provenance(
        command=tuple(command), tool_version=VERSION, git_commit=commit, git_dirty=dirty,
        hostname=socket.gethostname(), started_at=started_at, finished_at=utc_now(),
        python=f"{platform.python_implementation()} {sys.version.split()[0]}",
        libraries=library_versions(), gpu=gpu, package_sha256=package_sha256(),
    )
