"""Fuzzing every input a user hands moebench: result files mutated the way an edit, a bug or an
adversary would (a number nudged, scaled, negated or replaced by something no run writes, a key
deleted, an item duplicated), through load, every report format and compare; and bad values
for every option of every command.

What must hold: the only way out is a correct result or one line and a non-zero exit (no other
exception), and no number a view shows from a file that loaded is forged: each summary and
ratio field equals what the named statistics give from the file's own samples, and what cannot
be derived is in range and consistent with the fields it depends on.

Result mutations start from a small CPU-made result (tests/helpers/result_factory.py): 400 examples of
5 mutated files each, 2,000 mutations.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from pathlib import Path

import click
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from result_factory import make_result, run_cli

from moebench.errors import UserError
from moebench.record import store
from moebench.analysis import load as loader
from moebench.views.formats import FORMATS
from moebench.record.schema import to_plain
from moebench.analysis.stats import summarize, summary_samples

BASE = make_result(shapes=("A8",), arms=("triton", "cuda-fused"), rounds=3, samples=3)
PLAIN = to_plain(BASE)
FILES_PER_EXAMPLE = 5
EXAMPLES = 400  # x FILES_PER_EXAMPLE = 2,000 mutated files
_TMP = Path(tempfile.mkdtemp(prefix="moebench-fuzz-"))

ODD = st.one_of(
    st.sampled_from([None, True, False, "", "x", [], {}, [1, "x"], -1, 0, 2**63, 2**64, -(2**63) - 1, 10**400,
                     math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324]),
    st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
)
SCALES = (0.0, -1.0, 0.5, 0.999, 1.001, 1.1, 2.0, 33.0, 1e6)


def _leaf_paths(data, path=()):
    """Every path into `data` (containers and leaves)."""
    yield path
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield from _leaf_paths(value, (*path, key))


PATHS = tuple(p for p in _leaf_paths(PLAIN) if p)


def _mutate(plain, draw):
    """A copy of `plain` with one change at a drawn path: a number scaled or nudged (a
    plausible forgery), a value replaced by an odd one, a key or item deleted or duplicated."""
    data = json.loads(json.dumps(plain))
    path = draw(st.sampled_from(PATHS))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key, value = path[-1], parent[path[-1]]
    how = draw(st.sampled_from(["scale", "scale", "nudge", "odd", "delete", "duplicate"]))
    if how in ("scale", "nudge") and isinstance(value, (int, float)) and not isinstance(value, bool):
        if how == "scale":
            new = value * draw(st.sampled_from(SCALES))
        else:
            new = value + draw(st.sampled_from([-1, 1, -1000, 1000]))
        parent[key] = type(value)(new) if isinstance(value, int) and math.isfinite(new) else new
    elif how == "delete":
        del parent[key]
    elif how == "duplicate" and isinstance(parent, list):
        parent.insert(key, parent[key])
    else:
        parent[key] = draw(ODD)
    return data


def _one_line(text: str) -> None:
    assert text and "\n" not in text.strip() and "Traceback" not in text, repr(text)


def _close(a, b) -> bool:
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(b, float):
        return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)
    return a == b


def _nothing_forged(result) -> None:
    """Every shown number of a loaded file follows from its samples or is possible: checked here
    with the named statistics, apart from the loader's own code."""
    s = result.settings
    hbm = {f.name: f.floors.hbm_bytes for f in result.fixtures}
    bw = result.provenance.gpu.read_bandwidth_bytes_per_s if result.provenance.gpu else None
    samples = summary_samples(result)
    if not samples:
        assert not result.summaries and not result.ratios, "numbers with no samples to derive them from"
        return
    summaries, ratios = summarize(samples, s.shapes, s.arms, s.ref, hbm, bw)
    assert [(x.shape, x.arm) for x in summaries] == [(x.shape, x.arm) for x in result.summaries]
    for mine, stored in zip(summaries, result.summaries):
        for field in ("median_ns", "row_medians_ns", "min_ns", "max_ns", "samples", "hbm_bandwidth_bytes_per_s",
                      "span_median_ns", "sum_median_ns", "fraction_of_read_bandwidth"):
            shown = getattr(stored, field)
            if shown is None and field in ("span_median_ns", "sum_median_ns", "fraction_of_read_bandwidth"):
                continue
            assert _close(shown, getattr(mine, field)), f"forged {field}: {shown} vs {getattr(mine, field)}"
    assert sorted((r.shape, r.arm) for r in ratios) == sorted((r.shape, r.arm) for r in result.ratios)
    for r in result.ratios:
        mine = next(x for x in ratios if (x.shape, x.arm) == (r.shape, r.arm))
        for field in ("ref", "median", "low", "high", "per_round", "rounds_won", "rounds"):
            assert _close(getattr(r, field), getattr(mine, field)), f"forged ratio {field}"
    for p in result.parity:
        assert p.passed == (p.nonfinite == 0 and 0 <= p.rel_l2 <= p.threshold), "forged parity verdict"
    assert s.warmup >= 0 and s.placements >= 1 and s.flush_bytes >= 0
    assert all(f.floors.hbm_bytes > 0 and f.M >= 1 for f in result.fixtures)
    assert bw is None or bw > 0
    assert all((c.sm_mhz or 1) > 0 for c in result.clocks)


