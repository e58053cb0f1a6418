"""The two floors under a shape's time, and which of them binds.

HBM floor: the bytes that must cross HBM once (Floors.hbm_bytes: the routed experts'
weights and scales, the activations, the output) at the read bandwidth the run measured
on its device. FP8 floor: the shape's FLOPs (Floors.flops) at the board's dense FP8
tensor-core peak from its datasheet (moebench.record.device_peaks). The larger one binds:
no kernel can beat it, and an arm's time as a multiple of it says how far off the limit
the arm is. A floor whose input is missing (no bandwidth measured, a board not in the
peak table) is None, and then nothing is said about which one binds.

An arm above its floor (more than 100% of the measured read bandwidth, or under 1x the binding
floor) has beaten what no kernel can beat: the floor was understated (a read probe slower than
the card, a routed-bytes count too small). Every view takes an arm's floor numbers through one
function, `arm_floor`, whose `understated` flag it shows beside them, never a plain 107%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moebench.record.device_peaks import DevicePeak, fp8_dense_peak
from moebench.record.schema import ArmSummary, FixtureInfo, RunResult

HBM, FP8 = "HBM", "FP8"


@dataclass(frozen=True)
class ShapeFloors:
    shape: str
    hbm_floor_ns: float | None  # hbm_bytes / measured read bandwidth
    fp8_floor_ns: float | None  # flops / dense FP8 peak
    peak: DevicePeak | None  # the peak the FP8 floor was taken at
    read_bandwidth_bytes_per_s: float | None  # the bandwidth the HBM floor was taken at

    @property
    def binding(self) -> str | None:
        """HBM or FP8: the larger floor, when both are known."""
        if self.hbm_floor_ns is None or self.fp8_floor_ns is None:
            return None
        return HBM if self.hbm_floor_ns >= self.fp8_floor_ns else FP8

    @property
    def floor_ns(self) -> float | None:
        """The larger of the floors that are known (a bound on the time either way)."""
        known = [f for f in (self.hbm_floor_ns, self.fp8_floor_ns) if f is not None]
        return max(known) if known else None


def floors_of(fixture: FixtureInfo, gpu_name: str | None, read_bandwidth_bytes_per_s: float | None) -> ShapeFloors:
    peak = fp8_dense_peak(gpu_name)
    bw = read_bandwidth_bytes_per_s
    return ShapeFloors(
        shape=fixture.name,
        hbm_floor_ns=fixture.floors.hbm_bytes / bw * 1e9 if bw else None,
        fp8_floor_ns=fixture.floors.flops / peak.fp8_dense_flops_per_s * 1e9 if peak else None,
        peak=peak, read_bandwidth_bytes_per_s=bw)


def shape_floors(result: RunResult) -> dict[str, ShapeFloors]:
    """Each fixture's floors on the device that timed it: the run's GPU (provenance.gpu), or
    in a sharded sweep the cell's own device and the bandwidth measured on it."""
    gpu = result.provenance.gpu
    cells = {c.shape: c for c in result.sharding.cells} if result.sharding else {}
    out = {}
    for fx in result.fixtures:
        cell = cells.get(fx.name)
        if cell is not None:
            out[fx.name] = floors_of(fx, cell.gpu_name, cell.read_bandwidth_bytes_per_s)
        else:
            out[fx.name] = floors_of(fx, gpu.name if gpu else None, gpu.read_bandwidth_bytes_per_s if gpu else None)
    return out


def times_floor(median_ns: float | None, floors: ShapeFloors | None) -> float | None:
    """An arm's time as a multiple of the binding floor (1.0 would be at the limit)."""
    if median_ns is None or floors is None or floors.floor_ns is None:
        return None
    return median_ns / floors.floor_ns


UNDERSTATED = "floor understated"


@dataclass(frozen=True)
class ArmFloor:
    """An arm's standing against its floors at one shape, and whether it beat them."""

    read_share: float | None  # HBM floor bytes / median time, over the measured read bandwidth
    multiple: float | None  # median time over the binding floor (times_floor)

    @property
    def share_understated(self) -> bool:
        """Above 100% of the measured read bandwidth: the HBM floor was understated."""
        return self.read_share is not None and self.read_share > 1

    @property
    def multiple_understated(self) -> bool:
        """Under 1x the binding floor: that floor was understated."""
        return self.multiple is not None and self.multiple < 1

    @property
    def understated(self) -> bool:
        return self.share_understated or self.multiple_understated


def arm_floor(summary: ArmSummary | None, floors: ShapeFloors | None, median_ns: float | None = None) -> ArmFloor:
    """The one way a view gets an arm's floor numbers: its share of the read bandwidth (from the
    summary) and its multiple of the binding floor (of `median_ns`, the summary's median unless
    given), with the flag that says the floor was understated."""
    if median_ns is None and summary is not None:
        median_ns = summary.median_ns
    return ArmFloor(summary.fraction_of_read_bandwidth if summary is not None else None,
                    times_floor(median_ns, floors))


def understated_arms(result: RunResult) -> list[tuple[str, str, ArmFloor]]:
    """(shape, arm, its floor numbers) of every arm that beat its floor in `result`."""
    floors = shape_floors(result)
    found = [(s.shape, s.arm, arm_floor(s, floors.get(s.shape))) for s in result.summaries]
    return [f for f in found if f[2].understated]


@dataclass(frozen=True)
class FloorSeries:
    """One floor against M for a sweep plot: its label and its points (µs)."""

    kind: str  # HBM or FP8
    label: str
    ms: tuple[int, ...]
    us: tuple[float, ...]


def floor_series(result: RunResult, fixtures: Iterable[FixtureInfo]) -> list[FloorSeries]:
    """The HBM floor and the FP8 floor of a sweep's fixtures (in their order), each where known."""
    floors = shape_floors(result)
    fixtures = list(fixtures)
    series = []
    for kind, attr in ((HBM, "hbm_floor_ns"), (FP8, "fp8_floor_ns")):
        pts = [(f.M, getattr(floors[f.name], attr) / 1e3) for f in fixtures
               if f.name in floors and getattr(floors[f.name], attr) is not None]
        if pts:
            label = floor_label(kind, [floors[f.name] for f in fixtures if f.name in floors], short=True)
            series.append(FloorSeries(kind, label, tuple(m for m, _ in pts), tuple(u for _, u in pts)))
    return series


def floor_label(kind: str, floors: list[ShapeFloors], short: bool = False) -> str:
    """What a floor was taken at: one value, or 'each cell's' when a sharded sweep's cells
    differ; `short` for a plot's legend."""
    if kind == HBM:
        bws = {f.read_bandwidth_bytes_per_s for f in floors if f.read_bandwidth_bytes_per_s}
        at = f"{bws.pop() / 1e12:.2f} TB/s" if len(bws) == 1 else "each cell's"
        return f"HBM floor ({at} read)" if short else f"HBM floor (bytes at {at} measured read bandwidth)"
    peaks = {f.peak for f in floors if f.peak is not None}
    at = f"{peaks.pop().tflops:,.0f} TFLOP/s" if len(peaks) == 1 else "each cell's"
    return f"FP8 floor ({at} dense)" if short else f"FP8 floor (FLOPs at {at} dense FP8 peak)"
