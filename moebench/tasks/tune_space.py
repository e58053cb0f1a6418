"""What `moebench tune` may try: the engines' search space, pruned as they prune it for 128x128
block-quantised FP8, and pruned further by rules that only drop configs that cannot be faster.

The engines' space (SGLang's `benchmark/kernels/fused_moe_triton/common_utils.py`
get_configs_compute_bound, the same as vLLM's `benchmarks/kernels/benchmark_moe.py`):
BLOCK_SIZE_M 16..256, BLOCK_SIZE_N 32..256, BLOCK_SIZE_K 64..256, GROUP_SIZE_M 1/16/32/64,
4 or 8 warps, 2 to 5 stages: 1,920 configs. Their tuners keep, for block-quantised weights, the
configs whose BLOCK_SIZE_K divides the block's K (128): BLOCK_SIZE_K 64 or 128, 1,280 configs;
SGLang's `search_space.py` drops those whose staged tiles, (BM*BK + BK*BN) * stages bytes of
FP8, pass the GPU's shared memory per block; its separate-GEMM tuner times the down GEMM with
and without TMA and keeps BLOCK_SIZE_M common to both GEMMs (one route plan).

moebench's own rules, each a reason a config is left out (`left_out`):
  * BLOCK_SIZE_N and the 128-wide weight scale blocks nest (BN divides 128 or 128 divides BN):
    moebench's kernel reads one scale a tile, or one a column (every engine value passes).
  * BLOCK_SIZE_K divides the GEMM's K.
  * A BLOCK_SIZE_M past the largest expert's rows (rounded up to a power of two, at least 16)
    only adds padding rows: the route plan gives each expert whole blocks.
  * More stages than the K loop has steps, plus one, buy nothing (the down GEMM's K is I = 128:
    one step at BK 128).
  * TMA only where the GPU and Triton have tensor descriptors on SM90.

The search (`moebench.tasks.tune`) is a walk from the engine's shipped config for each M, not the
whole grid: first BLOCK_SIZE_M for both GEMMs together (their sum), then each GEMM's other
parameters one at a time (`moves`), the best kept, repeated for `passes` rounds or until
nothing changes. Typical counts are in the tune's progress lines and its provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moebench.kernels.stock.engine_config import QUANT_GROUP, TritonMoeConfig

ENGINE_GRID: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}
# Shared memory one CTA may opt into on sm_90 (torch's shared_memory_per_block_optin on an
# H100 and an H200): the stand-in where the device cannot say (the interpreter).
SM90_SMEM_PER_BLOCK = 232_448
FP8_BYTES = 1
# The axes a GEMM's own moves change; BLOCK_SIZE_M moves both GEMMs at once.
OWN_AXES = ("BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages", "USE_TMA")


@dataclass(frozen=True)
class GemmShape:
    """One of the two GEMMs: `up` (gate/up, N = 2I wide, K deep) or `down` (N = K wide, I deep)."""

    gemm: str  # "up" or "down"
    N: int
    K: int


@dataclass(frozen=True)
class Limits:
    """What the device and the fixture allow."""

    max_expert_rows: int  # slots routed to the busiest expert at this M
    smem_per_block: int = SM90_SMEM_PER_BLOCK
    tma: bool = False  # tensor descriptors usable on this GPU (SM90 with Triton's)

    @property
    def block_m_cap(self) -> int:
        return max(16, next_pow2(self.max_expert_rows))


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def staged_smem_bytes(c: TritonMoeConfig) -> int:
    """SGLang's estimate of a config's shared memory: the A and W tiles, once per stage."""
    return (c.BLOCK_SIZE_M * c.BLOCK_SIZE_K + c.BLOCK_SIZE_K * c.BLOCK_SIZE_N) * FP8_BYTES * c.num_stages


def _grid(c, g, lim):
    for axis, values in ENGINE_GRID.items():
        if getattr(c, axis) not in values:
            return f"{axis}={getattr(c, axis)} is outside the engines' search space"
    return None


def _scale_k(c, g, lim):
    if QUANT_GROUP % c.BLOCK_SIZE_K:
        return f"BLOCK_SIZE_K={c.BLOCK_SIZE_K} does not divide the 128-wide scale block (the engines' rule)"
    return f"BLOCK_SIZE_K={c.BLOCK_SIZE_K} does not divide K={g.K}" if g.K % c.BLOCK_SIZE_K else None


def _scale_n(c, g, lim):
    if QUANT_GROUP % c.BLOCK_SIZE_N and c.BLOCK_SIZE_N % QUANT_GROUP:
        return f"BLOCK_SIZE_N={c.BLOCK_SIZE_N} and the 128-wide scale blocks do not nest"
    return None


def _smem(c, g, lim):
    need = staged_smem_bytes(c)
    return f"{need:,} bytes of staged tiles exceed {lim.smem_per_block:,} of shared memory" \
        if need > lim.smem_per_block else None


def _padding(c, g, lim):
    if c.BLOCK_SIZE_M > lim.block_m_cap:
        return f"BLOCK_SIZE_M={c.BLOCK_SIZE_M} is past the busiest expert's {lim.max_expert_rows} rows (padding only)"
    return None


def _k_loop(c, g, lim):
    steps = g.K // c.BLOCK_SIZE_K
    return f"{c.num_stages} stages for a K loop of {steps} step(s)" if c.num_stages > max(2, steps + 1) else None


def _tma(c, g, lim):
    return "no tensor descriptors (TMA) on this GPU" if c.USE_TMA and not lim.tma else None


# Each rule with the axes it reads: a move is judged only by the rules of the axes it changes,
# so a shipped config outside a rule (4 stages over a one-step K loop) still moves on its other axes.
RULES = (
    (tuple(ENGINE_GRID), _grid),
    (("BLOCK_SIZE_K",), _scale_k),
    (("BLOCK_SIZE_N",), _scale_n),
    (("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_stages"), _smem),
    (("BLOCK_SIZE_M",), _padding),
    (("BLOCK_SIZE_K", "num_stages"), _k_loop),
    (("USE_TMA",), _tma),
)
ALL_AXES = (*ENGINE_GRID, "USE_TMA")


def left_out(c: TritonMoeConfig, g: GemmShape, lim: Limits, moved: tuple[str, ...] = ALL_AXES) -> str | None:
    """Why the search leaves `c` out for GEMM `g` (by the rules of the `moved` axes), or None."""
    for axes, rule in RULES:
        if set(axes) & set(moved):
            why = rule(c, g, lim)
            if why:
                return why
    return None


def engine_space(block_quant: bool = True) -> list[TritonMoeConfig]:
    """The engines' grid, pruned for 128x128 blocks as their tuners prune it (BK divides 128)."""
    out = []
    for bm in ENGINE_GRID["BLOCK_SIZE_M"]:
        for bn in ENGINE_GRID["BLOCK_SIZE_N"]:
            for bk in ENGINE_GRID["BLOCK_SIZE_K"]:
                if block_quant and QUANT_GROUP % bk:
                    continue
                for group in ENGINE_GRID["GROUP_SIZE_M"]:
                    for warps in ENGINE_GRID["num_warps"]:
                        for stages in ENGINE_GRID["num_stages"]:
                            out.append(TritonMoeConfig(bm, bn, bk, group, warps, stages))
    return out


