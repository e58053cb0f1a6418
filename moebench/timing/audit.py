"""The audit: does every sample hold exactly what its arm declared, and nothing else? Pure.

A CUPTI sample passes when
  * its kernels are exactly the arm's declared kernels (each pattern, its count, nothing more),
  * every kernel's duration is positive,
  * no record was dropped in its round,
  * no kernel outside the sample (the flush, another sample, stray work) overlaps the
    window [first start, last end] of the sample's kernels.
An interval sample (CUDA events) passes when its interval is positive and no record was
dropped in its round; its kernels cannot be seen. Each timer strategy
(moebench.timing.timers) says which of the two audits its samples get.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from moebench.record.schema import Audit, AuditFinding, Sample
from moebench.timing.records import TaggedKernel


class Declared(Protocol):
    label: str
    pattern: str
    count: int


@lru_cache(maxsize=None)
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _assign(names: Sequence[str], declared: Sequence[Declared]) -> tuple[list[int | None], list[int]]:
    """Each kernel to the first declaration that matches it and still has room: the index of
    its declaration (None: no room anywhere), and the room left in each declaration."""
    room = [d.count for d in declared]
    given: list[int | None] = []
    for name in names:
        for i, d in enumerate(declared):
            if room[i] > 0 and _regex(d.pattern).search(name):
                room[i] -= 1
                given.append(i)
                break
        else:
            given.append(None)
    return given, room


def kernel_labels(names: Sequence[str], declared: Sequence[Declared]) -> list[str | None]:
    """The declared label each kernel is given, as the audit assigns them (None: no room)."""
    given, _ = _assign(names, declared)
    return [None if i is None else declared[i].label for i in given]


def kernel_mismatch(names: Sequence[str], declared: Sequence[Declared]) -> str | None:
    """Why `names` are not exactly the declared kernels, or None if they are."""
    given, room = _assign(names, declared)
    unexpected = [n for n, i in zip(names, given) if i is None]
    expected = sum(d.count for d in declared)
    if not unexpected and not any(room):
        return None
    parts = [f"{len(names)} kernels, expected {expected}"]
    missing = [f"{d.label} x{n}" for d, n in zip(declared, room) if n > 0]
    if missing:
        parts.append("missing " + ", ".join(missing))
    if unexpected:
        shown = ", ".join(repr(_short(n)) for n in unexpected[:3])
        parts.append(f"unexpected {shown}" + (f" (+{len(unexpected) - 3})" if len(unexpected) > 3 else ""))
    return "; ".join(parts)


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


class _Intervals:
    """All kernels of a run, sorted by start, to find the ones overlapping a window."""

    def __init__(self, kernels: Iterable[TaggedKernel]):
        self.kernels = sorted(kernels, key=lambda k: (k.start_ns, k.end_ns))
        self.starts = [k.start_ns for k in self.kernels]
        self.longest = max((k.end_ns - k.start_ns for k in self.kernels), default=0)

    def overlapping(self, start: int, end: int) -> Iterable[TaggedKernel]:
        lo = bisect_left(self.starts, start - self.longest)
        hi = bisect_left(self.starts, end)
        for k in self.kernels[lo:hi]:
            if k.end_ns > start and k.start_ns < end:
                yield k


def audit_samples(samples: Sequence[Sample], declared: Mapping[tuple[str, str], Sequence[Declared]],
                  kernels: Iterable[TaggedKernel] = (), dropped_by_round: Mapping[int, int] | None = None) -> Audit:
    """Audit every kernel-record sample. `declared` maps (shape, arm) to the arm's declared
    kernels; `kernels` are all kernels seen during the timed rounds, each tagged with its
    external id (0 if none); `dropped_by_round` counts records CUPTI dropped in each round."""
    intervals = _Intervals(kernels)
    return _audit(samples, dropped_by_round, lambda s: _kernel_problem(s, declared, intervals))


def audit_intervals(samples: Sequence[Sample], dropped_by_round: Mapping[int, int] | None = None) -> Audit:
    """Audit every interval sample (CUDA events): a positive interval, nothing dropped."""
    return _audit(samples, dropped_by_round, _interval_problem)


def _audit(samples: Sequence[Sample], dropped_by_round: Mapping[int, int] | None,
           problem: Callable[[Sample], str | None]) -> Audit:
    dropped_by_round = dict(dropped_by_round or {})
    findings: list[AuditFinding] = []
    bad_rounds = {r for r, n in dropped_by_round.items() if n > 0}
    for r in sorted(bad_rounds):
        findings.append(AuditFinding("*", "*", r, -1, f"{dropped_by_round[r]} CUPTI records dropped in round {r}"))
    passed = 0
    for s in samples:
        reason = problem(s)
        if reason is not None:
            findings.append(AuditFinding(s.shape, s.arm, s.round, s.index, reason))
        elif s.round not in bad_rounds:
            passed += 1
    return Audit(samples_total=len(samples), samples_passed=passed,
                 dropped_records=sum(dropped_by_round.values()), findings=tuple(findings))


def _interval_problem(s: Sample) -> str | None:
    if s.events_ns is None:
        return "no event interval"
    return None if s.events_ns > 0 else f"event interval {s.events_ns} ns is not positive"


def _kernel_problem(s: Sample, declared, intervals: _Intervals) -> str | None:
    if s.events_ns is not None:
        return "events sample in a CUPTI run"
    decl = declared.get((s.shape, s.arm))
    if decl is None:
        return "arm declares no kernels"
    mismatch = kernel_mismatch([k.name for k in s.kernels], decl)
    if mismatch:
        return mismatch
    for k in s.kernels:
        if k.end_ns <= k.start_ns:
            return f"kernel {_short(k.name)!r} duration {k.end_ns - k.start_ns} ns is not positive"
    if s.kernels:
        start = min(k.start_ns for k in s.kernels)
        end = max(k.end_ns for k in s.kernels)
        for other in intervals.overlapping(start, end):
            if other.external_id != s.external_id:
                whose = "untagged" if other.external_id == 0 else f"external id {other.external_id}"
                return f"foreign kernel {_short(other.name)!r} ({whose}) inside the sample's window"
    return None


def audited(samples: Sequence[Sample], audit: Audit) -> list[Sample]:
    """The samples `audit` passed: no finding names them and no record was dropped in their
    round. Statistics are taken over these only."""
    failed = {(f.shape, f.arm, f.round, f.index) for f in audit.findings if f.index >= 0}
    bad_rounds = {f.round for f in audit.findings if f.index < 0}
    return [s for s in samples if s.round not in bad_rounds and (s.shape, s.arm, s.round, s.index) not in failed]


def combined(first: Audit, later: Audit) -> Audit:
    """The audit of two stretches of one run's rounds (a run and its resume) as one audit of
    all of them would read: the rounds with dropped records first, then the samples' findings
    in sample order. Every check is of one sample within its own round, so the parts add up."""
    findings = first.findings + later.findings
    by_round = sorted((f for f in findings if f.index < 0), key=lambda f: f.round)
    return Audit(samples_total=first.samples_total + later.samples_total,
                 samples_passed=first.samples_passed + later.samples_passed,
                 dropped_records=first.dropped_records + later.dropped_records,
                 findings=tuple(by_round) + tuple(f for f in findings if f.index >= 0))
