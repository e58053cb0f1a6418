"""A Comparison as a terminal table, Markdown or JSON: a registry, name -> renderer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TextIO

from moebench.results.compare import Comparison, Verdict
from moebench.results.schema import to_plain
from moebench.results.tables import make_console

VERDICT_STYLE = {Verdict.FASTER: "green", Verdict.SLOWER: "bold red", Verdict.SAME: "", Verdict.NOISY: "yellow"}


def _headline(c: Comparison) -> str:
    t = c.thresholds
    return (f"B = {c.b_label} against A = {c.a_label}: change threshold ±{t.change:.1%}, "
            f"rounds may spread {t.spread_limit:.1%}")


def _built(identity_changed: tuple[str, ...]) -> str:
    return ", ".join(identity_changed) if identity_changed else "same"


def render_table(c: Comparison, out: TextIO) -> None:
    from rich.table import Table

    console = make_console(out)
    builds = any(a.identity_changed for a in c.arms)
    t = Table(title=_headline(c), title_justify="left")
    columns = [("shape", "left"), ("arm", "left"), ("A µs", "right"), ("B µs", "right"),
               ("change", "right"), ("verdict", "left"), ("why", "left")]
    for name, justify in columns + ([("build changed", "left")] if builds else []):
        t.add_column(name, justify=justify, overflow="fold", no_wrap=name in ("arm", "verdict"))
    for a in c.arms:
        style = VERDICT_STYLE[a.verdict]
        t.add_row(a.shape, a.arm, f"{a.a_median_ns / 1e3:,.2f}", f"{a.b_median_ns / 1e3:,.2f}",
                  f"{a.change:+.1%}", f"[{style}]{a.verdict.value}[/]" if style else a.verdict.value,
                  a.reason.split(": ", 1)[-1], *([_built(a.identity_changed)] if builds else []))
    console.print(t)
    if c.ratios:
        r_t = Table(title="paired ratios within each run (ref / arm; > 1: the arm is faster)", title_justify="left")
        for name, justify in (("shape", "left"), ("arm / ref", "left"), ("A", "right"),
                              ("B", "right"), ("change", "right"), ("verdict", "left"), ("why", "left")):
            r_t.add_column(name, justify=justify, overflow="fold", no_wrap=name in ("arm / ref", "verdict"))
        for r in c.ratios:
            style = VERDICT_STYLE[r.verdict]
            r_t.add_row(r.shape, f"{r.arm} / {r.ref}", f"{r.a_median:.3f}×", f"{r.b_median:.3f}×",
                        f"{r.change:+.1%}", f"[{style}]{r.verdict.value}[/]" if style else r.verdict.value,
                        r.reason.split(": ", 1)[-1])
        console.print(r_t)
    for note in c.notes:
        console.print(f"note: {note}", highlight=False)


def render_markdown(c: Comparison, out: TextIO) -> None:
    lines = [f"### moebench compare: {_headline(c)}", "",
             "| shape | arm | A µs | B µs | change | verdict | why | build changed |",
             "|---|---|--:|--:|--:|---|---|---|"]
    for a in c.arms:
        verdict = f"**{a.verdict.value}**" if a.verdict is not Verdict.SAME else a.verdict.value
        lines.append(f"| {a.shape} | `{a.arm}` | {a.a_median_ns / 1e3:,.2f} | {a.b_median_ns / 1e3:,.2f} | "
                     f"{a.change:+.1%} | {verdict} | {a.reason.split(': ', 1)[-1]} | {_built(a.identity_changed)} |")
    if c.ratios:
        lines += ["", "Paired ratios within each run (ref / arm; > 1: the arm is faster):", "",
                  "| shape | arm / ref | A | B | change | verdict | why |",
                  "|---|---|--:|--:|--:|---|---|"]
        for r in c.ratios:
            lines.append(f"| {r.shape} | `{r.arm}` / `{r.ref}` | {r.a_median:.3f}× | {r.b_median:.3f}× | "
                         f"{r.change:+.1%} | {r.verdict.value} | {r.reason.split(': ', 1)[-1]} |")
    if c.notes:
        lines += [""] + [f"- {n}" for n in c.notes]
    out.write("\n".join(lines).replace("|  |", "| |") + "\n")


def render_json(c: Comparison, out: TextIO) -> None:
    plain = to_plain(c)
    plain["regressions"] = [f"{a.shape}/{a.arm}" for a in c.regressions]
    out.write(json.dumps(plain, indent=1) + "\n")


COMPARE_FORMATS: dict[str, Callable[[Comparison, TextIO], None]] = {
    "table": render_table,
    "markdown": render_markdown,
    "json": render_json,
}
