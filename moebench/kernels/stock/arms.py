"""Arms `triton`, `triton-default`, `triton-swapab`, `triton-tuned`: the stock five-kernel FP8 block-scale path.

`triton` is the path as the serving engines launch it on the GPU at hand (engine_config.py
states their rules): the tuned config tables the engine ships for this device and Triton
version (up and down GEMM), the engine's route-plan sizing, swap-AB by the engine's rule, TMA
loads where a table entry asks for them, and PDL on SM90. `--triton-config FILE` replaces the
tables with a file of per-M configs in the engines' format (one entry for both GEMMs, as the
engines' own override does); `--triton-config default` forces the engines' untuned default.

`triton-default` is that path with the engines' untuned default config (BM 64, BN 128, BK 128,
group-M 32, 4 warps, 3 stages): what an engine runs on a GPU it has no table for.

`triton-swapab` applies the swap-AB block-shape test on every device (the engines add the
SM90 condition), so the interpreter and non-SM90 GPUs run the swapped kernels; where no table
exists it falls back to the small-batch config BM 16 rather than BM 64. On an SM90 GPU with
tables it launches what `triton` launches.

`triton-tuned` is the path with the tables `moebench tune` wrote for this GPU and Triton
(`--tuned DIR`, moebench.kernels.stock.tuned_tables), looked up as the engines look theirs up.

This module imports without Triton: availability is reported by `unavailable_reason`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, RoutePlan, engine_plan_capacity, route_plan
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.stock.engine_config import (DEFAULT_CONFIG, SWAP_AB_RULE, ConfigTable, Device, StockPlan,
                                                  TritonMoeConfig, load_config_file, resolve, sorted_rows, stock_plan,
                                                  swap_ab_rule)

KERNEL_MODULE = "moebench.kernels.stock.moe"
# Every module of @triton.jit functions, in import order (each imports the ones before it).
KERNEL_MODULES = ("moebench.kernels.stock.rounding", "moebench.kernels.stock.moe_gemm", KERNEL_MODULE)
QUANT_GROUP = 128

STOCK_CONFIG = DEFAULT_CONFIG  # vLLM/SGLang get_default_config, fp8_w8a8 with block_shape [128, 128]
SWAPAB_DEFAULT_CONFIG = TritonMoeConfig(BLOCK_SIZE_M=16, GROUP_SIZE_M=1)  # small-M H200 config


def swap_ab_selected(config: TritonMoeConfig) -> bool:
    """The engines' block-shape test for swap-AB, on SM90 (see engine_config.swap_ab_rule)."""
    return swap_ab_rule(config, on_sm90=True)


# ----------------------------------------------------------------------------------------------
# The interpreter switch: @triton.jit reads TRITON_INTERPRET when the kernel module is imported.
# ----------------------------------------------------------------------------------------------


def interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def use_interpreter(on: bool) -> None:
    """Run (on=True) or stop running the Triton kernels on the CPU interpreter, from now on."""
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)


def kernels_module():
    """The kernel module, defined under the interpreter setting now in force: imported, or
    re-imported when it was defined under the other setting."""
    module = sys.modules.get(KERNEL_MODULE)
    if module is None:
        return importlib.import_module(KERNEL_MODULE)
    if module.INTERPRETED != interpreter_requested():
        for name in KERNEL_MODULES:
            importlib.reload(importlib.import_module(name))
        module = sys.modules[KERNEL_MODULE]
    return module


