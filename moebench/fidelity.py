"""A single-kernel workload for checking the timer against Nsight Compute, and the reader
of ncu's CSV. `moebench probe` times the workload exactly as `moebench run` times an arm;
under ncu, `--timer none` just launches it.

The workload is one torch elementwise kernel (`add`: c = a + b, fp32; `mul`: c = 2a), a
pure streaming kernel whose cold time is what the L2 flush and the timer decide.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from statistics import median

import torch

from moebench.errors import UserError
from moebench.results.schema import Audit, DeclaredKernel, Sample
from moebench.timing.engine import Unit

OPS = {
    # op: (kernel pattern for the audit and for ncu -k regex:..., tensors read, tensors written)
    "add": (r"Functor\w*_add", 2, 1),
    "mul": ("MulFunctor", 1, 1),
}
TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
                 "second": 1e9, "s": 1e9}


def probe_unit(op: str, mib: int, device: torch.device) -> tuple[Unit, DeclaredKernel, int]:
    """The workload as a Unit, its declared kernel, and the bytes it moves."""
    if op not in OPS:
        raise UserError(f"unknown probe op {op!r} (known: {', '.join(OPS)})")
    if mib < 1:
        raise UserError("--mib must be at least 1")
    pattern, reads, writes = OPS[op]
    n = mib * 2**20 // 4
    a = torch.ones(n, dtype=torch.float32, device=device)
    c = torch.empty_like(a)
    if op == "add":
        b = torch.ones_like(a)
        run = lambda: torch.add(a, b, out=c)  # noqa: E731
    else:
        run = lambda: torch.mul(a, 2.0, out=c)  # noqa: E731
    return Unit("_probe", op, run), DeclaredKernel(op, pattern, 1), (reads + writes) * n * 4


@dataclass(frozen=True)
class ProbeResult:
    op: str
    bytes_moved: int
    samples: tuple[Sample, ...]
    audit: Audit
    timer: str

    @property
    def values_ns(self) -> list[int]:
        return [s.value_ns for s in self.samples]

    @property
    def median_ns(self) -> float | None:
        vals = self.values_ns
        return float(median(vals)) if vals and self.timer != "none" else None

    @property
    def kernel_names(self) -> list[str]:
        return sorted({k.name for s in self.samples for k in s.kernels})


def parse_ncu_csv(text: str, metric: str = "gpu__time_duration.sum", kernel_regex: str | None = None) -> list[float]:
    """Values (ns) of `metric` from `ncu --csv` output, one per profiled kernel, in order.
    Lines before the CSV header (ncu's ==PROF== chatter, the program's output) are skipped."""
    import re
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise UserError("no ncu CSV header (\"ID\",...) found; run ncu with --csv")
    values = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != metric:
            continue
        if kernel_regex and not re.search(kernel_regex, row.get("Kernel Name", "")):
            continue
        unit = (row.get("Metric Unit") or "nsecond").strip()
        if unit not in TIME_UNITS_NS:
            raise UserError(f"ncu metric unit {unit!r} is not a time unit")
        values.append(float(row["Metric Value"].replace(",", "")) * TIME_UNITS_NS[unit])
    if not values:
        raise UserError(f"no {metric} values in the ncu CSV")
    return values


def run_probe(op: str = "add", mib: int = 256, samples: int = 100, warmup: int = 10, flush: str = "read",
              timer: str = "cupti", backend=None) -> ProbeResult:
    """Time the workload like an arm: one round, `samples` cold samples, audited."""
    from moebench.runner import MAX_SAMPLES, RunRequest, cuda_backend
    from moebench.timing.audit import audit_samples
    from moebench.timing.engine import EngineConfig, run_rounds
    from moebench.timing.events_timer import NullTimer

    if timer not in ("cupti", "events", "none"):
        raise UserError(f"unknown --timer {timer!r} (known: cupti, events, none)")
    if not (1 <= samples <= MAX_SAMPLES and 0 <= warmup <= MAX_SAMPLES):
        raise UserError(f"--samples must be 1 to {MAX_SAMPLES:,}, --warmup 0 to {MAX_SAMPLES:,}")
    if not 1 <= mib <= 65536:
        raise UserError(f"--mib must be 1 to 65536 (MiB per tensor), got {mib}")
    if backend is None:
        req = RunRequest(shapes=("_probe",), arms=(op,), flush=flush, timer="events" if timer == "none" else timer)
        backend = cuda_backend(req)
    unit, decl, nbytes = probe_unit(op, mib, backend.device)
    t = NullTimer() if timer == "none" else backend.make_timer(samples)
    try:
        out = run_rounds([unit], EngineConfig(1, samples, warmup), t, flush=backend.flush, sync=backend.sync,
                         markers=backend.markers)
    finally:
        t.close()
    if timer == "none":
        audit = Audit(len(out.samples), 0, 0)
    else:
        audit = audit_samples(out.samples, {(unit.shape, unit.arm): (decl,)}, out.kernels,
                              out.dropped_by_round, timer)
    return ProbeResult(op, nbytes, tuple(out.samples), audit, timer)
