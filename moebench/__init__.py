"""moebench: is this MoE kernel faster than that one, on this GPU, and by how much?"""

from moebench.record import VERSION as __version__  # noqa: E402


def _interrupted_while_starting(signum, frame):  # noqa: ARG001
    import os
    import sys
    sys.stderr.write("moebench: interrupted\n")
    os._exit(130)


def _guard_the_command_start() -> None:
    """Run as the `moebench` command (the console script, or `python -m moebench`), Ctrl-C
    before `moebench.cli.main` takes over (while this package and its stages import) ends in one
    line and exit 130, not a traceback; main puts Python's own handler back. Imported as a
    library, nothing changes."""
    import os
    import signal
    import sys
    if sys.argv and (os.path.basename(sys.argv[0]) == "moebench" or sys.argv[0] == "-m") \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)


_guard_the_command_start()

# The library entry point, `moebench.bench(callables, ...)` (moebench/run/bench.py).
from moebench.run.bench import bench  # noqa: E402

__all__ = ["bench", "__version__"]
