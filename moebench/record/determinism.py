"""The determinism verdicts a RunResult may carry (moebench.determinism.checks makes them).

Plain frozen records, stored as they are (RunResult.determinism). A difference is counted in
output elements whose bits differ; its size, max_abs, is the largest |a - b| over those
elements, -1.0 where no differing pair is finite on both sides (JSON has no inf).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunToRun:
    """One prepared call run `runs` times on the same inputs, against its first run."""

    runs: int
    differing_runs: int  # runs whose output differs from the first's
    elements: int  # the most elements any run differs from the first in
    max_abs: float

    @property
    def bitwise(self) -> bool:
        return self.differing_runs == 0


@dataclass(frozen=True)
class BatchRows:
    """The first m tokens' rows computed alone against the same rows inside a batch of `batch`."""

    m: int
    batch: int
    elements: int
    max_abs: float

    @property
    def bitwise(self) -> bool:
        return self.elements == 0


@dataclass(frozen=True)
class CrossProcess:
    """The SHA-256 of the first run's output here and in a fresh process."""

    hash_here: str
    hash_there: str | None  # None: the fresh process gave no hash (see error)
    error: str | None = None

    @property
    def equal(self) -> bool | None:
        return None if self.hash_there is None else self.hash_here == self.hash_there


@dataclass(frozen=True)
class DeterminismVerdict:
    arm: str
    shape: str  # the fixture's shape name
    M: int
    run_to_run: RunToRun
    batch: tuple[BatchRows, ...]
    cross_process: CrossProcess | None  # None: not checked
    note: str | None = None  # what the engine defines for this arm (moebench.determinism.checks.ENGINE_NOTES)
    identity: dict[str, Any] = field(default_factory=dict)  # the prepared arm's identity (build hashes)

    @property
    def batch_invariant(self) -> bool:
        return all(b.bitwise for b in self.batch)

    @property
    def deterministic(self) -> bool:
        """Bitwise run to run, and no different in a fresh process where that gave a hash."""
        return self.run_to_run.bitwise and (self.cross_process is None or self.cross_process.equal is not False)

    @property
    def passed(self) -> bool:
        """Every check ran and held."""
        return (self.run_to_run.bitwise and self.batch_invariant and self.cross_process is not None
                and self.cross_process.equal is True)


def determinism_problems(verdicts: tuple[DeterminismVerdict, ...]) -> list[str]:
    """What in stored verdicts cannot be (a file edited or written by a bug)."""
    out = []
    for v in verdicts:
        where = f"determinism[{v.shape} {v.arm}]"
        r = v.run_to_run
        if r.runs < 2 or not 0 <= r.differing_runs <= r.runs - 1 or r.elements < 0:
            out.append(f"{where}.run_to_run: {r.differing_runs} differing of {r.runs} runs, {r.elements} elements")
        elif (r.differing_runs == 0) != (r.elements == 0):
            out.append(f"{where}.run_to_run: differing runs and differing elements disagree")
        for b in v.batch:
            if not 1 <= b.m < b.batch or b.m > v.M or b.elements < 0:
                out.append(f"{where}.batch: m={b.m} inside {b.batch} tokens of M={v.M}, {b.elements} elements")
    return out
