"""`moebench tune` on the CPU: the search space and its pruning, the buckets, the tables' names
and format (read back by moebench and, where SGLang is installed, by SGLang's own loader), and
a real tune of the tiny family under the Triton interpreter, timed by the measurement core
over fake kernel records: stopped by its budget, continued from its state, read by the
`triton-tuned` arm."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
from result_factory import run_cli
from run_fakes import fake_backend
from timing_fakes import FakeGpu

from moebench.tasks import tune_space as ts
from moebench.choices import ENGINE_BATCH_SIZES
from moebench.errors import UserError
from moebench.kernels.stock.engine_config import TritonMoeConfig, load_config_file, resolve
from moebench.kernels.stock.tuned_tables import TunedTables, load_tuned, table_json, table_name, tables_folder, write_table
from moebench.tasks.tune_state import TuneState

C = TritonMoeConfig
UP_A, DOWN_A = ts.GemmShape("up", 256, 7168), ts.GemmShape("down", 7168, 128)


# ---- the space -------------------------------------------------------------------------------

def test_the_engines_space_and_their_block_quant_pruning():
    assert len(ts.engine_space(block_quant=False)) == 1920  # 5 x 4 x 3 x 4 x 2 x 4, as their tuners list it
    pruned = ts.engine_space()
    assert len(pruned) == 1280 and {c.BLOCK_SIZE_K for c in pruned} == {64, 128}


@pytest.mark.parametrize("config, gemm, rows, tma, needle", [
    (C(BLOCK_SIZE_K=256), UP_A, 64, False, "does not divide the 128-wide scale block"),
    (C(BLOCK_SIZE_M=48), UP_A, 64, False, "outside the engines' search space"),
    (C(BLOCK_SIZE_M=256, BLOCK_SIZE_N=256, num_stages=5), UP_A, 4096, False, "exceed 232,448"),
    (C(BLOCK_SIZE_M=64), UP_A, 3, False, "past the busiest expert's 3 rows"),
    (C(BLOCK_SIZE_M=16, num_stages=3), DOWN_A, 3, False, "3 stages for a K loop of 1 step"),
    (C(BLOCK_SIZE_M=16, USE_TMA=True), UP_A, 3, False, "no tensor descriptors"),
])
def test_each_rule_says_why_it_leaves_a_config_out(config, gemm, rows, tma, needle):
    assert needle in ts.left_out(config, gemm, ts.Limits(rows, tma=tma))


def test_what_the_rules_keep():
    lim = ts.Limits(max_expert_rows=3, tma=True)
    assert ts.left_out(C(BLOCK_SIZE_M=16, BLOCK_SIZE_K=64, num_stages=3), DOWN_A, lim) is None  # two K steps
    assert ts.left_out(C(BLOCK_SIZE_M=16, num_stages=2, USE_TMA=True), DOWN_A, lim) is None
    space = ts.pruned_space(UP_A, lim)
    assert space and all(c.BLOCK_SIZE_M == 16 for c in space)  # 3 rows: BLOCK_SIZE_M 16 only
    assert all(ts.staged_smem_bytes(c) <= ts.SM90_SMEM_PER_BLOCK for c in space)
    assert {c.USE_TMA for c in space} == {False, True}


def test_a_move_is_judged_by_the_axes_it_changes():
    # The shipped down entry has 4 stages over a one-step K loop: its other axes still move.
    shipped = C(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_stages=4)
    lim = ts.Limits(max_expert_rows=9)
    got = ts.moves(shipped, DOWN_A, lim)
    assert C(16, 64, 128, 1, 4, 4) in got and C(16, 256, 128, 1, 4, 4) in got  # BLOCK_SIZE_N moves
    assert all(c.num_stages in (2, 4) for c in got)  # stages move only to what the K loop uses
    assert not [c for c in got if c.USE_TMA]  # no TMA here
    assert len(got) == len(set(got)) and shipped not in got
    # The up GEMM with one tile across N (BN 256 = N): GROUP_SIZE_M orders nothing and is not moved.
    wide = C(BLOCK_SIZE_M=16, BLOCK_SIZE_N=256, GROUP_SIZE_M=1)
    assert {c.GROUP_SIZE_M for c in ts.moves(wide, UP_A, lim)} == {1}
    pairs = ts.block_m_moves(shipped, shipped, UP_A, DOWN_A, ts.Limits(max_expert_rows=40))
    assert [p[0].BLOCK_SIZE_M for p in pairs] == [32, 64]  # 40 rows: up to 64, both GEMMs together
    assert all(u.BLOCK_SIZE_M == d.BLOCK_SIZE_M for u, d in pairs)


def test_candidates_per_m_for_the_shipped_h100_tables():
    """How many candidates the first pass tries for family A on an H100 under Triton 3.6."""
    from moebench.kernels.stock.engine_config import Device
    dev = Device("NVIDIA H100 80GB HBM3", (9, 0), "3.6.0", True)
    counts = {}
    for M, rows in ((1, 1), (8, 8), (128, 128), (4096, 4096)):  # the shared expert holds every token
        plan = resolve(dev, E=257, N=128, M=M, K=7168, top_k=9)
        up, down = plan.up.config, plan.down.config
        lim = ts.Limits(rows, tma=True)
        counts[M] = (1 + len(ts.block_m_moves(up, down, UP_A, DOWN_A, lim)),
                     len(ts.moves(up, UP_A, lim)), len(ts.moves(down, DOWN_A, lim)))
    assert counts[1][0] == 1 and counts[4096][0] == 5  # BLOCK_SIZE_M: one choice at M=1, five at 4096
    assert all(8 <= u <= 16 and 4 <= d <= 12 for _, u, d in counts.values()), counts


def test_the_buckets():
    assert ts.parse_ms(None, ENGINE_BATCH_SIZES) == ENGINE_BATCH_SIZES
    assert ts.parse_ms("128, 8,1", ENGINE_BATCH_SIZES) == (1, 8, 128)
    for bad in ("", "0", "8,x", "1,1", "-4", "99999999"):
        with pytest.raises(UserError) as err:
            ts.parse_ms(bad, ENGINE_BATCH_SIZES)
        assert "\n" not in str(err.value)


# ---- the tables --------------------------------------------------------------------------------

def test_names_and_format_are_the_engines(tmp_path):
    assert table_name(257, 128, "NVIDIA H100 80GB HBM3") == \
        "E=257,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert table_name(512, 128, "NVIDIA H200", down=True).endswith("block_shape=[128, 128]_down.json")
    assert tables_folder(tmp_path, "3.6.0").relative_to(tmp_path).as_posix() == "configs/triton_3_6_0"
    assert tables_folder(tmp_path, "3.6.0+git1").name == "triton_3_6_0+git1"  # as SGLang forms it
    entries = {128: C(16, 128, 128, 1, 4, 3, True), 8: C(16, 64, 128, 16, 4, 4)}
    text = table_json(entries).decode()
    assert text.endswith("}\n") and list(json.loads(text)) == ["8", "128"]  # ascending M
    assert '    "8": {\n        "BLOCK_SIZE_M": 16,' in text  # indented by 4, as the engines' tuners write
    assert json.loads(text)["128"]["USE_TMA"] is True and "USE_TMA" not in json.loads(text)["8"]
    path = write_table(tmp_path / "t.json", entries)
    table = load_config_file(path)
    assert dict(table.entries) == entries


def test_the_lookup_picks_the_nearest_bucket_and_forces_the_down_block_m(tmp_path):
    up = load_config_file(write_table(tmp_path / "u.json", {1: C(16), 64: C(32), 4096: C(64)}))
    down = load_config_file(write_table(tmp_path / "d.json", {1: C(16, 256), 4096: C(64, 128)}))
    t = TunedTables(up, down, {"gpu": {"name": "x"}, "timing": {"flush": "read"}})
    identity, u, d = t.select(48)  # 64 is nearer than 1; the down table's nearest is 1
    assert (identity["up_key"], identity["down_key"], u.BLOCK_SIZE_M, d.BLOCK_SIZE_M) == (64, 1, 32, 32)
    assert identity["down_block_m_forced"] == "16 -> 32" and identity["tuned_provenance"]["timing"]["flush"] == "read"
    assert t.select(2100)[0]["up_key"] == 4096 and t.select(2100)[0]["down_key"] == 4096
    assert t.select(2080)[0]["up_key"] == 64  # equally near 64 and 4096: the first in file order
    with pytest.raises(UserError, match="no table 'E=8,N=128,device_name=cpu"):
        load_tuned(tmp_path, 8, 128, "cpu", "3.9.0")
    other = write_table(tmp_path / table_name(512, 128, "cpu"), {1: C(16)})
    with pytest.raises(UserError, match="another geometry's or GPU's table"):
        load_tuned(other, 8, 128, "cpu", "3.9.0")
    assert load_tuned(write_table(tmp_path / table_name(8, 128, "cpu"), {1: C(16)}), 8, 128, "cpu", "3.9.0").down is None


def test_the_written_tables_load_through_sglangs_own_loader(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from moebench.kernels.stock.sglang_arm import load_engine, sglang_version
    if sglang_version() is None:
        pytest.skip("SGLang is not installed")
    import triton
    engine = load_engine()
    up = {1: C(16, 64, 128, 1, 4, 5), 8: C(16, 128, 128, 16, 4, 4, True), 4096: C(64, 128, 128, 32, 4, 3)}
    down = {1: C(16, 128, 128, 16, 4, 2, True), 8: C(16, 256, 64, 1, 4, 3, True), 4096: C(64, 128, 128, 1, 8, 2)}
    device_name = "NVIDIA H100 80GB HBM3"
    folder = tables_folder(tmp_path, triton.__version__)
    write_table(folder / table_name(257, 128, device_name), up)
    write_table(folder / table_name(257, 128, device_name, down=True), down)
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(engine.configs, "get_device_name", lambda device_id=0: device_name)
    engine.configs.get_moe_configs.cache_clear()
    try:
        for M in (1, 8, 4096):
            config, down_config, _ = engine.lookup_config((257, 256, 7168), (257, 7168, 128), 9, M)
            assert config == up[M].as_dict() and down_config == down[M].as_dict(), M
        assert engine.configs.get_config_file_name(257, 128, "fp8_w8a8", [128, 128]) == table_name(257, 128, device_name)
    finally:
        engine.configs.get_moe_configs.cache_clear()


def test_a_state_of_other_settings_is_refused_in_one_line(tmp_path):
    state = TuneState.open(tmp_path / "s.json", {"triton": "3.6.0", "passes": 2})
    state.put(8, "up x", 1000)
    state.save()
    assert TuneState.open(tmp_path / "s.json", {"triton": "3.6.0", "passes": 2}).get(8, "up x") == {"ns": 1000, "why": None}
    with pytest.raises(UserError, match=r"other settings \(passes differ\)") as err:
        TuneState.open(tmp_path / "s.json", {"triton": "3.6.0", "passes": 3})
    assert "\n" not in str(err.value)
    (tmp_path / "s.json").write_text("{")
    with pytest.raises(UserError, match="not readable JSON"):
        TuneState.open(tmp_path / "s.json", {})


# ---- a real tune on the interpreter, timed over fake records -----------------------------------

SMALL_GRID = {"BLOCK_SIZE_M": (16, 32, 64), "BLOCK_SIZE_N": (64, 128), "BLOCK_SIZE_K": (64, 128),
              "GROUP_SIZE_M": (32,), "num_warps": (4,), "num_stages": (2, 3)}


def fake_ns(label: str) -> int:
    """A fake GEMM time that prefers BLOCK_SIZE_M 16 and BLOCK_SIZE_N 64 (each term of a pair's label)."""
    total = 0
    for bm, bn in re.findall(r"BM(\d+)\.BN(\d+)", label):
        total += 10_000 + 40 * int(bm) + 20 * int(bn)
    return total


class CountingWrap:
    """Put each unit's declared kernels on the fake GPU after its real (interpreted) call."""

    def __init__(self, gpu: FakeGpu):
        self.gpu, self.labels = gpu, []

    def __call__(self, unit):
        names = [re.sub(r"^\^|\(\?:.*$", "", d.pattern) for d in unit.kernels]
        self.labels.append(unit.arm)

        def run():
            unit.run()
            for name in names:
                self.gpu.launch(name, fake_ns(unit.arm) // len(names))
        return replace(unit, run=run)


@pytest.fixture
def interpreted(monkeypatch):
    from moebench.kernels.stock.arms import interpreter_requested, use_interpreter
    was = interpreter_requested()
    use_interpreter(True)
    monkeypatch.setattr(ts, "ENGINE_GRID", SMALL_GRID)
    yield
    use_interpreter(was)


def test_a_tune_stops_on_its_budget_continues_and_feeds_the_tuned_arm(tmp_path, interpreted):
    from moebench.fixtures import ShapeRegistry, build_fixture
    from moebench.kernels.api.parity import References, check_parity
    from moebench.kernels.registry import make_arm
    from moebench.tasks.tune import MeasureTimer, TuneRequest, tune
    req = TuneRequest("T", (2,), str(tmp_path), budget_s=10, rounds=1, samples=2, warmup=0, check_rounds=2, passes=2)
    ticks = iter(range(10_000))
    wrap = CountingWrap(FakeGpu())
    timer = MeasureTimer(fake_backend(wrap.gpu), wrap)
    first = tune(req, torch.device("cpu"), timer, clock=lambda: next(ticks))
    assert first.stopped == "budget" and first.finished == () and first.tables == ()
    state_file = next(first.folder.glob("*.tune-state.json"))
    known = {k for k, v in json.loads(state_file.read_text())["measured"]["2"].items() if v["ns"] is not None}
    assert known and wrap.labels  # it timed some candidates, and saved them

    wrap.labels.clear()
    logs = []
    done = tune(replace(req, budget_s=None), torch.device("cpu"), timer, log=logs.append)
    assert done.stopped is None and done.finished == (2,)
    assert any(line.startswith("continuing from") for line in logs)
    assert not known & set(wrap.labels)  # nothing timed twice
    up_path, down_path, prov_path = done.tables
    up, down = json.loads(up_path.read_text()), json.loads(down_path.read_text())
    # The walk found BLOCK_SIZE_M 16 (both GEMMs) and BLOCK_SIZE_N 64, which the fake timer prefers.
    assert (up["2"]["BLOCK_SIZE_M"], up["2"]["BLOCK_SIZE_N"], down["2"]["BLOCK_SIZE_N"]) == (16, 64, 64)
    prov = json.loads(prov_path.read_text())
    assert prov["timing"]["flush"] == "read" and prov["timing"]["sampler"] == "eager"
    assert prov["ms"] == [2] and prov["entries"]["2"]["kept"] == "tuned"
    assert prov["entries"]["2"]["shipped_up"]["BLOCK_SIZE_M"] == 64  # the engine's default here
    assert prov["entries"]["2"]["check"]["ratio_shipped_over_tuned"] > 1

    spec = ShapeRegistry().resolve("T3")
    fx = build_fixture(spec)
    call = make_arm("triton-tuned", tuned=str(tmp_path)).prepare(fx)
    assert call.identity["config_source"] == "tuned" and call.identity["up_key"] == 2
    assert call.identity["tuned_file"] == str(up_path) and call.identity["config"] == up["2"]
    assert check_parity(call, References(fx), spec.name).passed


def test_tune_and_tuned_inputs_are_one_line(tmp_path):
    cases = [
        (["tune", "--shape", "A", "--ms", "8,x"], "--ms: expected token counts"),
        (["tune", "--shape", "Z", "--ms", "8"], "unknown shape family"),
        (["tune", "--shape", "A8", "--ms", "8"], "--shape: expected one family letter"),
        (["tune", "--ms", "8"], "Missing option '--shape'"),
        (["tune", "--shape", "A", "--ms", "8", "--budget", "0"], "--budget must be a positive number"),
        (["tune", "--shape", "A", "--ms", "8", "--samples", "0"], "--rounds and --samples"),
        (["run", "--shape", "T2", "--arms", "triton", "--tuned", str(tmp_path)], "--tuned applies to none"),
    ]
    for argv, needle in cases:
        code, _, err = run_cli(argv)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and needle in lines[0], (argv, err)
    if not torch.cuda.is_available():
        code, _, err = run_cli(["tune", "--shape", "A", "--ms", "8"])
        assert code == 2 and "no CUDA device" in err and len(err.strip().splitlines()) == 1


def test_a_candidate_that_cannot_run_is_refused_with_why(tmp_path, interpreted):
    from moebench.fixtures import ShapeRegistry, build_fixture
    from moebench.kernels.stock.arms import device_of
    from moebench.tasks.tune import Budget, MeasureTimer, MTune, TuneRequest, _interrupted
    fx = build_fixture(ShapeRegistry().resolve("T1"))
    wrap = CountingWrap(FakeGpu())
    state = TuneState(tmp_path / "s.json", {})
    req = TuneRequest("T", (1,), str(tmp_path), rounds=1, samples=2, warmup=0)
    mt = MTune(fx, device_of(fx.device), ts.Limits(2), state, MeasureTimer(fake_backend(wrap.gpu), wrap), req,
               Budget(None), lambda m: None)
    good, bad = C(16, 64, 128, 1, 4, 2), C(16, 64, 256, 1, 4, 2)  # BLOCK_SIZE_K 256 over a K of 128
    got = mt.values([("down", bad, good), ("down", good, good)])
    assert got[mt.key("down", good, good)] == fake_ns("BM16.BN64") // 1
    assert got[mt.key("down", bad, good)] is None and "BLOCK_SIZE_K=256 must divide" in \
        state.get(1, mt.key("down", bad, good))["why"]
    assert wrap.labels == [mt.key("down", good, good)]  # a refused candidate is never timed
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as err:
        assert _interrupted(err) and not _interrupted(RuntimeError("plain"))


def test_tuned_adds_its_arm_to_a_run_that_names_none():
    from moebench.kernels.registry import default_arms
    cpu = torch.device("cpu")
    seen = lambda options: {n for n in default_arms(cpu, options)[0]} | {n for n, _ in default_arms(cpu, options)[1]}  # noqa: E731
    assert "triton-tuned" in seen({"tuned": "DIR"}) and "triton-tuned" not in seen({})
