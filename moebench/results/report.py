"""`moebench report`'s work: a saved result in one format, with its plots written beside it
and linked from the Markdown relative to where the report is written."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from moebench.atomic_write import atomic_write
from moebench.errors import UserError
from moebench.results.formats import FORMATS
from moebench.results.markdown import Image
from moebench.results.schema import RunResult


@dataclass(frozen=True)
class Report:
    text: str
    written: tuple[str, ...]  # files written (plots, the report itself), in order


def make_report(result: RunResult, fmt: str, plot_dir: str | None = None, output: str | None = None,
                prefix: str = "", ref: str | None = None, stream: TextIO | None = None,
                wide: bool = False) -> Report:
    """Render the report to the file `output`, else to `stream` (a terminal keeps its width and
    colours), else only into the returned text; and say which files were written."""
    from moebench.results.index import ResultIndex
    from moebench.stats import with_ref

    if prefix and (any(sep in prefix for sep in ("/", "\\")) or ".." in prefix):
        raise UserError(f"--prefix {prefix!r}: a prefix of file names, without a folder or '..'")
    if ref is not None:
        result = with_ref(result, ref)
    images, written = [], []
    if plot_dir is not None:
        from moebench.results.plots import write_plots
        try:
            plots = write_plots(ResultIndex(result), plot_dir, prefix=prefix)
        except OSError as err:
            raise UserError(f"cannot write plots into {plot_dir}: {err.strerror or err}") from None
        for plot in plots:
            png = plot.paths[0]
            # Links relative to the Markdown file when it has one, else as the folder was given.
            link = os.path.relpath(png, Path(output).parent) if output else png
            images.append(Image(plot.title, Path(link).as_posix()))
            written.append(f"{png} and .svg")
    text = io.StringIO() if output is not None or stream is None else stream
    FORMATS[fmt](result, text, images, wide=wide)
    if text is stream:
        return Report("", tuple(written))
    if output is not None:
        try:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(output, text.getvalue().encode("utf-8"))
        except OSError as err:
            raise UserError(f"cannot write {output}: {err.strerror or err}") from None
        written.append(output)
    return Report(text.getvalue(), tuple(written))
