"""Throttled rounds, and what `compare` does with them (`--rule throttled:auto|drop|keep`).

A round is throttled when NVML reported a clock event at its start or end (a power cap, a
thermal slowdown, ...) or its SM clock moved (ClockSample.throttled). Its times may be slower
than the card's, but a card capped in every round is still a card a user owns: its runs get
verdicts, marked, never none (nvbench#231 is the same trap).

  auto (default)  the throttled rounds of both runs are left out when each run keeps at least
                  one round that was not; otherwise every round of both is judged and every
                  verdict says it was judged on throttled rounds
  drop            the throttled rounds are always left out (a run with none left is refused)
  keep            every round is judged, the verdicts marked where any was throttled

`plan` is that choice for two runs; `run_line` says in a run's own table what compare will do.
"""

from __future__ import annotations

from dataclasses import dataclass

from moebench.errors import UserError
from moebench.record.schema import RunResult

POLICIES = ("auto", "drop", "keep")


@dataclass(frozen=True)
class RunThrottle:
    """One run's rounds and the throttled ones among them, with why."""

    label: str
    rounds: tuple[int, ...]  # every round the run has samples of
    flagged: dict[int, str]  # round -> why its clocks did not hold

    @property
    def every_round(self) -> bool:
        return bool(self.rounds) and all(r in self.flagged for r in self.rounds)

    @property
    def clean_rounds(self) -> tuple[int, ...]:
        return tuple(r for r in self.rounds if r not in self.flagged)

    def describe(self) -> str:
        """'every round (5) throttled: clock events sw_power_cap' or 'rounds 2, 4 of 5 throttled: ...'."""
        why = "; ".join(sorted(set(self.flagged.values())))
        if self.every_round:
            return f"every round ({len(self.rounds)}) throttled: {why}"
        which = sorted(self.flagged)
        word = "round" if len(which) == 1 else "rounds"
        return f"{word} {', '.join(map(str, which))} of {len(self.rounds)} throttled: {why}"


def run_throttle(result: RunResult, label: str) -> RunThrottle:
    rounds = tuple(sorted({s.round for s in result.samples}))
    return RunThrottle(label, rounds, {c.round: c.throttled for c in result.clocks if c.throttled})


@dataclass(frozen=True)
class ThrottlePlan:
    """Which rounds of each run compare leaves out, and the mark its verdicts carry."""

    dropped: dict[str, frozenset[int]]  # run label -> rounds left out
    mark: str  # '' or what every verdict says: which run's throttled rounds it was judged on
    notes: tuple[str, ...]


def plan(policy: str, a: RunThrottle, b: RunThrottle) -> ThrottlePlan:
    """What compare does with the throttled rounds of runs `a` and `b` under `policy`."""
    if policy not in POLICIES:
        raise UserError(f"rule throttled: {policy!r} is not one of {', '.join(POLICIES)}")
    runs = [r for r in (a, b) if r.flagged]
    none = {a.label: frozenset(), b.label: frozenset()}
    if not runs:
        return ThrottlePlan(none, "", ())
    if policy == "drop":
        for r in runs:
            if r.every_round:
                raise UserError(f"every round of {r.label} was throttled ({next(iter(r.flagged.values()))}); "
                                "judge it anyway with --rule throttled:auto or throttled:keep")
        return _dropping(a, b, "left out of every statistic here (throttled:drop)")
    if policy == "auto" and all(r.clean_rounds for r in (a, b)):
        return _dropping(a, b, "left out of every statistic here: both runs keep unthrottled rounds")
    why = "throttled:keep" if policy == "keep" else \
        "no unthrottled round in " + " or ".join(r.label for r in (a, b) if not r.clean_rounds)
    mark = "judged on throttled rounds of " + " and ".join(r.label for r in runs)
    notes = tuple(f"{r.label}: {r.describe()}: kept and judged ({why}); every verdict is marked" for r in runs)
    return ThrottlePlan(none, mark, notes)


def _dropping(a: RunThrottle, b: RunThrottle, what: str) -> ThrottlePlan:
    notes = tuple(f"{r.label}: {r.describe()}: {what}" for r in (a, b) if r.flagged)
    return ThrottlePlan({r.label: frozenset(r.flagged) for r in (a, b)}, "", notes)


def run_line(result: RunResult) -> str | None:
    """What compare (under its default, auto) will do with this run's throttled rounds; None
    when none was throttled."""
    t = run_throttle(result, "this run")
    if not t.flagged:
        return None
    if t.every_round:
        return (f"{t.describe()}: compare judges every round and marks its verdicts "
                "\"judged on throttled rounds\" (the card was capped throughout)")
    return (f"{t.describe()}: compare leaves them out when the run it is compared with keeps "
            "unthrottled rounds too, else judges every round and marks its verdicts")
