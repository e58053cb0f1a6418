"""The floors of moebench.results.roofline as table cells: the columns the summary tables
add, the per-sweep table of floors against M, and the sentence that says what each floor
was taken at. Text only (rich and Markdown each lay it out); nothing is computed here."""

from __future__ import annotations

from moebench.results.index import ResultIndex, us
from moebench.results.roofline import FP8, HBM, ShapeFloors, floor_label, shape_floors, times_floor

FLOOR_HEADER = ("HBM floor µs", "FP8 floor µs", "binding", "× floor")


def floor_cells(floors: dict[str, ShapeFloors], shape: str, median_ns: float | None) -> list[str]:
    """The four FLOOR_HEADER cells of one (shape, arm) row."""
    f = floors.get(shape)
    if f is None:
        return ["—"] * len(FLOOR_HEADER)
    multiple = times_floor(median_ns, f)
    return [us(f.hbm_floor_ns), us(f.fp8_floor_ns), f.binding or "—",
            "—" if multiple is None else f"{multiple:,.2f}×"]


def floor_note(ix: ResultIndex) -> str:
    """One line: what the two floors were taken at, the datasheet named; '' without fixtures."""
    floors = [f for f in shape_floors(ix.result).values()]
    if not floors:
        return ""
    fp8 = floor_label(FP8, floors) if any(f.peak for f in floors) else \
        "FP8 floor — (no datasheet peak for this GPU)"
    hbm = floor_label(HBM, floors) if any(f.read_bandwidth_bytes_per_s for f in floors) else \
        "HBM floor — (no read bandwidth measured)"
    sources = sorted({f.peak.source for f in floors if f.peak})
    cited = f"; peak: {'; '.join(sources)}" if sources else ""
    return f"{hbm}; {fp8}; binding: the larger; × floor: median / the larger{cited}"


def sweep_floor_rows(ix: ResultIndex) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per sweep family: (family, header, rows), one row per M: the floors, which binds, and
    each arm's median as a multiple of the binding floor."""
    floors = shape_floors(ix.result)
    out = []
    for family, fixtures in ix.sweeps().items():
        arms = [a for a in ix.arms if any(ix.summary(f.name, a) for f in fixtures)]
        header = ["M", "shape", *FLOOR_HEADER[:3], *(f"{a} × floor" for a in arms)]
        rows = []
        for fx in fixtures:
            f = floors.get(fx.name)
            cells = floor_cells(floors, fx.name, None)[:3]
            for arm in arms:
                s = ix.summary(fx.name, arm)
                multiple = times_floor(s.median_ns if s else None, f)
                cells.append("—" if multiple is None else f"{multiple:,.2f}×")
            rows.append([str(fx.M), fx.name, *cells])
        out.append((family, header, rows))
    return out


def sweep_floor_tables(ix: ResultIndex):
    """sweep_floor_rows as rich tables, one per family, the note as their caption."""
    from rich.table import Table
    tables = []
    for family, header, rows in sweep_floor_rows(ix):
        t = Table(title=f"family {family}: floors against M (µs) and each arm's median over the binding floor",
                  title_justify="left")
        for i, col in enumerate(header):
            t.add_column(col, justify="left" if i == 1 or col == "binding" else "right", no_wrap=True)
        for row in rows:
            t.add_row(*row)
        tables.append(t)
    return tables
