"""A Comparison as a terminal table, Markdown or JSON: a registry, name -> renderer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TextIO

from moebench.results.compare import Comparison, Verdict, gate
from moebench.results.schema import to_plain
from moebench.results.verdicts import is_win
from moebench.results.tables import make_console
from moebench.significance import RESAMPLES

VERDICT_STYLE = {Verdict.FASTER: "green", Verdict.SLOWER: "bold red", Verdict.SAME: "", Verdict.NOISY: "yellow",
                 Verdict.AMBIGUOUS: "magenta"}


def _headline(c: Comparison) -> str:
    return f"B = {c.b_label} against A = {c.a_label}: rules {c.rules.describe()}"


def _method(c: Comparison) -> str:
    unit = "round medians" if c.rules.test == "rows" else "audited samples"
    return (f"From audited samples only. A time is the median of round medians; [..] is its {c.rules.ci_name} "
            f"({RESAMPLES} bootstrap draws of rounds, then of samples within them); p is a two-sided "
            f"Mann-Whitney rank test between the runs' {unit}.")


def _built(identity_changed: tuple[str, ...]) -> str:
    return ", ".join(identity_changed) if identity_changed else "same"


def _us(ns: float) -> str:
    return f"{ns / 1e3:,.2f}"


def _time(median_ns: float, ci: tuple[float, float]) -> str:
    return f"{_us(median_ns)} [{_us(ci[0])}, {_us(ci[1])}]"


def _ratio(median: float, ci: tuple[float, float]) -> str:
    return f"{median:.3f}× [{ci[0]:.3f}, {ci[1]:.3f}]"


def _change(change: float, ci: tuple[float, float]) -> str:
    return f"{change:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}]"


def _why(reason: str) -> str:
    return reason.split(": ", 1)[-1]


ARM_COLUMNS = ("shape", "arm", "A µs", "B µs", "change", "p", "verdict", "why")
RATIO_COLUMNS = ("shape", "arm / ref", "A", "B", "change", "p", "verdict", "why")


def _verdict(verdict: Verdict, mark: str) -> str:
    """The verdict's word, marked when it was judged on throttled rounds."""
    return f"{verdict.value} (throttled)" if mark else verdict.value


def _arm_cells(c: Comparison) -> list[tuple[Verdict, list[str]]]:
    return [(a.verdict, [a.shape, a.arm, _time(a.a_median_ns, a.a_ci_ns), _time(a.b_median_ns, a.b_ci_ns),
                         _change(a.change, a.change_ci), f"{a.p_value:.2g}", _verdict(a.verdict, a.mark), _why(a.reason),
                         _built(a.identity_changed)]) for a in c.arms]


def _ratio_cells(c: Comparison) -> list[tuple[Verdict, list[str]]]:
    return [(r.verdict, [r.shape, f"{r.arm} / {r.ref}", _ratio(r.a_median, r.a_ci), _ratio(r.b_median, r.b_ci),
                         _change(r.change, r.change_ci), f"{r.p_value:.2g}", _verdict(r.verdict, r.mark),
                         _why(r.reason)])
            for r in c.ratios]


def render_table(c: Comparison, out: TextIO) -> None:
    from rich.table import Table
    from rich.text import Text

    console = make_console(out)
    builds = any(a.identity_changed for a in c.arms)
    t = Table(title=_headline(c), title_justify="left", caption=_method(c), caption_justify="left")
    for name in ARM_COLUMNS + (("build changed",) if builds else ()):
        t.add_column(name, justify="left" if name in ("shape", "arm", "verdict", "why", "build changed") else "right",
                     overflow="fold", no_wrap=name in ("arm", "verdict"))
    for verdict, cells in _arm_cells(c):
        style = VERDICT_STYLE[verdict]
        cells[6] = Text(cells[6], style=style or "")
        t.add_row(*(cells if builds else cells[:-1]))
    console.print(t)
    if c.ratios:
        r_t = Table(title="paired ratios within each run (ref / arm; > 1: the arm is faster)", title_justify="left")
        for name in RATIO_COLUMNS:
            r_t.add_column(name, justify="left" if name in ("shape", "arm / ref", "verdict", "why") else "right",
                           overflow="fold", no_wrap=name in ("arm / ref", "verdict"))
        for verdict, cells in _ratio_cells(c):
            style = VERDICT_STYLE[verdict]
            cells[6] = Text(cells[6], style=style or "")
            r_t.add_row(*cells)
        console.print(r_t)
    for note in c.notes:
        console.print(f"note: {note}", highlight=False)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(c: Comparison, out: TextIO) -> None:
    lines = [f"### moebench compare: {_headline(c)}", "", _method(c), "",
             _md_row(list(ARM_COLUMNS) + ["build changed"]), "|---|---|--:|--:|--:|--:|---|---|---|"]
    for verdict, cells in _arm_cells(c):
        cells[1] = f"`{cells[1]}`"
        cells[6] = f"**{cells[6]}**" if is_win(verdict) else cells[6]
        lines.append(_md_row(cells))
    if c.ratios:
        lines += ["", "Paired ratios within each run (ref / arm; > 1: the arm is faster):", "",
                  _md_row(list(RATIO_COLUMNS)), "|---|---|--:|--:|--:|--:|---|---|"]
        for _verdict, cells in _ratio_cells(c):
            arm, ref = cells[1].split(" / ")
            cells[1] = f"`{arm}` / `{ref}`"
            lines.append(_md_row(cells))
    if c.notes:
        lines += [""] + [f"- {n}" for n in c.notes]
    out.write("\n".join(lines).replace("|  |", "| |") + "\n")


def render_json(c: Comparison, out: TextIO) -> None:
    plain = to_plain(c)
    plain["regressions"] = [f"{a.shape}/{a.arm}" for a in c.regressions]
    plain["gate"] = gate(c)
    out.write(json.dumps(plain, indent=1) + "\n")


COMPARE_FORMATS: dict[str, Callable[[Comparison, TextIO], None]] = {
    "table": render_table,
    "markdown": render_markdown,
    "json": render_json,
}
