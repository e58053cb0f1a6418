"""Output streams that never fail on a character: a terminal whose encoding cannot print µ,
× or an en dash gets "us", "x" and "-" instead (and "?" for anything else), not a
UnicodeEncodeError in the middle of a table."""

from __future__ import annotations

import sys

FALLBACK = str.maketrans({"µ": "u", "×": "x", "–": "-", "—": "-", "→": "->", "±": "+/-", "Δ": "d", "≤": "<=",
                          "≥": ">=", "·": "*", "…": "...", "’": "'", "“": '"', "”": '"'})


class FittedStream:
    """`stream`, writing what its encoding cannot hold in the fallback spelling. Everything else
    (encoding, isatty, fileno, buffer) is the stream's own, so Rich and click see the truth and
    choose ASCII boxes for an ASCII terminal themselves."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:
            enc = self._stream.encoding or "ascii"
            return self._stream.write(text.translate(FALLBACK).encode(enc, "replace").decode(enc))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _needs_fallback(stream) -> bool:
    try:
        "µ×–".encode(getattr(stream, "encoding", None) or "utf-8")
        return False
    except (UnicodeEncodeError, LookupError):
        return True


def fit_streams() -> None:
    """Wrap stdout and stderr where their encoding cannot print moebench's units."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, FittedStream) and _needs_fallback(stream):
            setattr(sys, name, FittedStream(stream))
