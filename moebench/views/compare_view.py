"""A Comparison as a terminal table, Markdown or JSON: a registry, name -> renderer."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TextIO

from moebench.analysis.compare import Comparison, Verdict, gate
from moebench.analysis.significance import RESAMPLES
from moebench.analysis.verdicts import is_win
from moebench.record.schema import to_plain
from moebench.views.tables import make_console

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


# The terminal table's columns by default (fits 100 columns: medians alone, the change with its
# interval, the verdict) and with --wide (every column of the Markdown). Numbers never wrap; text folds.
NARROW_ARM = (0, 1, "A µs", "B µs", 4, 6)
NUMBER_COLUMNS = {"A µs", "B µs", "A", "B", "change", "p"}


def _narrow(cells: list[str], a_median: str, b_median: str) -> list[str]:
    return [cells[0], cells[1], a_median, b_median, cells[4], cells[6]]


def _rich_table(title: str, header: Sequence[str], rows: list[tuple[Verdict, list[str]]], caption: str = ""):
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left", caption=caption or None, caption_justify="left")
    for name in header:
        number = name in NUMBER_COLUMNS or name.startswith("change")
        t.add_column(name, justify="right" if number else "left", no_wrap=number or name == "verdict",
                     overflow="ellipsis" if number else "fold")
    for verdict, cells in rows:
        cells = list(cells)
        cells[header.index("verdict")] = Text(cells[header.index("verdict")], style=VERDICT_STYLE[verdict])
        t.add_row(*cells)
    return t


def render_table(c: Comparison, out: TextIO, wide: bool = False) -> None:
    console = make_console(out, wide)
    builds = any(a.identity_changed for a in c.arms)
    change = f"change [{c.rules.ci_name}]"
    if wide:
        header = list(ARM_COLUMNS) + (["build changed"] if builds else [])
        rows = [(v, cells if builds else cells[:-1]) for v, cells in _arm_cells(c)]
    else:
        header = ["shape", "arm", "A µs", "B µs", change, "verdict"]
        rows = [(a.verdict, _narrow(cells, _us(a.a_median_ns), _us(a.b_median_ns)))
                for a, (_v, cells) in zip(c.arms, _arm_cells(c))]
    console.print(_rich_table(_headline(c), header, rows, _method(c)))
    if c.ratios:
        title = "paired ratios within each run (ref / arm; > 1: the arm is faster)"
        if wide:
            header, rows = list(RATIO_COLUMNS), _ratio_cells(c)
        else:
            header = ["shape", "arm / ref", "A", "B", change, "verdict"]
            rows = [(r.verdict, _narrow(cells, f"{r.a_median:.3f}×", f"{r.b_median:.3f}×"))
                    for r, (_v, cells) in zip(c.ratios, _ratio_cells(c))]
        console.print(_rich_table(title, header, rows))
    if not wide:
        for line in _why_lines(c):
            console.print(line, highlight=False)
    for note in c.notes:
        console.print(f"note: {note}", highlight=False)


def _why_lines(c: Comparison) -> list[str]:
    """Under the narrow tables: each verdict's reason and the builds that changed, one line per
    group of rows that share them."""
    groups: dict[str, list[str]] = {}
    for a in c.arms:
        groups.setdefault(f"{a.verdict.value}: {_why(a.reason)}", []).append(f"{a.shape} {a.arm}")
    for r in c.ratios:
        groups.setdefault(f"{r.verdict.value} (ratio): {_why(r.reason)}", []).append(f"{r.shape} {r.arm}/{r.ref}")
    lines = [f"{why} — {', '.join(rows) if len(rows) <= 4 else f'{len(rows)} rows'}" for why, rows in groups.items()]
    changed = sorted({f"{a.arm}" for a in c.arms if a.identity_changed})
    if changed:
        lines.append(f"build identity changed: {', '.join(changed)} (--wide: which keys)")
    return lines + ["--wide: intervals of each median, p values and reasons in the tables"]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(c: Comparison, out: TextIO, wide: bool = False) -> None:
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


def render_json(c: Comparison, out: TextIO, wide: bool = False) -> None:
    plain = to_plain(c)
    plain["regressions"] = [f"{a.shape}/{a.arm}" for a in c.regressions]
    plain["gate"] = gate(c)
    out.write(json.dumps(plain, indent=1) + "\n")


COMPARE_FORMATS: dict[str, Callable[..., None]] = {  # (comparison, out, wide=False)
    "table": render_table,
    "markdown": render_markdown,
    "json": render_json,
}
