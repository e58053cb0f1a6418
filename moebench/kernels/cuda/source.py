"""A CUDA kernel's source as an explicit input: its text, every local header it includes, and
the defines a build adds, pinned when the source is read.

The shipped arms compile `KernelSource.shipped(NAME)` (moebench/kernels/NAME) unless they are
given another one; a `--build` is the same arm given the build's source. Everything NVRTC
reads from the project is in the record, so the compile-cache key is over the record alone,
and a compile reads the record, never the disk (`materialize` writes it to a content-addressed
folder for NVRTC's include search).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from moebench.errors import UserError

KERNELS_DIR = Path(__file__).resolve().parent

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def include_closure(source: str, lookup: Callable[[str], str | None]) -> dict[str, str]:
    """Text of every `#include "..."` header reachable from `source`, by name; `lookup(name)`
    gives a header's text, or None to leave that name to the compiler's own search."""
    out: dict[str, str] = {}
    todo = list(_INCLUDE_RE.findall(source))
    while todo:
        name = todo.pop()
        if name in out:
            continue
        text = lookup(name)
        if text is not None:
            out[name] = text
            todo.extend(_INCLUDE_RE.findall(text))
    return dict(sorted(out.items()))


def folder_lookup(*folders: Path) -> Callable[[str], str | None]:
    """A header lookup over folders, the first holding the name wins."""
    def lookup(name: str) -> str | None:
        found = next((d / name for d in folders if (d / name).is_file()), None)
        return found.read_text() if found is not None else None
    return lookup


def local_headers(source: str, search: tuple[Path, ...]) -> dict[str, str]:
    """Text of every local header the source includes, found in the `search` folders."""
    return include_closure(source, folder_lookup(*search))


@dataclass(frozen=True)
class KernelSource:
    """What one CUDA module compiles from. `defines` are a build's own (`--define`), added to
    the arm's; the arm's meta-parameters stay the arm's to set."""

    filename: str  # e.g. sm90_fused_moe.cu: what NVRTC calls the program
    text: str
    headers: tuple[tuple[str, str], ...] = ()  # (local header name, its text), sorted
    defines: tuple[tuple[str, str], ...] = ()
    origin: str = ""  # where the text was read, for messages

    @classmethod
    def from_text(cls, text: str, filename: str = "inline.cu", search: tuple[Path, ...] = (KERNELS_DIR,),
                  headers: Mapping[str, str] | None = None, origin: str = "") -> KernelSource:
        """A source whose local headers are `headers` where given, else found in `search`."""
        found = dict(headers) if headers is not None else local_headers(text, search)
        return cls(filename, text, tuple(sorted(found.items())), (), origin or filename)

    @classmethod
    def from_file(cls, path: Path, extra_search: tuple[Path, ...] = (KERNELS_DIR,)) -> KernelSource:
        """A file, its headers looked up next to it first."""
        path = Path(path).resolve()
        return cls.from_text(path.read_text(), path.name, (path.parent, *extra_search), origin=str(path))

    @classmethod
    def shipped(cls, filename: str) -> KernelSource:
        """A source of moebench/kernels as it is in this tree."""
        return cls.from_file(KERNELS_DIR / filename, ())

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def with_defines(self, defines: Mapping[str, str]) -> KernelSource:
        return replace(self, defines=tuple(sorted((str(k), str(v)) for k, v in defines.items())))

    def all_defines(self, arm_defines: Mapping[str, str]) -> dict[str, str]:
        """The arm's defines and this source's; a key both set is a mistake, not an override."""
        clash = sorted(k for k, _ in self.defines if k in arm_defines)
        if clash:
            raise UserError(f"define {', '.join(clash)} is set by the arm itself for {self.filename}; "
                            "change it through the arm's options, not --define")
        return {**{str(k): str(v) for k, v in arm_defines.items()}, **dict(self.defines)}

    def content_sha256(self) -> str:
        """SHA-256 over the text and the headers: what `materialize` names its folder by."""
        h = hashlib.sha256(f"{self.filename}\0{self.text}".encode())
        for name, body in self.headers:
            h.update(f"\0{name}\0{body}".encode())
        return h.hexdigest()


def materialize(source: KernelSource, root: Path) -> Path:
    """Write the source and its headers to `root/<content hash>/` (content-addressed, so a
    folder once written never changes); returns the source file's path."""
    from moebench.errors import UserError
    from moebench.record.atomic import atomic_write
    folder = root / source.content_sha256()[:24]
    try:
        for name, body in ((source.filename, source.text), *source.headers):
            p = folder / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.is_file() or p.read_text() != body:
                atomic_write(p, body.encode())
    except OSError as err:  # the cache folder, not NVRTC: say which folder and how to move it
        raise UserError(f"cannot write kernel sources into {str(root)!r} ({err.strerror or err}); "
                        f"set MOEBENCH_CACHE to a writable folder") from None
    return folder / source.filename