def _kernel_source_sha256() -> str:
    """SHA-256 over the kernel modules' files, in order."""
    h = hashlib.sha256()
    for name in KERNEL_MODULES:
        h.update(Path(__file__).with_name(name.rpartition(".")[2] + ".py").read_bytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# The arms.
# ----------------------------------------------------------------------------------------------


def _decl(label: str, name: str) -> KernelDecl:
    # Triton 3.x reports the bare function name; older releases appended a signature suffix.
    return KernelDecl(label, rf"^{name}(?:_\w+)?$", 1)


TRITON_KERNELS = (
    _decl("gemm1", "moebench_moe_gemm1"),
    _decl("silu_and_mul", "moebench_moe_silu_and_mul"),
    _decl("per_token_group_quant", "moebench_moe_act_quant"),
    _decl("gemm2", "moebench_moe_gemm2"),
    _decl("combine", "moebench_moe_combine"),
)


def device_of(device: torch.device) -> Device:
    """What the engines' rules read off the device; off the GPU a stand-in with no SM90 and no PDL."""
    import triton

    from moebench.kernels.stock.moe import tensor_descriptors_available
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name, cap = torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)
    else:
        name, cap = "cpu", (0, 0)
    return Device(name, tuple(cap), triton.__version__, tensor_descriptors_available())


