"""A run that survives its own end: its result is on disk after every round.

Before the first round and after each one, the run's RunResult so far (the rounds done, their
audit and statistics) is written, marked incomplete with the planned request, so that
`moebench run --resume FILE` can finish it. The first write takes a free name and creates the
file whole; later ones replace it atomically, so a reader never finds it empty. When the run
ends early (Ctrl-C, SIGTERM, an exception) the last file is written once more with the
reason. A SIGKILL leaves the last round's file, whose reason says the run was in progress
when it was written.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from moebench.errors import UserError
from moebench.record import schema as S
from moebench.record.store import save, save_new
from moebench.run.assemble import result_filename

IN_PROGRESS = "in progress when written (a run killed here says no more)"
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Stopped(BaseException):
    """A stop signal (SIGTERM) arrived during a run: raised where the run was, like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunInterrupted(Exception):
    """The run was stopped by a signal; its partial result is kept (exit 128 + signal)."""

    def __init__(self, message: str, path: Path | None, exit_code: int):
        super().__init__(message)
        self.path = path
        self.exit_code = exit_code


@contextmanager
def stop_signals():
    """SIGTERM raises `Stopped` inside the block (SIGINT already raises KeyboardInterrupt), so
    the run can say why it ended. Only the main thread can take signals; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def incomplete(rounds_done: int, reason: str, request: dict, resumed_at: tuple[int, ...] = ()) -> S.RunStatus:
    return S.RunStatus(complete=False, reason=reason, rounds_done=rounds_done, request=request,
                       resumed_at=resumed_at)


class PartialSaver:
    """Writes the run's result after every round. `make(measurement, status)` assembles the
    RunResult; the file is `path`, or a free name in `out_dir` taken at the first write.
    `check(result)` sees the first result before anything is written (a resume's last check)."""

    def __init__(self, make: Callable, request: dict, *, path: Path | None = None, out_dir: str | None = None,
                 resumed_at: tuple[int, ...] = (), check: Callable[[S.RunResult], None] | None = None):
        self.make, self.request, self.path, self.out_dir = make, request, path, out_dir
        self.resumed_at, self.check = resumed_at, check
        self.last = None  # the newest measurement written

    def status(self, rounds_done: int, reason: str) -> S.RunStatus:
        return incomplete(rounds_done, reason, self.request, self.resumed_at)

    def __call__(self, m) -> None:
        result = self.make(m, self.status(m.rounds_done, IN_PROGRESS))
        if self.last is None and self.check is not None:
            self.check(result)
        self.last = m
        self._write(result)

    def _write(self, result: S.RunResult) -> None:
        if self.path is None:  # the first write names the file, and it appears whole
            self.path = save_new(result, Path(self.out_dir) / result_filename(result))
        else:
            save(result, self.path)

    def finish(self, m) -> S.RunResult:
        """The finished run, written complete."""
        status = S.RunStatus(complete=True, rounds_done=m.rounds_done, resumed_at=self.resumed_at)
        result = self.make(m, status)
        self._write(result)
        return result

    def stopped(self, err: BaseException) -> BaseException:
        """Write the last round's result with why the run ended; return what to raise: a
        RunInterrupted for a signal, else `err` itself with a note of where the rounds are."""
        signum = signal.SIGINT if isinstance(err, KeyboardInterrupt) else getattr(err, "signum", None)
        if signum is not None:
            why = f"interrupted by {signal.Signals(signum).name}"
        else:
            why = f"crashed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
        kept = None
        if self.last is not None:
            m = self.last
            self._write(self.make(m, self.status(m.rounds_done, why)))
            kept = (f"{m.rounds_done} of {m.protocol.rounds} rounds kept in {self.path}; "
                    f"`moebench run --resume {self.path}` finishes the run")
        if signum is not None:
            return RunInterrupted(f"{why}: " + (kept or "no round was saved"), self.path if kept else None,
                                  EXIT_CODES.get(signum, 128 + int(signum)))
        if kept and isinstance(err, UserError):  # one line still (out of GPU memory mid-run, say)
            return UserError(f"{err}; {kept}")
        if kept:
            err.add_note(f"moebench: {kept}")
        return err
