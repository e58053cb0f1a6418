"""Save and read RunResults: atomic writes, the format and schema version checked on read. A path ending in
`.gz` is gzip-compressed on save, and any gzip file is decompressed on load (a run's samples
make its JSON 1-2 MB; compressed, about a tenth).

Reading here checks only that the text is a RunResult of a readable version; whether its numbers
follow from its samples is the analysis stage's question (moebench.analysis.load, which every
reader of a file goes through)."""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path

from moebench.errors import UserError
from moebench.record.atomic import atomic_write, create_whole
from moebench.record.schema import FORMAT, READABLE_VERSIONS, SCHEMA_VERSION, RunResult, from_plain, to_plain

MAX_DEPTH = 64  # far deeper than any record; a file nested deeper was built to break the reader


def dumps(result: RunResult) -> str:
    plain = to_plain(result)
    bad = _unwritable(plain, "RunResult")
    if bad:  # e.g. NaN in an arm's identity: JSON has no NaN, and a file must read back
        raise UserError(f"cannot write the result: {bad}")
    return json.dumps(plain, indent=1, allow_nan=False) + "\n"


def _unwritable(data, path: str, depth: int = 0) -> str | None:
    """Where in plain data a value is that a result file must not hold (NaN, Infinity, nesting
    deeper than MAX_DEPTH), or None. Iterative in spirit: bounded by MAX_DEPTH."""
    if depth > MAX_DEPTH:
        return f"{path}: nested more than {MAX_DEPTH} levels deep"
    if isinstance(data, float) and not math.isfinite(data):
        return f"{path} is {data}, not a finite number"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = _unwritable(value, f"{path}[{key!r}]" if isinstance(data, dict) else f"{path}[{key}]", depth + 1)
        if found:
            return found
    return None


def _depth(data) -> int:
    """How deeply `data` nests, without recursion (a hostile file may nest thousands deep)."""
    deepest, stack = 1, [(data, 1)]
    while stack:  # containers only: leaves add no depth
        node, d = stack.pop()
        if d > deepest:
            deepest = d
            if d > MAX_DEPTH:
                break
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, d + 1))
    return deepest


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a result holds")


def ensure_writable_dir(folder: str | Path) -> Path:
    """Make `folder` (and its parents) and prove a file can be written there, or say why not in
    one line: a run checks this before any GPU work, not after all its timing."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = atomic_write(folder / ".moebench-write-check", b"")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write results into {str(folder)!r}: {err.strerror or err}") from None
    return folder


def _free_names(path: Path):
    """`path`, then `stem_2.json`, `stem_3.json`, ...: the names a new result may take."""
    stem, suffix = (path.name[: -len(".json.gz")], ".json.gz") if path.name.endswith(".json.gz") \
        else (path.stem, path.suffix)
    for n in range(1, 10_000):
        yield path if n == 1 else path.with_name(f"{stem}_{n}{suffix}")
    raise UserError(f"no free result name beside {str(path)!r}")


def reserve_path(path: str | Path) -> Path:
    """`path`, or `stem_2.json`, `stem_3.json`, ... if taken: the name is claimed by creating the
    file exclusively (empty until it is written), so two runs saving in the same second never
    overwrite each other. A result that exists when its name is chosen takes save_new instead."""
    for candidate in _free_names(Path(path)):
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return candidate
        except FileExistsError:
            continue


def save(result: RunResult, path: str | Path) -> Path:
    """Write `result` to `path` atomically: a reader sees the old file or the new one, whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, _encoded(result, path))
    return path


def save_new(result: RunResult, path: str | Path) -> Path:
    """Write `result` under `path`, or `stem_2.json`, ... if taken, never over another file; the
    file appears whole (a reader watching the folder never finds it empty). Returns the name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _encoded(result, path)
    for candidate in _free_names(path):
        if create_whole(candidate, data):
            return candidate


def _encoded(result: RunResult, path: Path) -> bytes:
    data = dumps(result).encode()
    return gzip.compress(data, mtime=0) if path.suffix == ".gz" else data


def parse(text: str, source: str = "<string>") -> RunResult:
    """The RunResult in `text`, or one line saying why it is none (not JSON, another format or
    schema version, fields of the wrong type)."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise UserError(f"{source}: not JSON ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise UserError(f"{source}: not a RunResult (nested too deeply to read)") from None
    except ValueError as err:  # NaN/Infinity, or an integer of thousands of digits
        raise UserError(f"{source}: not a RunResult ({str(err).splitlines()[0][:120]})") from None
    if isinstance(data, (dict, list)) and _depth(data) > MAX_DEPTH:
        raise UserError(f"{source}: not a RunResult (nested more than {MAX_DEPTH} levels deep)")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{source}: not a moebench RunResult (no \"format\": \"{FORMAT}\")")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        known = ", ".join(map(str, READABLE_VERSIONS))
        raise UserError(f"{source}: schema_version {version!r}, this moebench reads {known} (writes {SCHEMA_VERSION})")
    try:
        result = from_plain(RunResult, data)
    except (ValueError, TypeError) as err:
        raise UserError(f"{source}: malformed RunResult: {err}") from None
    return result


def read(path: str | Path) -> RunResult:
    """The RunResult saved at `path` (gzip or plain), its numbers as stored."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":  # gzip's magic
            data = gzip.decompress(data)
        text = data.decode()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as err:  # a folder, no permission, bad gzip, truncated
        raise UserError(f"{path}: cannot read: {err}") from None
    return parse(text, str(path))
