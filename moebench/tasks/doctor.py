"""What this machine has for moebench: one finding per line, OK, WARN or ERROR, each not-OK
line saying what to do.

ERROR: a run cannot work (no GPU, CUPTI refused, NVRTC or the compile cache unusable).
WARN: a run works but its numbers may mislead (another process on the GPU, a throttled clock,
MIG slices, persistence off) or an optional part is missing (the referee engine).
`cpu_only` checks what CPU use needs (tests, `fixtures`, `build`, `report`): torch, the Triton
interpreter, NVRTC, the compile cache.

The GPU's state comes through a `GpuProbe` (NVML and CUPTI by default), so the checks that read
it can be tested on a machine without one. `arm_availability` is what `moebench arms` lists.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

OK, WARN, ERROR = "OK", "WARN", "ERROR"

# NVML clock-event reasons that mean the GPU is slowed against its will (not idle, not a user
# setting): the bit values of nvmlClocksEventReason*, stable across driver versions.
SLOWDOWN_REASONS = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                    0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}


@dataclass(frozen=True)
class Finding:
    level: str  # OK | WARN | ERROR
    label: str
    detail: str
    advice: str = ""  # what to do, for WARN and ERROR

    def line(self) -> str:
        text = f"{self.level:6} {self.label}: {self.detail}"
        return f"{text}; {self.advice}" if self.advice else text


@dataclass(frozen=True)
class GpuState:
    """What NVML says of one device now. None: the query is not available."""

    other_processes: tuple[tuple[int, int], ...] | None  # (pid, used bytes), this process left out
    mig_enabled: bool | None
    persistence_on: bool | None
    sm_mhz: int | None
    sm_max_mhz: int | None
    mem_mhz: int | None
    mem_max_mhz: int | None
    clock_event_reasons: int | None


class GpuProbe:
    """The GPU facts the checks read; tests pass a fake with the same methods."""

    def device(self) -> str:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible")
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, {p.total_memory / 2**30:.0f} GiB")

    def driver(self) -> str:
        import pynvml
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def state(self) -> GpuState:
        import pynvml
        pynvml.nvmlInit()
        import torch
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if torch.cuda.is_available() else 0)

        def ask(fn, *args):
            try:
                return fn(h, *args)
            except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: unknown, not a failure
                return None

        procs = ask(pynvml.nvmlDeviceGetComputeRunningProcesses)
        others = None if procs is None else tuple(
            (int(p.pid), int(p.usedGpuMemory or 0)) for p in procs if int(p.pid) != os.getpid())
        mig = ask(pynvml.nvmlDeviceGetMigMode)
        persistence = ask(pynvml.nvmlDeviceGetPersistenceMode)
        return GpuState(
            other_processes=others,
            mig_enabled=None if mig is None else bool(mig[0]),
            persistence_on=None if persistence is None else bool(persistence),
            sm_mhz=ask(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
            sm_max_mhz=ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
            mem_mhz=ask(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
            mem_max_mhz=ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM),
            clock_event_reasons=ask(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                    or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons),
        )

    def cupti(self) -> str:
        """Subscribe to CUPTI's callbacks and open the activity tracer a run uses, then let both
        go; raises what CUPTI raised (another profiler holds it, no permission, no driver)."""
        from importlib.metadata import version

        from moebench.timing.cupti_tracer import CuptiTracer, load_cupti
        cupti = load_cupti()
        handle = cupti.subscribe(lambda *args: None, None)
        cupti.unsubscribe(handle)
        CuptiTracer().close()
        return f"cupti-python {version('cupti-python')}: subscribed and traced"


# ---------------------------------------------------------------------------- CPU checks

def _versions() -> Finding:
    from importlib.metadata import PackageNotFoundError, version
    found, missing = [], []
    for dist in ("torch", "triton", "cuda-core", "cuda-bindings", "cupti-python", "nvidia-ml-py", "nvtx", "rich"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            missing.append(dist)
    import torch
    found.append(f"torch's CUDA {torch.version.cuda or 'none'}")
    if missing:
        return Finding(ERROR, "libraries", f"missing {', '.join(missing)} ({'; '.join(found)})",
                       "install moebench's dependencies: pip install -e .")
    return Finding(OK, "libraries", ", ".join(found))


def _triton_interpreter() -> str:
    """Run a two-line kernel on the CPU interpreter and check what it wrote."""
    import torch
    import triton
    import triton.language as tl

    was = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        @triton.jit
        def double(x_ptr, y_ptr, N: tl.constexpr):
            offs = tl.arange(0, N)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2)

        x = torch.arange(1, 9, dtype=torch.float32)
        y = torch.zeros_like(x)
        double[(1,)](x, y, 8)
    finally:
        if was is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = was
    if not torch.equal(y, 2 * x):
        raise RuntimeError(f"a kernel doubling 1..8 wrote {y.tolist()}")
    return f"triton {triton.__version__}: a kernel ran on the CPU"


def _nvrtc() -> str:
    from moebench.kernels.cuda.nvrtc import compile_source, nvrtc_version
    module = compile_source('extern "C" __global__ void doctor_probe(float* x) { x[threadIdx.x] = 1.0f; }',
                            name="doctor_probe.cu", use_cache=False)
    return f"NVRTC {nvrtc_version()}: compiled for {module.build.arch}"


def _cache() -> str:
    from moebench.kernels.cuda.cache import cache_dir
    from moebench.record.atomic import atomic_write
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / ".moebench-write-check", b"").unlink()
    except OSError as err:
        raise RuntimeError(f"cannot write into {folder}: {err.strerror or err}") from None
    return f"{folder} is writable"


def _nvrtc_advice(err: BaseException) -> str:
    """A UserError already says what to do (an unwritable cache folder is not a missing NVRTC)."""
    from moebench.errors import UserError
    return "" if isinstance(err, UserError) else "pip install nvidia-cuda-nvrtc cuda-core matching your CUDA driver"


def cpu_findings() -> list[Finding]:
    return [
        _versions(),
        _attempt("Triton interpreter", _triton_interpreter, "pip install triton (tests run kernels under it)"),
        _attempt("NVRTC", _nvrtc, _nvrtc_advice),
        _attempt("compile cache", _cache, "set MOEBENCH_CACHE to a writable folder"),
    ]


# ---------------------------------------------------------------------------- GPU checks

def _processes(state: GpuState) -> Finding:
    if state.other_processes is None:
        return Finding(WARN, "other processes", "unknown (NVML cannot list them)", "check nvidia-smi before timing")
    if state.other_processes:
        listed = ", ".join(f"pid {pid} ({used / 2**30:.1f} GiB)" for pid, used in state.other_processes[:5])
        return Finding(WARN, "other processes", f"{len(state.other_processes)} on this GPU: {listed}",
                       "they share the SMs and HBM with the kernels timed; stop them or use another GPU")
    return Finding(OK, "other processes", "none on this GPU")


def _mig(state: GpuState) -> Finding:
    if state.mig_enabled is None:
        return Finding(OK, "MIG", "not supported on this GPU")
    if state.mig_enabled:
        return Finding(WARN, "MIG", "on: a run times one slice of the GPU",
                       "its numbers do not compare with a whole GPU's; sudo nvidia-smi -mig 0 to turn it off")
    return Finding(OK, "MIG", "off")


def _persistence(state: GpuState) -> Finding:
    if state.persistence_on is None:
        return Finding(WARN, "persistence mode", "unknown", "sudo nvidia-smi -pm 1 keeps the driver loaded")
    if not state.persistence_on:
        return Finding(WARN, "persistence mode", "off: the driver reinitializes the GPU for each process",
                       "sudo nvidia-smi -pm 1")
    return Finding(OK, "persistence mode", "on")


def _clocks(state: GpuState) -> Finding:
    def pair(now, top):
        return f"{now if now is not None else '?'}/{top if top is not None else '?'} MHz"
    detail = f"SM {pair(state.sm_mhz, state.sm_max_mhz)}, memory {pair(state.mem_mhz, state.mem_max_mhz)} (now/max)"
    if state.clock_event_reasons is None:
        return Finding(OK, "clocks", detail + "; slowdown reasons unknown")
    slow = [name for bit, name in SLOWDOWN_REASONS.items() if state.clock_event_reasons & bit]
    if slow:
        return Finding(WARN, "clocks", f"{detail}, slowed by {', '.join(slow)}",
                       "let the GPU cool or check its power limit (nvidia-smi -q -d PERFORMANCE) before timing")
    if state.mem_mhz is not None and state.mem_max_mhz and state.mem_mhz < state.mem_max_mhz:
        return Finding(WARN, "clocks", f"{detail}: memory below its maximum",
                       "memory-bound kernels will read slow; check for a locked memory clock (nvidia-smi -q -d CLOCK)")
    return Finding(OK, "clocks", detail + " (an idle SM clock below max is normal)")


def gpu_findings(probe: GpuProbe) -> list[Finding]:
    device = _attempt("GPU", probe.device, "run on a machine with a CUDA GPU, or `moebench doctor --cpu` for CPU use")
    out = [device, _attempt("driver", probe.driver, "install the NVIDIA driver (NVML comes with it)")]
    if device.level == ERROR:
        return out
    out.append(_attempt("CUPTI", probe.cupti, _cupti_advice))
    try:
        state = probe.state()
    except Exception as err:
        out.append(Finding(WARN, "GPU state", f"unknown ({_first_line(err)})",
                           "other processes, MIG, persistence and clocks unchecked; see nvidia-smi"))
        return out
    return out + [_processes(state), _mig(state), _persistence(state), _clocks(state)]


def _cupti_advice(err: BaseException) -> str:
    from moebench.failures import cupti_advice
    return cupti_advice(err)


# ---------------------------------------------------------------------------- optional

def _stock_tables() -> str:
    """Which built-in families the stock arm has the engine's tuned tables for on this GPU."""
    import torch
    import triton

    from moebench.fixtures import ShapeRegistry
    from moebench.kernels.stock.engine_config import TableKey, base_version, load_engine_tables
    tables = load_engine_tables()
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    found = []
    for family in ("A", "Q"):
        spec = ShapeRegistry().resolve(f"{family}8")
        for down in (False, True):
            key = TableKey(name.replace(" ", "_"), spec.E, spec.N // 2, down)
            table, version = tables.find(key, base_version(triton.__version__))
            if table is not None:
                found.append(f"{family} {'down' if down else 'up'} (Triton {version})")
    where = ", ".join(found) or "none: the engines' default config"
    return f"{tables.engine} {tables.version} tables for {name}: {where}"


def _referee() -> str:
    from moebench.kernels.stock.sglang_arm import load_engine
    engine = load_engine()
    how = "whole engine" if not engine.stand_ins else f"{len(engine.stand_ins)} engine modules stood in for"
    return f"sglang {engine.version} ({how})"


def optional_findings() -> list[Finding]:
    """Reported, never an ERROR: the stock arm runs without tuned tables, a run without the referee."""
    return [_attempt("stock tables", _stock_tables, "the stock arm runs the engines' default config", WARN),
            _attempt("referee", _referee, "optional: only the sglang referee arm needs it", WARN)]


# ---------------------------------------------------------------------------- all

def findings(cpu_only: bool = False, probe: GpuProbe | None = None) -> list[Finding]:
    from moebench.record import VERSION
    out = [Finding(OK, "moebench", VERSION), *cpu_findings()]
    if not cpu_only:
        out += gpu_findings(probe or GpuProbe())
    return out + optional_findings()


def exit_code(found: Iterable[Finding]) -> int:
    return 1 if any(f.level == ERROR for f in found) else 0


def _attempt(label: str, fn: Callable[[], str], advice: str | Callable[[BaseException], str],
             level: str = ERROR) -> Finding:
    try:
        return Finding(OK, label, fn())
    except Exception as err:  # each check reports, never stops the others
        return Finding(level, label, _first_line(err), advice(err) if callable(advice) else advice)


def _first_line(err: BaseException) -> str:
    """The error in words: its message (an OSError's reason and file), or, for an exception that
    carries none, its class name spelled out (NVMLError_LibraryNotFound: "NVML library not found")."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    text = str(err).strip()
    return text.splitlines()[0] if text else _spelled(type(err).__name__)


def _spelled(name: str) -> str:
    import re
    head, _, rest = name.partition("_")
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", rest or head)
    subject = re.sub(r"(Error|Exception)$", "", head) if rest else ""
    return " ".join(filter(None, [subject, *(w if w.isupper() else w.lower() for w in words)])) or name


# ---------------------------------------------------------------------------- arms

def arm_availability() -> tuple[str, list[tuple[str, str, str | None]]]:
    """The device looked at, and each registered arm: name, description, why it cannot run here
    (None: it can). `moebench arms` prints these."""
    import torch

    from moebench.kernels.registry import load_builtin_arms
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name, factory in sorted(load_builtin_arms().items()):
        arm = factory()
        rows.append((name, getattr(arm, "description", ""), arm.unavailable_reason(device)))
    return str(device), rows
