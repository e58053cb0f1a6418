"""The on-disk cache of NVRTC builds, and the records that identify a build.

A build is identified by `build_hash`: SHA-256 over the source text, the text of every
local header it includes (recursively), the NVRTC flags, the defines, the target arch,
the NVRTC version and the cache format. Entries live in ~/.cache/moebench/cuda (or
$MOEBENCH_CACHE) as `<hash>.cubin` plus `<hash>.json` (metadata holding the cubin's SHA-256).

A miss is built under an fcntl lock on `<hash>.lock`, so processes asking for the same key
compile it once and the others wait and read it; different keys never wait on each other.
Each file is written to a temporary name and renamed into place, the metadata last, so a
reader without the lock sees the old entry, the new one, or none. An entry counts only if
its metadata decodes to a build of this key and vouches for its cubin; anything else
(unparsable or foreign metadata, a cubin whose hash differs, another key's record, a bad
symbol mapping) is a miss: rebuilt and replaced. A cache that cannot be written is one
line naming MOEBENCH_CACHE.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moebench.errors import UserError
from moebench.record.atomic import atomic_write

CACHE_FORMAT = "moebench-cuda-cache-v2"


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
    # How ptxas took away the asynchrony of the kernel's wgmma, in its words: "serialized: <why>"
    # (each waited for before the next issues), else a wait it injected before registers a wgmma
    # writes are used; "" when neither, or when the resources come from the driver (no log).
    wgmma_serialized: str = ""


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


Entry = tuple[CudaBuild, bytes, dict[str, str], str]  # build record, cubin, symbol mapping, NVRTC log


def _unwritable(folder: Path, err: OSError) -> UserError:
    return UserError(f"compile cache {str(folder)!r} cannot be written ({err.strerror or err}); "
                     "set MOEBENCH_CACHE to a writable folder")


@contextlib.contextmanager
def locked(path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")
    except OSError as err:
        raise _unwritable(path.parent, err) from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def build_from_meta(meta: dict) -> CudaBuild:
    b = dict(meta["build"])
    b["flags"] = tuple(b["flags"])
    b["defines"] = tuple(sorted(b["defines"].items()))
    b["headers"] = tuple(sorted(b["headers"].items()))
    b["resources"] = {k: KernelResources(**v) for k, v in b["resources"].items()}
    return CudaBuild(**b)


def decode_entry(meta: dict, key: str) -> tuple[CudaBuild, dict[str, str], str]:
    """An entry's build record, symbol mapping and log; raises on anything that does not fit `key`."""
    record = build_from_meta(meta)
    mapping, log = meta.get("symbol_mapping", {}), meta.get("log", "")
    if record.build_hash != key or not isinstance(mapping, dict) or not isinstance(log, str) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ValueError("cache entry does not fit its key")
    return record, mapping, log


def read_entry(root: Path, key: str) -> Entry | None:
    """The entry for `key` if it is whole and checks out; None for a miss or a bad entry."""
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        cubin = (root / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):  # absent, unreadable, not JSON, not UTF-8
        return None
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
        return None
    build = meta.get("build")
    if not isinstance(build, dict) or build.get("binary_sha256") != hashlib.sha256(cubin).hexdigest():
        return None
    try:
        record, mapping, log = decode_entry(meta, key)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return record, cubin, mapping, log


def publish(root: Path, key: str, build: CudaBuild, cubin: bytes, symbol_mapping: dict[str, str], log: str) -> None:
    """Write one entry: the cubin first, the metadata that vouches for it last."""
    meta = {"format": CACHE_FORMAT, "build": build.to_dict(), "symbol_mapping": symbol_mapping, "log": log}
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / f"{key}.cubin", cubin)
        atomic_write(root / f"{key}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    except OSError as err:
        raise _unwritable(root, err) from None


def get_or_build(root: Path, key: str, build: Callable[[], Entry]) -> tuple[Entry, bool]:
    """The entry for `key` and whether it was found (True) or built here (False). A miss is
    checked again under the key's lock, since another process may have built it meanwhile."""
    hit = read_entry(root, key)
    if hit is not None:
        return hit, True
    with locked(root / f"{key}.lock"):
        hit = read_entry(root, key)
        if hit is not None:
            return hit, True
        entry = build()
        publish(root, key, *entry)
        return entry, False
