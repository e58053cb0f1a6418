"""The on-disk cache of NVRTC builds, and the records that identify a build.

A build is identified by `build_hash`: SHA-256 over the source text, the text of every
local header it includes (recursively), the NVRTC flags, the defines, the target arch,
the NVRTC version and the cache format. Entries live in ~/.cache/moebench/cuda (or
$MOEBENCH_CACHE) as `<hash>.cubin` plus `<hash>.json` (metadata, written last). A build
runs under an fcntl lock on `<hash>.lock`; each file is written to a temporary name and
renamed into place, so a reader sees a whole entry or none. An entry whose cubin does not
match the SHA-256 in its metadata, or whose metadata does not parse, is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moebench.atomic_write import atomic_write

CACHE_FORMAT = "moebench-cuda-cache-v1"


@dataclass(frozen=True)
class KernelResources:
    registers: int
    shared_bytes: int  # static shared memory; dynamic shared memory is chosen at launch
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    # "ptxas": from ptxas's verbose log. "driver": NVRTC returned no log (NVRTC 13.0 on the H200
    # machine did, for some builds of one source and not others), so the loaded kernel's
    # attributes: registers and local memory; the spill counts are then the local bytes (an
    # upper bound: any stack frame counts), 0 when there is none.
    source: str = "ptxas"


@dataclass(frozen=True)
class CudaBuild:
    """What identifies one compiled module, stored with every result that used it."""

    name: str
    build_hash: str  # the cache key
    source_sha256: str
    binary_sha256: str
    flags: tuple[str, ...]
    defines: tuple[tuple[str, str], ...]
    arch: str
    nvrtc_version: str
    headers: tuple[tuple[str, str], ...]  # (local header name, its SHA-256)
    resources: dict = field(default_factory=dict)  # mangled kernel name -> KernelResources

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flags"] = list(self.flags)
        d["defines"] = {k: v for k, v in self.defines}
        d["headers"] = {k: v for k, v in self.headers}
        d["resources"] = {k: asdict(v) for k, v in self.resources.items()}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def spills(self) -> int:
        return sum(r.spill_stores + r.spill_loads for r in self.resources.values())


def cache_dir() -> Path:
    root = os.environ.get("MOEBENCH_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "moebench"
    return base / "cuda"


def sources_dir() -> Path:
    """Where sources are written, by content, for NVRTC's include search (and a reader)."""
    return cache_dir().parent / "sources"


def build_key(source: str, headers: dict[str, str], flags: tuple[str, ...],
              defines: dict[str, str], arch: str, nvrtc: str, name_expressions: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    blob = {
        "format": CACHE_FORMAT, "arch": arch, "nvrtc": nvrtc, "flags": list(flags),
        "defines": sorted(defines.items()), "name_expressions": list(name_expressions),
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "headers": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in headers.items()},
    }
    h.update(json.dumps(blob, sort_keys=True).encode())
    return h.hexdigest()


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_entry(root: Path, key: str) -> tuple[bytes, dict] | None:
    """The cubin and metadata of a whole, uncorrupted entry; None otherwise."""
    meta_path, bin_path = root / f"{key}.json", root / f"{key}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = bin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("build", {}).get("binary_sha256"):
        return None
    return cubin, meta


def build_from_meta(meta: dict) -> CudaBuild:
    b = dict(meta["build"])
    b["flags"] = tuple(b["flags"])
    b["defines"] = tuple(sorted(b["defines"].items()))
    b["headers"] = tuple(sorted(b["headers"].items()))
    b["resources"] = {k: KernelResources(**v) for k, v in b["resources"].items()}
    return CudaBuild(**b)


def publish(root: Path, key: str, build: CudaBuild, cubin: bytes, symbol_mapping: dict[str, str], log: str) -> None:
    """Write one entry: the cubin first, its metadata last (a reader trusts only whole entries)."""
    root.mkdir(parents=True, exist_ok=True)
    meta = {"format": CACHE_FORMAT, "build": build.to_dict(), "symbol_mapping": symbol_mapping, "log": log}
    atomic_write(root / f"{key}.cubin", cubin)
    atomic_write(root / f"{key}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
