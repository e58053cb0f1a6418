"""Arm `sglang`: the referee of `triton`. SGLang's own fused-MoE GEMM kernels, launched as the
engine launches them, from the installed engine package (`pip install 'moebench[sglang]'`).

What is the engine's here, and what is not:
  * GEMM1 and GEMM2 are SGLang's `fused_moe_kernel`, through its `invoke_fused_moe_kernel`:
    the engine's kernel source, grid, swap-AB rule, TMA descriptors and PDL launch.
  * The configs come from the engine's own `try_get_optimal_moe_config` over the tables the
    installed package ships (up and down, the forced BLOCK_SIZE_M, the Triton-version
    fallback), and the route plan is sized as its `moe_align_block_size` sizes it.
  * SwiGLU, the FP8 requant and the top-k combine are moebench's Triton kernels, the same
    launches as in `triton`: the engine's own are CUDA kernels of its compiled companion
    package, which is not installable without the whole engine. So the referee checks the
    GEMMs and their configs, the part a stock arm can get wrong, and `triton` and `sglang`
    differ only there.

The whole engine imports only with its many dependencies. Where it does not, the two modules
needed (the kernel module and the config module) are loaded from the package's files with
the engine-wide helpers they import replaced by stand-ins that answer as the engine would on
this GPU (is_cuda, is_sm90_supported, PDL support, no AITER, no batch-invariant or
deterministic mode, no MoE padding, no config override). The arm's identity lists each one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.stock.arms import TRITON_KERNELS, interpreter_requested, stock_workspace
from moebench.kernels.stock.engine_logs import ENGINE_MESSAGES, captured_engine_messages

KERNEL_MODULE = "sglang.kernels.ops.moe.fused_moe_triton_kernels"
CONFIG_MODULE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
INSTALL_HINT = "pip install 'moebench[sglang]'"

SGLANG_KERNELS = (
    KernelDecl("gemm1", r"^fused_moe_kernel(?:_\w+)?$", 1),
    *(d for d in TRITON_KERNELS if d.label in ("silu_and_mul", "per_token_group_quant")),
    KernelDecl("gemm2", r"^fused_moe_kernel(?:_\w+)?$", 1),
    *(d for d in TRITON_KERNELS if d.label == "combine"),
)


# ----------------------------------------------------------------------------------------------
# Loading the engine's two modules.
# ----------------------------------------------------------------------------------------------


def _cuda_capability() -> tuple[int, int]:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


def _is_cuda() -> bool:
    return torch.cuda.is_available() and torch.version.cuda is not None


def _is_sm90_supported() -> bool:  # capability 9.x with CUDA >= 12.3
    cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    return _is_cuda() and _cuda_capability()[0] == 9 and cuda >= (12, 3)


class _PdlSwitch:
    """The engine's is_arch_support_pdl (capability >= 9), with moebench's `pdl=False` on top."""

    def __init__(self):
        self.enabled = True

    def __call__(self) -> bool:
        return self.enabled and _is_cuda() and _cuda_capability()[0] >= 9


def _unavailable(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is not loaded by moebench's referee (it is never called for FP8 inputs)")
    return fail


class _Flag:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _stand_ins(pdl: _PdlSwitch) -> dict[str, dict]:
    """Module name -> the attributes the two modules import from it, as the engine answers."""
    exec_ctx = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    return {
        "sglang.kernels.jit.utils": {"is_arch_support_pdl": pdl},
        "sglang.kernels.ops.quantization.fp8_kernel": {
            n: _unavailable(n) for n in ("per_token_group_quant_fp8", "scaled_fp8_quant",
                                         "sglang_per_token_group_quant_fp8")},
        "sglang.kernels.ops.quantization.int8_kernel": {
            n: _unavailable(n) for n in ("per_token_group_quant_int8", "per_token_quant_int8",
                                         "sglang_per_token_group_quant_int8")},
        "sglang.srt.batch_invariant_ops": {"is_batch_invariant_mode_enabled": lambda: False},
        "sglang.srt.environ": {"envs": types.SimpleNamespace(SGLANG_USE_AITER=_Flag(False))},
        "sglang.srt.layers.moe.utils": {"get_moe_padding_size": lambda is_aiter: 0},
        "sglang.srt.utils": {
            "cpu_has_amx_support": lambda: False, "is_cpu": lambda: False, "is_cuda": _is_cuda,
            "is_hip": lambda: torch.version.hip is not None, "is_sm90_supported": _is_sm90_supported,
            "get_device_name": lambda device_id=0: torch.cuda.get_device_name(device_id)},
        "sglang.srt.runtime_context": {"get_exec": lambda: exec_ctx},
        "sglang.srt.layers.moe.moe_runner.triton_utils": {"get_config": lambda: None},
    }


@contextmanager
def _installed(stand_ins: dict[str, dict]):
    """The stand-in modules in sys.modules, for the duration (the real ones, if any, restored)."""
    saved = {name: sys.modules.get(name) for name in stand_ins}
    for name, attrs in stand_ins.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        module.__moebench_stand_in__ = True
        sys.modules[name] = module
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _load_file(package_root: Path, module_name: str):
    path = package_root.joinpath(*module_name.split(".")[1:]).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(f"moebench_referee.{module_name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Engine:
    version: str
    kernels: types.ModuleType
    configs: types.ModuleType
    stand_ins: dict[str, dict]  # empty when the engine imported whole
    pdl: _PdlSwitch | None
    load_messages: tuple[str, ...] = ()  # what the engine logged while it loaded (engine_logs)
    # What its config lookup logged, by weight shapes: the engine caches the lookup, so a later
    # shape of the same geometry, resolved from the same table, logs nothing itself.
    config_messages: dict = field(default_factory=dict)

    @property
    def identity(self) -> dict:
        return {"engine": f"sglang {self.version}",
                "engine_import": "whole" if not self.stand_ins else "kernel and config modules from the package files",
                "stand_ins": {name: sorted(attrs) for name, attrs in self.stand_ins.items()}}

    def set_pdl(self, on: bool) -> None:
        """PDL as the engine decides it (`on`), or off."""
        if self.pdl is not None:
            self.pdl.enabled = on
        else:
            if not hasattr(self, "_engine_pdl"):
                self._engine_pdl = self.kernels.is_arch_support_pdl
            self.kernels.is_arch_support_pdl = self._engine_pdl if on else (lambda: False)

    def lookup_config(self, w1_shape: tuple, w2_shape: tuple, top_k: int, M: int) -> tuple[dict, dict | None, list[str]]:
        """The engine's own config resolution for these weights at M: the up and down configs,
        and what the engine logged loading and resolving them (its table fallbacks), kept here
        and printed nowhere."""
        with self.resolving(), captured_engine_messages() as said:
            config, (down_config, _) = self.configs.try_get_optimal_moe_config(
                w1_shape, w2_shape, top_k, "fp8_w8a8", M, block_shape=[128, 128], return_down_config=True)
        known = self.config_messages.setdefault((w1_shape, w2_shape), [])
        known.extend(m for m in said if m not in known)
        return (dict(config), dict(down_config) if down_config is not None else None,
                list(dict.fromkeys([*self.load_messages, *known])))

    @contextmanager
    def resolving(self):
        """Around the engine's config lookup, whose lazy imports must find the stand-ins."""
        with _installed(self.stand_ins):
            yield


