"""`moebench report`'s work: a saved result in one format, with its plots written beside it
and linked from the Markdown relative to where the report is written."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from moebench.errors import UserError
from moebench.record.atomic import atomic_write
from moebench.record.schema import RunResult
from moebench.views.formats import FORMATS
from moebench.views.markdown import Image

IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def check_outputs(plot_dir: str | None, output: str | None) -> None:
    """Refuse, before anything is written, output paths that would make folders nobody asked
    for: `-o` into a folder that does not exist, `--plot` given a file name (it takes a folder,
    of which only the last level is made)."""
    if output is not None and not Path(output).parent.is_dir():
        raise UserError(f"cannot write {output}: {str(Path(output).parent)!r} is not an existing folder "
                        f"(moebench makes no folders for a report)")
    if plot_dir is not None:
        if Path(plot_dir).suffix.lower() in IMAGE_SUFFIXES:
            raise UserError(f"--plot {plot_dir}: takes a folder (PNG and SVG files are written into it), "
                            f"not an image's file name")
        if not Path(plot_dir).parent.is_dir():
            raise UserError(f"cannot write plots into {plot_dir}: {str(Path(plot_dir).parent)!r} is not an "
                            f"existing folder (--plot makes only its last folder)")


@dataclass(frozen=True)
class Report:
    text: str
    written: tuple[str, ...]  # files written (plots, the report itself), in order


def make_report(result: RunResult, fmt: str, plot_dir: str | None = None, output: str | None = None,
                prefix: str = "", ref: str | None = None, stream: TextIO | None = None,
                wide: bool = False) -> Report:
    """Render the report to the file `output`, else to `stream` (a terminal keeps its width and
    colours), else only into the returned text; and say which files were written."""
    from moebench.analysis.stats import with_ref
    from moebench.record.index import ResultIndex

    if prefix and (any(sep in prefix for sep in ("/", "\\")) or ".." in prefix):
        raise UserError(f"--prefix {prefix!r}: a prefix of file names, without a folder or '..'")
    check_outputs(plot_dir, output)
    if ref is not None:
        result = with_ref(result, ref)
    images, written = [], []
    if plot_dir is not None:
        from moebench.views.plots import write_plots
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
            atomic_write(output, text.getvalue().encode("utf-8"))
        except OSError as err:
            raise UserError(f"cannot write {output}: {err.strerror or err}") from None
        written.append(output)
    return Report(text.getvalue(), tuple(written))