def pruned_space(g: GemmShape, lim: Limits) -> list[TritonMoeConfig]:
    """The engines' block-quant space with every moebench rule applied, TMA variants added."""
    base = [c for c in engine_space() if left_out(c, g, lim) is None]
    if lim.tma:
        base += [replace(c, USE_TMA=True) for c in base]
    return base


def block_m_moves(up: TritonMoeConfig, down: TritonMoeConfig, g_up: GemmShape, g_down: GemmShape,
                  lim: Limits) -> list[tuple[TritonMoeConfig, TritonMoeConfig]]:
    """The pairs with another BLOCK_SIZE_M, both GEMMs' other parameters kept, that both may try."""
    out = []
    for bm in ENGINE_GRID["BLOCK_SIZE_M"]:
        if bm == up.BLOCK_SIZE_M:
            continue
        pair = (replace(up, BLOCK_SIZE_M=bm), replace(down, BLOCK_SIZE_M=bm))
        moved = ("BLOCK_SIZE_M",)
        if left_out(pair[0], g_up, lim, moved) is None and left_out(pair[1], g_down, lim, moved) is None:
            out.append(pair)
    return out


def moves(c: TritonMoeConfig, g: GemmShape, lim: Limits) -> list[TritonMoeConfig]:
    """One GEMM's configs that differ from `c` in one of its own axes and may be tried. Where the
    GEMM has one tile across N, GROUP_SIZE_M orders nothing (each program is its own row block)
    and is not moved."""
    out = []
    for axis in OWN_AXES:
        if axis == "GROUP_SIZE_M" and g.N <= c.BLOCK_SIZE_N:
            continue
        values = (False, True) if axis == "USE_TMA" else ENGINE_GRID[axis]
        for v in values:
            if v == getattr(c, axis):
                continue
            moved = replace(c, **{axis: v})
            if left_out(moved, g, lim, (axis,)) is None:
                out.append(moved)
    return out


def config_label(c: TritonMoeConfig) -> str:
    """A config in one short token: `BM16.BN128.BK128.G1.w4.s3` (`.tma` when on)."""
    return (f"BM{c.BLOCK_SIZE_M}.BN{c.BLOCK_SIZE_N}.BK{c.BLOCK_SIZE_K}.G{c.GROUP_SIZE_M}"
            f".w{c.num_warps}.s{c.num_stages}" + (".tma" if c.USE_TMA else ""))


def expert_rows(topk_ids, E: int) -> int:
    """Slots routed to the busiest expert (`topk_ids` [M, top_k] on any device)."""
    import torch
    counts = torch.bincount(topk_ids.reshape(-1).to("cpu", torch.int64), minlength=E)
    return int(counts.max()) if counts.numel() else 0


def parse_ms(text: str | None, engine_buckets: tuple[int, ...]) -> tuple[int, ...]:
    """`--ms`: the engines' buckets when not given, else the positive token counts named, ascending."""
    from moebench.errors import UserError
    if text is None:
        return tuple(engine_buckets)
    items = [m.strip() for m in str(text).split(",") if m.strip()]
    if not items or not all(m.isdigit() and len(m) <= 7 and 0 < int(m) <= 1 << 20 for m in items):
        raise UserError(f"--ms: expected token counts from 1 to {1 << 20} like 1,8,128,4096, got {text!r}")
    ms = [int(m) for m in items]
    dupes = sorted({m for m in ms if ms.count(m) > 1})
    if dupes:
        raise UserError(f"--ms: M given twice: {', '.join(map(str, dupes))}")
    return tuple(sorted(ms))