def parse_triton_config(value) -> str | None:
    """`--triton-config`: None or "auto" (the engine's tables), "default", or a file's path."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    return str(value)


class TritonMoeArm(Arm):
    """GEMM1, SwiGLU, FP8 requant, GEMM2 with the route weight, top-k combine: five launches."""

    fallback_config: TritonMoeConfig = STOCK_CONFIG  # where no table exists
    swap_on_any_device: bool = False
    tables_only_default: bool = False  # triton-default: never read the tables

    def __init__(self, triton_config: str | Path | None = None, pdl: bool = True):
        choice = parse_triton_config(triton_config)
        self.pdl = bool(pdl)
        self.force_default = choice == "default" or (choice is None and self.tables_only_default)
        self.override: ConfigTable | None = None
        if choice not in (None, "default"):
            self.override = load_config_file(choice)

    def unavailable_reason(self, device: torch.device) -> str | None:
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed"
        device = torch.device(device)
        if device.type == "cpu":
            if interpreter_requested():
                return None
            return "no CUDA device for Triton; --interpret runs the kernels on the CPU interpreter"
        if device.type != "cuda":
            return f"Triton arms run on CUDA devices, not {device.type}"
        if not torch.cuda.is_available():
            return "no CUDA device"
        if interpreter_requested():
            return "TRITON_INTERPRET=1 is set: the interpreter runs on CPU tensors only here"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return f"FP8 tl.dot needs sm_89 or newer, this GPU is sm_{major}{minor}"
        return None

    def plan(self, fx: Fixture) -> StockPlan:
        spec = fx.spec
        return resolve(device_of(fx.device), E=spec.E, N=spec.N // 2, M=fx.M, K=spec.K, top_k=spec.top_k,
                       override=self.override, force_default=self.force_default,
                       swap_on_any_device=self.swap_on_any_device, pdl=self.pdl, default=self.fallback_config)

    def prepare(self, fx: Fixture) -> PreparedCall:
        reason = self.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {self.name!r} cannot run here: {reason}")
        call, _, _ = stock_call(fx, self.plan(fx), self.name,
                                swap_rule_note=" (the SM90 condition dropped)" if self.swap_on_any_device else "")
        if fx.device.type == "cuda":  # compile all five now, untimed
            call.run()
            torch.cuda.synchronize(fx.device)
        return call


def stock_call(fx: Fixture, plan: StockPlan, arm: str, ws: StockWorkspace | None = None,
               swap_rule_note: str = "") -> tuple[PreparedCall, object, object]:
    """The stock path launched as `plan` says, on `ws` (made here when None; it must be a
    workspace of the plan's block_m and layout): the prepared call, and its two GEMMs alone
    (`moebench tune` times them one by one). Nothing is launched here."""
    tm = kernels_module()
    up, down = plan.up, plan.down
    if ws is None:
        ws = stock_workspace(fx, plan.block_m, plan.sorted_down)
    elif ws.block_m != plan.block_m or ws.sorted != plan.sorted_down:
        raise ValueError("the workspace is not one of this plan's block_m and layout")
    w1, w2 = fx.w1.contiguous(), fx.w2.contiguous()
    up_cfg, down_cfg = up.config.as_dict(), down.config.as_dict()
    # Tensor descriptors, made once (the engines cache the weights'): boxes [1, BN, BK], [BM, BK].
    w1_desc = tm.tensor_descriptor(w1, [1, up_cfg["BLOCK_SIZE_N"], up_cfg["BLOCK_SIZE_K"]]) if up.tma else None
    w2_desc = tm.tensor_descriptor(w2, [1, down_cfg["BLOCK_SIZE_N"], down_cfg["BLOCK_SIZE_K"]]) if down.tma else None
    a2_desc = tm.tensor_descriptor(ws.act_q, [plan.block_m, down_cfg["BLOCK_SIZE_K"]]) if down.tma else None
    if (up.tma or down.tma) and fx.device.type == "cuda":
        tm.set_tma_allocator()
    x, x_scale = fx.x_fp8.contiguous(), fx.x_scale.contiguous()
    w1_scale, w2_scale = fx.w1_scale.contiguous(), fx.w2_scale.contiguous()
    route_weights, top_k, plan_args = ws.route_weights, fx.spec.top_k, ws.plan_args
    h, act_q, act_scale, y_slots, in_plan_order = ws.h, ws.act_q, ws.act_scale, ws.y_slots, ws.sorted

    def gemm1() -> None:
        tm.launch_moe_gemm(tm.moebench_moe_gemm1, x, x_scale, w1, w1_scale, h, route_weights, *plan_args,
                           a_row_div=top_k, mul_route_weight=False, swap_ab=up.swap_ab, config=up_cfg,
                           c_sorted=in_plan_order, w_desc=w1_desc, pdl=up.pdl, pdl_early=up.pdl_early)

    def gemm2() -> None:
        tm.launch_moe_gemm(tm.moebench_moe_gemm2, act_q, act_scale, w2, w2_scale, y_slots,
                           route_weights, *plan_args, a_row_div=1, mul_route_weight=True, swap_ab=down.swap_ab,
                           config=down_cfg, a_sorted=in_plan_order, a_desc=a2_desc, w_desc=w2_desc,
                           pdl=down.pdl, pdl_early=down.pdl_early)

    import triton
    identity = {
        **plan.identity,
        "config": up_cfg, "down_config": down_cfg,
        "swap_ab": up.swap_ab, "down_swap_ab": down.swap_ab,
        "swap_ab_rule": SWAP_AB_RULE + swap_rule_note,
        "tma": up.tma, "down_tma": down.tma, "pdl": up.pdl, "pdl_early": up.pdl_early,
        "down_pdl_early": down.pdl_early, **ws.identity,
        "triton": triton.__version__,
        "interpreted": bool(tm.INTERPRETED),
        "kernel_source_sha256": _kernel_source_sha256(),
    }
    call = PreparedCall(arm=arm, run=ws.path(gemm1, gemm2), output=ws.out, kernels=TRITON_KERNELS,
                        identity=identity, oracle="bf16-intermediates", workspace=ws)
    return call, gemm1, gemm2


@dataclass
class StockWorkspace:
    """What a prepared stock-path call owns besides its weights: the route plan, sized as the
    engines size it, and the intermediates, in slot order or (`sorted`) in route-plan order.
    Everything run() touches is made here, once: the timed call creates no tensor, not a view."""

    plan: RoutePlan
    sorted: bool
    route_weights: torch.Tensor  # [S] fp32
    h: torch.Tensor  # [rows, N] bf16: GEMM1's output
    act: torch.Tensor  # [rows, I] bf16: silu(gate) * up
    act_q: torch.Tensor  # [rows, I] e4m3, and its scales act_scale [rows, I/128]
    act_scale: torch.Tensor
    y: torch.Tensor  # [M, top_k, K] bf16: GEMM2's output, y_slots its [S, K] view
    y_slots: torch.Tensor
    out: torch.Tensor  # [M, K] bf16

    @property
    def block_m(self) -> int:
        return int(self.plan.block_m)

    @property
    def plan_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.plan.sorted_token_ids, self.plan.expert_ids, self.plan.num_tokens_post_padded

    @property
    def row_plan(self):
        """What the row kernels read in plan order: sorted slots, padded total, slot count."""
        return (self.plan.sorted_token_ids, self.plan.num_tokens_post_padded, self.plan.num_slots) \
            if self.sorted else None

    @property
    def identity(self) -> dict:
        return {"sorted_intermediate": self.sorted, "route_plan_capacity": int(self.plan.sorted_token_ids.numel()),
                "intermediate_rows": int(self.h.shape[0])}

    def path(self, gemm1, gemm2):
        """run(): GEMM1, SwiGLU, requant, GEMM2, combine, with the two GEMMs given."""
        tm = kernels_module()
        h, act, act_q, act_scale, y, out, row_plan = (self.h, self.act, self.act_q, self.act_scale, self.y,
                                                      self.out, self.row_plan)

        def run() -> None:
            gemm1()
            tm.launch_silu_and_mul(h, act, row_plan)
            tm.launch_act_quant(act, act_q, act_scale, row_plan)
            gemm2()
            tm.launch_combine(y, out)
        return run


def stock_workspace(fx: Fixture, block_m: int, sorted_down: bool) -> StockWorkspace:
    """Untimed: the route plan built on the host and moved once, every buffer allocated."""
    spec = fx.spec
    S = fx.M * spec.top_k
    plan = route_plan(fx.topk_ids, spec.E, block_m, capacity=engine_plan_capacity(S, spec.E, block_m))
    rows = sorted_rows(S, spec.E, block_m, sorted_down)
    b = kernels_module().allocate_buffers(fx.M, spec.top_k, spec.K, spec.N, fx.device, rows=rows)
    return StockWorkspace(plan.to(fx.device), sorted_down, fx.topk_weights.contiguous().reshape(-1), b["h"], b["act"],
                          b["act_q"], b["act_scale"], b["y"], b["y"].view(S, spec.K), b["out"])


@register_arm("triton")
class StockTritonArm(TritonMoeArm):
    description = ("stock Triton path as the engines launch it here: their tuned tables (up and down), plan "
                   "sizing, swap-AB rule, TMA and PDL")


@register_arm("triton-default")
class DefaultTritonArm(TritonMoeArm):
    description = "stock Triton path with the engines' untuned default config (BM64/BN128/BK128, group-M 32)"
    tables_only_default = True


@register_arm("triton-swapab")
class SwapABTritonArm(TritonMoeArm):
    description = "stock Triton path with the swap-AB rule on any device (BM 16 where no table exists)"
    fallback_config = SWAPAB_DEFAULT_CONFIG
    swap_on_any_device = True

    def default_skip_reason(self, device: torch.device) -> str | None:
        device = torch.device(device)
        if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
            return "launches what `triton` launches on SM90"
        return None


@register_arm("triton-tuned")
class TunedTritonArm(TritonMoeArm):
    """The stock path with the tables `moebench tune` wrote (`--tuned DIR|FILE`): the engines'
    lookup (nearest M key, the down entry's BLOCK_SIZE_M forced to the up entry's) over the tuned
    up and down tables for this GPU and Triton version; the identity names the files and keys."""

    description = "stock Triton path with the tables `moebench tune` wrote for this GPU (--tuned DIR)"

    def __init__(self, tuned: str | Path | None = None, pdl: bool = True):
        super().__init__(None, pdl)
        self.tuned = None if tuned is None else str(tuned)

    def unavailable_reason(self, device: torch.device) -> str | None:
        if self.tuned is None:
            return "needs --tuned DIR (a folder `moebench tune` wrote, or one of its table files)"
        return super().unavailable_reason(device)

    def plan(self, fx: Fixture) -> StockPlan:
        from moebench.kernels.stock.tuned_tables import load_tuned
        spec, device = fx.spec, device_of(fx.device)
        tables = load_tuned(self.tuned, spec.E, spec.N // 2, device.name, device.triton_version)
        identity, up, down = tables.select(fx.M)
        identity = {"triton_version": device.triton_version, "device_name": device.name, **identity}
        return stock_plan(device, up, down, M=fx.M, E=spec.E, top_k=spec.top_k, identity=identity, pdl=self.pdl)
