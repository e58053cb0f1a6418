"""Command line: parse, call the library, print. No logic of its own.

Every user mistake ends as one line on stderr and a non-zero exit, whatever its source (a flag,
a file, the environment, a signal); see `main`. Command modules import the heavy stages
(torch, Triton, CUDA) inside their functions, so `--help` answers without them.
"""

from __future__ import annotations

import sys

import click

from moebench.errors import UserError, one_line
from moebench.record import VERSION


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="moebench")
def cli() -> None:
    """Paired, cold-L2, CUPTI-timed benchmarks of FP8 MoE kernels."""


def _register_commands() -> None:
    """Every subcommand, named here: the command modules import nothing of this package, so the
    command line is one list and no import circles back to it."""
    from moebench.cli.arms_cmd import arms
    from moebench.cli.build_cmd import build
    from moebench.cli.compare_cmd import compare
    from moebench.cli.doctor_cmd import doctor
    from moebench.cli.fixtures_cmd import fixtures
    from moebench.cli.probe_cmd import probe
    from moebench.cli.profile_cmd import profile
    from moebench.cli.report_cmd import report
    from moebench.cli.run_cmd import run_command
    from moebench.cli.sweep_cmd import sweep
    from moebench.cli.tune_cmd import tune_command
    from moebench.cli.verify_cmd import verify_command
    for command in (arms, build, compare, doctor, fixtures, probe, profile, report, run_command, sweep,
                    tune_command, verify_command):
        cli.add_command(command)


_register_commands()


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _fail(message: str, code: int = 2) -> None:
    if _interrupts:  # the error came after a Ctrl-C a library swallowed: the user stopped the command
        _interrupted()
    print(f"moebench: {one_line(message)}", file=sys.stderr)
    sys.exit(code)


_interrupts: list[int] = []  # SIGINTs seen by this command


def _interrupted() -> None:
    """One line and exit 130, and nothing after it: a second Ctrl-C is ignored, and the process
    ends without the interpreter's shutdown (whose thread joins and exit hooks a late
    KeyboardInterrupt could still break into, ending the process by the signal instead)."""
    import os
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("moebench: interrupted", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(INTERRUPTED)


def _on_interrupt(signum, frame) -> None:  # noqa: ARG001
    """Python's own behaviour (KeyboardInterrupt), remembered: a library that wraps the
    KeyboardInterrupt in an error of its own (the Triton interpreter does) still ends the
    command as interrupted."""
    _interrupts.append(signum)
    raise KeyboardInterrupt


def _take_over_interrupts() -> None:
    import signal
    import threading
    current = signal.getsignal(signal.SIGINT)
    starting = getattr(current, "__name__", "") == "_interrupted_while_starting"
    # Only over Python's own handler (or the package's start-up guard): an ignored SIGINT (a
    # background job's) stays ignored, and a caller's handler stays theirs.
    if threading.current_thread() is threading.main_thread() and (current is signal.default_int_handler or starting):
        _interrupts.clear()
        signal.signal(signal.SIGINT, _on_interrupt)


def main(argv: list[str] | None = None) -> None:
    from moebench.cli.terminal import fit_streams
    fit_streams()
    try:
        _take_over_interrupts()
        args = list(sys.argv[1:] if argv is None else argv)
        code = cli.main(args=args, prog_name="moebench", standalone_mode=False, obj={"argv": args})
        # a library swallowed the KeyboardInterrupt and the command went on: still a Ctrl-C (unless the
        # command ended as interrupted itself, its line said: a run's partial file)
        if _interrupts and code != INTERRUPTED:
            _interrupted()
    except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C at any point, imports included
        _interrupted()
    except SystemExit as exit_:  # a command's own exit (a failed check: 1) after a swallowed Ctrl-C is 130
        if _interrupts and exit_.code != INTERRUPTED:  # (one that says so itself has said its line)
            _interrupted()
        raise
    except click.UsageError as err:  # bad flag, missing argument: one line, exit 2
        _fail(f"error: {err.format_message()}")
    except UserError as err:
        _fail(f"error: {err}")
    except RecursionError:  # an input nested past what Python's stack holds
        _fail("error: the input is nested too deeply to read")
    except BrokenPipeError:  # `moebench report x | head`: the reader left; nothing to say
        sys.stderr.close()
        sys.exit(1)
    except OSError as err:  # a path the system refuses (too long, not a folder, no permission)
        if err.filename is None:
            raise
        name = str(err.filename)
        _fail(f"error: {name if len(name) <= 80 else name[:77] + '...'}: {err.strerror or err}")
    except Exception:
        if _interrupts:  # the interrupt came back as another library's error
            _interrupted()
        raise
    sys.exit(code if isinstance(code, int) else 0)
