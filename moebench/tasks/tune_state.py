"""The state file of `moebench tune`: every candidate timed (or refused, with why) per M, and
each finished M's outcome, saved after every batch so that a stopped tune (its budget spent,
Ctrl-C, a lost machine) continues where it stopped when the same command runs again.

The file says what its measurements are valid for (`key`: geometry, GPU, Triton, the kernels'
source hash, the timing protocol, the search's passes); a rerun whose key differs is refused in
one line rather than mixing measurements of two settings. Format history:
  moebench-tune-state-1: key, measured {M: {candidate: {ns, why}}}, done {M: outcome}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from moebench.errors import UserError
from moebench.record.atomic import atomic_write

STATE_FORMAT = "moebench-tune-state-1"


@dataclass
class TuneState:
    path: Path
    key: dict
    measured: dict[str, dict[str, dict]] = field(default_factory=dict)
    done: dict[str, dict] = field(default_factory=dict)
    resumed: bool = False  # read from a file a previous run left

    @classmethod
    def open(cls, path: Path, key: dict) -> TuneState:
        """The state at `path` (a new one when there is none); a file of other settings is refused."""
        path = Path(path)
        key = json.loads(json.dumps(key))  # as it will read back
        if not path.exists():
            return cls(path, key)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise UserError(f"tune state {path} is not readable JSON ({err}); move it away to start afresh") from None
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise UserError(f"tune state {path} is not a {STATE_FORMAT} file; move it away to start afresh")
        if data.get("key") != key:
            old = data.get("key") if isinstance(data.get("key"), dict) else {}
            diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
            raise UserError(f"tune state {path} was made with other settings ({', '.join(diff) or 'key'} differ); "
                            f"use another --out, or move the file away to start afresh")
        measured, done = data.get("measured"), data.get("done")
        if not isinstance(measured, dict) or not isinstance(done, dict):
            raise UserError(f"tune state {path} is damaged (no measured or done); move it away to start afresh")
        return cls(path, key, measured, done, resumed=True)

    def get(self, M: int, candidate: str) -> dict | None:
        return self.measured.get(str(M), {}).get(candidate)

    def put(self, M: int, candidate: str, ns: int | None, why: str | None = None) -> None:
        self.measured.setdefault(str(M), {})[candidate] = {"ns": ns, "why": why}

    def count(self, M: int) -> tuple[int, int]:
        """(candidates timed, candidates refused) at M."""
        rows = self.measured.get(str(M), {}).values()
        timed = sum(1 for r in rows if r.get("ns") is not None)
        return timed, sum(1 for r in rows if r.get("ns") is None)

    def finish(self, M: int, outcome: dict) -> None:
        self.done[str(M)] = outcome

    def finished(self) -> dict[int, dict]:
        return {int(m): o for m, o in sorted(self.done.items(), key=lambda kv: int(kv[0]))}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": STATE_FORMAT, "key": self.key, "measured": self.measured, "done": self.done}
        atomic_write(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
