"""CUPTI activity records as plain tuples, and samples made from them. Pure: no CUPTI here.

The tracer turns each activity into one of the tuples below inside the buffer-completed
callback (`parse_activities`); everything after that — tying kernels to the external id
pushed around a sample, counting what is missing — works on those tuples, so it is tested
on synthetic streams.

How a kernel finds its sample: CUPTI gives every API call a correlation id, and the kernel
it launches carries the same id. While an external id is pushed, each traced API call also
emits an external-correlation record (correlation id -> external id). So: kernel ->
correlation id -> external id -> sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple


class KernelRec(NamedTuple):
    name: str
    start_ns: int
    end_ns: int
    correlation_id: int
    stream_id: int = 0


class ExternalRec(NamedTuple):
    correlation_id: int
    external_id: int


class ApiRec(NamedTuple):
    cbid: int
    correlation_id: int


@dataclass(frozen=True)
class ActivityKinds:
    """The integer values of the activity kinds we read (cupti.ActivityKind's, or a test's)."""

    kernel: frozenset[int]  # KERNEL, CONCURRENT_KERNEL
    external_correlation: int
    api: frozenset[int]  # DRIVER, RUNTIME


@dataclass
class RecordBatch:
    """Everything one flush delivered (or several, appended)."""

    kernels: list[KernelRec] = field(default_factory=list)
    externals: list[ExternalRec] = field(default_factory=list)
    api_records: int = 0
    other_records: int = 0
    dropped: int = 0
    events_ns: dict[int, int] = field(default_factory=dict)  # external id -> event interval (events timer)

    def extend(self, other: RecordBatch) -> None:
        self.kernels.extend(other.kernels)
        self.externals.extend(other.externals)
        self.api_records += other.api_records
        self.other_records += other.other_records
        self.dropped += other.dropped
        self.events_ns.update(other.events_ns)


def parse_activities(activities: Iterable[Any], kinds: ActivityKinds, into: RecordBatch) -> None:
    """Append the records we use from CUPTI activity objects (anything with the same
    attribute names) to `into`. Kept small: it runs inside CUPTI's buffer callback."""
    kernel_kinds, ext_kind, api_kinds = kinds.kernel, kinds.external_correlation, kinds.api
    kernels, externals = into.kernels, into.externals
    api = other = 0
    for a in activities:
        k = a.kind
        if k in kernel_kinds:
            kernels.append(KernelRec(a.name, a.start, a.end, a.correlation_id, getattr(a, "stream_id", 0)))
        elif k == ext_kind:
            externals.append(ExternalRec(a.correlation_id, a.external_id))
        elif k in api_kinds:
            api += 1
        else:
            other += 1
    into.api_records += api
    into.other_records += other


class TaggedKernel(NamedTuple):
    """A kernel with the external id of the sample it belongs to (0: none, e.g. the flush)."""

    name: str
    start_ns: int
    end_ns: int
    external_id: int


def tag_kernels(batch: RecordBatch) -> list[TaggedKernel]:
    """Each kernel with its external id (0 if its launch carried none), in start order.

    A correlation id seen with two different external ids is a CUPTI or usage error: the
    kernel is tagged with -1 so the audit reports it rather than picking one."""
    ext_of: dict[int, int] = {}
    for corr, ext in batch.externals:
        prev = ext_of.get(corr)
        ext_of[corr] = ext if prev is None or prev == ext else -1
    tagged = [TaggedKernel(k.name, k.start_ns, k.end_ns, ext_of.get(k.correlation_id, 0)) for k in batch.kernels]
    tagged.sort(key=lambda t: (t.start_ns, t.end_ns))
    return tagged


def group_by_external_id(tagged: Iterable[TaggedKernel]) -> dict[int, list[TaggedKernel]]:
    """Kernels of each external id (> 0), in start order."""
    groups: dict[int, list[TaggedKernel]] = {}
    for t in tagged:
        if t.external_id > 0:
            groups.setdefault(t.external_id, []).append(t)
    return groups