_ENGINE: Engine | None = None


def sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def load_engine() -> Engine:
    """The engine's kernel and config modules: imported whole when the engine imports, else
    loaded from its files with stand-ins (once per process)."""
    global _ENGINE
    if _ENGINE is not None:
        return _ENGINE
    version = sglang_version()
    if version is None:
        raise UserError(f"SGLang is not installed ({INSTALL_HINT})")
    with captured_engine_messages() as said:
        try:
            kernels = importlib.import_module(KERNEL_MODULE)
            configs = importlib.import_module(CONFIG_MODULE)
            engine = Engine(version, kernels, configs, {}, None)
        except Exception:  # noqa: BLE001 (any missing dependency of the whole engine)
            spec = importlib.util.find_spec("sglang")
            root = Path(next(iter(spec.submodule_search_locations)))
            pdl = _PdlSwitch()
            stand_ins = _stand_ins(pdl)
            try:
                with _installed(stand_ins):
                    kernels = _load_file(root, KERNEL_MODULE)
                    configs = _load_file(root, CONFIG_MODULE)
            except Exception as err:  # noqa: BLE001
                raise UserError(f"cannot load SGLang {version}'s fused-MoE modules: {type(err).__name__}: {err}") from None
            engine = Engine(version, kernels, configs, stand_ins, pdl)
    _ENGINE = replace(engine, load_messages=tuple(said))
    return _ENGINE


