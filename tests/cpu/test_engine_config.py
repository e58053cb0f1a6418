"""The engines' config resolution, plan sizing and launch switches (engine_config.py), checked
against the rules read from SGLang 0.5.23's fused-MoE code, on synthetic and shipped tables."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moebench.errors import UserError
from moebench.fixtures import engine_plan_capacity, route_plan
from moebench.kernels.stock.engine_config import (DEFAULT_CONFIG, ConfigTable, Device, EngineTables, TableKey,
                                            TritonMoeConfig, load_config_file, load_engine_tables, parse_entry,
                                            resolve, sorted_rows, swap_ab_rule)

H200 = Device("NVIDIA H200", (9, 0), "3.6.0", True)
H200_NO_TMA = Device("NVIDIA H200", (9, 0), "3.6.0", False)
CPU = Device("cpu", (0, 0), "3.9.0", True)


def cfg(bm, bn=128, bk=128, g=1, w=4, s=3, tma=False):
    return TritonMoeConfig(bm, bn, bk, g, w, s, tma)


def table(name, *entries):
    return ConfigTable(name, tuple(entries))


def tables(entries: dict) -> EngineTables:
    return EngineTables("sglang", "test", "0" * 64, entries)


KEY_UP = TableKey("NVIDIA_H200", 8, 128, False)
KEY_DOWN = TableKey("NVIDIA_H200", 8, 128, True)


def _resolve(t, device=H200, M=8, **kw):
    return resolve(device, E=8, N=128, M=M, K=256, top_k=2, tables=t, **kw)


# ---- lookup ------------------------------------------------------------------------------------


def test_nearest_key_first_in_file_order_on_a_tie():
    up = table("up", (1, cfg(16)), (4, cfg(32)), (8, cfg(64)), (64, cfg(128, bn=64)))
    t = tables({(KEY_UP, "3.6.0"): up})
    picks = {M: _resolve(t, M=M).up.config.BLOCK_SIZE_M for M in (1, 2, 3, 6, 7, 36, 37, 1000)}
    assert picks == {1: 16, 2: 16, 3: 32, 6: 32, 7: 64, 36: 64, 37: 128, 1000: 128}


def test_down_table_with_its_block_m_forced_to_the_up_one():
    up = table("up", (8, cfg(16, bn=64)))
    down = table("down", (8, cfg(32, bn=256, bk=64, tma=True)))
    plan = _resolve(tables({(KEY_UP, "3.6.0"): up, (KEY_DOWN, "3.6.0"): down}))
    assert plan.up.config == cfg(16, bn=64)
    assert plan.down.config == cfg(16, bn=256, bk=64, tma=True)  # BM 32 -> 16
    assert plan.identity["down_block_m_forced"] == "32 -> 16"
    assert plan.down.tma and not plan.up.tma and plan.sorted_down


def test_other_triton_versions_newest_first_when_this_one_has_no_table():
    t = tables({(KEY_UP, "3.3.1"): table("old", (1, cfg(16))), (KEY_UP, "3.4.0"): table("newer", (1, cfg(32))),
                (KEY_UP, "3.10.0"): table("newest", (1, cfg(64)))})
    plan = _resolve(t, device=Device("NVIDIA H200", (9, 0), "3.6.0+gitabc", True))
    assert plan.up.config.BLOCK_SIZE_M == 64 and plan.identity["up_table_triton"] == "3.10.0"
    exact = tables({**t.tables, (KEY_UP, "3.6.0"): table("exact", (1, cfg(128)))})
    assert _resolve(exact).identity["up_table_triton"] == "3.6.0"


def test_no_down_table_reuses_the_up_entry_with_its_tma_switch():
    up = table("up", (8, cfg(16, tma=True)))
    plan = _resolve(tables({(KEY_UP, "3.6.0"): up}))
    assert plan.down.config == plan.up.config
    assert plan.down.tma and plan.up.tma  # as the engine's code does (its log line says otherwise)
    assert "up table" in plan.identity["down_note"]


def test_no_table_at_all_is_the_engines_default():
    plan = _resolve(tables({}))
    assert plan.up.config == plan.down.config == DEFAULT_CONFIG
    assert plan.identity["config_source"] == "default"
    assert not plan.up.swap_ab and not plan.down.tma  # BM 64: no swap; the default asks no TMA
    assert DEFAULT_CONFIG.as_dict() == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                                        "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}


def test_a_user_table_overrides_both_gemms_without_down_tma(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"4": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                                      "GROUP_SIZE_M": 1, "USE_TMA": True}}))
    plan = _resolve(tables({(KEY_UP, "3.6.0"): table("up", (8, cfg(64)))}), override=load_config_file(path))
    assert plan.up.config.BLOCK_SIZE_N == 64 and plan.up.tma
    assert not plan.down.tma and plan.down.config.BLOCK_SIZE_N == 64
    assert plan.identity["config_source"] == "file" and plan.identity["config_key"] == 4


def test_forced_default_ignores_the_tables():
    plan = _resolve(tables({(KEY_UP, "3.6.0"): table("up", (8, cfg(16)))}), force_default=True)
    assert plan.up.config == DEFAULT_CONFIG and plan.identity["config_source"] == "default"


def test_tma_needs_tensor_descriptors():
    t = tables({(KEY_UP, "3.6.0"): table("up", (8, cfg(16, tma=True)))})
    assert _resolve(t).up.tma and not _resolve(t, device=H200_NO_TMA).up.tma


# ---- swap-AB and PDL ---------------------------------------------------------------------------


def test_swap_ab_rule_is_sm90_bm_below_64_bn_at_least_64():
    assert swap_ab_rule(cfg(16), on_sm90=True) and swap_ab_rule(cfg(32, bn=64), on_sm90=True)
    assert not swap_ab_rule(cfg(16), on_sm90=False)
    assert not swap_ab_rule(cfg(64), on_sm90=True) and not swap_ab_rule(cfg(16, bn=32), on_sm90=True)


def test_swap_is_decided_per_gemm():
    up, down = table("up", (8, cfg(16, bn=32))), table("down", (8, cfg(16, bn=128)))
    both = tables({(KEY_UP, "3.6.0"): up, (KEY_DOWN, "3.6.0"): down})
    plan = _resolve(both)
    assert (plan.up.swap_ab, plan.down.swap_ab) == (False, True)
    not_sm90 = Device("NVIDIA H200", (8, 9), "3.6.0", True)  # the same tables on a GPU outside SM90
    assert not _resolve(both, device=not_sm90).down.swap_ab
    assert _resolve(both, device=not_sm90, swap_on_any_device=True).down.swap_ab


def test_pdl_on_sm90_and_early_release_up_to_512_rows():
    t = tables({(KEY_UP, "3.6.0"): table("up", (8, cfg(16)))})
    assert _resolve(t, M=512).up.pdl_early and not _resolve(t, M=513).up.pdl_early
    assert not _resolve(t, device=CPU).up.pdl
    off = _resolve(t, pdl=False)
    assert not off.up.pdl and not off.down.pdl and not off.up.pdl_early


# ---- plan sizing -------------------------------------------------------------------------------


def test_engine_plan_capacity_as_moe_align_block_size_sizes_it():
    assert engine_plan_capacity(72, 257, 16) == 72 * 16  # A8: fewer slots than E + 1 buckets
    assert engine_plan_capacity(80, 512, 16) == 1280  # Q8
    assert engine_plan_capacity(1152, 257, 16) == 1152 + 258 * 15 + 2  # A128, rounded up to 4
    assert engine_plan_capacity(3, 8, 5) == 16  # 15, a multiple of 4


def test_sorted_rows():
    assert sorted_rows(80, 512, 16, sorted_down=False) == 80
    assert sorted_rows(80, 512, 16, sorted_down=True) == 80 + 80 * 15
    assert sorted_rows(1280, 512, 16, sorted_down=True) == 1280 + 513 * 15


@settings(max_examples=100, deadline=None)
@given(E=st.integers(1, 12), M=st.integers(1, 40), block_m=st.sampled_from([1, 3, 8, 16, 64]), data=st.data())
def test_engine_sized_plans_hold_every_slot(E, M, block_m, data):
    top_k = data.draw(st.integers(1, E))
    ids = torch.tensor([data.draw(st.permutations(range(E)))[:top_k] for _ in range(M)], dtype=torch.int32)
    cap = engine_plan_capacity(M * top_k, E, block_m)
    plan = route_plan(ids, E, block_m, capacity=cap)
    assert plan.sorted_token_ids.numel() == cap >= plan.padded_total
    assert plan.expert_ids.numel() == -(-cap // block_m)
    live = plan.sorted_token_ids[: plan.padded_total].long()
    assert sorted(live[live != M * top_k].tolist()) == list(range(M * top_k))
    assert torch.all(plan.expert_ids[plan.padded_total // block_m:] == -1)


def test_a_plan_smaller_than_its_padded_total_is_refused():
    with pytest.raises(ValueError, match="below the padded total"):
        route_plan(torch.tensor([[0], [1], [2]], dtype=torch.int32), 3, 4, capacity=8)


# ---- the shipped tables ------------------------------------------------------------------------


def test_shipped_tables_name_the_engine_and_its_files():
    t = load_engine_tables()
    assert (t.engine, t.version) == ("sglang", "0.5.23") and len(t.sha256) == 64
    sources = {tab.source for tab in t.tables.values()}
    assert all(s.startswith("sglang 0.5.23: sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_")
               for s in sources)
    assert (TableKey("NVIDIA_H200", 512, 128, True), "3.6.0") in t.tables


def test_h200_q8_takes_the_tuned_down_table_with_tma():
    plan = resolve(H200, E=512, N=128, M=8, K=2048, top_k=10)
    assert plan.up.config == TritonMoeConfig(16, 64, 128, 16, 4, 5, False)
    assert plan.down.config == TritonMoeConfig(16, 128, 64, 1, 4, 3, True)
    assert plan.up.swap_ab and plan.down.swap_ab and plan.down.tma and plan.up.pdl_early
    assert plan.identity["up_table_triton"] == plan.identity["down_table_triton"] == "3.6.0"


def test_h200_a8_falls_back_to_the_triton_3_3_1_table_and_reuses_it_for_the_down_gemm():
    plan = resolve(H200, E=257, N=128, M=8, K=7168, top_k=9)
    assert plan.identity["up_table_triton"] == "3.3.1" and "down_note" in plan.identity
    assert plan.up.config == plan.down.config == TritonMoeConfig(16, 128, 128, 32, 4, 4, False)
    assert not plan.sorted_down and plan.up.swap_ab


def test_a_gpu_without_tables_gets_the_default():
    plan = resolve(Device("NVIDIA GB300", (10, 3), "3.6.0", True), E=257, N=128, M=8, K=7168, top_k=9)
    assert plan.identity["config_source"] == "default" and plan.up.config == DEFAULT_CONFIG


@pytest.mark.parametrize("entry, message", [
    ({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "USE_TMA": 1}, "true or false"),
    ({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 96, "GROUP_SIZE_M": 1}, "power of two"),
])
def test_bad_entries_are_user_errors(entry, message):
    with pytest.raises(UserError, match=message):
        parse_entry(entry, "here")
