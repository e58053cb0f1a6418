"""CUDA-event timing: the explicit alternative to CUPTI (`--timer events`).

An event pair around `run()` measures the stream interval, launch gaps included; it
cannot see which kernels ran, so its samples are not audited for kernels and the result
says `timer: events`. Events are preallocated per round; read after the round's sync.
"""

from __future__ import annotations

import torch

from moebench.timing.records import RecordBatch


class EventsTimer:
    def __init__(self, capacity: int):
        self._starts = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        self._ends = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        self._ids: list[int] = []

    def begin(self, external_id: int) -> None:
        self._starts[len(self._ids)].record()

    def end(self, external_id: int) -> None:
        self._ends[len(self._ids)].record()
        self._ids.append(external_id)

    def collect(self) -> RecordBatch:
        batch = RecordBatch()
        if self._ids:
            self._ends[len(self._ids) - 1].synchronize()
        batch.events_ns = {ext: int(round(self._starts[i].elapsed_time(self._ends[i]) * 1e6))
                           for i, ext in enumerate(self._ids)}
        self._ids = []
        return batch

    def close(self) -> None:
        self._ids = []


class NullTimer:
    """Times nothing: runs the schedule for an outside profiler (ncu, nsys) to measure."""

    def begin(self, external_id: int) -> None:
        pass

    def end(self, external_id: int) -> None:
        pass

    def collect(self) -> RecordBatch:
        return RecordBatch()

    def close(self) -> None:
        pass
