"""The Triton arms on the CPU interpreter (TRITON_INTERPRET=1): parity with the oracle on T
shapes and the route-plan edge cases, configs in the engines' format, swap-AB selection,
declared kernels, and `moebench verify` / `moebench arms`.

Two references: the oracle (FP32 intermediate before the requant) and the stock path's own
rounding model (the oracle's "bf16-intermediates" roundings, as the engines store them),
which the arms declare and are judged against.
Against the model the kernels must agree to rounding noise; against the oracle the bf16
intermediate alone costs 1.2-1.7e-2 typical and up to ~4e-2 at M of 1 or 2 (measured over 100
seeds of T shapes), above the DESIGN threshold of 1e-2, hence ORACLE_BOUND here.
"""

from __future__ import annotations

import json

import pytest
import torch

from moebench.errors import UserError
from moebench.fixtures import build_fixture, derive, engine_plan_capacity, rel_l2_error, route_plan
from moebench.kernels.stock import arms as triton_arms
from moebench.kernels.registry import make_arm
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.stock.arms import (STOCK_CONFIG, SWAPAB_DEFAULT_CONFIG, TRITON_KERNELS,
                                          TritonMoeConfig, kernels_module, load_config_file,
                                          swap_ab_selected, use_interpreter)
from moebench.kernels.verify import edge_cases, verify_arms

pytestmark = pytest.mark.usefixtures("interpreted_triton")

MODEL_BOUND = 1e-3  # against stock_rounding_reference; the interpreter lands at 0
ORACLE_BOUND = 5e-2  # against the oracle, see the module docstring

# Small tiles, more programs: BN 256 takes the per-column weight-scale path, BK 64 two steps per
# scale group, BM 16 with swap-AB on (triton-swapab) or off (triton).
WIDE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 2,
               "num_warps": 4, "num_stages": 2}


@pytest.fixture(scope="module")
def t8(registry):
    return build_fixture(registry.resolve("T8"))


@pytest.fixture(scope="module")
def wide_config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "wide.json"
    path.write_text(json.dumps({"1": WIDE_CONFIG}))
    return str(path)


def _check(arm_name: str, fx, **options):
    call = make_arm(arm_name, **options).prepare(fx)
    parity = check_parity(call, References(fx), fx.spec.name)
    assert parity.nonfinite == 0, parity.reason()
    assert parity.oracle == "bf16-intermediates"
    assert parity.rel_l2 <= MODEL_BOUND, f"{arm_name} {fx.spec.name}: {parity.rel_l2:.3g} from the stock rounding model"
    assert parity.rel_l2_exact <= ORACLE_BOUND, f"{arm_name} {fx.spec.name}: {parity.rel_l2_exact:.3g} from the exact oracle"
    assert parity.passed, parity.reason()
    return call, parity


# ---- parity ------------------------------------------------------------------------------------

