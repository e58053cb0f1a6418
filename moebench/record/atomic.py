"""Write a file so that a reader sees the old contents or the new, whole: never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, rename it into place.
    The file gets the permissions the umask gives a new file (mkstemp alone makes 0600).
    A path that exists and is no regular file (a device such as /dev/null, a pipe) is
    written through, not replaced."""
    path = Path(path)
    if path.exists() and not path.is_file():  # /dev/null, a FIFO: renaming over it would replace it
        with open(path, "wb") as f:
            f.write(data)
        return path
    tmp = _written_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def create_whole(path: str | os.PathLike, data: bytes) -> bool:
    """Create `path` holding `data`, only if no file of that name exists (False then): the file
    appears whole, by a hard link to a written temporary, so a reader never sees it empty or
    part-written, and two writers never both create it."""
    path = Path(path)
    tmp = _written_beside(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _written_beside(path: Path, data: bytes) -> Path:
    """A temporary beside `path` holding `data`, synced, with the permissions the umask gives."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)