def _shown(result, fmt: str, compare: bool) -> None:
    out = io.StringIO()
    FORMATS[fmt](result, out, [])
    if not result.samples:
        assert "audit passed" not in out.getvalue()
    if compare:
        from moebench.analysis.compare import compare_results
        from moebench.analysis.verdicts import Rules
        try:
            compare_results(BASE, result, Rules(), "base", "mutated")
        except UserError as err:
            _one_line(str(err))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_result_files_load_report_and_compare_or_are_refused_in_one_line(data):
    for i in range(FILES_PER_EXAMPLE):
        mutated = _mutate(PLAIN, data.draw)
        path = _TMP / f"m{i}.json"
        path.write_text(json.dumps(mutated))  # NaN and Infinity as Python's json writes them
        try:
            result = loader.load(path)
        except UserError as err:
            _one_line(str(err))
            continue
        _nothing_forged(result)
        _shown(result, data.draw(st.sampled_from(sorted(FORMATS))), compare=data.draw(st.integers(0, 5)) == 0)


# --- bad values for every option of every command ------------------------------------------

BAD_VALUES = st.one_of(
    st.sampled_from(["-1", "0", "-0", "nan", "inf", "-inf", "1e309", "9" * 5000, "", " ", "µ", "((", "[", "A8,,",
                     "-", "%", "5%", "-5%", "101%", "/proc/x", "/nonexistent/dir/f", "\n", "1,2,,3", "T-1", "T0",
                     "0x10", "x=y", "a=b:c=d", "triton,triton", "A" * 300, "regex:(", "\x7f", "é"]),
    st.text(max_size=8).filter(lambda t: "\x00" not in t),
)


def _good_file() -> str:
    path = _TMP / "good.json"
    if not path.exists():
        store.save(BASE, path)
    return str(path)


# Each command's arguments that stop quickly on a CPU machine (a missing GPU, a name refused);
# builds that compile and launches that start torchrun are left out by leaving out their options.
BASES = {
    "run": ["run", "--shape", "T8", "--arms", "triton"],
    "sweep": ["sweep", "--family", "T", "--m", "8", "--arms", "triton"],
    "verify": ["verify", "--shape", "T8", "--arms", "triton"],
    "fixtures": ["fixtures", "--shape", "T8"],
    "probe": ["probe"],
    "profile": ["profile", "T8", "triton"],
    "report": ["report", "GOOD"],
    "compare": ["compare", "GOOD", "GOOD"],
    "build": ["build", "--arm", "nosuch"],
}
LEFT_OUT = {"--gpus", "--out", "--plot", "--output", "--table-row", "--build", "--source"}  # start or write things


def _options():
    from moebench.cli import cli
    out = []
    for name, base in BASES.items():
        for p in cli.commands[name].params:
            if isinstance(p, click.Option) and not p.is_flag and p.opts[0] not in LEFT_OUT:
                out.append((name, p.opts[0]))
    return tuple(out)


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(_options()), value=BAD_VALUES)
def test_a_bad_value_for_any_option_is_one_line_or_a_result(option, value):
    name, flag = option
    argv = [_good_file() if a == "GOOD" else a for a in BASES[name]] + [flag, value]
    code, out, err = run_cli(argv)
    assert "Traceback" not in err and code in (0, 1, 2), (argv, code, err)
    if code != 0:
        last = [ln for ln in err.splitlines() if ln.strip()][-1]
        assert last.startswith("moebench:"), (argv, err)