# "one expert set" routes 67 tokens to experts 0 and 1: 67 slots each, a full block of 64 and a
# partial one, so it also covers M not a multiple of BM; the plain M=67 case runs on the GPU.
CASES = ["fresh", "M=1", "one expert set", "empty experts"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arm", ["triton", "triton-swapab"])
def test_default_config_matches_oracle(arm, case, t8):
    fx = derive(t8, 7) if case == "fresh" else {c.label: c.fixture for c in edge_cases(t8, 11)}[case]
    call, _ = _check(arm, fx)
    assert call.identity["config"] == (STOCK_CONFIG if arm == "triton" else SWAPAB_DEFAULT_CONFIG).as_dict()
    assert call.identity["swap_ab"] is (arm == "triton-swapab")
    assert call.identity["interpreted"] is True


def test_edge_cases_are_what_they_say(t8):
    cases = {c.label: c.fixture for c in edge_cases(t8, 11)}
    assert cases["M=1"].M == 1
    one_set = cases["one expert set"].topk_ids
    assert sorted(torch.unique(one_set).tolist()) == [0, 1]
    assert torch.bincount(one_set.reshape(-1).long()).tolist() == [67, 67]
    routed = torch.unique(cases["empty experts"].topk_ids).tolist()
    assert routed == [0, 2, 4, 6]  # odd experts get no tokens
    assert cases["M=67"].M == 67 and 67 % STOCK_CONFIG.BLOCK_SIZE_M


@pytest.mark.parametrize("arm", ["triton", "triton-swapab"])
def test_wide_config_file_matches_oracle(arm, t8, wide_config_file):
    fx = derive(t8, 3, M=21)  # 42 slots: not a multiple of BM 16 either
    call, _ = _check(arm, fx, triton_config=wide_config_file)
    assert call.identity["config"] == WIDE_CONFIG
    assert call.identity["config_source"] == "file" and call.identity["config_key"] == 1
    assert call.identity["swap_ab"] is (arm == "triton-swapab")


def test_run_is_repeatable_and_writes_every_element(t8):
    call = make_arm("triton").prepare(derive(t8, 5, M=3))
    call.run()
    first = call.output.clone()
    call.output.fill_(float("nan"))
    call.run()
    assert torch.equal(call.output, first)


def test_swapped_and_plain_gemms_agree(t8, wide_config_file):
    fx = derive(t8, 9)
    outs = [make_arm(a, triton_config=wide_config_file).prepare(fx) for a in ("triton", "triton-swapab")]
    for call in outs:
        call.run()
    assert [c.identity["swap_ab"] for c in outs] == [False, True]
    # Not bitwise: the swapped tile applies the two scales in the other order, as the engines do.
    assert rel_l2_error(outs[1].output, outs[0].output) <= MODEL_BOUND


def test_requant_kernel_matches_the_oracle_quantizer_exactly():
    from moebench.fixtures.quant import quantize_per_token_group
    tm = kernels_module()
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, 256, generator=g) * torch.logspace(-8, 3, 6)[:, None]).bfloat16()
    x[2] = 0.0  # an all-zero group stays zero
    x[3, :128] = 31.95  # rounds up across a binade: the interpreter's own cast gets this wrong
    q, s = torch.empty(6, 256, dtype=torch.float8_e4m3fn), torch.empty(6, 2)
    tm.launch_act_quant(x, q, s)
    q_ref, s_ref = quantize_per_token_group(x.float())
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8) & 0x7F, q_ref.view(torch.uint8) & 0x7F)  # zero's sign may differ
    assert torch.equal(q.float(), q_ref.float())


# ---- configs and swap-AB -----------------------------------------------------------------------


def test_stock_config_is_the_engines_fp8_block_default():
    assert STOCK_CONFIG.as_dict() == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                                      "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}


def test_swap_ab_rule():
    assert not swap_ab_selected(STOCK_CONFIG)
    assert swap_ab_selected(SWAPAB_DEFAULT_CONFIG)
    assert swap_ab_selected(TritonMoeConfig(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64))
    assert not swap_ab_selected(TritonMoeConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32))
    assert not swap_ab_selected(TritonMoeConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128))


def _entry(bm):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3}


def test_nearest_key_as_the_engines_pick_it(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"1": _entry(16), "4": _entry(32), "8": _entry(64), "64": _entry(128)}))
    cf = load_config_file(path)
    picks = {M: cf.select(M)[0] for M in (1, 2, 3, 6, 7, 36, 37, 1000)}
    # 6 is 2 from 4 and from 8, 36 is 28 from 8 and from 64: the first key in file order wins,
    # as min() over the keys does
    assert picks == {1: 1, 2: 1, 3: 4, 6: 4, 7: 8, 36: 8, 37: 64, 1000: 64}
    assert cf.select(37)[1].BLOCK_SIZE_M == 128
    assert len(cf.sha256) == 64


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ("[]", "expected an object"),
    ('{"x": {}}', "positive token count"),
    (json.dumps({"1": {**_entry(16), "BLOCK_SIZE_Q": 1}}), "unknown key"),
    (json.dumps({"1": {"BLOCK_SIZE_M": 16}}), "missing"),
    (json.dumps({"1": {**_entry(16), "BLOCK_SIZE_K": 256}}), "must divide the scale group"),
    (json.dumps({"1": {**_entry(16), "BLOCK_SIZE_N": 96}}), "power of two"),
    (json.dumps({"1": {**_entry(16), "SPLIT_K": 2}}), "SPLIT_K"),
    (json.dumps({"1": {**_entry(16), "num_warps": "4"}}), "integers"),
])
def test_bad_config_files_are_user_errors(tmp_path, content, message):
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_config_file(path)


