"""CPU tests of the CUDA build layer and the CUDA arms' host logic (no GPU needed)."""

from __future__ import annotations

import json
import re

import pytest

cuda_core = pytest.importorskip("cuda.core")

from moebench.errors import UserError  # noqa: E402
from moebench.kernels.cuda import nvrtc as cuda_build  # noqa: E402
from moebench.kernels.cuda import launch as cuda_launch  # noqa: E402
from moebench.kernels.cuda.nvrtc import (CudaBuildError, build_key, compile_source,  # noqa: E402
                                         parse_ptxas_log)

TINY = r'''
#include "sm90_common.cuh"
extern "C" __global__ void tiny(float* out) {
#ifdef SCALE
  out[threadIdx.x] = SCALE * threadIdx.x;
#else
  out[threadIdx.x] = threadIdx.x;
#endif
}
'''


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    yield tmp_path / "cuda"
    cuda_build.clear_memo()


def test_compile_records_resources_without_gpu(cache):
    m = compile_source(TINY)
    b = m.build
    assert b.arch == "sm_90a" and not m.cache_hit
    assert set(b.resources) == {"tiny"}
    r = b.resources["tiny"]
    assert r.registers > 0 and r.spill_stores == 0 and r.spill_loads == 0
    assert len(b.build_hash) == 64 and len(b.binary_sha256) == 64
    d = json.loads(b.to_json())
    assert d["build_hash"] == b.build_hash and d["resources"]["tiny"]["registers"] == r.registers


def _without_log_resources(m):
    """The module as NVRTC 13.0 on the H200 machine left some builds: no ptxas log, no resources."""
    from dataclasses import replace
    return cuda_build.CudaModule(replace(m.build, resources={}), m.cubin, m.symbol_mapping, "")


def test_resources_without_a_ptxas_log_come_from_the_loaded_kernel(cache, monkeypatch):
    m = _without_log_resources(compile_source(TINY))

    class Attrs:
        num_regs, local_size_bytes, shared_size_bytes = 40, 24, 0

    class Kernel:
        attributes = Attrs()

    seen = []
    monkeypatch.setattr(m, "kernel", lambda name, device=None: seen.append((name, device)) or Kernel())
    r = m.resources("tiny", 3)
    assert seen == [("tiny", 3)]
    assert (r.registers, r.stack_bytes, r.spill_stores, r.spill_loads, r.source) == (40, 24, 24, 24, "driver")
    Attrs.local_size_bytes = 0
    assert m.resources("tiny").spill_stores == 0


KERNELS = r'''
__device__ __noinline__ float twice(float x) { return 2.f * x; }
extern "C" __global__ void first(float* out) { out[threadIdx.x] = twice(out[threadIdx.x]); }
extern "C" __global__ void second(float* out) { out[threadIdx.x] = 0.f; }
template <int N> __global__ void scaled(float* out) { out[threadIdx.x] *= N; }
'''


def test_a_module_lists_its_kernels_from_the_cubin_with_or_without_the_log(cache):
    m = compile_source(KERNELS, name_expressions=("scaled<3>",), name="k.cu")
    assert m.entries == {"first", "second", m.mangled("scaled<3>")} and m.mangled("scaled<3>") != "scaled<3>"
    bare = _without_log_resources(m)  # what made a build of the decode file look like it lacked a kernel
    assert bare.build.resources == {} and bare.entries == m.entries
    for module in (m, bare):
        cuda_build.need_kernels(module, ("first", "scaled<3>"), "k.cu", "test launch")
        with pytest.raises(UserError, match=r"^k.cu: no third kernel, which this tree's test launch runs; "
                                            r"build a copy of k.cu that has it$"):
            cuda_build.need_kernels(module, ("first", "third"), "k.cu", "test launch")


