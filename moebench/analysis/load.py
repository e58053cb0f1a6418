"""Reading a result file as every command does: parsed by the record stage, then checked against
its own samples. A file whose summaries, ratios, audit or fields do not follow from its samples
is refused in one line, unless the caller trusts it as stored and reports
`validate.problems` itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moebench.analysis.validate import problems
from moebench.analysis.validate_fields import pattern_problems
from moebench.errors import UserError
from moebench.record.schema import RunResult
from moebench.record.store import parse, read


def _well_formed(result: RunResult, source: str) -> RunResult:
    bad = pattern_problems(result)  # refused whatever the caller trusts: the audit cannot run it
    if bad:
        raise UserError(f"{source}: malformed RunResult: {bad[0]}")
    return result


def loads(text: str, source: str = "<string>") -> RunResult:
    """The RunResult in `text`, well formed (its patterns compile, its fields have their shapes)."""
    return _well_formed(parse(text, source), source)


def load(path: str | Path, *, trust_stored: bool = False) -> RunResult:
    """The RunResult saved at `path`, checked against its own samples (moebench.analysis.validate)."""
    result = _well_formed(read(path), str(path))
    if not trust_stored:
        found = problems(result)
        if found:
            more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
            raise UserError(f"{path}: disagrees with its own samples or fields: {found[0]}{more}; "
                            "--trust-stored reads it anyway")
        result = _unfloored(result)
    return result


def _unfloored(result: RunResult) -> RunResult:
    """A shape with no fixture has no floor bytes, so its stored bandwidth cannot be derived
    from anything in the file (files written by scripts before runs recorded their fixtures, or
    one whose fixture was cut out): it is read as unknown and every view shows "—"."""
    floored = {f.name for f in result.fixtures}
    if all(s.shape in floored for s in result.summaries):
        return result
    return dataclasses.replace(result, summaries=tuple(
        s if s.shape in floored else
        dataclasses.replace(s, hbm_bandwidth_bytes_per_s=None, fraction_of_read_bandwidth=None)
        for s in result.summaries))
