"""CUDA sources compiled at run time by NVRTC, cached on disk, launched on torch's stream.

A build is identified by `build_hash`: SHA-256 over the source text, the text of every
local header it includes (recursively), the NVRTC flags, the defines, the target arch,
the NVRTC version and the cache format. Entries live in ~/.cache/moebench/cuda (or
$MOEBENCH_CACHE) as `<hash>.cubin` plus `<hash>.json` (metadata, written last), read and
published by moebench.kernels.compile_cache: built under a per-key lock, published by atomic
renames, a corrupt entry rebuilt.

Compiling needs no GPU (NVRTC runs on the host and ptxas's verbose log gives each
kernel's registers, shared memory and spills); loading a kernel needs one, and launching
is moebench.kernels.cuda_launch's.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moebench.kernels import compile_cache
from moebench.kernels.cuda_launch import device_index

KERNELS_DIR = Path(__file__).resolve().parent
CACHE_FORMAT = "moebench-cuda-cache-v1"
DEFAULT_ARCH = "sm_90a"
BASE_FLAGS = ("-std=c++17", "--ptxas-options=-v")

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


# ---------------------------------------------------------------------------- records

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


class CudaBuildError(RuntimeError):
    """NVRTC rejected a source: the message carries its log."""

    def one_line(self) -> str:
        """The first error of the log and where the whole log was saved, on one line."""
        text = str(self)
        head, _, log = text.partition("\n")
        errors = [ln.strip() for ln in log.splitlines() if " error" in ln or ln.strip().startswith("error")]
        path = cache_dir() / "logs" / f"nvrtc-{hashlib.sha256(text.encode()).hexdigest()[:16]}.log"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            where = f"full log: {path}"
        except OSError:
            where = "the log could not be saved"
        first = f": {errors[0]}" + (f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else "") if errors else ""
        return f"{head.split(': ', 1)[0]}{first}; {where}"


# ---------------------------------------------------------------------------- environment

def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        raise CudaBuildError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


def cuda_include_dirs() -> list[str]:
    """Where cuda_fp8.h and friends live: the pip wheel nvidia-cuda-runtime first (so users
    need no toolkit), then $CUDA_HOME / $CUDA_PATH, then /usr/local/cuda."""
    found: list[str] = []
    try:
        import nvidia  # namespace package of the NVIDIA pip wheels
        for root in map(Path, getattr(nvidia, "__path__", [])):
            for sub in ("cu13/include", "cu12/include", "cuda_runtime/include"):
                if (root / sub / "cuda_fp8.h").is_file():
                    found.append(str(root / sub))
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "include"))
    found.append("/usr/local/cuda/include")
    seen, out = set(), []
    for d in found:
        if d not in seen and Path(d, "cuda_fp8.h").is_file():
            seen.add(d)
            out.append(d)
    return out[:1]  # one toolkit's headers, never a mix


def cache_dir() -> Path:
    root = os.environ.get("MOEBENCH_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "moebench"
    return base / "cuda"


# ---------------------------------------------------------------------------- key

def include_closure(source: str, lookup) -> dict[str, str]:
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


def local_headers(source: str, search: tuple[Path, ...]) -> dict[str, str]:
    """Text of every local header the source includes, found in the `search` folders."""
    def lookup(name: str) -> str | None:
        found = next((d / name for d in search if (d / name).is_file()), None)
        return found.read_text() if found is not None else None
    return include_closure(source, lookup)


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


# ---------------------------------------------------------------------------- ptxas log

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Per-kernel resources from ptxas's verbose log (entry functions only)."""
    entries: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            current = m.group(1)
            entries[current] = dict(registers=0, shared_bytes=0, spill_stores=0, spill_loads=0, stack_bytes=0)
        elif m := _PROPS_RE.search(line):
            current = m.group(1) if m.group(1) in entries else current
        elif current is not None and (m := _FRAME_RE.search(line)):
            entries[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                                    spill_loads=int(m.group(3)))
        elif current is not None and (m := _USED_RE.search(line)):
            entries[current]["registers"] = int(m.group(1))
            if s := _SMEM_RE.search(line):
                entries[current]["shared_bytes"] = int(s.group(1))
    return {k: KernelResources(**v) for k, v in entries.items()}


# ---------------------------------------------------------------------------- flags

def parse_defines(items) -> dict[str, str]:
    """`NAME=VALUE` (or `NAME`, meaning 1) texts -> preprocessor defines; a bad name is a UserError."""
    from moebench.errors import UserError
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UserError(f"--define {item!r}: expected NAME=VALUE")
        out[key] = value if sep else "1"
    return out