def test_split_k_one_is_accepted(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"16": {**_entry(16), "SPLIT_K": 1}}))
    assert load_config_file(path).select(3) == (16, TritonMoeConfig(**_entry(16)))


def test_missing_config_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        make_arm("triton", triton_config=str(tmp_path / "none.json"))


# ---- declared kernels --------------------------------------------------------------------------


def test_five_declared_kernels_match_the_kernel_function_names():
    tm = kernels_module()
    assert [d.label for d in TRITON_KERNELS] == ["gemm1", "silu_and_mul", "per_token_group_quant", "gemm2",
                                                 "combine"]
    assert sum(d.count for d in TRITON_KERNELS) == 5
    names = [getattr(tm, n).fn.__name__ for n in tm.KERNEL_NAMES]
    for decl, name in zip(TRITON_KERNELS, names):
        assert decl.matches(name)
        assert decl.matches(name + "_0d1d2d")  # older Triton's signature suffix
        assert [d.label for d in TRITON_KERNELS if d.matches(name)] == [decl.label]  # no cross-matches
    assert not any(d.matches("fused_moe_kernel") or d.matches("moebench_moe_gemm12") for d in TRITON_KERNELS)


def test_interpreter_switch_redefines_the_kernels():
    assert kernels_module().INTERPRETED is True
    use_interpreter(False)
    try:
        assert kernels_module().INTERPRETED is False
        assert make_arm("triton").unavailable_reason(torch.device("cpu")) is not None
    finally:
        use_interpreter(True)
    assert kernels_module().INTERPRETED is True
    assert make_arm("triton").unavailable_reason(torch.device("cpu")) is None


# ---- verify library and CLI --------------------------------------------------------------------


def test_verify_arms_rows(registry):
    rows = verify_arms(build_fixture(registry.resolve("T2")), ["triton"], seed=4, threshold=ORACLE_BOUND)
    assert [(r.arm, r.shape) for r in rows] == [("triton", "T2")]
    assert rows[0].passed and rows[0].max_abs < rows[0].ref_max_abs


def test_verify_rejects_an_option_no_arm_takes(t8, wide_config_file, monkeypatch):
    from moebench.kernels import registry as arm_module
    monkeypatch.setitem(arm_module.ARMS, "plain-test-arm", lambda: None)
    with pytest.raises(UserError, match="--triton-config applies to none"):
        verify_arms(t8, ["plain-test-arm"], options={"triton_config": wide_config_file})


