"""Arms `triton` and `triton-swapab`: the stock five-kernel FP8 block-scale path of triton_moe.

Configs come in the serving engines' format: a JSON object of per-M configs keyed by the
number of tokens M, {"1": {"BLOCK_SIZE_M": 16, ...}, "64": {...}}, the entry for a fixture
being the key nearest to its M, the first such key in file order on a tie (the engines'
`min(keys, key=lambda k: abs(k - M))`). Without a file the engines' default for FP8
block-scale weights applies (BM 64, BN 128, BK 128, group-M 32, 4 warps, 3 stages).

Swap-AB is selected as SGLang selects it for its fused MoE Triton kernel
(`should_enable_swap_ab`, fused_moe_triton_kernels.py; vLLM PR #36559 uses the same test):
FP8 W8A8, BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64, on SM90. The `triton-swapab` arm applies
the block-shape test on every device, so the interpreter covers the swapped kernels; the
engines add the SM90 condition, which the H200 meets. With the stock BM 64 the test fails, so
`triton-swapab` defaults to the engines' small-batch H200 config, BM 16 (the config of vLLM's
swap-AB H200 benchmarks), and records in its identity whether the swap is on.

This module imports without Triton: availability is reported by `unavailable_reason`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, route_plan
from moebench.kernels.arm import Arm, KernelDecl, PreparedCall, register_arm

KERNEL_MODULE = "moebench.kernels.triton_moe"
QUANT_GROUP = 128
SWAP_AB_RULE = "BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 (SGLang should_enable_swap_ab; the engines also require SM90)"


@dataclass(frozen=True)
class TritonMoeConfig:
    """One entry of an engine config file: tile shape, launch shape."""

    BLOCK_SIZE_M: int = 64
    BLOCK_SIZE_N: int = 128
    BLOCK_SIZE_K: int = 128
    GROUP_SIZE_M: int = 32
    num_warps: int = 4
    num_stages: int = 3

    def validate(self, where: str) -> None:
        def pow2(v: int) -> bool:
            return v > 0 and v & (v - 1) == 0
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, name)
            if not pow2(v) or v < 16:
                raise UserError(f"{where}: {name}={v} must be a power of two >= 16 (tl.dot needs 16)")
        if QUANT_GROUP % self.BLOCK_SIZE_K:
            raise UserError(f"{where}: BLOCK_SIZE_K={self.BLOCK_SIZE_K} must divide the scale group {QUANT_GROUP}")
        if self.GROUP_SIZE_M < 1:
            raise UserError(f"{where}: GROUP_SIZE_M must be >= 1")
        if not pow2(self.num_warps) or self.num_warps > 16:
            raise UserError(f"{where}: num_warps={self.num_warps} must be a power of two <= 16")
        if self.num_stages < 1:
            raise UserError(f"{where}: num_stages must be >= 1")

    def as_dict(self) -> dict:
        return asdict(self)


STOCK_CONFIG = TritonMoeConfig()  # vLLM/SGLang get_default_config, fp8_w8a8 with block_shape [128, 128]
SWAPAB_DEFAULT_CONFIG = TritonMoeConfig(BLOCK_SIZE_M=16, GROUP_SIZE_M=1)  # small-M H200 config

_CONFIG_KEYS = {f for f in TritonMoeConfig.__dataclass_fields__}
_REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")


@dataclass(frozen=True)
class ConfigFile:
    path: str
    sha256: str
    entries: tuple[tuple[int, TritonMoeConfig], ...]  # in file order

    def select(self, M: int) -> tuple[int, TritonMoeConfig]:
        """The entry whose key is nearest to M; the first in file order on a tie."""
        return min(self.entries, key=lambda kv: abs(kv[0] - M))


def load_config_file(path: str | Path) -> ConfigFile:
    """Per-M configs in the engines' JSON format; every mistake is a UserError naming the file."""
    where = f"Triton config {str(path)!r}"
    try:
        raw_bytes = Path(path).read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {where}: {err.strerror or err}") from None
    try:
        data = json.loads(raw_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{where} is not valid JSON: {err}") from None
    if not isinstance(data, dict) or not data:
        raise UserError(f'{where}: expected an object of per-M configs, like {{"1": {{"BLOCK_SIZE_M": 16, ...}}}}')
    entries = []
    for key, entry in data.items():
        here = f"{where}, entry {key!r}"
        if not (isinstance(key, str) and key.strip().isdigit() and int(key) > 0):
            raise UserError(f"{here}: a key is a positive token count M")
        if not isinstance(entry, dict):
            raise UserError(f"{here}: expected an object")
        extra = dict(entry)
        if extra.pop("SPLIT_K", 1) != 1:  # vLLM's tuner writes SPLIT_K=1; nothing else is supported
            raise UserError(f"{here}: SPLIT_K other than 1 is not supported")
        unknown = sorted(set(extra) - _CONFIG_KEYS)
        if unknown:
            raise UserError(f"{here}: unknown key(s) {', '.join(unknown)}")
        missing = [k for k in _REQUIRED_KEYS if k not in extra]
        if missing:
            raise UserError(f"{here}: missing {', '.join(missing)}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in extra.values()):
            raise UserError(f"{here}: values must be integers")
        config = TritonMoeConfig(**extra)
        config.validate(here)
        entries.append((int(key), config))
    return ConfigFile(str(path), hashlib.sha256(raw_bytes).hexdigest(), tuple(entries))


def swap_ab_selected(config: TritonMoeConfig) -> bool:
    """The engines' block-shape test for swap-AB (see the module docstring)."""
    return config.BLOCK_SIZE_M < 64 and config.BLOCK_SIZE_N >= 64


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
        module = importlib.reload(module)
    return module


def _kernel_source_sha256() -> str:
    path = Path(__file__).with_name("triton_moe.py")
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


class TritonMoeArm(Arm):
    """GEMM1, SwiGLU, FP8 requant, GEMM2 with the route weight, top-k combine: five launches."""

    default_config: TritonMoeConfig = STOCK_CONFIG
    swap_capable: bool = False

    def __init__(self, triton_config: str | Path | None = None):
        self.config_file = load_config_file(triton_config) if triton_config is not None else None

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

    def select_config(self, M: int) -> tuple[TritonMoeConfig, dict]:
        if self.config_file is None:
            return self.default_config, {"config_source": "default"}
        key, config = self.config_file.select(M)
        return config, {"config_source": "file", "config_file": self.config_file.path,
                        "config_sha256": self.config_file.sha256, "config_key": key}

    def prepare(self, fx: Fixture) -> PreparedCall:
        reason = self.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {self.name!r} cannot run here: {reason}")
        tm = kernels_module()
        spec = fx.spec
        M, K, N, E, top_k = fx.M, spec.K, spec.N, spec.E, spec.top_k
        config, source = self.select_config(M)
        swap_ab = self.swap_capable and swap_ab_selected(config)
        meta = config.as_dict()

        # Untimed: the route plan on the host, moved once; every buffer allocated here.
        plan = route_plan(fx.topk_ids, E, config.BLOCK_SIZE_M).to(fx.device)
        buf = tm.allocate_buffers(M, top_k, K, N, fx.device)
        x, x_scale = fx.x_fp8.contiguous(), fx.x_scale.contiguous()
        w1, w1_scale, w2, w2_scale = (t.contiguous() for t in (fx.w1, fx.w1_scale, fx.w2, fx.w2_scale))
        route_weights = fx.topk_weights.contiguous().reshape(-1)
        h, act, act_q, act_scale, y, out = (buf[k] for k in ("h", "act", "act_q", "act_scale", "y", "out"))
        y_slots = y.view(M * top_k, K)
        plan_args = (plan.sorted_token_ids, plan.expert_ids, plan.num_tokens_post_padded)

        def run() -> None:
            tm.launch_moe_gemm(tm.moebench_moe_gemm1, x, x_scale, w1, w1_scale, h, route_weights, *plan_args,
                               a_row_div=top_k, mul_route_weight=False, swap_ab=swap_ab, config=meta)
            tm.launch_silu_and_mul(h, act)
            tm.launch_act_quant(act, act_q, act_scale)
            tm.launch_moe_gemm(tm.moebench_moe_gemm2, act_q, act_scale, w2, w2_scale, y_slots, route_weights,
                               *plan_args, a_row_div=1, mul_route_weight=True, swap_ab=swap_ab, config=meta)
            tm.launch_combine(y, out)

        if fx.device.type == "cuda":  # compile all five now, untimed
            run()
            torch.cuda.synchronize(fx.device)

        import triton
        identity = {
            "config": meta, **source,
            "swap_ab": swap_ab,
            "swap_ab_rule": SWAP_AB_RULE if self.swap_capable else "never",
            "route_plan_capacity": int(plan.sorted_token_ids.numel()),
            "triton": triton.__version__,
            "interpreted": bool(tm.INTERPRETED),
            "kernel_source_sha256": _kernel_source_sha256(),
        }
        return PreparedCall(arm=self.name, run=run, output=out, kernels=TRITON_KERNELS, identity=identity,
                            oracle="bf16-intermediates")


@register_arm("triton")
class StockTritonArm(TritonMoeArm):
    name = "triton"
    description = "stock Triton path (vLLM/SGLang): GEMM1, SwiGLU, FP8 requant, GEMM2, combine"


@register_arm("triton-swapab")
class SwapABTritonArm(TritonMoeArm):
    name = "triton-swapab"
    description = "stock Triton path, GEMMs as W^T.A^T when BLOCK_SIZE_M < 64 (SGLang's swap-AB rule)"
    default_config = SWAPAB_DEFAULT_CONFIG
    swap_capable = True
