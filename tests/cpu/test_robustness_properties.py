"""Property tests: whatever is done to a committed result file, a shape name or a shapes file,
the only exception that comes out is the tool's own UserError, with a one-line message; and a
mutated result that loads still renders.

Result mutations start from real H200 files (results/h200), so every field a run writes is
reached: a key deleted, a value of the wrong type, a negative, NaN, infinite or huge number, a
file truncated, a gzip stream damaged, random bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import tempfile
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from moebench.errors import UserError
from moebench.fixtures import ShapeRegistry
from moebench.fixtures.shapes import MAX_M, load_shapes_file
from moebench.record import store
from moebench.analysis import load as loader
from moebench.views.formats import FORMATS

RESULTS = Path(__file__).resolve().parents[2] / "results" / "h200"
# Small committed files of different kinds (builds, flush modes): their samples load fast.
FILES = ("builds-fused-v3-vs-v2.json", "flush-read.json.gz", "builds-fused-split-vs-adda171.json.gz")
BOUNDED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_TMP = Path(tempfile.mkdtemp(prefix="moebench-props-"))


@cache
def _plain(name: str) -> dict:
    data = (RESULTS / name).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _one_line(err: UserError) -> None:
    text = str(err)
    assert text and "\n" not in text and "\r" not in text, repr(text)


def _load_and_render(path: Path) -> None:
    """store.load either refuses in one line or gives a result every text view can render."""
    try:
        result = loader.load(path)
    except UserError as err:
        _one_line(err)
        return
    for fmt in ("table", "markdown", "csv"):
        FORMATS[fmt](result, io.StringIO(), [])


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5), st.just([]), st.just({}), st.just([1, "x"]),
    st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from([-1, 0, 2**63, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308]),
)


def _mutated(data, draw) -> object:
    """A copy of `data` with one value somewhere inside deleted or replaced. Only the
    containers on the way down are copied; the rest is shared with the cached original."""
    if isinstance(data, dict) and data:
        key = draw(st.sampled_from(sorted(data)))
        out = dict(data)
        action = draw(st.sampled_from(["descend", "descend", "delete", "replace"]))
        if action == "delete":
            del out[key]
        elif action == "replace" or not isinstance(data[key], (dict, list)) or not data[key]:
            out[key] = draw(ODD_VALUES)
        else:
            out[key] = _mutated(data[key], draw)
        return out
    if isinstance(data, list) and data:
        i = draw(st.integers(0, len(data) - 1))
        out = list(data)
        action = draw(st.sampled_from(["descend", "descend", "delete", "replace", "duplicate"]))
        if action == "delete":
            del out[i]
        elif action == "duplicate":
            out.insert(i, out[i])
        elif action == "replace" or not isinstance(data[i], (dict, list)) or not data[i]:
            out[i] = draw(ODD_VALUES)
        else:
            out[i] = _mutated(data[i], draw)
        return out
    return draw(ODD_VALUES)


@BOUNDED
@given(name=st.sampled_from(FILES), data=st.data(), gz=st.booleans())
def test_a_mutated_result_file_loads_or_is_refused_in_one_line(name, data, gz):
    mutated = _mutated(_plain(name), data.draw)
    try:
        text = json.dumps(mutated)  # NaN and Infinity written as Python's json writes them
    except (ValueError, OverflowError):
        assume(False)
    raw = text.encode()
    path = _TMP / ("m.json.gz" if gz else "m.json")
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    _load_and_render(path)


@BOUNDED
@given(name=st.sampled_from(FILES), data=st.data())
def test_damaged_bytes_of_a_result_file_are_refused_in_one_line(name, data):
    raw = (RESULTS / name).read_bytes()
    if raw[:2] != b"\x1f\x8b":
        raw = gzip.compress(raw, mtime=0)
    how = data.draw(st.sampled_from(["truncate", "flip", "random", "text-truncate"]))
    if how == "truncate":
        damaged = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        at = data.draw(st.integers(0, len(raw) - 1))
        damaged = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    elif how == "random":
        damaged = data.draw(st.binary(max_size=4096))
    else:  # the JSON text cut short, not compressed
        text = gzip.decompress(raw)
        damaged = text[: data.draw(st.integers(0, len(text) - 1))]
    path = _TMP / "d.json.gz"
    path.write_bytes(damaged)
    _load_and_render(path)


def test_the_committed_files_used_here_load_unchanged():
    for name in FILES:
        assert loader.load(RESULTS / name).samples  # the mutations start from good files


# --- shape names ----------------------------------------------------------------------------

NAME_PARTS = st.one_of(
    st.text(max_size=12),
    st.builds(lambda letter, digits, pad: f"{pad}{letter}{digits}{pad}",
              st.sampled_from(list("AQTaqtXZ") + ["", "AA", "８", "A-"]),
              st.one_of(st.integers(-10, 10**7).map(str), st.text("0123456789-+_.e٣８", max_size=8),
                        st.just("9" * 5000)),
              st.sampled_from(["", " ", "\t", "\n"])),
)


@settings(max_examples=200, deadline=None)
@given(name=NAME_PARTS)
def test_a_shape_name_resolves_or_is_refused_in_one_line(name):
    try:
        spec = ShapeRegistry().resolve(name)
    except UserError as err:
        _one_line(err)
        return
    assert spec.name[0] in "AQT" and 1 <= spec.M <= MAX_M and spec.name == f"{spec.name[0]}{spec.M}"


@settings(max_examples=100, deadline=None)
@given(names=st.lists(NAME_PARTS, max_size=4))
def test_a_list_of_shape_names_resolves_or_is_refused_in_one_line(names):
    try:
        specs = ShapeRegistry().resolve_many(names)
    except UserError as err:
        _one_line(err)
        return
    assert specs


# --- shapes files ---------------------------------------------------------------------------

TOML_VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str), st.sampled_from(["0", "-1", "128", "256", "1099511627776",
                                                                "9223372036854775807", "1e9", "1_000"]),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: repr(x).replace("inf", "inf").lower()),
    st.sampled_from(["true", "false", '"x"', '"a\\nb"', "[]", "[1, 2]", "{}", "{ K = 1 }", "nan", "-inf",
                     "1979-05-27", "'''multi\nline'''"]),
)
KEYS = st.sampled_from(["K", "E", "top_k", "N", "routed_scale", "shared_expert", "override", "description",
                        "bogus", "K"])
LETTERS = st.sampled_from(["X", "Y", "A", "Q", "T", "x", "XY", "1", '"é"', '"a b"', '"\\n"', "Z"])


def _family_table(draw) -> str:
    base = {"K": "256", "E": "8", "top_k": "2", "N": "256"}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(KEYS)
        if draw(st.booleans()):
            base.pop(key, None)
        else:
            base[key] = draw(TOML_VALUES)
    return "".join(f"{k} = {v}\n" for k, v in base.items())


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_shapes_file_loads_or_is_refused_in_one_line(data):
    kind = data.draw(st.sampled_from(["families", "families", "garbage", "bytes", "top-level"]))
    if kind == "families":
        tables = [f"[families.{data.draw(LETTERS)}]\n{_family_table(data.draw)}"
                  for _ in range(data.draw(st.integers(1, 3)))]
        body = "\n".join(tables).encode()
    elif kind == "garbage":
        body = data.draw(st.text(max_size=200)).encode()
    elif kind == "bytes":
        body = data.draw(st.binary(max_size=200))
    else:
        body = data.draw(st.sampled_from([b"families = 3\n", b"families = []\n", b"[families]\nX = 1\n",
                                          b"[families.X]\n", b"", b"[other]\nK = 1\n"]))
    path = _TMP / "shapes.toml"
    path.write_bytes(body)
    try:
        families = load_shapes_file(path)
        registry = ShapeRegistry().with_shapes_file(path)
    except UserError as err:
        _one_line(err)
        return
    for letter, family in families.items():
        try:
            spec = registry.resolve(f"{letter}8")
        except UserError as err:
            _one_line(err)
            continue
        assert spec.K == family.K and spec.family.K % 128 == 0 and spec.E >= spec.top_k >= 1


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: None], ids=["a folder", "missing"])
def test_a_shapes_path_that_is_not_a_file_is_refused_in_one_line(tmp_path, make):
    path = tmp_path / "shapes.toml"
    make(path)
    with pytest.raises(UserError) as err:
        load_shapes_file(path)
    _one_line(err.value)
