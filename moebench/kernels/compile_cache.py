"""The on-disk compile cache: entries that are whole or absent, shared safely by processes.

An entry is `<key>.cubin` and `<key>.json` (metadata, holding the cubin's SHA-256). A miss is
built under an fcntl lock on `<key>.lock`, so concurrent processes asking for the same key
compile it once and the others wait and read it; different keys never wait on each other.
Each file is written to a temporary name and renamed into place, the metadata last, so a
reader without the lock sees the old entry, the new one, or none. An entry that does not
check out (unparsable or foreign metadata, a cubin whose hash differs, metadata the caller
cannot decode) is a miss: rebuilt and replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moebench.atomic_write import atomic_write
from moebench.errors import UserError

Entry = tuple[bytes, dict]  # cubin, metadata


@contextlib.contextmanager
def _locked(path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")
    except OSError as err:
        raise UserError(f"compile cache {str(path.parent)!r} cannot be written ({err.strerror or err}); "
                        "set MOEBENCH_CACHE to a writable folder") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_entry(root: Path, key: str, cache_format: str, decode: Callable[[dict], Any] | None = None) -> Entry | None:
    """The cubin and metadata of a whole entry that checks out; None for a miss or a bad entry.
    `decode(meta)` must not raise for an entry to count (the caller's own record of it)."""
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        cubin = (root / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):  # absent, unreadable, not JSON, not UTF-8
        return None
    if not isinstance(meta, dict) or meta.get("format") != cache_format:
        return None
    build = meta.get("build")
    if not isinstance(build, dict) or build.get("binary_sha256") != hashlib.sha256(cubin).hexdigest():
        return None
    if decode is not None:
        try:
            decode(meta)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
    return cubin, meta


def publish(root: Path, key: str, cubin: bytes, meta: dict) -> None:
    """Write an entry: the cubin, then the metadata that vouches for it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / f"{key}.cubin", cubin)
        atomic_write(root / f"{key}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    except OSError as err:
        raise UserError(f"compile cache {str(root)!r} cannot be written ({err.strerror or err}); "
                        "set MOEBENCH_CACHE to a writable folder") from None


def get_or_build(root: Path, key: str, cache_format: str, build: Callable[[], Entry],
                 decode: Callable[[dict], Any] | None = None) -> tuple[Entry, bool]:
    """The entry for `key` and whether it was found (True) or built here (False). A miss is
    checked again under the key's lock, since another process may have built it meanwhile."""
    hit = read_entry(root, key, cache_format, decode)
    if hit is not None:
        return hit, True
    with _locked(root / f"{key}.lock"):
        hit = read_entry(root, key, cache_format, decode)
        if hit is not None:
            return hit, True
        cubin, meta = build()
        publish(root, key, cubin, meta)
        return (cubin, meta), False
