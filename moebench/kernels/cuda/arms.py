"""`cuda-gemm` and `cuda-swapab`: the MoE path on CUDA sm_90a grouped GEMMs (wgmma + TMA).

Both arms run the same three kernels of sm90_grouped_gemm.cu, built with the same tiles
(64 weight rows x 128 of K per step), stages, pipeline and epilogue; they differ only in
SWAP_AB, i.e. in what fills wgmma's 64-row slot:

  cuda-gemm    tokens (so a route-plan block is 64 slots; at decode most are padding)
  cuda-swapab  the expert's weight rows (B^T A^T), tokens in wgmma's N: blocks of 16 slots

so their ratio is what Swap-AB alone buys. Everything here except `run()` is untimed:
route plan, buffers, TMA descriptors, compilation and the launch configurations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from moebench.fixtures import Fixture, route_plan
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall, register_arm
from moebench.kernels.cuda.source import KernelSource

SOURCE = "sm90_grouped_gemm.cu"
BLOCK_R = 64  # weight rows per tile (the .cu's BLOCK_R)
BLOCK_K = 128  # K per pipeline step (the .cu's BLOCK_K), also the FP8 scale block
THREADS = 160  # one consumer warpgroup + one producer warp
TARGET_STEPS = 8  # GEMM2 (K of 128 per tile): tiles per CTA so each CTA streams >= this many steps
LONG_STEPS = 16  # ... or this many, where the grid still fills one wave of resident CTAs

KERNELS = (
    KernelDecl("gemm1", r"moe_grouped_gemm1"),
    KernelDecl("swiglu_quant", r"moe_swiglu_quant"),
    KernelDecl("gemm2", r"moe_grouped_gemm2"),  # its epilogue is the combine (BF16 reduce-add)
)


WGMMA_N = (8, 16, 24, 32, 48, 64)  # the m64nNk32 shapes sm90_common.cuh's Wgmma<N> spells out


@dataclass(frozen=True)
class GemmConfig:
    swap_ab: bool
    block_t: int  # slots per route-plan block (wgmma N when swapped; 64 when not)
    stages: int = 5
    # host side: K steps a GEMM2 CTA streams; None = the rule of `gemm2_target_steps`
    target_steps: int | None = None

    def __post_init__(self):
        if not self.swap_ab and self.block_t != 64:
            raise ValueError("with tokens in the 64-row wgmma slot a block is 64 slots")
        if self.block_t not in WGMMA_N:
            raise ValueError(f"block_t must be one of {', '.join(map(str, WGMMA_N))} (the wgmma N the "
                             f"kernel has), got {self.block_t}")

    def defines(self) -> dict[str, str]:
        return {"SWAP_AB": str(int(self.swap_ab)), "BLOCK_T": str(self.block_t), "STAGES": str(self.stages)}

    @property
    def mma(self) -> str:
        n = self.block_t if self.swap_ab else BLOCK_R
        return f"wgmma m64n{n}k32 e4m3 -> f32 (" + ("weights" if self.swap_ab else "tokens") + " in M)"

    def shared_bytes(self) -> int:
        """Dynamic shared memory per GEMM CTA; mirrors the .cu's layout constants
        (a test compiles a static_assert that the two agree)."""
        t, s = self.block_t, self.stages
        scales = (t + 1 + 3) // 4 * 4
        off = s * BLOCK_R * BLOCK_K + s * t * BLOCK_K + s * scales * 4 + t * (BLOCK_R + 4) * 4
        off = (off + t * 4 + 7) // 8 * 8
        return off + 2 * s * 8 + 1024


CUDA_GEMM = GemmConfig(swap_ab=False, block_t=64)
CUDA_SWAPAB = GemmConfig(swap_ab=True, block_t=16)


# ------------------------------------------------------------------ host logic (pure)

def tiles_per_cta(row_tiles: int, k_steps: int, target_steps: int = TARGET_STEPS) -> int:
    """How many 64-row tiles one CTA streams: 1 when a tile alone has enough K steps,
    else the largest divisor of row_tiles that keeps tiles * k_steps <= target_steps."""
    if k_steps >= target_steps:
        return 1
    best = 1
    for d in range(1, row_tiles + 1):
        if row_tiles % d == 0 and d * k_steps <= target_steps:
            best = d
    return best


def gemm_grid(num_blocks: int, rows_per_expert: int, k_dim: int,
              target_steps: int = TARGET_STEPS) -> tuple[tuple[int, int, int], int]:
    """(grid, tiles_per_cta) of one grouped GEMM: x = route-plan block, y = group of row tiles."""
    if rows_per_expert % BLOCK_R or k_dim % BLOCK_K:
        raise ValueError(f"rows {rows_per_expert} / K {k_dim} not tiled by {BLOCK_R} / {BLOCK_K}")
    row_tiles = rows_per_expert // BLOCK_R
    tiles = tiles_per_cta(row_tiles, k_dim // BLOCK_K, target_steps)
    return (num_blocks, row_tiles // tiles, 1), tiles


def gemm2_target_steps(num_blocks: int, rows_per_expert: int, k_dim: int, wave_ctas: int) -> int:
    """GEMM2's K steps per CTA: TARGET_STEPS when that grid fits in one wave of `wave_ctas`
    resident CTAs (all run at once, so one CTA's length is the kernel's: keep CTAs short),
    else LONG_STEPS (CTAs run in waves; longer ones pay pipeline fill and drain fewer times).

    From the H200 experiment (results/h200/experiments/cuda-swapab-gemm2-steps-*.json.gz):
    16 steps gained 1-6% at A8, A128 and Q128, whose 8-step grids are 798 to 3,668 CTAs,
    and lost 8.5% at Q8, whose 8-step grid (296 CTAs) fits in one wave; 4 and 32 steps lost
    everywhere."""
    (blocks, groups, _), _ = gemm_grid(num_blocks, rows_per_expert, k_dim, TARGET_STEPS)
    return TARGET_STEPS if blocks * groups <= wave_ctas else LONG_STEPS


def swiglu_grid(num_slots: int, inter: int) -> tuple[int, int, int]:
    return ((num_slots * (inter // 128) + 3) // 4, 1, 1)  # one warp per (slot, 128-group), 4 per CTA


def weight_box() -> tuple[int, int]:
    """TMA box of a weight tile, outermost first: 64 rows x 128 bytes (128-byte swizzle)."""
    return (BLOCK_R, BLOCK_K)


def resident_ctas(kernel, smem: int, device: torch.device) -> int:
    """CTAs of `kernel` the whole GPU runs at once (SMs x the driver's occupancy answer)."""
    from moebench.kernels.cuda.launch import raise_shared_limit
    index = torch.device(device).index or 0
    raise_shared_limit(kernel, smem, index)  # occupancy counts 0 above the 48 KiB default
    per_sm = int(kernel.occupancy.max_active_blocks_per_multiprocessor(THREADS, smem))
    if per_sm < 1:
        raise RuntimeError(f"a {smem}-byte GEMM CTA does not fit on an SM")
    return per_sm * torch.cuda.get_device_properties(index).multi_processor_count


# ------------------------------------------------------------------ the arms

def _ptr(t: torch.Tensor):
    import numpy as np
    return np.uint64(t.data_ptr())


def _i32(v: int):
    import numpy as np
    return np.int32(v)


class CudaGroupedGemmArm(Arm):
    config: GemmConfig
    source_file = SOURCE

    def __init__(self, source: KernelSource | None = None):
        self.source = source or KernelSource.shipped(SOURCE)

    def unavailable_reason(self, device: torch.device) -> str | None:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return "needs a CUDA device (sm_90a kernels)"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            return f"needs an sm_90 (Hopper) GPU, found sm_{major}{minor}"
        try:
            import cuda.core  # noqa: F401
            from cuda.bindings import nvrtc  # noqa: F401
        except ImportError as err:
            return f"cuda-core / cuda-bindings not importable: {err}"
        return None

    def build(self):
        from moebench.kernels.cuda.nvrtc import compile_source
        return compile_source(self.source, defines=self.config.defines())

    def prepare(self, fx: Fixture) -> PreparedCall:
        from moebench.kernels.cuda.launch import bind_launch, tensor_map
        reason = self.unavailable_reason(fx.device)
        if reason:
            raise RuntimeError(f"{self.name}: {reason}")
        cfg, s = self.config, fx.spec
        M, K, N, I, E, top_k = fx.M, s.K, s.N, s.I, s.E, s.top_k
        dev = fx.device
        num_slots = M * top_k
        module = self.build()

        plan = route_plan(fx.topk_ids, E, cfg.block_t)  # on the host: num_blocks is a plain int
        num_blocks = plan.num_blocks
        plan = plan.to(dev)
        w1 = fx.w1.view(torch.uint8).reshape(E * N, K)
        w2 = fx.w2.view(torch.uint8).reshape(E * K, I)
        x = fx.x_fp8.view(torch.uint8).contiguous()
        x_scale = fx.x_scale.contiguous()
        route_w = fx.topk_weights.reshape(-1).float().contiguous()
        h = torch.empty(num_slots, N, dtype=torch.float32, device=dev)
        a = torch.empty(num_slots, I, dtype=torch.uint8, device=dev)
        a_scale = torch.empty(num_slots, I // 128, dtype=torch.float32, device=dev)
        out = torch.empty(M, K, dtype=torch.bfloat16, device=dev)  # zeroed by moe_swiglu_quant
        w1_map = tensor_map(w1, weight_box())
        w2_map = tensor_map(w2, weight_box())

        smem = cfg.shared_bytes()
        gemm1, gemm2 = module.kernel("moe_grouped_gemm1"), module.kernel("moe_grouped_gemm2")
        steps2 = cfg.target_steps
        wave = None
        if steps2 is None:
            wave = resident_ctas(gemm2, smem, dev)
            steps2 = gemm2_target_steps(num_blocks, K, I, wave)
        grid1, tiles1 = gemm_grid(num_blocks, N, K, TARGET_STEPS)
        grid2, tiles2 = gemm_grid(num_blocks, K, I, steps2)
        launches = [
            bind_launch(gemm1, grid1, THREADS, smem,
                        w1_map, _ptr(fx.w1_scale), _ptr(x), _ptr(x_scale), _ptr(plan.sorted_token_ids),
                        _ptr(plan.expert_ids), _ptr(h),
                        _i32(K), _i32(N), _i32(top_k), _i32(num_slots), _i32(tiles1)),
            bind_launch(module.kernel("moe_swiglu_quant"), swiglu_grid(num_slots, I), 128, 0,
                        _ptr(h), _ptr(a), _ptr(a_scale), _i32(num_slots), _i32(I),
                        _ptr(out), _i32(out.numel() * 2 // 16)),
            bind_launch(gemm2, grid2, THREADS, smem,
                        w2_map, _ptr(fx.w2_scale), _ptr(a), _ptr(a_scale), _ptr(plan.sorted_token_ids),
                        _ptr(plan.expert_ids), _ptr(out), _ptr(route_w),
                        _i32(top_k), _i32(I), _i32(K), _i32(num_slots), _i32(tiles2)),
        ]
        keep_alive = (plan, w1, w2, x, x_scale, route_w, h, a, a_scale, w1_map, w2_map, fx)

        def run() -> None:
            for launch in launches:
                launch()
        run.keep_alive = keep_alive  # the descriptors and argument pointers refer to these

        identity = {
            "config": asdict(cfg), "mma": cfg.mma, "source": SOURCE,
            "build": module.build.to_dict(), "shared_bytes": smem,
            "grids": {"gemm1": grid1, "gemm2": grid2, "tiles_per_cta": [tiles1, tiles2],
                      "gemm2_steps": steps2, "resident_ctas": wave},
            "route_blocks": num_blocks,
        }
        return PreparedCall(arm=self.name, run=run, output=out, kernels=KERNELS, identity=identity)


@register_arm("cuda-gemm")
class CudaGemmArm(CudaGroupedGemmArm):
    description = "CUDA sm_90a grouped GEMMs (wgmma+TMA), tokens in the 64-row wgmma slot"
    config = CUDA_GEMM


@register_arm("cuda-swapab")
class CudaSwapAbArm(CudaGroupedGemmArm):
    description = "CUDA sm_90a grouped GEMMs (wgmma+TMA), weight rows in the 64-row wgmma slot (Swap-AB)"
    config = CUDA_SWAPAB