def _cli(argv, capsys):
    from moebench.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_verify_cli_interpret_passes_and_fails_on_threshold(capsys, monkeypatch):
    code, out, err = _cli(["verify", "--shape", "T2", "--arms", "triton,triton-swapab", "--interpret"], capsys)
    assert code == 0, err
    assert "triton-swapab" in out and "ok" in out
    # Judged against the exact oracle instead of its declared roundings, the stock path's BF16
    # intermediates (1.2-4e-2 from it) cannot meet a 1e-3 bar: verify must say so and exit 1.
    prepare = triton_arms.TritonMoeArm.prepare

    def prepare_exact(self, fx):
        call = prepare(self, fx)
        call.oracle = "exact"
        return call
    monkeypatch.setattr(triton_arms.TritonMoeArm, "prepare", prepare_exact)
    code, out, err = _cli(["verify", "--shape", "T2", "--arms", "triton", "--interpret", "--threshold", "1e-3"],
                          capsys)
    assert code == 1
    assert "FAIL" in out and "1 of 1 checks failed" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_verify_cli_without_gpu_or_interpret_is_one_line_exit_2(capsys):
    code, out, err = _cli(["verify", "--shape", "T2", "--arms", "triton"], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "--interpret" in err


@pytest.mark.parametrize("argv, message", [
    (["verify", "--shape", "T2", "--arms", "nope", "--interpret"], "unknown arm"),
    (["verify", "--shape", "T2", "--arms", "triton", "--interpret", "--triton-config", "/nonexistent.json"],
     "cannot read"),
    (["verify", "--shape", "T2", "--arms", ",", "--interpret"], "no arm given"),
])
def test_verify_cli_user_errors(argv, message, capsys):
    code, _, err = _cli(argv, capsys)
    assert code == 2 and message in err and err.strip().count("\n") == 0


def test_verify_without_arms_checks_every_arm_that_can_run_here(capsys):
    code, out, _ = _cli(["verify", "--shape", "T2", "--interpret"], capsys)
    assert code == 0, out
    assert "arms left out: sglang (SGLang is not installed" in out.replace("\n", " ")
    for arm in ("triton", "triton-default", "triton-swapab"):
        assert f" {arm} " in out


def test_arms_cli_lists_the_triton_arms(capsys):
    code, out, _ = _cli(["arms"], capsys)
    assert code == 0
    assert "triton-swapab" in out and "stock Triton path" in out


def test_text_in_brackets_is_printed_as_written(capsys, monkeypatch):
    """Nothing a user or an arm writes is read as rich markup: `pip install 'moebench[sglang]'`
    once lost its `[sglang]` in every table and log line."""
    from moebench.cli import arms_cmd
    from moebench.kernels.stock.sglang_arm import INSTALL_HINT
    monkeypatch.setattr(arms_cmd, "arm_availability",
                        lambda: ("cpu", [("mine", "a [bold]kernel[/bold]", f"not installed ({INSTALL_HINT})")]))
    code, out, _ = _cli(["arms"], capsys)
    assert code == 0 and "a [bold]kernel[/bold]" in out and INSTALL_HINT in out, out
    code, out, _ = _cli(["verify", "--shape", "T2", "--arms", "triton", "--interpret"], capsys)
    assert code == 0 and "[green]" not in out and " ok" in out, out


# ---- the engines' launch paths: tuned tables, TMA, the sorted intermediate ---------------------


def _cpu_tables(up: dict, down: dict | None):
    from moebench.kernels.stock.engine_config import EngineTables, TableKey, parse_table
    entries = {(TableKey("cpu", 8, 128, False), "3.6.0"): parse_table({"1": up}, "up", "test up")}
    if down is not None:
        entries[(TableKey("cpu", 8, 128, True), "3.6.0")] = parse_table({"1": down}, "down", "test down")
    return EngineTables("sglang", "test", "0" * 64, entries)


TMA_UP = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
          "num_stages": 2, "USE_TMA": True}
TMA_DOWN = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 2, "num_warps": 4,
            "num_stages": 2, "USE_TMA": True}


@pytest.mark.parametrize("case", ["fresh", "M=1", "one expert set", "empty experts"])
def test_tuned_tables_with_tma_and_the_sorted_intermediate_match_oracle(case, t8, monkeypatch):
    from moebench.kernels.stock import engine_config
    monkeypatch.setattr(engine_config, "load_engine_tables", lambda: _cpu_tables(TMA_UP, TMA_DOWN))
    fx = derive(t8, 13) if case == "fresh" else {c.label: c.fixture for c in edge_cases(t8, 17)}[case]
    call, _ = _check("triton-swapab", fx)
    ident = call.identity
    assert ident["config_source"] == "engine table" and ident["down_block_m_forced"] == "32 -> 16"
    assert ident["tma"] and ident["down_tma"] and ident["sorted_intermediate"]
    assert ident["swap_ab"] and ident["down_swap_ab"] and not ident["pdl"]  # no PDL off the GPU
    S = fx.M * fx.spec.top_k
    assert ident["route_plan_capacity"] == engine_plan_capacity(S, 8, 16)
    assert ident["intermediate_rows"] == S + min(S, 9) * 15


