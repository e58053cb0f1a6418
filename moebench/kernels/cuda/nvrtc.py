"""CUDA sources compiled at run time by NVRTC, through the on-disk cache of cuda_cache.

`compile_source` takes a KernelSource (or a file, a file name of moebench/kernels, or text)
and the arm's defines; the cache key is over exactly what NVRTC reads (kernel_source says
why). Compiling needs no GPU (NVRTC runs on the host and ptxas's verbose log gives each
kernel's registers, shared memory and spills); loading a kernel needs one, and launching
is moebench.kernels.cuda.launch's.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import struct
from pathlib import Path

from moebench.kernels.cuda.cache import (CACHE_FORMAT, CudaBuild, KernelResources, build_key, cache_dir,  # noqa: F401
                                         get_or_build, sources_dir)
from moebench.kernels.cuda.launch import device_index
from moebench.kernels.cuda.source import (KERNELS_DIR, KernelSource, include_closure, local_headers,  # noqa: F401
                                          materialize)

DEFAULT_ARCH = "sm_90a"
BASE_FLAGS = ("-std=c++17", "--ptxas-options=-v")


# ---------------------------------------------------------------------------- records

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


# ---------------------------------------------------------------------------- ptxas log

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
# ptxas's notes when it takes a wgmma's asynchrony away: it waits for each before the next
# (serialized), or inserts a wait of its own before registers a wgmma writes are used. Each names
# the function, and may come before that function's "Compiling entry function" line.
_SERIAL_RE = re.compile(r"wgmma\.mma_async instructions are serialized due to (.+?) in the function '([^']+)'")
_INJECTED_RE = re.compile(r"(?:wgmma\.wait_group|warpgroup\.wait) is injected in around line (\d+) by compiler "
                          r"to allow use of registers defined by GMMA in function '([^']+)'")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Per-kernel resources from ptxas's verbose log (entry functions only)."""
    entries: dict[str, dict] = {}
    serialized: dict[str, str] = {}
    current = None
    for line in log.splitlines():
        if m := _SERIAL_RE.search(line):
            serialized[m.group(2)] = "serialized: " + m.group(1).strip()
        elif m := _INJECTED_RE.search(line):
            serialized.setdefault(m.group(2), f"a wait injected before its registers are used (PTX line {m.group(1)})")
        elif m := _ENTRY_RE.search(line):
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
    return {k: KernelResources(**v, wgmma_serialized=serialized.get(k, "")) for k, v in entries.items()}


# ---------------------------------------------------------------------------- cubin

_SHT_SYMTAB, _STT_FUNC = 2, 2
_STB_GLOBAL, _STB_WEAK = 1, 2  # a template's instance is weak
_STO_CUDA_ENTRY = 0x10  # st_other bit of a kernel entry's symbol in a CUDA ELF


def entry_kernels(cubin: bytes) -> frozenset[str]:
    """The (mangled) names of the kernel entries in `cubin`, read from its ELF symbol table.

    What a module holds, whether or not NVRTC returned ptxas's log (the resources come from that
    log, and NVRTC 13.0 on the H200 machine left it empty for some builds). A few lines of the
    ELF64 layout, not a library: the entry bit is CUDA's own, which general ELF readers fold
    into st_other's visibility."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB:
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize or 24):
            name, info, other = struct.unpack_from("<IBB", cubin, at)
            if info & 0xF == _STT_FUNC and info >> 4 in (_STB_GLOBAL, _STB_WEAK) and other & _STO_CUDA_ENTRY:
                start = strings + name
                names.add(cubin[start:cubin.index(b"\0", start)].decode())
    return frozenset(names)


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

    @functools.cached_property
    def entries(self) -> frozenset[str]:
        """The mangled names of the module's kernels (its cubin's entry symbols)."""
        return entry_kernels(self.cubin)

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


def need_kernels(module, names, source: str, launch: str) -> None:
    """One line, not a loader's traceback, when `module` (a build of an older copy of `source`,
    say) lacks a kernel of `names`, which this tree's `launch` runs."""
    from moebench.errors import UserError
    for name in names:
        if module.mangled(name) not in module.entries:
            raise UserError(f"{module.build.name}: no {name} kernel, which this tree's {launch} runs; "
                            f"build a copy of {source} that has it")


