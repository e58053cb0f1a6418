"""Frozen records to JSON-able plain data and back, strictly: `from_plain` builds a record
type (or a typing form over records) from `to_plain` output and raises ValueError with the
field's path on anything that does not fit, including numbers no run writes (NaN, Infinity,
integers beyond 64 bits). moebench.record.schema's records go through these."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any


def to_plain(obj: Any) -> Any:
    """Records to JSON-able dicts/lists, keeping only declared fields (no properties)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(cls: type, data: Any) -> Any:
    """Build `cls` (a record type, or a typing form over records) from `to_plain` output.
    Raises ValueError with a path on anything that does not fit."""
    return _build(cls, data, cls.__name__ if isinstance(cls, type) else "value")


INT_LIMIT = 1 << 63


def _short(number: int | float) -> str:
    if isinstance(number, int) and abs(number) >= INT_LIMIT:
        return f"an integer of {number.bit_length()} bits"
    return repr(number)


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    """A record's resolved field types, once per class (resolving them per object was most of
    the time a load took)."""
    return typing.get_type_hints(tp)


@functools.cache
def _fields(tp: type) -> tuple[tuple[str, Any, bool], ...]:
    """A record's (name, resolved type, required) per field, once per class."""
    hints = _hints(tp)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(tp))


def _build(tp: Any, data: Any, path: str) -> Any:
    if tp in _LEAVES:  # most values of a file: checked before the typing forms are looked at
        return _LEAVES[tp](data, path)
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _build(arg, data, path)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"{path}: unexpected null")
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list")
        (item, *_rest) = typing.get_args(tp)
        return tuple(_build(item, v, f"{path}[{i}]") for i, v in enumerate(data))
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object")
        args = typing.get_args(tp)
        value_tp = args[1] if args else Any
        return {k: _build(value_tp, v, f"{path}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object")
        kwargs = {}
        for name, hint, required in _fields(tp):
            if name in data:
                kwargs[name] = _build(hint, data[name], f"{path}.{name}")
            elif required:
                raise ValueError(f"{path}: missing field {name!r}")
        return tp(**kwargs)
    raise ValueError(f"{path}: unsupported type {tp!r}")


# `save` writes no NaN or Infinity and every integer a run records fits in 64 bits; a file holding
# anything else was edited, and its numbers would break the statistics.
def _float(data: Any, path: str) -> float:
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError(f"{path}: expected a number")
    if isinstance(data, int) and abs(data) >= INT_LIMIT or not math.isfinite(data):
        raise ValueError(f"{path}: {_short(data)} is not a finite number of a sane size")
    return float(data)


def _exact(tp: type):
    def build(data: Any, path: str):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise ValueError(f"{path}: expected {tp.__name__}")
        if tp is int and abs(data) >= INT_LIMIT:
            raise ValueError(f"{path}: {_short(data)} does not fit in 64 bits")
        return data
    return build


_LEAVES = {float: _float, int: _exact(int), str: _exact(str), bool: _exact(bool)}
