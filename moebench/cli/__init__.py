"""Command line: parse, call the library, print. No logic of its own.

Every user mistake ends as one line on stderr and exit code 2; see `main`.
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


def main(argv: list[str] | None = None) -> None:
    from moebench.cli import commands  # noqa: F401  (registers the subcommands)

    try:
        args = list(sys.argv[1:] if argv is None else argv)
        code = cli.main(args=args, prog_name="moebench", standalone_mode=False, obj={"argv": args})
    except click.exceptions.Abort:
        print("moebench: aborted", file=sys.stderr)
        sys.exit(130)
    except click.UsageError as err:  # bad flag, missing argument: one line, exit 2
        print(f"moebench: error: {err.format_message()}", file=sys.stderr)
        sys.exit(2)
    except UserError as err:
        print(f"moebench: error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
