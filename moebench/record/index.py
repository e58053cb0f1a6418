"""Look-ups into a RunResult for the presenters: by shape and arm, in the run's own order.

Nothing here computes a statistic; it finds the records a view needs and names the
quantities and units every view shows the same way.
"""

from __future__ import annotations

from collections import defaultdict

from moebench.record.metrics import TimedMetric, timed_metric
from moebench.record.schema import ArmInfo, ArmSummary, FixtureInfo, RatioSummary, RunResult, Sample


class ResultIndex:
    """A RunResult's records keyed by shape and arm. Shapes and arms keep the run's order."""

    def __init__(self, result: RunResult):
        self.result = result
        self.settings = result.settings
        self.ref = result.settings.ref
        self._summaries = {(s.shape, s.arm): s for s in result.summaries}
        self._ratios = {(r.shape, r.arm): r for r in result.ratios}
        self._fixtures = {f.name: f for f in result.fixtures}
        self._arms = {(a.shape, a.name): a for a in result.arms}
        self._samples: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
        for s in result.samples:
            self._samples[(s.shape, s.arm, s.round)].append(s)
        self.shapes = _ordered(result.settings.shapes, (s.shape for s in result.summaries))
        self.arms = _ordered(result.settings.arms, (s.arm for s in result.summaries))
        self.rounds = tuple(range(1, result.settings.rounds + 1))
        self.metric: TimedMetric = timed_metric(result.settings.timer)  # what a sample's value is

    def summary(self, shape: str, arm: str) -> ArmSummary | None:
        return self._summaries.get((shape, arm))

    def ratio(self, shape: str, arm: str) -> RatioSummary | None:
        return self._ratios.get((shape, arm))

    def fixture(self, shape: str) -> FixtureInfo | None:
        return self._fixtures.get(shape)

    def arm_info(self, shape: str, arm: str) -> ArmInfo | None:
        return self._arms.get((shape, arm))

    def samples(self, shape: str, arm: str, round_: int) -> list[Sample]:
        return self._samples.get((shape, arm, round_), [])

    def arms_at(self, shape: str) -> tuple[str, ...]:
        return tuple(a for a in self.arms if (shape, a) in self._summaries)

    def compared_arms(self, shape: str) -> tuple[str, ...]:
        """Arms with a ratio against the reference at `shape`."""
        return tuple(a for a in self.arms if (shape, a) in self._ratios)

    def sweeps(self, min_points: int = 3) -> dict[str, tuple[FixtureInfo, ...]]:
        """Families present at `min_points` or more M (a sweep; two points are just two
        shapes), each with its fixtures in increasing M."""
        by_family: dict[str, list[FixtureInfo]] = defaultdict(list)
        for shape in self.shapes:
            fx = self._fixtures.get(shape)
            if fx is not None:
                by_family[fx.family].append(fx)
        return {fam: tuple(sorted(fxs, key=lambda f: f.M))
                for fam, fxs in by_family.items() if len({f.M for f in fxs}) >= min_points}


def _ordered(preferred: tuple[str, ...], seen) -> tuple[str, ...]:
    seen = list(dict.fromkeys(seen))
    return tuple([x for x in preferred if x in seen] + [x for x in seen if x not in preferred])


# --- units: each quantity shown the same way in every view ------------------------------

def us(ns: float | None, digits: int = 2) -> str:
    return "—" if ns is None else f"{ns / 1e3:,.{digits}f}"


def ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}×"


def percent(fraction: float | None, digits: int = 1) -> str:
    return "—" if fraction is None else f"{100 * fraction:.{digits}f}%"


def placement_cells(p) -> tuple[str, str, str]:
    """A PlacementSummary's cells: the median per placement, their spread, the ratio per placement."""
    return (" / ".join(us(m) for m in p.medians_ns), percent(p.spread),
            "—" if p.ratios is None else " / ".join(f"{x:.3f}" for x in p.ratios))


def tb_per_s(bytes_per_s: float | None) -> str:
    return "—" if bytes_per_s is None else f"{bytes_per_s / 1e12:.2f} TB/s"


def mbytes(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.1f} MB"


def mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f} MiB"
