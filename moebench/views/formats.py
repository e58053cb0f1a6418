"""Output formats of `moebench report`: a registry, name -> renderer.

A renderer writes one finished RunResult to a text stream; `images` are plots already
written for it (only formats that can show pictures use them); `wide` asks the terminal
tables for every column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TextIO

from moebench.record.metrics import timed_metric
from moebench.record.schema import RunResult
from moebench.views.markdown import Image

Renderer = Callable[..., None]  # (result, out, images, *, wide=False): `wide` is for terminal tables


def _table(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.views.tables import make_console, print_tables
    print_tables(result, make_console(out, wide), wide=wide)


def _kernels(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.analysis.stats import kernel_summaries, referee_checks
    from moebench.views.tables import kernel_table, make_console, referee_table
    console = make_console(out, wide)
    kernels = kernel_summaries(result)
    if not kernels:
        console.print(f"no per-kernel durations: its samples hold no matching kernel records "
                      f"(timer: {timed_metric(result.settings.timer).source})")
        return
    for table in (kernel_table(kernels), referee_table(referee_checks(result))):
        if table is not None:
            console.print(table)


def _markdown(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.views.markdown import render_markdown
    out.write(render_markdown(result, images))


def _summary(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.views.markdown import render_summary
    out.write(render_summary(result))


def _pr(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.views.pr_view import render_pr
    out.write(render_pr(result))


def _csv(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.views.csv_view import render_csv
    out.write(render_csv(result))


def _json(result: RunResult, out: TextIO, images: Sequence[Image], *, wide: bool = False) -> None:
    from moebench.record.store import dumps
    out.write(dumps(result))


FORMATS: dict[str, Renderer] = {
    "table": _table,
    "kernels": _kernels,
    "markdown": _markdown,
    "summary": _summary,
    "pr": _pr,
    "csv": _csv,
    "json": _json,
}
