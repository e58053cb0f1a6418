"""Parity rows against the oracle (`verify`, a run's prepare): a terminal table and a Markdown one."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from moebench.record.schema import ParityInfo


def parity_only(result) -> bool:
    """A file of `verify --out`'s parity rows alone (untimed), not a timed run without samples."""
    return not result.samples and bool(result.parity) and result.settings.timer == "none"


# threshold: the relative L2 the arm's error model allows over the whole output (or --threshold);
# excess: the residual over the error model's allowance at its worst place (<= 1 passes)
WIDE_ONLY = ("max abs err", "ref max abs", "NaN/Inf", "threshold")


def parity_table(rows: Sequence[ParityInfo], where: str, wide: bool = False) -> Table:
    """Shape, arm, oracle, the distances, the excess and the verdict (with its reason): within
    100 columns; `wide` adds the magnitudes, the non-finite count and the threshold."""
    t = Table(title=f"parity against the oracle ({where})", title_justify="left")
    for col in ("shape", "arm", "oracle"):
        t.add_column(col, no_wrap=True)
    columns = ("rel L2", *(WIDE_ONLY if wide else ()), "excess", "vs exact")
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("result")
    for r in rows:
        result = Text("ok", style="green") if r.passed else Text.assemble(("FAIL", "red"), f" {r.reason()}")
        cells = {"rel L2": f"{r.rel_l2:.2e}", "max abs err": f"{r.max_abs:.2e}", "ref max abs": _num(r.ref_max_abs),
                 "NaN/Inf": str(r.nonfinite), "threshold": f"{r.threshold:.2e}",
                 "excess": "—" if r.model_excess is None else f"{r.model_excess:.3f}", "vs exact": _num(r.rel_l2_exact)}
        t.add_row(r.shape, r.arm, r.oracle, *(cells[c] for c in columns), result)
    return t


def parity_markdown(rows: Sequence[ParityInfo], heading: str) -> str:
    lines = [heading, "", "| shape | arm | oracle | rel L2 | rel L2 vs exact | excess | result |",
             "|---|---|---|--:|--:|--:|---|"]
    for r in rows:
        lines.append(f"| {r.shape} | `{r.arm}` | {r.oracle} | {r.rel_l2:.2e} | {_num(r.rel_l2_exact)} | "
                     f"{'—' if r.model_excess is None else f'{r.model_excess:.3f}'} | "
                     f"{'ok' if r.passed else '**FAIL** ' + r.reason()} |")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2e}"