def _program_options(name: str, arch: str, flags: tuple[str, ...], defines: dict[str, str],
                     include_dirs: list[str]):
    """Our flag strings -> cuda.core ProgramOptions (only the flags we know how to map)."""
    from cuda.core import ProgramOptions
    kw: dict = dict(name=name, arch=arch, include_path=include_dirs,
                    define_macro=[(k, v) for k, v in sorted(defines.items())] or None)
    ptxas: list[str] = []
    for f in flags:
        if f.startswith("-std="):
            kw["std"] = f.split("=", 1)[1]
        elif f.startswith(("--ptxas-options=", "-Xptxas=")):
            ptxas.extend(f.split("=", 1)[1].split(","))
        elif f in ("-lineinfo", "--generate-line-info"):
            kw["lineinfo"] = True
        elif f in ("-use_fast_math", "--use_fast_math"):
            kw["use_fast_math"] = True
        elif f.startswith(("-maxrregcount=", "--maxrregcount=")):
            kw["max_register_count"] = int(f.split("=", 1)[1])
        elif f.startswith(("-ftz=", "--ftz=")):
            kw["ftz"] = f.split("=", 1)[1] == "true"
        else:
            raise ValueError(f"unsupported NVRTC flag {f!r}")
    kw["ptxas_options"] = ptxas or None
    return ProgramOptions(**kw)


# ---------------------------------------------------------------------------- cache entries
# (reading, locking and publishing: moebench.kernels.compile_cache)

def _decode_entry(meta: dict, key: str) -> tuple[CudaBuild, dict[str, str], str]:
    """An entry's build record, symbol mapping and log; raises on anything that does not fit."""
    record = _build_from_meta(meta)
    mapping, log = meta.get("symbol_mapping", {}), meta.get("log", "")
    if record.build_hash != key or not isinstance(mapping, dict) or not isinstance(log, str) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ValueError("cache entry does not fit its key")
    return record, mapping, log


def _build_from_meta(meta: dict) -> CudaBuild:
    b = dict(meta["build"])
    b["flags"] = tuple(b["flags"])
    b["defines"] = tuple(sorted(b["defines"].items()))
    b["headers"] = tuple(sorted(b["headers"].items()))
    b["resources"] = {k: KernelResources(**v) for k, v in b["resources"].items()}
    return CudaBuild(**b)


# ---------------------------------------------------------------------------- module

class CudaModule:
    """A compiled module: its build record, its cubin, and (once on a GPU) its kernels."""

    def __init__(self, build: CudaBuild, cubin: bytes, symbol_mapping: dict[str, str],
                 log: str = "", cache_hit: bool = False):
        self.build = build
        self.cubin = cubin
        self.symbol_mapping = dict(symbol_mapping)
        self.log = log
        self.cache_hit = cache_hit
        self._object_code = None
        self._kernels: dict = {}

    def mangled(self, name: str) -> str:
        return self.symbol_mapping.get(name, name)

    def resources(self, name: str, device: int | None = None) -> KernelResources:
        """The kernel's registers, spills and stack, from ptxas's log; where the log had none,
        from the kernel as loaded on `device` (a GPU is needed then)."""
        found = self.build.resources.get(self.mangled(name))
        if found is not None:
            return found
        attrs = self.kernel(name, device).attributes
        local = int(attrs.local_size_bytes)
        return KernelResources(registers=int(attrs.num_regs), shared_bytes=int(attrs.shared_size_bytes),
                               spill_stores=local, spill_loads=local, stack_bytes=local, source="driver")

    def kernel(self, name: str, device: int | None = None):
        """The loaded cuda.core Kernel `name` (a name expression or an extern "C" name)."""
        if name in self._kernels:
            return self._kernels[name]
        from cuda.core import Device, ObjectCode
        dev = Device(device_index(device))
        dev.set_current()
        if self._object_code is None:
            self._object_code = ObjectCode.from_cubin(self.cubin, name=self.build.name,
                                                      symbol_mapping=self.symbol_mapping)
        k = self._object_code.get_kernel(name)
        self._kernels[name] = k
        return k


_MEMO: dict[str, CudaModule] = {}


# ---------------------------------------------------------------------------- source overrides

@dataclass(frozen=True)
class SourceOverride:
    """Compile `path` (its directory searched first for local headers), with `defines` added,
    wherever code asks compile_source for the built-in source named `source_name`. This is
    how `--build` times one arm family from another source without touching the arm."""

    source_name: str  # e.g. "sm90_fused_moe.cu": matched against the requested file's name
    path: Path
    defines: tuple[tuple[str, str], ...] = ()


@dataclass
class _OverrideScope:
    overrides: dict[str, SourceOverride]
    used: list[CudaBuild] = field(default_factory=list)  # every build an override applied to


_OVERRIDE: contextvars.ContextVar[_OverrideScope | None] = contextvars.ContextVar("moebench_source_override",
                                                                                   default=None)


@contextlib.contextmanager
def source_override(*overrides: SourceOverride):
    """Within the block, compile_source substitutes each override's file for its source name.
    Yields the list of CudaBuilds compiled (or found cached) under an override, so a caller can
    check that the code it ran really went through the override."""
    scope = _OverrideScope({o.source_name: o for o in overrides})
    token = _OVERRIDE.set(scope)
    try:
        yield scope.used
    finally:
        _OVERRIDE.reset(token)