def test_sorted_rows_past_the_plan_are_never_touched_and_padding_rows_are_zero(t8, monkeypatch):
    from moebench.kernels.stock import engine_config
    monkeypatch.setattr(engine_config, "load_engine_tables", lambda: _cpu_tables(TMA_UP, TMA_DOWN))
    call = make_arm("triton").prepare(derive(t8, 21, M=5))
    ws = call.workspace
    assert ws.sorted
    ws.act.fill_(float("nan"))
    call.run()
    n, S = ws.plan.padded_total, ws.plan.num_slots
    assert n < ws.act.shape[0] and torch.isnan(ws.act[n:].float()).all()  # past the padded total: untouched
    pad_rows = (ws.plan.sorted_token_ids[:n] >= S).nonzero().reshape(-1)
    assert pad_rows.numel() > 0 and torch.all(ws.act[pad_rows].float() == 0)
    assert torch.all(ws.act_scale[pad_rows] == 1e-10)  # the all-zero group's floor
    assert torch.isfinite(call.output.float()).all()


def test_triton_default_ignores_the_tables(t8, monkeypatch):
    from moebench.kernels.stock import engine_config
    monkeypatch.setattr(engine_config, "load_engine_tables", lambda: _cpu_tables(TMA_UP, None))
    call = make_arm("triton-default").prepare(derive(t8, 3))
    assert call.identity["config"] == STOCK_CONFIG.as_dict() and call.identity["config_source"] == "default"
    assert not call.identity["tma"]
    tuned = make_arm("triton").prepare(derive(t8, 3))
    assert tuned.identity["config_source"] == "engine table" and tuned.identity["tma"]
    assert tuned.identity["down_config"] == tuned.identity["config"]  # no down table: the up entry


def test_default_arms_on_the_cpu_interpreter():
    from moebench.kernels.registry import default_arms
    chosen, skipped = default_arms(torch.device("cpu"))
    assert chosen == ["triton", "triton-default", "triton-swapab"]
    why = dict(skipped)
    assert set(why) == {"sglang", "cuda-gemm", "cuda-swapab", "cuda-fused"}
    assert all(why.values())


def test_blocks_of_filtered_experts_write_zero_rows(t8):
    """A block whose expert is -1 (an expert this rank does not hold) writes its slots' rows as
    zeros, as the engines' kernel does; the other blocks are computed as usual."""
    tm = kernels_module()
    fx = derive(t8, 31, M=4)
    plan = route_plan(fx.topk_ids, 8, 16)
    experts = plan.expert_ids.clone()
    experts[0] = -1  # the first block's expert is filtered
    S, N = fx.M * fx.spec.top_k, fx.spec.N
    h = torch.full((S, N), float("nan"), dtype=torch.bfloat16)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
           "num_warps": 4, "num_stages": 2}
    tm.launch_moe_gemm(tm.moebench_moe_gemm1, fx.x_fp8, fx.x_scale, fx.w1, fx.w1_scale, h,
                       fx.topk_weights.reshape(-1), plan.sorted_token_ids, experts, plan.num_tokens_post_padded,
                       a_row_div=fx.spec.top_k, mul_route_weight=False, swap_ab=False, config=cfg)
    first = plan.sorted_token_ids[:16].long()
    first = first[first < S]
    rest = torch.tensor([s for s in range(S) if s not in set(first.tolist())])
    assert first.numel() > 0 and torch.all(h[first].float() == 0)
    assert torch.isfinite(h[rest].float()).all() and (h[rest].float() != 0).any()
