"""Each input that once gave a traceback or a silently wrong answer now gives one clear line on
stderr and a non-zero exit (or a correct result): forged result files, patterns that are no
regular expressions, numbers no run writes, the environment, output paths, options that
contradict each other, and values named before any GPU is looked for."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from result_factory import make_result, run_cli

from moebench.errors import UserError
from moebench.record import store
from moebench.record.schema import to_plain


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _write_plain(tmp_path, plain: dict, name: str = "r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(plain))
    return path


@pytest.fixture(scope="module")
def good():
    return make_result(arms=("triton", "cuda-fused"), rounds=3, samples=4)


def _refused(tmp_path, result_or_plain, needle: str, *commands: str) -> None:
    """Every reading command refuses the file in one line that contains `needle`, exit 2."""
    plain = result_or_plain if isinstance(result_or_plain, dict) else to_plain(result_or_plain)
    path = _write_plain(tmp_path, plain)
    ok = store.save(make_result(arms=("triton", "cuda-fused"), rounds=3, samples=4), tmp_path / "ok.json")
    for argv in [["report", str(path)], ["compare", str(ok), str(path)], *([c, str(path)] for c in commands)]:
        code, _, err = run_cli(argv)
        assert code == 2 and needle in _one_line(err), (argv, err)


# --- forged numbers: each is re-derived from the samples or checked against its fields ------

def _forgeries(r):
    s0, x0, p0, f0 = r.summaries[0], r.ratios[0], r.parity[0], r.fixtures[0]
    yield "rows min-max", replace(r, summaries=(replace(s0, min_ns=1e6, max_ns=-0.0), *r.summaries[1:])), "min_ns"
    yield "row medians", replace(r, summaries=(replace(s0, row_medians_ns=(1.0,) * 3), *r.summaries[1:])), \
        "row_medians_ns"
    yield "n", replace(r, summaries=(replace(s0, samples=999), *r.summaries[1:])), ".samples 999"
    yield "span", replace(r, summaries=(replace(s0, span_median_ns=5.0), *r.summaries[1:])), "span_median_ns"
    yield "bandwidth", replace(r, summaries=(replace(s0, hbm_bandwidth_bytes_per_s=9e13), *r.summaries[1:])), \
        "hbm_bandwidth"
    yield "ratio low-high", replace(r, ratios=(replace(x0, low=50.0, high=-3.0),)), "ratios["
    yield "per-round ratios", replace(r, ratios=(replace(x0, per_round=(9.0, 9.0, 9.0)),)), "per_round"
    yield "rounds won", replace(r, ratios=(replace(x0, rounds_won=0),)), "rounds_won"
    yield "ref's own ratio", replace(r, ratios=(*r.ratios, replace(x0, arm=x0.ref, median=1.869))), \
        "ratios: 3 stored, the samples give 2"
    yield "parity", replace(r, parity=(replace(p0, rel_l2=5.0, passed=True), *r.parity[1:])), "parity["
    yield "negative floor", replace(r, provenance=replace(r.provenance, gpu=replace(
        r.provenance.gpu, read_bandwidth_bytes_per_s=-4.3e12))), "bandwidth"
    yield "floor sum", replace(r, fixtures=(replace(f0, floors=replace(f0.floors, hbm_bytes=f0.floors.hbm_bytes * 2)),
                                            *r.fixtures[1:])), "hbm_bandwidth"
    yield "clock", replace(r, clocks=(replace(r.clocks[0], sm_mhz=-5), *r.clocks[1:])), "sm_mhz"
    yield "negative warm-up", replace(r, settings=replace(r.settings, warmup=-3)), "warmup -3"
    yield "placements", replace(r, settings=replace(r.settings, placements=-2)), "placements -2"
    yield "placement mode", replace(r, settings=replace(r.settings, placement_mode="")), "placement_mode ''"
    yield "flush bytes", replace(r, settings=replace(r.settings, flush_bytes=-1)), "flush_bytes -1"
    yield "negative M", replace(r, fixtures=(replace(f0, M=-8), *r.fixtures[1:])), "M -8"
    yield "fixture left out", replace(r, fixtures=r.fixtures[1:]), f"samples at {f0.name}: no fixture"


@pytest.mark.parametrize("label", [f[0] for f in _forgeries(make_result(rounds=3, samples=4))])
def test_a_forged_number_is_refused_naming_its_field(tmp_path, good, label):
    forged, needle = next((f, n) for name, f, n in _forgeries(good) if name == label)
    _refused(tmp_path, forged, needle)


def test_a_bandwidth_no_fixture_derives_is_shown_as_unknown(tmp_path):
    # One shape, its one fixture cut out: the file now looks like one a script wrote, so it
    # loads, but the stored bandwidth has no floor bytes behind it and no view prints it.
    one = make_result(shapes=("A8",), rounds=3, samples=4)
    assert one.summaries[0].hbm_bandwidth_bytes_per_s > 0
    path = store.save(replace(one, fixtures=()), tmp_path / "cut.json")
    from moebench.analysis.load import load
    loaded = load(path)
    assert all(s.hbm_bandwidth_bytes_per_s is None and s.fraction_of_read_bandwidth is None
               for s in loaded.summaries)
    assert [s.median_ns for s in loaded.summaries] == [s.median_ns for s in one.summaries]
    whole = store.save(one, tmp_path / "whole.json")
    assert "hbm_floor_bandwidth" in run_cli(["report", str(whole), "--format", "csv"])[1]
    code, out, _ = run_cli(["report", str(path), "--format", "csv"])
    assert code == 0 and "hbm_floor_bandwidth" not in out and ",median," in out
    code, out, _ = run_cli(["report", str(path), "--format", "markdown"])
    assert code == 0 and "—" in out


def test_a_time_far_under_the_physical_floor_is_refused(tmp_path, good):
    # Samples and summaries agree, but the bandwidth the floor is taken at says the bytes alone
    # need about 40x the times stored: no GPU measured those.
    from moebench.analysis.stats import summarize
    slow = good.provenance.gpu.read_bandwidth_bytes_per_s / 40
    summaries, ratios = summarize(good.samples, good.settings.shapes, good.settings.arms, good.settings.ref,
                                  {f.name: f.floors.hbm_bytes for f in good.fixtures}, slow)
    gpu = replace(good.provenance.gpu, read_bandwidth_bytes_per_s=slow)
    forged = replace(good, provenance=replace(good.provenance, gpu=gpu), summaries=summaries, ratios=ratios)
    _refused(tmp_path, forged, "under its physical floor")


def test_a_file_without_samples_is_refused_or_read_as_unaudited_never_as_passed(tmp_path, good):
    empty = replace(good, samples=(), audit=replace(good.audit, samples_total=0, samples_passed=0))
    _refused(tmp_path, empty, "no samples to derive them from")
    path = store.save(empty, tmp_path / "e.json")
    for fmt in ("table", "markdown", "summary"):
        code, out, err = run_cli(["report", str(path), "--trust-stored", "--format", fmt])
        assert code == 0 and "--trust-stored" in err and "AS STORED" in err, err
        assert "unaudited" in out.lower() and "passed: 0/0" not in out and "audit passed" not in out, out


# --- tracebacks once: patterns, integers, NaN, nesting, environment, encodings ---------------

def test_a_kernel_pattern_that_is_no_regex_is_refused_by_report_and_compare(tmp_path, good):
    plain = to_plain(good)
    plain["arms"][0]["kernels"][0]["pattern"] = "fused_moe_kernel(("
    _refused(tmp_path, plain, "is not a regular expression")
    path = _write_plain(tmp_path, plain, "t.json")
    code, _, err = run_cli(["report", str(path), "--trust-stored"])  # trusting does not make it runnable
    assert code == 2 and "is not a regular expression" in _one_line(err)


def test_an_external_id_of_the_largest_64_bit_integer_prints_exactly_in_csv(tmp_path, good):
    s0 = good.samples[0]
    path = store.save(replace(good, samples=(replace(s0, external_id=2**63 - 1), *good.samples[1:])), tmp_path / "x.json")
    code, out, err = run_cli(["report", str(path), "--format", "csv"])
    assert code == 0, err
    assert str(2**63 - 1) in out


def test_an_integer_of_thousands_of_digits_is_refused(tmp_path, good):
    text = json.dumps(to_plain(good)).replace('"warmup": 2', '"warmup": ' + "9" * 5000)
    path = tmp_path / "big.json"
    path.write_text(text)
    code, _, err = run_cli(["report", str(path)])
    assert code == 2 and "not a RunResult" in _one_line(err)


def test_nan_anywhere_is_refused_on_read_and_named_on_write(tmp_path, good):
    arm = good.arms[0]
    nan = replace(good, arms=(replace(arm, identity={"config": {"alpha": math.nan}}), *good.arms[1:]))
    with pytest.raises(UserError, match=r"cannot write the result: .*'alpha'\] is nan, not a finite number"):
        store.save(nan, tmp_path / "n.json")
    text = json.dumps(to_plain(good)).replace('"BLOCK_M": 64', '"BLOCK_M": NaN')
    (tmp_path / "n.json").write_text(text)
    code, _, err = run_cli(["report", str(tmp_path / "n.json")])
    assert code == 2 and "NaN is not a number a result holds" in _one_line(err)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_nesting_is_refused(tmp_path, good, depth):
    text = json.dumps(to_plain(good)).replace('"options": {}', '"options": {"x": ' + "[" * depth + "]" * depth + "}")
    path = tmp_path / "deep.json"
    path.write_text(text)
    code, _, err = run_cli(["report", str(path)])
    assert code == 2 and "nested" in _one_line(err)


@pytest.mark.parametrize("env, needle", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x': expected a whole number"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "the rank must be inside a world"),
    ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE="),
])
def test_a_launcher_environment_that_is_no_world_is_one_line(monkeypatch, env, needle):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, _, err = run_cli(["sweep", "--family", "T", "--m", "8", "--arms", "triton"])
    assert code == 2 and needle in _one_line(err)


def test_a_terminal_that_cannot_print_mu_gets_us(tmp_path, good):
    import os
    import subprocess
    import sys
    path = store.save(good, tmp_path / "r.json")
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "COLUMNS": "200"}
    for fmt in ("table", "markdown"):
        done = subprocess.run([sys.executable, "-m", "moebench", "report", str(path), "--format", fmt],
                              capture_output=True, env=env, timeout=120)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
        assert b" us" in done.stdout and "µ".encode() not in done.stdout


# --- output paths ----------------------------------------------------------------------------

def test_report_into_a_missing_folder_fails_and_makes_nothing(tmp_path, good):
    path = store.save(good, tmp_path / "r.json")
    code, _, err = run_cli(["report", str(path), "--format", "markdown", "-o", str(tmp_path / "no" / "dir" / "o.md")])
    assert code == 2 and "is not an existing folder" in _one_line(err)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("name", ["out.png", "plots.SVG"])
def test_plot_given_an_image_name_is_refused(tmp_path, good, name):
    path = store.save(good, tmp_path / "r.json")
    code, _, err = run_cli(["report", str(path), "--plot", str(tmp_path / name)])
    assert code == 2 and "takes a folder" in _one_line(err)
    assert not (tmp_path / name).exists()


def test_plot_makes_only_its_last_folder(tmp_path, good):
    path = store.save(good, tmp_path / "r.json")
    code, _, err = run_cli(["report", str(path), "--plot", str(tmp_path / "a" / "b")])
    assert code == 2 and "is not an existing folder" in _one_line(err) and not (tmp_path / "a").exists()


# --- options that contradict each other or are out of range ----------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["--threshold", "5%", "--rule", "median:1%"], "give one of them"),
    (["--rule", "median:1%,median:2%"], "given twice"),
    (["--threshold", "0"], "must be more than 0% and less than 100%"),
    (["--threshold", "nan%"], "must be more than 0% and less than 100%"),
])
def test_compare_refuses_contradicting_or_empty_thresholds(tmp_path, good, argv, needle):
    a = store.save(good, tmp_path / "a.json")
    code, _, err = run_cli(["compare", str(a), str(a), *argv])
    assert code == 2 and needle in _one_line(err)


@pytest.mark.parametrize("argv, needle", [
    (["profile", "A8", "nope"], "unknown arm 'nope'"),
    (["probe", "--op", "spin", "--us", "-5"], "--us must be 0 to 1,000,000"),
    (["probe", "--us", "nan"], "--us must be"),
    (["run", "--shape", "A8", "--arms", "triton", "--warmup", "-1"], "--warmup at least 0"),
    (["run", "--shape", "A8", "--arms", "triton", "--placements", "-1"], "--placements must be"),
    (["sweep", "--family", "A", "--m", "-8", "--arms", "triton"], "expected positive token counts"),
])
def test_a_bad_value_is_named_before_any_gpu_is_looked_for(argv, needle):
    code, _, err = run_cli(argv)
    assert code == 2 and needle in _one_line(err) and "CUDA" not in err


def test_doctor_names_an_unusable_cache_folder_not_nvrtc(monkeypatch):
    monkeypatch.setenv("MOEBENCH_CACHE", "/proc/x")
    code, out, _ = run_cli(["doctor", "--cpu"])
    lines = {ln.split(":")[0].split(None, 1)[1]: ln for ln in out.splitlines()}
    assert code == 1
    assert "/proc/x" in lines["NVRTC"] and "MOEBENCH_CACHE" in lines["NVRTC"] and "pip install" not in lines["NVRTC"]
    assert "/proc/x" in lines["compile cache"] and "Error" not in lines["compile cache"]


def test_doctor_spells_out_errors_that_carry_no_message():
    from moebench.tasks.doctor import _first_line

    class NVMLError_LibraryNotFound(Exception):  # noqa: N801  (pynvml's naming)
        pass
    assert _first_line(NVMLError_LibraryNotFound()) == "NVML library not found"
    assert _first_line(FileNotFoundError(2, "No such file or directory", "/proc/x")) == \
        "No such file or directory: /proc/x"
    assert _first_line(RuntimeError("first\nsecond")) == "first"


def test_ctrl_c_at_any_point_is_one_line_and_exit_130():
    """SIGINT while the command's stages are imported (torch takes the first second or two) or
    while it works: one line, exit 130, never a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time
    # (the edge cases keep it working past the last delay: a signal that lands once the work is done
    # meets the interpreter's own shutdown, not moebench)
    argv = [sys.executable, "-m", "moebench", "verify", "--interpret", "--shape", "T8", "--arms", "triton",
            "--edge-cases"]
    interrupted = 0
    for delay in (0.5, 0.9, 1.5, 3.0):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "TRITON_INTERPRET": "1"})
        time.sleep(delay)
        if proc.poll() is not None:  # finished before the signal: nothing to interrupt
            continue
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        text = err.decode()
        assert proc.returncode == 130 and _one_line(text) == "moebench: interrupted", (delay, proc.returncode, text)
        interrupted += 1
    assert interrupted >= 2  # the early windows at least were hit