def _apply_override(source, defines: dict[str, str]):
    """(source, defines, scope) with the active override for this source, if any."""
    scope = _OVERRIDE.get()
    if scope is None or not (isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source)):
        return source, defines, None
    o = scope.overrides.get(Path(source).name)
    if o is None:
        return source, defines, None
    clash = sorted(k for k, _ in o.defines if k in defines)
    if clash:
        from moebench.errors import UserError
        raise UserError(f"define {', '.join(clash)} is set by the arm itself for {o.source_name}; "
                        "change it through the arm's options, not --define")
    return o.path, {**defines, **dict(o.defines)}, scope


def compile_source(source: str | os.PathLike, *, defines: dict[str, str] | None = None,
                   name_expressions: tuple[str, ...] = (), arch: str = DEFAULT_ARCH,
                   extra_flags: tuple[str, ...] = (), name: str | None = None,
                   use_cache: bool = True) -> CudaModule:
    """Compile a .cu file (a path, or a file name in moebench/kernels/) or source text for
    `arch`, through the on-disk cache. Needs no GPU. Inside `source_override`, a file with an
    overridden name compiles from the override's path and defines instead."""
    defines = {str(k): str(v) for k, v in (defines or {}).items()}
    source, defines, scope = _apply_override(source, defines)
    module = _compile_cached(source, defines, name_expressions, arch, extra_flags, name, use_cache)
    if scope is not None:
        scope.used.append(module.build)
    return module


def _compile_cached(source, defines: dict[str, str], name_expressions, arch, extra_flags, name,
                    use_cache) -> CudaModule:
    text, name, search = _resolve_source(source, name)
    flags = tuple(BASE_FLAGS) + tuple(extra_flags)
    headers = local_headers(text, search)
    nvrtc = nvrtc_version()
    key = build_key(text, headers, flags, defines, arch, nvrtc, tuple(name_expressions))
    if use_cache and key in _MEMO:
        return _MEMO[key]
    if use_cache:
        built: list[CudaModule] = []

        def build() -> tuple[bytes, dict]:
            built.append(_compile(text, name, search, headers, flags, defines, arch, nvrtc,
                                  tuple(name_expressions), key))
            return built[0].cubin, _entry_meta(built[0])
        (cubin, meta), _found = compile_cache.get_or_build(cache_dir(), key, CACHE_FORMAT, build,
                                                        lambda meta: _decode_entry(meta, key))
        if built:
            module = built[0]
        else:
            record, mapping, log = _decode_entry(meta, key)
            module = CudaModule(record, cubin, mapping, log, cache_hit=True)
    else:
        module = _compile(text, name, search, headers, flags, defines, arch, nvrtc,
                          tuple(name_expressions), key)
    _MEMO[key] = module
    return module


def clear_memo() -> None:
    """Forget modules loaded in this process (tests; the disk cache is untouched)."""
    _MEMO.clear()


def _resolve_source(source, name) -> tuple[str, str, tuple[Path, ...]]:
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                            and source.endswith((".cu", ".cuh"))):
        p = Path(source)
        if not p.is_absolute() and not p.exists():
            p = KERNELS_DIR / p
        if not p.is_file():
            raise FileNotFoundError(f"no CUDA source {source}")
        return p.read_text(), name or p.name, (p.resolve().parent, KERNELS_DIR)
    return str(source), name or "inline.cu", (KERNELS_DIR,)


def _compile(text, name, search, headers, flags, defines, arch, nvrtc, name_expressions, key) -> CudaModule:
    from cuda.core import Program
    include_dirs = [str(d) for d in dict.fromkeys(search)] + cuda_include_dirs()
    options = _program_options(name, arch, flags, defines, include_dirs)
    log = io.StringIO()
    try:
        program = Program(text, "c++", options)
        obj = program.compile("cubin", name_expressions=tuple(name_expressions), logs=log)
    except Exception as err:  # NVRTC's log is in the message or in `log`
        raise CudaBuildError(f"NVRTC failed to compile {name} for {arch}: {err}\n{log.getvalue()}") from err
    cubin = bytes(obj.code)
    mapping = getattr(obj, "symbol_mapping", None) or getattr(obj, "_sym_map", None) or {}
    mapping = {str(k): (v.decode() if isinstance(v, bytes) else str(v)) for k, v in mapping.items()}
    build = CudaBuild(
        name=name, build_hash=key, source_sha256=hashlib.sha256(text.encode()).hexdigest(),
        binary_sha256=hashlib.sha256(cubin).hexdigest(), flags=flags,
        defines=tuple(sorted(defines.items())), arch=arch, nvrtc_version=nvrtc,
        headers=tuple((k, hashlib.sha256(v.encode()).hexdigest()) for k, v in headers.items()),
        resources=parse_ptxas_log(log.getvalue()),
    )
    return CudaModule(build, cubin, mapping, log.getvalue(), cache_hit=False)


def _entry_meta(module: CudaModule) -> dict:
    return {"format": CACHE_FORMAT, "build": module.build.to_dict(),
            "symbol_mapping": module.symbol_mapping, "log": module.log}
