"""The HBM read floor: the best cold read this card does, by the run's own timer.

An arm's HBM floor is its floor bytes (Floors.hbm_bytes) at the device's read bandwidth, so
that bandwidth must be the best this card reads, or a kernel that reads well beats its
"floor" (a `torch.sum` over 1 GiB read 2.86-2.89 TB/s on H100s where a streaming read reached
3.17 TB/s; /work/shared GPU.md, 2026-12-06). The reading comes from a purpose-built kernel
(kernels/sm90_read_probe.cu: 16-byte non-caching loads, several in flight a thread,
grid-stride) launched in a few layouts, READ_CONFIGS; each is timed cold like an arm (flush,
CUPTI, audited), after a warm-up burst that brings the clocks up, and the layout with the
highest bandwidth (median of its audited samples) is the floor. The result keeps every
layout's rate, the winner, and the board's datasheet bandwidth beside it
(moebench.record.device_peaks).

`best_read` is the arithmetic (pure, tested on the CPU); `read_probe` the device side.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from moebench.record.device_peaks import hbm_datasheet
from moebench.record.schema import ReadFloor

READ_SOURCE = "sm90_read_probe.cu"
READ_KERNEL_PATTERN = r"^moebench_read_probe_u\d+$"
BUFFER_BYTES = 2**30  # 1 GiB: 20x an H100's L2, and it still fits a card other work has filled
WARM_SECONDS = 0.2  # the burst before the first timed read: SM and memory clocks up from idle
MIN_AUDITED_SHARE = 0.5  # a layout with fewer of its samples audited is not read


@dataclass(frozen=True)
class ReadConfig:
    """One launch layout of the read kernel: CTAs an SM x threads a CTA x loads in flight a thread."""

    ctas_per_sm: int
    threads: int
    unroll: int  # 16-byte loads in flight a thread: the kernel instance moebench_read_probe_u<unroll>

    @property
    def name(self) -> str:
        return f"{self.ctas_per_sm}x{self.threads}x{self.unroll}"

    @property
    def kernel(self) -> str:
        return f"moebench_read_probe_u{self.unroll}"

    def in_flight_bytes_per_sm(self) -> int:
        return self.ctas_per_sm * self.threads * self.unroll * 16


# Each keeps 128 KB an SM in flight, several times what latency x bandwidth asks (~18 KB an SM on
# an H100); they differ in CTA size and count, which decides how evenly the SMs finish.
READ_CONFIGS: tuple[ReadConfig, ...] = (
    ReadConfig(8, 256, 4),   # full occupancy, 32 registers a thread
    ReadConfig(16, 128, 4),  # full occupancy in small CTAs
    ReadConfig(4, 256, 8),   # half occupancy, twice the loads a thread
    ReadConfig(2, 512, 8),   # half occupancy in large CTAs
)


def config_named(name: str) -> ReadConfig:
    from moebench.errors import UserError
    found = next((c for c in READ_CONFIGS if c.name == name), None)
    if found is None:
        raise UserError(f"unknown read layout {name!r} (known: {', '.join(c.name for c in READ_CONFIGS)})")
    return found


def best_read(values_ns: Mapping[str, Sequence[float]], nbytes: int, gpu_name: str | None,
              samples_each: int, method: str) -> ReadFloor | None:
    """The floor from each layout's audited sample times (ns): the layout whose median is the
    shortest (the highest bandwidth) wins. A layout with fewer than half of `samples_each`
    audited, or a time not above 0, is left out; None when none is left."""
    rates, counts = {}, {}
    for name, values in values_ns.items():
        values = list(values)
        if len(values) < max(1, samples_each * MIN_AUDITED_SHARE) or not all(v > 0 for v in values):
            continue
        rates[name] = nbytes / (float(median(values)) * 1e-9)
        counts[name] = len(values)
    if not rates:
        return None
    winner = max(rates, key=lambda n: rates[n])
    sheet = hbm_datasheet(gpu_name)
    return ReadFloor(bytes_per_s=rates[winner], config=winner, method=method, nbytes=nbytes,
                     samples=counts[winner], configs=rates,
                     datasheet_bytes_per_s=sheet.bytes_per_s if sheet else None,
                     datasheet_source=sheet.source if sheet else "")


@dataclass(frozen=True)
class ReadProbe:
    """What the measurement core times for the floor: one unit per layout (arm = layout name),
    the bytes each sample reads, and the warm-up burst to run first (None: none)."""

    units: tuple  # of moebench.timing.engine.Unit
    nbytes: int
    method: str
    warm: object = None  # Callable[[], None]


METHOD = "moebench_read_probe: 16-byte ld.global.nc.L1::no_allocate loads, grid-stride, best layout"


def read_probe(device, l2_bytes: int, configs: Sequence[ReadConfig] = READ_CONFIGS) -> ReadProbe:
    """The read kernel on a zeroed buffer of BUFFER_BYTES (less when memory is short, never
    under 16x L2), one unit per layout, and a warm-up burst of WARM_SECONDS of reads."""
    import numpy as np
    import torch

    from moebench.kernels.cuda.launch import bind_launch
    from moebench.kernels.cuda.nvrtc import compile_source
    from moebench.kernels.cuda.source import KernelSource
    from moebench.record.schema import DeclaredKernel
    from moebench.timing.engine import Unit

    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(BUFFER_BYTES, max(16 * l2_bytes, 2**28), free // 4) // 16 * 16
    buf = torch.zeros(nbytes // 16, 4, dtype=torch.int32, device=device)
    sink = torch.zeros(1, dtype=torch.int32, device=device)
    module = compile_source(KernelSource.shipped(READ_SOURCE))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    units = []
    for c in configs:
        kernel = module.kernel(c.kernel, device.index)
        launch = bind_launch(kernel, (c.ctas_per_sm * sms, 1, 1), (c.threads, 1, 1), 0,
                             np.uint64(buf.data_ptr()), np.int64(nbytes // 16), np.uint64(sink.data_ptr()))
        units.append(Unit("_read_floor", c.name, _holding(launch, buf, sink),
                          kernels=(DeclaredKernel("read", f"^{c.kernel}$", 1),)))
    first = units[0].run

    def warm() -> None:
        """Reads for WARM_SECONDS, synchronising every 16 launches (the clocks ramp under load)."""
        end = time.perf_counter() + WARM_SECONDS
        while time.perf_counter() < end:
            for _ in range(16):
                first()
            torch.cuda.synchronize(device)
    return ReadProbe(tuple(units), nbytes, METHOD, warm)


def _holding(launch, *tensors):
    """The launch, holding the tensors it reads alive as long as it is."""
    def run() -> None:
        _ = tensors
        launch()
    return run
