"""The floors of moebench.analysis.roofline as table cells: the columns the summary tables
add, the per-sweep table of floors against M, and the sentence that says what each floor
was taken at. Text only (rich and Markdown each lay it out); nothing is computed here."""

from __future__ import annotations

from moebench.analysis.roofline import (FP8, HBM, UNDERSTATED, ArmFloor, ShapeFloors, arm_floor, floor_label,
                                        shape_floors, understated_arms)
from moebench.record.index import ResultIndex, percent, us

FLOOR_HEADER = ("HBM floor µs", "FP8 floor µs", "binding", "× floor")


def share_text(f: ArmFloor, digits: int = 0) -> str:
    """An arm's share of the measured read bandwidth, flagged when above 100%."""
    return percent(f.read_share, digits) + (f" ({UNDERSTATED})" if f.share_understated else "")


def multiple_text(f: ArmFloor) -> str:
    """An arm's median over the binding floor, flagged when under 1x."""
    if f.multiple is None:
        return "—"
    return f"{f.multiple:,.2f}×" + (f" ({UNDERSTATED})" if f.multiple_understated else "")


def floor_cells(floors: dict[str, ShapeFloors], shape: str, median_ns: float | None) -> list[str]:
    """The four FLOOR_HEADER cells of one (shape, arm) row."""
    f = floors.get(shape)
    if f is None:
        return ["—"] * len(FLOOR_HEADER)
    return [us(f.hbm_floor_ns), us(f.fp8_floor_ns), f.binding or "—", multiple_text(arm_floor(None, f, median_ns))]


def understated_note(ix: ResultIndex) -> str:
    """One sentence naming the arms that beat their floor; '' when none did."""
    found = understated_arms(ix.result)
    if not found:
        return ""
    named = ", ".join(f"{arm} at {shape}" for shape, arm, _ in found)
    return (f"{UNDERSTATED}: {named} beat{'s' if len(found) == 1 else ''} the floor no kernel can beat, so the "
            f"floor is too low (the measured read is slower than this card can read); read their floor "
            f"columns as bounds that do not hold")


def read_floor_text(gpu) -> str:
    """How a result's read bandwidth was read (a GpuInfo): the winning layout of the read kernel
    and the datasheet's bandwidth beside it, or what a version 1 file's was."""
    if gpu is None or gpu.read_bandwidth_bytes_per_s is None:
        return "no read bandwidth measured"
    rate = f"{gpu.read_bandwidth_bytes_per_s / 1e12:.2f} TB/s"
    rf = gpu.read_floor
    if rf is None:
        return f"{rate} (a torch.sum read, as files of schema 1 measured it: kernels can beat it)"
    sheet = "no datasheet figure for this GPU" if rf.datasheet_bytes_per_s is None else \
        f"datasheet {rf.datasheet_bytes_per_s / 1e12:.2f} TB/s, measured {rf.of_datasheet:.0%} of it"
    return f"{rate} (read kernel, best of {len(rf.configs)} layouts: {rf.config}; {sheet})"


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
    flagged = understated_note(ix)
    read = f"; read: {read_floor_text(ix.result.provenance.gpu)}" if ix.result.sharding is None else ""
    return (f"{hbm}; {fp8}; binding: the larger; × floor: median / the larger{cited}{read}"
            + (f". {flagged}" if flagged else ""))


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
                cells.append(multiple_text(arm_floor(ix.summary(fx.name, arm), f)))
            rows.append([str(fx.M), fx.name, *cells])
        out.append((family, header, rows))
    return out


def sweep_floor_tables(ix: ResultIndex, wide: bool = False):
    """sweep_floor_rows as rich tables, one per family. By default the M column names the shape
    and each arm's column is headed by the arm alone (the title says what it is), so that the
    table fits 100 columns; `wide` keeps the rows' every column."""
    from rich.table import Table
    tables = []
    for family, header, rows in sweep_floor_rows(ix):
        t = Table(title=f"family {family}: floors against M (µs) and each arm's median over the binding floor",
                  title_justify="left")
        keep = list(range(len(header))) if wide else [i for i, col in enumerate(header) if col != "shape"]
        for i in keep:
            col = header[i] if wide else header[i].removesuffix(" × floor")
            t.add_column(col, justify="left" if col in ("shape", "binding") else "right", no_wrap=True)
        for row in rows:
            t.add_row(*(row[i] for i in keep))
        tables.append(t)
    return tables