_MEMO: dict[str, CudaModule] = {}


# ---------------------------------------------------------------------------- compile

def as_kernel_source(source: KernelSource | str | os.PathLike, name: str | None = None) -> KernelSource:
    """A KernelSource from what callers pass: one, a .cu/.cuh path (or a file name of
    moebench/kernels), or source text (its headers looked up in moebench/kernels)."""
    if isinstance(source, KernelSource):
        return source if name is None else KernelSource(name, source.text, source.headers, source.defines,
                                                        source.origin)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                            and source.endswith((".cu", ".cuh"))):
        p = Path(source)
        if not p.is_absolute() and not p.exists():
            p = KERNELS_DIR / p
        if not p.is_file():
            raise FileNotFoundError(f"no CUDA source {source}")
        found = KernelSource.from_file(p)
    else:
        found = KernelSource.from_text(str(source))
    return found if name is None else KernelSource(name, found.text, found.headers, (), found.origin)


def compile_source(source: KernelSource | str | os.PathLike, *, defines: dict[str, str] | None = None,
                   name_expressions: tuple[str, ...] = (), arch: str = DEFAULT_ARCH,
                   extra_flags: tuple[str, ...] = (), name: str | None = None,
                   use_cache: bool = True) -> CudaModule:
    """Compile `source` with the arm's `defines` (and the source's own) for `arch`, through
    the on-disk cache. Needs no GPU."""
    src = as_kernel_source(source, name)
    all_defines = src.all_defines(defines or {})
    flags = tuple(BASE_FLAGS) + tuple(extra_flags)
    nvrtc = nvrtc_version()
    key = build_key(src.text, dict(src.headers), flags, all_defines, arch, nvrtc, tuple(name_expressions))
    if use_cache and key in _MEMO:
        return _MEMO[key]
    if use_cache:
        def build():
            m = _compile(src, flags, all_defines, arch, nvrtc, tuple(name_expressions), key)
            return m.build, m.cubin, m.symbol_mapping, m.log
        entry, found = get_or_build(cache_dir(), key, build)
        module = CudaModule(*entry, cache_hit=found)
    else:
        module = _compile(src, flags, all_defines, arch, nvrtc, tuple(name_expressions), key)
    _MEMO[key] = module
    return module


def clear_memo() -> None:
    """Forget modules loaded in this process (tests; the disk cache is untouched)."""
    _MEMO.clear()


def _compile(src: KernelSource, flags, defines, arch, nvrtc, name_expressions, key) -> CudaModule:
    from cuda.core import Program
    folder = materialize(src, sources_dir()).parent  # NVRTC includes from here only
    options = _program_options(src.filename, arch, flags, defines, [str(folder)] + cuda_include_dirs())
    log = io.StringIO()
    try:
        program = Program(src.text, "c++", options)
        obj = program.compile("cubin", name_expressions=tuple(name_expressions), logs=log)
    except Exception as err:  # NVRTC's log is in the message or in `log`
        raise CudaBuildError(f"NVRTC failed to compile {src.filename} for {arch}: {err}\n{log.getvalue()}") from err
    cubin = bytes(obj.code)
    mapping = getattr(obj, "symbol_mapping", None) or getattr(obj, "_sym_map", None) or {}
    mapping = {str(k): (v.decode() if isinstance(v, bytes) else str(v)) for k, v in mapping.items()}
    build = CudaBuild(
        name=src.filename, build_hash=key, source_sha256=src.sha256,
        binary_sha256=hashlib.sha256(cubin).hexdigest(), flags=flags,
        defines=tuple(sorted(defines.items())), arch=arch, nvrtc_version=nvrtc,
        headers=tuple((k, hashlib.sha256(v.encode()).hexdigest()) for k, v in src.headers),
        resources=parse_ptxas_log(log.getvalue()),
    )
    return CudaModule(build, cubin, mapping, log.getvalue(), cache_hit=False)