_SWALLOWING_COMMAND = """
import os, signal, sys
import click
from moebench import cli as mcli

@click.command("swallow")
@click.option("--then", default="ok")
def swallow(then):
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while a library works ...
        sum(range(10_000))  # (the handler runs here, between bytecodes)
    except BaseException:  # ... which swallows the KeyboardInterrupt and goes on
        pass
    if then == "fail":
        raise SystemExit(1)
    if then == "error":
        from moebench.errors import UserError
        raise UserError("a later mistake")

mcli.cli.add_command(swallow)
mcli.main(["swallow", "--then", sys.argv[1]])
"""


@pytest.mark.parametrize("then", ["ok", "fail", "error"])
def test_a_ctrl_c_a_library_swallowed_still_ends_the_command_as_interrupted(then):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _SWALLOWING_COMMAND, then], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 130 and proc.stderr.strip() == "moebench: interrupted", (proc.returncode, proc.stderr)


@pytest.mark.parametrize("value", ["\x85", "a\u2028b", "x\x0cy", "\x1e"])
def test_a_value_with_a_line_break_of_any_kind_is_named_on_one_line(value):
    # str.splitlines ends a line at NEL, the Unicode separators, form feeds and record separators
    code, _, err = run_cli(["run", "--shape", "T8", "--arms", "triton", "--noise-from", value])
    assert code == 2 and _one_line(err).startswith("moebench: error: --noise-from ")
    code, _, err = run_cli(["report", value])
    assert code == 2 and _one_line(err).startswith("moebench: ")
