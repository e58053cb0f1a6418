"""Command line: parse, call the library, print. No logic of its own.

Every user mistake ends as one line on stderr and a non-zero exit, whatever its source (a flag,
a file, the environment, a signal); see `main`. Command modules import the heavy stages
(torch, Triton, CUDA) inside their functions, so `--help` answers without them.
"""

from __future__ import annotations

import sys

import click

from moebench import __version__
from moebench.errors import UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moebench")
def cli() -> None:
    """Paired, cold-L2, CUPTI-timed benchmarks of FP8 MoE kernels."""


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _fail(message: str, code: int = 2) -> None:
    print(f"moebench: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    from moebench.cli.terminal import fit_streams
    fit_streams()
    try:
        from moebench.cli import commands  # noqa: F401  (registers the subcommands)
        args = list(sys.argv[1:] if argv is None else argv)
        code = cli.main(args=args, prog_name="moebench", standalone_mode=False, obj={"argv": args})
    except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C at any point, imports included
        _fail("interrupted", INTERRUPTED)
    except click.UsageError as err:  # bad flag, missing argument: one line, exit 2
        _fail(f"error: {err.format_message()}")
    except UserError as err:
        _fail(f"error: {err}")
    except RecursionError:  # an input nested past what Python's stack holds
        _fail("error: the input is nested too deeply to read")
    except BrokenPipeError:  # `moebench report x | head`: the reader left; nothing to say
        sys.stderr.close()
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
