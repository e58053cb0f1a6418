"""What an engine says while an arm loads it or resolves its config, kept instead of printed.

SGLang logs through `logging` (and now and then `warnings`) when it falls back to another
Triton version's config table; printed, four such lines land in the middle of a run's progress.
They belong to the arm's identity (ENGINE_MESSAGES): what the engine did is part of what was
timed. The run says in one line that there are some (`messages_line`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

ENGINE_MESSAGES = "engine_messages"  # the identity key: a list of "level: text" lines, each once


def _text(record: logging.LogRecord) -> str:
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 (a bad format string in the engine: keep the raw message)
        text = str(record.msg)
    return f"{record.levelname.lower()}: {text}"


@contextmanager
def captured_engine_messages() -> Iterator[list[str]]:
    """Inside the block, warnings and the log records any logger would hand to its handlers (those
    its level lets through) are kept in the yielded list (in order, each once) and printed
    nowhere. Records are taken at `Logger.callHandlers`, so a logger the engine creates inside the
    block, with a handler of its own, is held too; the method is restored after."""
    kept: list[str] = []
    call_handlers = logging.Logger.callHandlers

    def keep(self: logging.Logger, record: logging.LogRecord) -> None:
        kept.append(_text(record))

    logging.Logger.callHandlers = keep
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield kept
        kept.extend(f"warning: {w.category.__name__}: {w.message}" for w in caught)
    finally:
        logging.Logger.callHandlers = call_handlers
        kept[:] = list(dict.fromkeys(kept))


def messages_line(arm: str, by_shape: dict[str, list[str]]) -> str:
    """The one terminal line for an arm whose engine spoke: how much, where, and the first words."""
    count = len({m for ms in by_shape.values() for m in ms})
    first = next(m for ms in by_shape.values() for m in ms)
    first = first if len(first) <= 60 else first[:57] + "..."
    return f"{arm}: {count} engine message(s) at {', '.join(by_shape)} kept in its identity ({ENGINE_MESSAGES}): {first}"
