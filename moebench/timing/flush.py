"""The L2 flush that runs before every sample, outside its timed window.

`read` (default) sums a buffer of at least twice the L2 into one preallocated scalar: L2
ends full of clean lines of that buffer, so the timed kernels start cold and nothing is
written back during them. `write` fills the buffer (what Triton's do_bench, nvbench and
FlashInfer do): it leaves L2 full of dirty lines whose write-back lands inside the timed
kernels (+25% on a 40 MB read on the H200, see H200.md). `none` leaves L2 as the previous
call left it (warm for a kernel timed back to back).

The buffer is allocated once; each flush is one torch op, no allocation, no sync.

The flush is fenced off from the sample that follows it. A kernel launched with programmatic
dependent launch (PDL) may start before the kernel ahead of it in its stream has finished; were
that kernel the flush, the sample would begin inside the flush (and the audit would reject it).
So the flush runs on a side stream between two events: the side stream waits for everything
before it on torch's stream, and torch's stream waits for the flush. An event wait is a full
dependency, which PDL does not relax. Mode `none` keeps the fence, so a PDL kernel cannot
overlap the previous sample either.
"""

from __future__ import annotations

from typing import Callable

import torch

from moebench.choices import FLUSH_MODES  # noqa: E402,F401  (defined where --help reads it)
from moebench.errors import UserError

MIN_FLUSH_BYTES = 256 * 2**20  # what H200.md measured with; 4.3x the H200's 60 MiB L2


def flush_bytes_for(l2_bytes: int, mode: str) -> int:
    """Buffer size for `mode`: >= 2x L2 and >= 256 MiB, whole MiB; 0 for `none`."""
    if mode not in FLUSH_MODES:
        raise UserError(f"unknown flush mode {mode!r} (known: {', '.join(FLUSH_MODES)})")
    if mode == "none":
        return 0
    nbytes = max(2 * int(l2_bytes), MIN_FLUSH_BYTES)
    return -(-nbytes // 2**20) * 2**20


class L2Flush:
    """Callable: `flush()` enqueues the fenced flush after the work on torch's current stream."""

    def __init__(self, mode: str, l2_bytes: int, device: torch.device | str = "cuda"):
        self.mode = mode
        self.nbytes = flush_bytes_for(l2_bytes, mode)
        self._buf = None
        self._out = None
        self._op: Callable[[], object] = _nothing
        on_gpu = torch.device(device).type == "cuda"
        self._side = torch.cuda.Stream(device) if on_gpu else None
        self._before, self._after = (torch.cuda.Event(), torch.cuda.Event()) if on_gpu else (None, None)
        if mode == "none":
            return
        self._buf = torch.zeros(self.nbytes // 4, dtype=torch.float32, device=device)
        if mode == "read":
            self._out = torch.zeros((), dtype=torch.float32, device=device)
            buf, out = self._buf, self._out
            self._op = lambda: torch.sum(buf, dim=0, out=out)
        else:
            buf = self._buf
            self._op = buf.zero_

    def __call__(self) -> None:
        if self._side is None:  # on the CPU (tests): no streams, nothing to fence
            self._op()
            return
        main = torch.cuda.current_stream(self._side.device)
        self._before.record(main)
        self._side.wait_event(self._before)
        with torch.cuda.stream(self._side):
            self._op()
        self._after.record(self._side)
        main.wait_event(self._after)

    def release(self) -> None:
        self._buf = self._out = None
        self._op = _nothing


def _nothing() -> None:
    return None
