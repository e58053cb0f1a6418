"""Determinism verdicts as a terminal table and as Markdown: one row per arm and shape.

Columns: run to run (bitwise over N runs, or how many runs differ, in how many elements at
most and by how much), batch invariance (each m's rows alone against inside larger batches),
across processes (the output hash of a fresh process), the verdict, and what the engine defines.
A timed run's summary tables add one short cell per arm and shape (det_text).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from moebench.record.determinism import DeterminismVerdict

HEADER = ("shape", "arm", "run to run", "batch invariance (rows of m tokens)", "across processes", "verdict", "engine")


def _size(max_abs: float) -> str:
    return "not finite" if max_abs < 0 else f"max |Δ| {max_abs:.3g}"


def run_to_run_text(v: DeterminismVerdict) -> str:
    r = v.run_to_run
    if r.bitwise:
        return f"bitwise, {r.runs} runs"
    return f"{r.differing_runs} of {r.runs - 1} later runs differ from the first: ≤ {r.elements} elements, {_size(r.max_abs)}"


def batch_text(v: DeterminismVerdict) -> str:
    parts = []
    for m in sorted({b.m for b in v.batch}):
        rows = [b for b in v.batch if b.m == m]
        bad = [b for b in rows if not b.bitwise]
        if not bad:
            parts.append(f"m={m} bitwise (in {', '.join(str(b.batch) for b in rows)})")
        else:
            worst = max(bad, key=lambda b: b.elements)
            parts.append(f"m={m} differs in {worst.batch}: {worst.elements} elements, {_size(worst.max_abs)}")
    return "; ".join(parts) or "—"


def cross_process_text(v: DeterminismVerdict) -> str:
    cp = v.cross_process
    if cp is None:
        return "not checked"
    if cp.equal is None:
        return f"no hash: {cp.error or 'unknown'}"
    return "same hash" if cp.equal else "different hash"


def verdict_text(v: DeterminismVerdict) -> str:
    words = ["deterministic" if v.deterministic else "NOT deterministic",
             "batch-invariant" if v.batch_invariant else "NOT batch-invariant"]
    return ", ".join(words)


def det_text(v: DeterminismVerdict | None) -> str:
    """A timed run's `det` cell: run to run (and across processes), then batch invariance."""
    if v is None:
        return "—"
    r, cp = v.run_to_run, v.cross_process
    if not r.bitwise:
        size = "not finite" if r.max_abs < 0 else f"max Δ {r.max_abs:.3g}"
        repeat = f"differs ({r.elements:,} elems, {size})"
    elif cp is not None and cp.equal is False:
        repeat = "differs across processes"
    else:
        repeat = "bitwise"
    return f"{repeat} · {'invariant' if v.batch_invariant else 'varies with batch'}"


def verdicts_by_unit(verdicts: Sequence[DeterminismVerdict]) -> dict[tuple[str, str], DeterminismVerdict]:
    return {(v.shape, v.arm): v for v in verdicts}


def verdict_rows(verdicts: Sequence[DeterminismVerdict]) -> list[list[str]]:
    return [[f"{v.shape} (M={v.M})", v.arm, run_to_run_text(v), batch_text(v), cross_process_text(v), verdict_text(v),
             v.note or ""] for v in verdicts]


def determinism_table(verdicts: Sequence[DeterminismVerdict], where: str = "") -> Table:
    t = Table(title="determinism and batch invariance" + (f" ({where})" if where else ""), title_justify="left")
    for col in HEADER:
        t.add_column(col, overflow="fold")
    for v, row in zip(verdicts, verdict_rows(verdicts)):
        style = "green" if v.passed else "yellow" if v.deterministic and v.batch_invariant else "red"
        row[5] = Text(row[5], style=style)
        t.add_row(*row)
    return t


def determinism_markdown(verdicts: Sequence[DeterminismVerdict], heading: str = "### Determinism") -> str:
    if not verdicts:
        return ""
    lines = [heading, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in verdict_rows(verdicts):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)
