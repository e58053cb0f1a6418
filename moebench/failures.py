"""The failures only a GPU machine meets, each turned into one line that says what happened
and what to do: out of GPU memory, a kernel that faults (an illegal instruction or address in a
build), CUPTI unavailable or taken by another profiler, arms that fail the oracle, a failed audit.

Small functions over exceptions and records, so the run can call them where the failure
happens and CPU tests can inject the failure. Nothing here touches a device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from moebench.errors import UserError


class RunFailed(Exception):
    """The run could not produce a trustworthy result (parity or audit failure): exit 1."""

    exit_code = 1


# ---------------------------------------------------------------------------- GPU memory

def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.2f} GB"


def out_of_memory(what: str, need_bytes: int | None, free_bytes: int | None = None,
                  total_bytes: int | None = None) -> UserError:
    """One line for an allocation the GPU could not satisfy while doing `what`."""
    facts = [f"the fixture's tensors take {_gb(need_bytes)}"] if need_bytes else []
    if free_bytes is not None and total_bytes:
        facts.append(f"{_gb(free_bytes)} of {_gb(total_bytes)} free")
    size = f" ({', '.join(facts)})" if facts else ""
    return UserError(f"out of GPU memory {what}{size}: try a smaller M, or free the GPU "
                     "(`moebench doctor` lists other processes on it)")


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError, or a RuntimeError that is one (older torch, cuBLAS, Triton)."""
    try:
        import torch
        if isinstance(err, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(err)
    return isinstance(err, (RuntimeError, MemoryError)) and (
        "out of memory" in text.lower() or "CUDA_ERROR_OUT_OF_MEMORY" in text)


def _memory_info(device) -> tuple[int | None, int | None]:
    try:
        import torch
        if device is not None and getattr(device, "type", None) == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            return int(free), int(total)
    except Exception:  # the device may be past answering after an OOM; the line goes without it
        pass
    return None, None


@contextlib.contextmanager
def gpu_memory_guard(what: str, need_bytes: int | None = None, device=None) -> Iterator[None]:
    """Inside the block, running out of GPU memory is one UserError naming `what` and its size."""
    try:
        yield
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        try:
            import torch
            torch.cuda.empty_cache()
        except Exception:
            pass
        free, total = _memory_info(device)
        raise out_of_memory(what, need_bytes, free, total) from None


# ---------------------------------------------------------------------------- kernel faults

# The CUDA runtime's and driver's names for a kernel that faulted: the context is lost with it.
_FAULTS = ("illegal instruction", "illegal memory access", "misaligned address", "unspecified launch failure",
           "an illegal address", "hardware stack error", "invalid program counter", "CUDA_ERROR_ILLEGAL",
           "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS", "device-side assert")


def is_kernel_fault(err: BaseException) -> bool:
    """A kernel's fault as torch (AcceleratorError, RuntimeError) or cuda.core report it."""
    text = str(err)
    return not isinstance(err, (UserError, RunFailed)) and any(k in text for k in _FAULTS)


@contextlib.contextmanager
def kernel_fault_guard(what: str) -> Iterator[None]:
    """Inside the block, a kernel's fault is one line naming `what` (RunFailed, exit 1): the
    process's CUDA context is lost with it, so the run cannot go on."""
    try:
        yield
    except Exception as err:
        if not is_kernel_fault(err):
            raise
        raise RunFailed(f"{what}: a kernel faulted ({_first_line(err)}); the CUDA context is lost, "
                        "nothing more runs in this process (compute-sanitizer names the kernel and the access)"
                        ) from None


def tensor_bytes(tensors: Iterable) -> int:
    """Bytes of the tensors (a fixture's, before it moves to the GPU)."""
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


# ---------------------------------------------------------------------------- CUPTI

# cupti-python's cuptiError carries CUPTI's CUptiResult name in its text, e.g.
# "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)".
_TAKEN = ("MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", "OLD_PROFILER_API_INITIALIZED", "LEGACY_PROFILER_NOT_SUPPORTED")
_PRIVILEGES = ("INSUFFICIENT_PRIVILEGES",)
EVENTS = "or time with --timer events (labelled so in the result)"


def cupti_advice(err: BaseException) -> str:
    """What to do about a CUPTI error, by its kind."""
    text = f"{type(err).__name__} {err}"
    if any(k in text for k in _TAKEN):
        return f"another profiler holds CUPTI (ncu, nsys, a torch profiler): run moebench outside it, {EVENTS}"
    if any(k in text for k in _PRIVILEGES):
        return ("profiling is restricted to administrators on this machine: run as root or load the driver with "
                f"NVreg_RestrictProfilingToAdminUsers=0, {EVENTS}")
    if "driver" in text.lower() and ("not found" in text.lower() or "libcuda" in text):
        return f"no CUDA driver: run on a GPU machine, {EVENTS}"
    return f"install cupti-python matching the CUDA driver, {EVENTS}"


def cupti_failure(err: BaseException, doing: str = "activity tracing") -> UserError:
    """One line for CUPTI refusing `doing`."""
    return UserError(f"CUPTI refused {doing} ({_first_line(err)}): {cupti_advice(err)}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---------------------------------------------------------------------------- the oracle

@dataclass(frozen=True)
class ParityFailure:
    shape: str
    arm: str
    reason: str

    def line(self) -> str:
        return f"{self.arm} at {self.shape}: {self.reason}"


def parity_exclusions(failed: Iterable[ParityFailure], keep_going: bool, ref: str) -> set[tuple[str, str]]:
    """The (shape, arm) units to leave out of timing. Without `keep_going` any failure stops
    the run before timing (RunFailed, exit 1); with it the failing units are left out and the
    rest is timed, unless the reference failed (no ratio would have a denominator)."""
    failed = list(failed)
    if not failed:
        return set()
    listed = "; ".join(f.line() for f in failed)
    if not keep_going:
        raise RunFailed(f"parity failed, not timing: {listed} (--keep-going times the other arms)")
    ref_failed = [f for f in failed if f.arm == ref]
    if ref_failed:
        raise RunFailed(f"the reference arm {ref!r} failed parity, nothing to take ratios against: {listed}")
    return {(f.shape, f.arm) for f in failed}


def excluded_line(failed: Iterable[ParityFailure]) -> str:
    return "left out of timing, failed the oracle: " + "; ".join(f.line() for f in failed)


# ---------------------------------------------------------------------------- audit

def audit_failure(result, path=None, first: Iterable[str] = ()) -> str:
    """One line for a saved result whose audit failed: the counts, where it was kept, the
    first findings."""
    a = result.audit
    drops = f", {a.dropped_records} records dropped" if a.dropped_records else ""
    kept = f"; kept in {path} and marked audit failed" if path is not None else ""
    found = " | ".join(first)
    return (f"audit failed: {a.samples_passed}/{a.samples_total} samples passed{drops}{kept}"
            + (f"; first findings: {found}" if found else ""))
