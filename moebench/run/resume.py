"""Finishing a partial run (`moebench run --resume FILE`): the same request, fixtures, builds
and GPU as the rounds already in the file, or one line saying what differs.

An incomplete file carries the request as asked (RunRequest as plain data). A resume plans
and prepares it again, then holds the new run to the file: every fixture's fingerprint and
dims, every arm's declared kernels and identity (config, source and binary hashes), the GPU,
moebench's own source hash and the settings the result would store. Only then are the
remaining rounds timed, numbered and ordered as they would have been, after a Measurement
rebuilt from the file's rounds (moebench.timing.measure's `before`).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from moebench.errors import UserError
from moebench.record import schema as S
from moebench.record.metrics import timed_metric
from moebench.run.plan import RunRequest
from moebench.run.prepare import Subjects
from moebench.timing.measure import Measurement, TimingProtocol

# Request fields that say nothing of what is measured: where results go, a safety limit.
NOT_SETTINGS = ("out_dir", "max_fixture_gb", "command")


def request_plain(req: RunRequest) -> dict:
    """The request as JSON-able data for the file; a shapes file by its absolute path."""
    plain = S.to_plain(req)
    if req.shapes_file:
        plain["shapes_file"] = str(Path(req.shapes_file).resolve())
    return plain


def request_from_plain(data: dict, source: str) -> RunRequest:
    hints = typing.get_type_hints(RunRequest)
    names = {f.name for f in dataclasses.fields(RunRequest)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UserError(f"{source}: its request has fields this moebench does not know ({', '.join(unknown)})")
    values = {k: tuple(v) if typing.get_origin(hints[k]) is tuple and isinstance(v, list) else v
              for k, v in data.items()}
    try:
        return RunRequest(**values)
    except TypeError as err:
        raise UserError(f"{source}: its request cannot be read: {err}") from None


def resumable_request(old: S.RunResult, source: str, given: dict | None = None) -> RunRequest:
    """The request an incomplete result was planned from. `given`: request fields named on the
    command line beside --resume, each of which must be what the file has (arm options by key)."""
    st = old.status
    if st.complete:
        raise UserError(f"{source}: the run is complete ({old.rounds_done} of {old.settings.rounds} rounds); "
                        f"nothing to resume")
    if st.request is None:
        raise UserError(f"{source}: incomplete, but holds no request to resume from")
    req = request_from_plain(st.request, source)
    for key, value in (given or {}).items():
        if key in NOT_SETTINGS:
            continue
        have = req.arm_options.get(key) if key not in st.request else getattr(req, key)
        if _plain(value) != _plain(have):
            raise UserError(f"{source} was run with {key} = {_shown(have)}, not {_shown(value)}: "
                            f"a resume keeps the run's settings")
    return dataclasses.replace(req, max_fixture_gb=(given or {}).get("max_fixture_gb", req.max_fixture_gb))


def check_same(old: S.RunResult, subjects: Subjects, gpu: S.GpuInfo | None, package: str | None,
               source: str) -> None:
    """The new run's fixtures, arms, GPU and code against the file's, as one UserError line."""
    for name, a, b in (("shapes", old.settings.shapes, subjects.shapes), ("arms", old.settings.arms, subjects.arms)):
        if tuple(a) != tuple(b):
            raise UserError(f"{source}: {name} {', '.join(a)} in the file, {', '.join(b)} now")
    now = {f.name: f for f in subjects.fixtures}
    for f in old.fixtures:
        field = _first_difference(f, now.get(f.name))
        if field:
            raise UserError(f"{source}: fixture {f.name} is not the file's: {field}")
    now_arms = {(a.shape, a.name): a for a in subjects.arm_infos}
    for a in old.arms:
        field = _first_difference(a, now_arms.get((a.shape, a.name)))
        if field:
            raise UserError(f"{source}: arm {a.name} at {a.shape} is not the file's: {field}")
    g = old.provenance.gpu
    if (g is None) != (gpu is None) or (g and gpu and (g.name, g.uuid) != (gpu.name, gpu.uuid)):
        raise UserError(f"{source}: timed on {_gpu(g)}, this is {_gpu(gpu)}: a resume runs on the same GPU")
    was = old.provenance.package_sha256
    if was and package and was != package:
        raise UserError(f"{source}: moebench's own source changed since the run (package sha256 "
                        f"{was[:12]}… then, {package[:12]}… now)")


def check_settings(old: S.RunResult, new: S.RunResult, source: str) -> None:
    """The settings the resumed result would store against the file's (the timer's record
    count aside, which grows with the rounds)."""
    a, b = (dataclasses.replace(r.settings, options={k: v for k, v in r.settings.options.items() if k != "api_records"})
            for r in (old, new))
    field = _first_difference(a, b)
    if field:
        raise UserError(f"{source}: the settings are not the file's: {field}")


def earlier_measurement(old: S.RunResult, protocol: TimingProtocol) -> Measurement:
    """The file's rounds as the Measurement a resume continues after."""
    s = old.settings
    gpu = old.provenance.gpu
    return Measurement(
        protocol=protocol, timer=s.timer, metric=timed_metric(s.timer), flush_bytes=s.flush_bytes,
        samples=old.samples, audit=old.audit, clocks=old.clocks,
        declared={(a.shape, a.name): a.kernels for a in old.arms}, inferred=frozenset(),
        read_bandwidth_bytes_per_s=gpu.read_bandwidth_bytes_per_s if gpu else None,
        read_floor=gpu.read_floor if gpu else None,
        timer_settings={k: v for k, v in s.options.items()}, rounds_done=old.rounds_done,
        api_records=int(s.options.get("api_records", 0) or 0))


def _first_difference(a, b, path: str = "") -> str | None:
    """Where `a` (the file's) and `b` (the new run's) first differ: the dotted field of records
    and dicts, with both values; None when equal."""
    if b is None and a is not None:
        return f"{path or 'it'}: not in the new run"
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        for f in dataclasses.fields(a):
            found = _first_difference(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}".lstrip("."))
            if found:
                return found
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            where = f"{path}.{k}".lstrip(".")
            if k not in a or k not in b:
                return f"{where}: {'not in the file' if k not in a else 'not in the new run'}"
            found = _first_difference(a[k], b[k], where)
            if found:
                return found
        return None
    if _plain(a) != _plain(b):
        return f"{path or 'value'}: {_shown(a)} in the file, {_shown(b)} now"
    return None


def _plain(v):
    return S.to_plain(v)


def _shown(v) -> str:
    text = repr(v) if not isinstance(v, (list, tuple)) else ",".join(map(str, v))
    return text if len(text) <= 40 else text[:20] + "…" + text[-12:]


def _gpu(g: S.GpuInfo | None) -> str:
    return "no GPU" if g is None else f"{g.name} {g.uuid or ''}".strip()