# ----------------------------------------------------------------------------------------------
# The arm.
# ----------------------------------------------------------------------------------------------


@register_arm("sglang")
class SglangArm(Arm):
    description = "referee: SGLang's own fused_moe_kernel GEMMs with its configs, TMA and PDL (installed engine)"

    def __init__(self, pdl: bool = True):
        self.pdl = bool(pdl)

    def unavailable_reason(self, device: torch.device) -> str | None:
        if sglang_version() is None:
            return f"SGLang is not installed ({INSTALL_HINT})"
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return "the engine's kernels run on a CUDA device only"
        if interpreter_requested():
            return "TRITON_INTERPRET=1 is set"
        try:
            load_engine()
        except UserError as err:
            return str(err)
        return None

    def prepare(self, fx: Fixture) -> PreparedCall:
        reason = self.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {self.name!r} cannot run here: {reason}")
        import triton.language as tl
        engine = load_engine()
        M, E, top_k, I = fx.M, fx.spec.E, fx.spec.top_k, fx.spec.N // 2
        w1, w1_scale, w2, w2_scale = (t.contiguous() for t in (fx.w1, fx.w1_scale, fx.w2, fx.w2_scale))
        x, x_scale = fx.x_fp8.contiguous(), fx.x_scale.contiguous()
        topk_ids, topk_weights = fx.topk_ids.contiguous(), fx.topk_weights.contiguous()

        # The engine's own resolution, then what _prepare_fused_moe_run does with it.
        engine.set_pdl(self.pdl)
        config, down_config, messages = engine.lookup_config(tuple(w1.shape), tuple(w2.shape), top_k, M)
        with engine.resolving():
            tma_ok = engine.kernels.support_tensor_descriptor()
            up_tma = tma_ok and config.pop("USE_TMA", False)
            down_tma = down_config is not None and tma_ok and down_config.pop("USE_TMA", False)
            pdl = bool(engine.kernels.is_arch_support_pdl())
            swap = [bool(engine.kernels.should_enable_swap_ab(c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]))
                    for c in (config, down_config or config)]
        ws = stock_workspace(fx, config["BLOCK_SIZE_M"], bool(down_tma))
        plan_args = (topk_ids, *ws.plan_args)
        fp8 = dict(compute_type=tl.bfloat16, use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False,
                   use_int4_w4a16=False, per_channel_quant=False, block_shape=[128, 128])
        invoke = engine.kernels.invoke_fused_moe_kernel
        pdl_on = self.pdl

        def gemm1() -> None:
            engine.set_pdl(pdl_on)
            invoke(x, w1, None, ws.h, x_scale, w1_scale, None, topk_weights, *plan_args, False, top_k, config,
                   **fp8, c_sorted=bool(down_tma), b_use_tma=bool(up_tma), filter_expert=False)

        def gemm2() -> None:
            invoke(ws.act_q, w2, None, ws.y, ws.act_scale, w2_scale, None, topk_weights, *plan_args, True, 1,
                   down_config or config, **fp8, a_use_tma=bool(down_tma), b_use_tma=bool(down_tma),
                   filter_expert=False, router_topk=top_k)

        run = ws.path(gemm1, gemm2)
        run()  # compile, untimed
        torch.cuda.synchronize(fx.device)
        identity = {
            **engine.identity,
            "config": config, "down_config": down_config or config,
            "swap_ab": swap[0], "down_swap_ab": swap[1], "tma": bool(up_tma), "down_tma": bool(down_tma),
            "pdl": pdl, "config_file": engine.configs.get_config_file_name(E, I, "fp8_w8a8", [128, 128]),
            **ws.identity,
            "not_the_engines": "SwiGLU, FP8 requant and combine are moebench's Triton kernels (as in `triton`)",
        }
        if messages:
            identity[ENGINE_MESSAGES] = messages
        return PreparedCall(arm=self.name, run=run, output=ws.out, kernels=SGLANG_KERNELS, identity=identity,
                            oracle="bf16-intermediates", workspace=ws)