def test_the_build_command_lists_every_kernel_of_the_cubin(cache, tmp_path, monkeypatch):
    from result_factory import run_cli
    src = tmp_path / "k.cu"
    src.write_text(KERNELS)
    code, out, _ = run_cli(["build", "--source", str(src)])
    assert code == 0 and re.search(r"first +│ +\d+ +│ +0 +│ +0/0 +│ +0 ", out), out
    assert re.search(r"second +│ +\d+ ", out), out
    assert "no ptxas log" not in out
    from moebench.cli import build_cmd
    modules = build_cmd.compiled_modules
    monkeypatch.setattr(build_cmd, "compiled_modules",
                        lambda *a: [(label, _without_log_resources(m)) for label, m in modules(*a)])
    code, out, _ = run_cli(["build", "--source", str(src)])
    assert code == 0 and re.search(r"first +│ +— +│ +— +│ +— +│ +— ", out), out
    assert "NVRTC returned no ptxas log" in out, out


def test_entry_kernels_refuses_what_is_not_a_cubin():
    with pytest.raises(ValueError, match="not an ELF64 cubin"):
        cuda_build.entry_kernels(b"// source text, not a cubin")


def test_cache_hit_miss_and_corrupt_entry(cache):
    first = compile_source(TINY)
    cuda_build.clear_memo()
    again = compile_source(TINY)
    assert again.cache_hit and again.build == first.build and again.cubin == first.cubin
    # a corrupt cubin (sha mismatch) is rebuilt, not loaded
    (cache / f"{first.build.build_hash}.cubin").write_bytes(b"garbage")
    cuda_build.clear_memo()
    rebuilt = compile_source(TINY)
    assert not rebuilt.cache_hit and rebuilt.cubin == first.cubin
    # unparsable metadata too
    (cache / f"{first.build.build_hash}.json").write_text("{not json")
    cuda_build.clear_memo()
    assert not compile_source(TINY).cache_hit
    cuda_build.clear_memo()
    assert compile_source(TINY).cache_hit
    leftovers = [p.name for p in cache.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_key_changes_with_defines_flags_and_headers(cache):
    base = compile_source(TINY).build.build_hash
    assert compile_source(TINY, defines={"SCALE": "2.0f"}).build.build_hash != base
    assert compile_source(TINY, extra_flags=("-lineinfo",)).build.build_hash != base
    h = {"sm90_common.cuh": "x"}
    k1 = build_key("s", h, ("-a",), {}, "sm_90a", "13.0")
    assert build_key("s", {"sm90_common.cuh": "y"}, ("-a",), {}, "sm_90a", "13.0") != k1
    assert build_key("s", h, ("-a",), {}, "sm_90a", "13.1") != k1
    assert build_key("s", h, ("-a",), {}, "sm_100a", "13.0") != k1
    assert build_key("s", h, ("-a",), {"A": "1"}, "sm_90a", "13.0") != k1


def test_compile_error_carries_the_log(cache):
    with pytest.raises(CudaBuildError, match="sm_90a"):
        compile_source('extern "C" __global__ void broken() { undefined_thing(); }')


def test_unknown_flag_is_refused(cache):
    with pytest.raises(ValueError, match="unsupported NVRTC flag"):
        compile_source(TINY, extra_flags=("--frobnicate",))


def test_parse_ptxas_log():
    log = """ptxas info    : Compiling entry function '_Z3fooILi32EEvPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooILi32EEvPf
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem
ptxas info    : Compiling entry function 'bar' for 'sm_90a'
ptxas info    : Function properties for bar
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""
    r = parse_ptxas_log(log)
    assert r["_Z3fooILi32EEvPf"].registers == 40 and r["_Z3fooILi32EEvPf"].spill_loads == 12
    assert r["_Z3fooILi32EEvPf"].wgmma_serialized == r["bar"].wgmma_serialized == ""
    assert r["_Z3fooILi32EEvPf"].stack_bytes == 8 and r["_Z3fooILi32EEvPf"].shared_bytes == 128
    assert r["bar"].registers == 8 and r["bar"].shared_bytes == 0


def test_parse_ptxas_log_names_the_kernels_whose_wgmma_ptxas_serialized():
    # ptxas's notes come before the entries they name; a serialization outranks an injected wait
    log = """ptxas info    : (C7517) warpgroup.wait is injected in around line 6594 by compiler to allow use of \
registers defined by GMMA in function 'k_b'
ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized \
due to program dependence on compiler-inserted WG.DP in divergent path in the function 'k_b'
ptxas info    : (C7517) wgmma.wait_group is injected in around line 72 by compiler to allow use of \
registers defined by GMMA in function 'k_c'
ptxas info    : Compiling entry function 'k_a' for 'sm_90a'
ptxas info    : Function properties for k_a
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 90 registers, used 1 barriers
ptxas info    : Compiling entry function 'k_b' for 'sm_90a'
ptxas info    : Function properties for k_b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers
ptxas info    : Compiling entry function 'k_c' for 'sm_90a'
ptxas info    : Function properties for k_c
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 0 barriers
"""
    r = parse_ptxas_log(log)
    assert r["k_a"].wgmma_serialized == ""
    assert r["k_b"].wgmma_serialized == ("serialized: program dependence on compiler-inserted WG.DP in "
                                         "divergent path")
    assert r["k_c"].wgmma_serialized == "a wait injected before its registers are used (PTX line 72)"
    assert r["k_b"].registers == 168 and r["k_c"].registers == 96


def test_a_wgmma_read_before_its_wait_shows_in_the_build_record(cache, tmp_path, monkeypatch):
    # ptxas's own note: the accumulators read between the wgmma's issue and the wait for it
    src = r"""#include "sm90_common.cuh"
extern "C" __global__ void __launch_bounds__(128) k(float* out) {
  __shared__ __align__(1024) uint8_t t[64 * 128 + 128 * 128];
  float d[64];
  wgmma_fence();
  Wgmma<128>::mma(d, wgmma_desc_sw128(t), wgmma_desc_sw128(t + 64 * 128), 0);
  wgmma_commit();
  out[threadIdx.x] = d[0];
  wgmma_wait<0>();
  for (int i = 0; i < 64; ++i) out[threadIdx.x + 128 * i] = d[i];
}
"""
    m = compile_source(src, name="serialized_check.cu")
    assert "a wait injected" in m.build.resources["k"].wgmma_serialized, m.log
    f = tmp_path / "serialized_check.cu"
    f.write_text(src)
    from click.testing import CliRunner
    from moebench.cli import cli
    res = CliRunner().invoke(cli, ["build", "--source", str(f)])
    assert res.exit_code == 0, res.output
    assert "k: ptxas took its wgmma's asynchrony (a wait injected" in " ".join(res.output.split())


def test_name_expressions_survive_the_cache(cache):
    src = "template <int N> __global__ void k(float* x) { x[0] = N; }"
    m = compile_source(src, name_expressions=("k<3>",))
    assert m.mangled("k<3>").startswith("_Z")
    cuda_build.clear_memo()
    hit = compile_source(src, name_expressions=("k<3>",))
    assert hit.cache_hit and hit.mangled("k<3>") == m.mangled("k<3>")
    assert hit.resources("k<3>").registers > 0


def test_check_box_rules():
    ok = dict(shape=(512, 7168), strides=(7168, 1), elem_bytes=1)
    cuda_launch.check_box(**ok, box_dim=(64, 128), swizzle="128B")
    with pytest.raises(ValueError, match="swizzle span"):
        cuda_launch.check_box(**ok, box_dim=(64, 256), swizzle="128B")
    with pytest.raises(ValueError, match=r"\[1, 256\]"):
        cuda_launch.check_box(**ok, box_dim=(512, 128), swizzle="128B")
    with pytest.raises(ValueError, match="multiple of 16"):
        cuda_launch.check_box(**ok, box_dim=(64, 8), swizzle="none")
    with pytest.raises(ValueError, match="contiguous"):
        cuda_launch.check_box((512, 7168), (1, 512), 1, (64, 128), "128B")


def test_kernel_attributes_are_set_once_and_never_taken_from_another_kernel(monkeypatch):
    from types import SimpleNamespace

    from cuda.bindings import driver
    calls = []

    def fake_set(handle, attr, value):  # cuFuncSetAttribute(hfunc, attrib, value)
        calls.append((int(attr), value, handle))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuFuncSetAttribute", fake_set)
    monkeypatch.setattr(cuda_launch, "_KERNEL_ATTRS", {})
    k = SimpleNamespace(handle="function-1")
    cuda_launch.set_cluster_policy(k, "load-balancing", 0)
    cuda_launch.set_cluster_policy(k, "load-balancing", 0)  # already set: no call
    cuda_launch.set_cluster_policy(k, "default", 0)
    assert [v for _, v, _ in calls] == [2, 0]
    cuda_launch.raise_shared_limit(k, 100_000, 0)
    cuda_launch.raise_shared_limit(k, 60_000, 0)  # less than allowed already: no call
    cuda_launch.raise_shared_limit(k, 150_000, 0)
    assert [v for _, v, _ in calls[2:]] == [100_000, 150_000]
    # an entry whose kernel is not this one (a newer kernel with the same id) is set again
    other = SimpleNamespace(handle="function-2")
    key = (id(k), 0, int(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE))
    cuda_launch._KERNEL_ATTRS[key] = (other, 0)
    cuda_launch.set_cluster_policy(k, "default", 0)
    assert calls[-1][1:] == (0, "function-1")
    # a library kernel (CUkernel) is set per device
    seen = []
    monkeypatch.setattr(driver, "cuKernelSetAttribute", lambda attr, value, handle, dev: (
        seen.append((int(attr), value, int(dev))) or (driver.CUresult.CUDA_SUCCESS,)))
    lib = SimpleNamespace(handle=driver.CUkernel())
    cuda_launch.raise_shared_limit(lib, 120_000, 1)
    cuda_launch.set_cluster_policy(lib, "spread", 1)
    assert [(v, d) for _, v, d in seen] == [(120_000, 1), (1, 1)]
    # and a refusal is one clear error
    monkeypatch.setattr(driver, "cuFuncSetAttribute",
                        lambda handle, attr, value: (driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(RuntimeError, match="cluster scheduling policy 'spread'"):
        cuda_launch.set_cluster_policy(k, "spread", 0)


@pytest.mark.parametrize("source", sorted(p.name for p in cuda_build.KERNELS_DIR.glob("*.cu")))
def test_every_cuda_source_compiles_for_sm90a_without_spills(cache, source):
    m = compile_source(source)
    assert m.build.resources, f"{source}: no kernels"
    for kernel, r in m.build.resources.items():
        assert r.spill_stores == 0 and r.spill_loads == 0, f"{source}:{kernel} spills"
        assert r.stack_bytes == 0, f"{source}:{kernel} uses a stack frame (local memory)"
        assert r.wgmma_serialized == "", f"{source}:{kernel}: ptxas serialized its wgmma ({r.wgmma_serialized})"


# ---------------------------------------------------------------- cuda-gemm / cuda-swapab host logic

from moebench.kernels.cuda import arms as cuda_arms  # noqa: E402
from moebench.kernels.cuda.arms import (CUDA_GEMM, CUDA_SWAPAB, GemmConfig,  # noqa: E402
                                        gemm2_target_steps, gemm_grid, swiglu_grid, tiles_per_cta)


@pytest.mark.parametrize("cfg", [CUDA_GEMM, CUDA_SWAPAB, GemmConfig(True, 8), GemmConfig(True, 24),
                                 GemmConfig(True, 32, stages=4), GemmConfig(True, 48)])
def test_host_shared_bytes_match_the_kernel_layout(cache, cfg):
    src = f'#include "sm90_grouped_gemm.cu"\nstatic_assert(SMEM_BYTES == {cfg.shared_bytes()}, "host/device smem");\n'
    compile_source(src, defines=cfg.defines(), name="smem_check.cu")  # fails to compile if they differ
    assert cfg.shared_bytes() <= 227 * 1024


def test_arms_differ_only_in_operand_placement():
    a, b = CUDA_GEMM.defines(), CUDA_SWAPAB.defines()
    assert a.keys() == b.keys() and a["STAGES"] == b["STAGES"]
    assert (a["SWAP_AB"], b["SWAP_AB"]) == ("0", "1")
    assert CUDA_GEMM.block_t == 64  # the 64-row slot holds tokens: a block is 64 slots
    with pytest.raises(ValueError):
        GemmConfig(swap_ab=False, block_t=16)
    with pytest.raises(ValueError):
        GemmConfig(swap_ab=True, block_t=12)


def test_grid_sizes():
    # GEMM1, DeepSeek slice: N=256 rows = 4 tiles, K=7168 = 56 steps: one tile per CTA
    assert gemm_grid(57, 256, 7168) == ((57, 4, 1), 1)
    # GEMM2: K=7168 rows = 112 tiles, one 128-K step each: 8 tiles per CTA
    assert gemm_grid(57, 7168, 128) == ((57, 14, 1), 8)
    assert gemm_grid(74, 2048, 128) == ((74, 4, 1), 8)  # Qwen slice
    assert tiles_per_cta(6, 1) == 6 and tiles_per_cta(10, 1) == 5 and tiles_per_cta(4, 16) == 1
    assert tiles_per_cta(4, 3) == 2  # 2 tiles x 3 steps <= 8
    with pytest.raises(ValueError):
        gemm_grid(1, 100, 128)
    assert swiglu_grid(72, 128) == (18, 1, 1) and swiglu_grid(73, 256) == (37, 1, 1)


@pytest.mark.parametrize("wave", [396, 528])  # 3 or 4 swapab CTAs an SM on 132 SMs
def test_gemm2_steps_rule_matches_the_h200_experiment(wave):
    # route-plan blocks of 16 at the fixtures: A8 57, Q8 74, A128 262, Q128 462 (K, I)
    # measured: 16 steps won at A8, A128, Q128 and lost at Q8
    assert gemm2_target_steps(57, 7168, 128, wave) == 16  # 798 CTAs at 8 steps: > a wave
    assert gemm2_target_steps(74, 2048, 128, wave) == 8  # 296 CTAs at 8 steps: one wave
    assert gemm2_target_steps(262, 7168, 128, wave) == 16
    assert gemm2_target_steps(462, 2048, 128, wave) == 16
    assert gemm2_target_steps(1, 2048, 128, wave) == 8  # M=1: a handful of CTAs
    # the grid the rule picks at 16 steps: half the CTAs, each twice as long
    assert gemm_grid(57, 7168, 128, 16) == ((57, 7, 1), 16)


def test_weight_descriptor_box():
    assert cuda_arms.weight_box() == (64, 128)
    cuda_launch.check_box((257 * 256, 7168), (7168, 1), 1, cuda_arms.weight_box(), "128B")
    cuda_launch.check_box((257 * 7168, 128), (128, 1), 1, cuda_arms.weight_box(), "128B")


@pytest.mark.parametrize("block_t", [16, 64])
def test_plan_handling_covers_every_slot_once(block_t):
    import torch
    from moebench.fixtures import route_plan
    # edge routes: M=1; one hot expert; empty experts; M not a multiple of block_t
    cases = [torch.tensor([[3, 5]]), torch.tensor([[0, 1]] * 37), torch.tensor([[7, 2], [2, 7], [6, 2]])]
    for ids in cases:
        plan = route_plan(ids, 8, block_t)
        grid, _ = gemm_grid(plan.num_blocks, 256, 256)
        assert grid[0] == plan.num_blocks and plan.padded_total % block_t == 0
        covered = plan.sorted_token_ids[: grid[0] * block_t]
        real = covered[covered < plan.sentinel]
        assert sorted(real.tolist()) == list(range(ids.numel()))
        assert (plan.expert_ids[: grid[0]] >= 0).all()
        for b in range(grid[0]):  # every slot of a block belongs to that block's expert
            slots = plan.sorted_token_ids[b * block_t:(b + 1) * block_t]
            slots = slots[slots < plan.sentinel]
            assert (ids.reshape(-1)[slots.long()] == plan.expert_ids[b]).all()


def test_cuda_arms_are_registered_and_say_why_not_on_cpu():
    import torch
    from moebench.kernels.registry import load_builtin_arms
    arms = load_builtin_arms()
    for name in ("cuda-gemm", "cuda-swapab"):
        arm = arms[name]()
        assert arm.unavailable_reason(torch.device("cpu"))
        assert [k.label for k in cuda_arms.KERNELS] == ["gemm1", "swiglu_quant", "gemm2"]  # combine in gemm2


def test_tensor_map_api_is_importable():
    smv, l2, sw = cuda_launch._tensor_map_api()
    assert hasattr(smv, "as_tensor_map") and hasattr(sw, "SWIZZLE_128B") and hasattr(l2, "L2_256B")
