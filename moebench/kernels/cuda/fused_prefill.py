"""`cuda-fused`'s path for prefill-sized expert groups: two FP8 wgmma kernels (sm90_fused_prefill.cu).

  moebench_prefill_gate_up   GEMM1, SwiGLU and the per-token FP8 requant, into a [slots, I] buffer
  moebench_prefill_down      GEMM2 and the route-weighted BF16 reduce-add into the output

The arm picks this path or the one-kernel decode path on the host, per prepared call, from the
route plan (`choose_path`); the choice, its kernels and their launch shape are in the call's
identity. Public helpers:
  choose_path(num_slots, routed_experts) -> "prefill" | "decode"
  prefill_weights(w1, w1_scale, w2, w2_scale) -> PrefillWeights       untimed views, no re-layout
  make_prefill_launch(x, x_scale, weights, plan, topk_weights, out=None) -> (launch, out, module, dims)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from moebench.fixtures import RoutePlan
from moebench.kernels.cuda.fused_checks import MAX_E, MAX_TOP_K, check_plan
from moebench.kernels.cuda.fused_checks import need as _need
from moebench.kernels.cuda.fused_layout import FP8, GROUP

SOURCE = "sm90_fused_prefill.cu"
GATE_UP, DOWN = "moebench_prefill_gate_up", "moebench_prefill_down"
BLOCK_M = 64  # slots per route-plan block: the wgmma M (the .cu's BLOCK_M)
BLOCK_N = 256  # weight rows per work item: two consumer warpgroups of 128 (the .cu's BLOCK_N)
THREADS = 384  # two consumer warpgroups + a producer warpgroup (the .cu's THREADS, its launch bound)
THREADS_CONSUMING = 256  # the two consumer warpgroups: gate_up's chained sums hold 64 floats each
STAGES = 4  # ring depth: 4 x 40 KB, plus the down kernel's output staging, fits one CTA an SM
# Mean slots per routed expert from which the wgmma path is taken: below it a block of 64 is
# mostly padding and the decode kernel, which streams each expert's weights near the HBM rate
# in blocks of 8, is faster. Each path forced in one run on the H200 (docs/kernels.md, "the
# paths' bounds", results/h200/experiments/prefill-path-bounds.json.gz): A128 (4.6 slots an
# expert) decode 174.3 us, prefill 179.9; Q256 (5.0) decode 104.4, prefill 111.7; A192 (6.7)
# prefill 183.7, decode 210.8; Q384 (7.5) prefill 113.5, decode 127.2. (Before the row gathers and
# pipelined down the bound was 10: A256 decode 217 us, prefill 230.)
MIN_TOKENS_PER_EXPERT = 6.0
# A band where neither fused path is the fastest arm: wide hidden sizes at 14 to 20 slots an
# expert, where the wgmma path's blocks of 64 are mostly padding and its grid of one item a block
# starts a third round (265 blocks or more on 132 CTAs). There the arm runs the Swap-AB grouped
# GEMMs (cuda-swapab's kernels). The same run: A384 (13.4) prefill 203.8, grouped 218.1; A448
# (15.7) grouped 223.0, prefill 240.1; A640 (22.4) prefill 246.8, grouped 270.5; A768 (26.9)
# prefill 251.6, grouped 304.0; and A512 (17.9) grouped 231.3, prefill 244.0 (experiments/
# prefill-gate-up-tail-before.json.gz). The upper bound lies between A512 and A640, unmeasured
# there. Q (K = 2048) keeps the fused paths: Q384 grouped 125.9 against prefill 113.5. Where the
# pair runs down beside gate_up's third round (overlap_down) it is the faster again, and the band
# does not apply: A448 prefill 204.9 us against grouped 220.6, A512 209.0 against 231.3 (one
# paired run, experiments/prefill-overlap.json.gz; without the overlap 248.3 and 249.0).
GROUPED_SLOTS_PER_EXPERT = (14.0, 20.0)
GROUPED_MIN_K = 4096
PATHS = ("auto", "decode", "grouped", "prefill")


def choose_path(num_slots: int, routed_experts: int, K: int = 0, overlaps: bool = False) -> str:
    """The kernels for a route plan: "grouped" in the band above unless the prefill pair would run
    its kernels overlapped there (`overlaps`: prefill_overlaps for the plan), else "prefill" where
    experts average at least MIN_TOKENS_PER_EXPERT slots, else "decode"."""
    per_expert = num_slots / max(routed_experts, 1)
    low, high = GROUPED_SLOTS_PER_EXPERT
    if K >= GROUPED_MIN_K and low <= per_expert < high and not overlaps:
        return "grouped"
    return "prefill" if num_slots >= MIN_TOKENS_PER_EXPERT * max(routed_experts, 1) else "decode"


def shared_bytes(stages: int = STAGES) -> int:
    """Dynamic shared memory of one CTA: mirrors the .cu's layout (a test checks the two agree)."""
    a_tile, b_tile, scales, c_row = BLOCK_M * 128, BLOCK_N * 128, (BLOCK_M + 4) * 4, 128 * 2 + 16
    # ring, amax exchange, down's output staging and its token-row tables
    n = stages * (a_tile + b_tile + scales) + 2 * 2 * BLOCK_M * 4 + 2 * BLOCK_M * c_row + 2 * 2 * BLOCK_M * 4
    return n + 2 * stages * 8 + 1024


# Work cuts the host weighs (split_work). gate_up: a K range's fixed cost, in units of its own
# steps, is the 64-row FP32 sum it stores and reloads. The default rule never splits gate_up's K:
# at A512 three chained ranges took gate_up from 155.4 us to 174.5 (docs/kernels.md); the chain
# stays as an option (make_prefill_launch's splits).
MAX_SPLITS, SPLIT_COST = 4, 2.0
DEFAULT_MAX_SPLITS = 1
MIN_SPLIT_STEPS = 4  # K steps a gate_up range keeps at least

# down: items run block fastest, so the grid walks chunk r of every block before chunk r + 1 and
# reduce-adds into tokens x chunk x BLOCK_N BF16 output values at once (the window). Chunks of 4
# tiles were best or tied with 2 at every prefill shape timed (A1024-A16384, Q1024, Q4096) where the
# window is at most 16 MiB; at Q16384 4 tiles are a 32 MiB window and 2 were faster; 1 tile an item
# reads its plan entries 4x as often and was slower than 2 and 4 everywhere; whole rows of tiles
# (the old cut) were slowest from A8192 up: down 822 -> 587 us at A8192, 1,656 -> 1,191 at A16384
# (experiments/prefill-chunk.json.gz).
DOWN_CHUNK = 4
DOWN_WINDOW_BYTES = 16 * 2**20


def _rounds_cost(units: int, parts: int, steps: int, ctas: int, fixed: float) -> float:
    """Modelled time of `units` x `parts` items of steps/parts steps each on `ctas` CTAs:
    full rounds of the persistent grid times one item's steps plus its fixed cost."""
    return -(-units * parts // ctas) * (steps / parts + fixed)


CUT_SLACK = 1.03  # the fewest items whose modelled time is within 3% of the best cut's


def _fewest_within(options: range, cost) -> int:
    best = min(cost(o) for o in options)
    return next(o for o in options if cost(o) <= best * CUT_SLACK)


def down_chunk(blocks: int, tokens: int, K: int, ctas: int) -> int:
    """Tiles a down item: DOWN_CHUNK, fewer while the window passes DOWN_WINDOW_BYTES, and fewer
    again while a plan of few blocks leaves CTAs of the grid without an item."""
    tiles = -(-K // BLOCK_N)
    chunk = min(DOWN_CHUNK, tiles)
    while chunk > 1 and tokens * chunk * BLOCK_N * 2 > DOWN_WINDOW_BYTES:
        chunk -= 1
    while chunk > 1 and max(blocks, 1) * -(-tiles // chunk) < ctas:
        chunk -= 1
    return chunk


def split_work(blocks: int, tokens: int, N: int, K: int, ctas: int,
               max_splits: int = DEFAULT_MAX_SPLITS) -> tuple[int, int]:
    """(splits, chunk) for a plan of `blocks` real blocks over `tokens` tokens: gate_up's K ranges
    a (block, group), the fewest within CUT_SLACK of the rounds model's best, so the last round of
    the persistent grid is not a few CTAs streaming alone; down's tiles an item (down_chunk)."""
    groups, k_steps = N // 256, K // 128
    units = max(blocks, 1)
    splits = _fewest_within(range(1, max(1, min(max_splits, MAX_SPLITS, k_steps // MIN_SPLIT_STEPS)) + 1),
                            lambda s: _rounds_cost(units * groups, s, k_steps, ctas, SPLIT_COST if s > 1 else 0.0))
    return splits, down_chunk(blocks, tokens, K, ctas)


# down beside gate_up's last round (overlap_down). The model counts gate_up K steps: a down step
# (a 256-row w2 tile over 128 of I, and its reductions) costs DOWN_STEP_COST of them, the median
# of the two kernels' times per step in the sweeps at 577609c (sweep-fused-{A,Q}.json.gz as of
# bf5051b: 1.22 at A256 to 2.02 at A4096, 1.75 at A1024, 1.69 at Q4096). The overlap is taken
# where the model's call is at least OVERLAP_GAIN shorter.
DOWN_STEP_COST = 1.7
OVERLAP_GAIN = 0.02


def overlap_down(items1: int, items2: int, grid1: int, ctas: int, gate_steps: int,
                 down_steps: int) -> tuple[bool, int]:
    """(overlap, down's CTAs): whether down runs beside gate_up's last round, on the SMs that round
    leaves idle, rather than after it on all `ctas`. `items1` gate_up items of `gate_steps` K steps
    on `grid1` CTAs; `items2` down items of `down_steps`. Modelled call: gate_up's rounds, then
    down's rounds of its grid; beside, down starts with gate_up's last round and its late blocks'
    items (last in its order) wait for that round's end."""
    rounds1, last = -(-items1 // max(grid1, 1)), items1 % max(grid1, 1)
    if rounds1 < 2 or last == 0 or ctas - last < 1:
        return False, ctas
    def down(grid):
        return -(-items2 // grid) * down_steps * DOWN_STEP_COST
    apart = rounds1 * gate_steps + down(ctas)
    beside = (rounds1 - 1) * gate_steps + max(gate_steps, down(ctas - last))
    return (True, ctas - last) if beside < apart * (1 - OVERLAP_GAIN) else (False, ctas)


def overlap_cut(blocks: int, N: int, K: int, splits: int, chunk: int, ctas: int,
                grid1: int | None = None) -> tuple[bool, int]:
    """overlap_down for `blocks` real plan blocks under a work cut (splits, chunk): gate_up on
    `grid1` CTAs (one an item, at most `ctas`, when None)."""
    items1, items2 = work_items(blocks, N, K, splits, chunk)
    grid1 = max(1, min(ctas, items1)) if grid1 is None else grid1
    return overlap_down(items1, items2, grid1, ctas, K // GROUP // splits, chunk * (N // 2 // GROUP))


def prefill_overlaps(blocks: int, tokens: int, N: int, K: int, ctas: int) -> bool:
    """Whether the prefill pair, cut by split_work for `blocks` real plan blocks, runs down beside
    gate_up's last round (overlap_down) on a GPU of `ctas` SMs."""
    return overlap_cut(blocks, N, K, *split_work(blocks, tokens, N, K, ctas), ctas)[0]


def work_items(blocks: int, N: int, K: int, splits: int = 1, chunk: int | None = None) -> tuple[int, int]:
    """(gate_up, down) work items for `blocks` plan blocks: gate_up one a block, requant group and
    K range; down one a block and chunk of `chunk` tiles of its expert's w2 (all
    -(-K // BLOCK_N) tiles when None)."""
    tiles = -(-K // BLOCK_N)
    chunk = tiles if chunk is None else chunk
    return blocks * (N // 256) * splits, blocks * -(-tiles // chunk)


KERNELS = ("gate_up", GATE_UP), ("down", DOWN)  # (the patterns also match the builds of the overlap)
OVERLAP_SUFFIX = "_overlap"  # the .cu's builds of both kernels for down beside gate_up's last round


def kernel_names(overlap: bool) -> tuple[str, str]:
    """The two kernels a launch runs: the builds apart, or those of the overlap."""
    suffix = OVERLAP_SUFFIX if overlap else ""
    return GATE_UP + suffix, DOWN + suffix


def need_kernels(module, names) -> None:
    """cuda_build.need_kernels for the prefill launch's kernels."""
    from moebench.kernels.cuda.nvrtc import need_kernels as need
    need(module, names, SOURCE, "prefill launch")


@dataclass(frozen=True)
class PrefillWeights:
    """The fixture's FP8 weights as 2-D row views (TMA boxes of 64 rows x 128 bytes) and scales."""

    w1: torch.Tensor  # [E * N, K] uint8, gate rows then up rows of each expert
    w1_scale: torch.Tensor  # [E, N/128, K/128] fp32
    w2: torch.Tensor  # [E * K, I] uint8
    w2_scale: torch.Tensor  # [E, K/128, I/128] fp32
    E: int
    N: int
    K: int

    @property
    def I(self) -> int:  # noqa: E743
        return self.N // 2


def prefill_weights(w1, w1_scale, w2, w2_scale) -> PrefillWeights:
    """The weights as the prefill kernels read them: the same bytes, no re-layout."""
    _need(w1.dtype in (FP8, torch.uint8) and w2.dtype in (FP8, torch.uint8), "w1 and w2 must be float8_e4m3fn codes")
    _need(w1.dim() == 3 and w2.dim() == 3, f"w1 must be [E, N, K] and w2 [E, K, I], got {list(w1.shape)}, {list(w2.shape)}")
    E, N, K = w1.shape
    _need(K % GROUP == 0 and K > 0, f"K={K} must be a positive multiple of {GROUP}")
    _need(N % (2 * GROUP) == 0 and N > 0, f"N={N} must be a positive multiple of {2 * GROUP}")
    _need(tuple(w2.shape) == (E, K, N // 2), f"w2 must be [E, K, I] = {[E, K, N // 2]}, got {list(w2.shape)}")
    for t, shape, name in ((w1_scale, (E, N // GROUP, K // GROUP), "w1_scale"),
                           (w2_scale, (E, K // GROUP, N // 2 // GROUP), "w2_scale")):
        _need(t.dtype == torch.float32 and tuple(t.shape) == shape, f"{name} must be float32 {list(shape)}")
    return PrefillWeights(w1.contiguous().view(torch.uint8).reshape(E * N, K), w1_scale.contiguous(),
                          w2.contiguous().view(torch.uint8).reshape(E * K, N // 2), w2_scale.contiguous(), E, N, K)


def validate_prefill(x, x_scale, w: PrefillWeights, plan: RoutePlan, topk_weights, out) -> dict:
    """Every assumption the two kernels make, as one sentence each; returns the dimensions."""
    E, N, K, I = w.E, w.N, w.K, w.I
    _need(1 <= E <= MAX_E, f"E={E} must be in [1, {MAX_E}]")
    _need(x.dtype == FP8 and x.dim() == 2 and x.shape[1] == K, f"x must be float8_e4m3fn [M, K={K}], got {x.dtype} {list(x.shape)}")
    M = x.shape[0]
    _need(M >= 1, "x has no rows")
    _need(x_scale.dtype == torch.float32 and tuple(x_scale.shape) == (M, K // GROUP),
          f"x_scale must be float32 [{M}, {K // GROUP}], got {x_scale.dtype} {list(x_scale.shape)}")
    _need(topk_weights.dtype == torch.float32 and topk_weights.dim() == 2 and topk_weights.shape[0] == M,
          f"topk_weights must be float32 [M={M}, top_k], got {topk_weights.dtype} {list(topk_weights.shape)}")
    top_k = topk_weights.shape[1]
    _need(1 <= top_k <= MAX_TOP_K, f"top_k={top_k} must be in [1, {MAX_TOP_K}]")
    _need(plan.block_m == BLOCK_M, f"the prefill path takes plans of block_m={BLOCK_M}, got {plan.block_m}")
    cap = check_plan(plan, M * top_k, E, BLOCK_M)
    _need(M * top_k * max(I, K) < 2**31, "the problem is too large for one launch")
    if out is not None:
        _need(out.dtype == torch.bfloat16 and tuple(out.shape) == (M, K), f"out must be bfloat16 [{M}, {K}]")
    tensors = {"x": x, "x_scale": x_scale, "w1": w.w1, "w1_scale": w.w1_scale, "w2": w.w2, "w2_scale": w.w2_scale,
               "topk_weights": topk_weights, "out": out, "plan.sorted_token_ids": plan.sorted_token_ids,
               "plan.expert_ids": plan.expert_ids, "plan.num_tokens_post_padded": plan.num_tokens_post_padded}
    for name, t in tensors.items():
        if t is not None:
            _need(t.device == x.device, f"{name} is on {t.device}, x on {x.device}: all tensors must share one CUDA device")
            _need(t.is_contiguous() and t.data_ptr() % 16 == 0, f"{name} must be contiguous and 16-byte aligned")
    _need(x.device.type == "cuda", f"tensors must be on a CUDA device, got {x.device}")
    cc = torch.cuda.get_device_capability(x.device)
    _need(cc == (9, 0), f"needs an sm_90 GPU (H100/H200), {x.device} is sm_{cc[0]}{cc[1]}")
    return dict(M=M, K=K, N=N, I=I, E=E, top_k=top_k, capacity=cap)


# Cached per process in the arm's own module, like fused_arm.build_fused.
@functools.lru_cache(maxsize=None)
def build_prefill(stages: int = STAGES, source=None):
    """The two kernels' module: the shipped source (moebench/kernels', never a file of that name
    in the current directory), or `source` (a KernelSource: a `--build`)."""
    from moebench.kernels.cuda.nvrtc import compile_source
    from moebench.kernels.cuda.source import KernelSource
    return compile_source(KernelSource.shipped(SOURCE) if source is None else source, defines={"STAGES": str(stages)})


def check_cut(K: int, splits: int | None, chunk: int | None) -> None:
    """A work cut the kernels can run at hidden size K (None: split_work's)."""
    if splits is not None:
        _need(1 <= splits <= K // GROUP, f"splits={splits} must be in [1, K/128 = {K // GROUP}]")
    if chunk is not None:
        tiles = -(-K // BLOCK_N)
        _need(1 <= chunk <= tiles, f"chunk={chunk} must be in [1, K/256 = {tiles}] (w2 tiles an item)")


def block_threads(*kernels) -> int:
    """The block size the prefill kernels declare (their __launch_bounds__, which the driver
    reports as the most threads a launch may take): the two consumer warpgroups and the producer,
    one warp in builds of files before 384 threads, a warpgroup since. Both kernels must agree."""
    sizes = sorted({int(k.attributes.max_threads_per_block) for k in kernels})
    known = (THREADS_CONSUMING + 32, THREADS)
    _need(len(sizes) == 1 and sizes[0] in known,
          f"{SOURCE}: the prefill kernels declare blocks of {sizes} threads; this host launches "
          f"blocks of {known[0]} or {known[1]}")
    return sizes[0]


def make_prefill_launch(x, x_scale, w: PrefillWeights, plan: RoutePlan, topk_weights, out=None, *,
                        max_ctas: int | None = None, blocks: int | None = None,
                        splits: int | None = None, chunk: int | None = None, source=None,
                        zero_out: bool = False, overlap: bool | None = None):
    """Validate, allocate the intermediate (and a zeroed output when None), build the TMA maps
    and both launches; `launch()` runs the two kernels on torch's current stream: down adds into
    `out`, which gate_up zeroes first when `zero_out` (the launch then writes it). Persistent
    grids of one CTA an SM (or `max_ctas`); the work cut (`split_work`) is picked for `blocks`
    real plan blocks (the plan's worst case when None) unless `splits`/`chunk` are given; down runs
    beside gate_up's last round where `overlap_down` says so for those blocks (or as `overlap`
    says). The kernels are compiled from `source` (a KernelSource) when given, else the shipped file."""
    import numpy as np

    from moebench.kernels.cuda.launch import bind_launch, raise_shared_limit, tensor_map
    check_cut(x.shape[-1], splits, chunk)  # (the caller's choice, before the tensors' checks)
    dims = validate_prefill(x, x_scale, w, plan, topk_weights, out)
    M, K, N, I, E, top_k, cap = (dims[k] for k in ("M", "K", "N", "I", "E", "top_k", "capacity"))
    dev = x.device
    if out is None:
        out = torch.zeros(M, K, dtype=torch.bfloat16, device=dev)
    slots = M * top_k
    # the intermediate, one row a plan position (the shipped kernels keep it in plan order, tiles
    # down loads whole; a build of a file that keeps it by slot indexes fewer rows: slots <= cap)
    a = torch.empty(cap, I, dtype=torch.uint8, device=dev)
    a_scale = torch.empty(cap, I // GROUP, dtype=torch.float32, device=dev)
    route_w = topk_weights.reshape(-1)
    w1_map, w2_map = tensor_map(w.w1, (64, 128)), tensor_map(w.w2, (64, 128))
    module = build_prefill(STAGES, source)
    smem = shared_bytes(STAGES)
    max_blocks = cap // BLOCK_M
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ctas = sms if max_ctas is None else max(1, min(sms, max_ctas))
    cut = split_work(max_blocks if blocks is None else blocks, M, N, K, ctas)
    splits, chunk = splits or cut[0], chunk or cut[1]  # (split_work's are in range; the caller's checked above)
    items1, items2 = work_items(max_blocks, N, K, splits, chunk)
    # gate_up's chained K ranges: a 64-row FP32 sum a (block, group), flags 0 between launches
    part = torch.empty((max_blocks * (N // 256) * THREADS_CONSUMING * 64) if splits > 1 else 1,
                       dtype=torch.float32, device=dev)
    flags = torch.zeros(max_blocks * (N // 256) if splits > 1 else 1, dtype=torch.int32, device=dev)
    grid1 = (max(1, min(ctas, items1)), 1, 1)
    # down beside gate_up's last round: on the SMs that round leaves, its launch a programmatic
    # dependent of gate_up's; counters and flags (0 between launches) order the two
    real_blocks = max_blocks if blocks is None else blocks
    chosen, down_ctas = overlap_cut(real_blocks, N, K, splits, chunk, ctas, grid1[0])
    overlap = chosen if overlap is None else bool(overlap)
    if overlap and down_ctas == ctas:  # (asked for where the model would not: the last round's SMs, if any)
        down_ctas = max(1, ctas - work_items(real_blocks, N, K, splits)[0] % grid1[0])
    grid2 = (max(1, min(down_ctas if overlap else ctas, items2)), 1, 1)
    tiles2 = -(-K // BLOCK_N)
    down_chunks = -(-tiles2 // chunk)
    sync = torch.zeros(2 + grid1[0] * down_chunks if overlap else 1, dtype=torch.int32, device=dev)
    names = kernel_names(overlap)
    need_kernels(module, names)
    k1, k2 = module.kernel(names[0], dev.index), module.kernel(names[1], dev.index)
    for k in (k1, k2):
        raise_shared_limit(k, smem, dev.index)
    # each build is launched with the block its kernels declare (__launch_bounds__): a build of an
    # older file (288 threads, one producer warp) runs beside this one in a paired run
    threads = block_threads(k1, k2)
    p = np.uint64
    # gate_up's zeroing of the output: its pointer and bytes, or none
    zeroing = (p(out.data_ptr()), np.int64(out.numel() * out.element_size())) if zero_out else (p(0), np.int64(0))
    plan_ptrs = [p(plan.sorted_token_ids.data_ptr()), p(plan.expert_ids.data_ptr()),
                 p(plan.num_tokens_post_padded.data_ptr())]
    i32 = np.int32
    run1 = bind_launch(k1, grid1, (threads, 1, 1), smem, w1_map, p(w.w1_scale.data_ptr()),
                       p(x.data_ptr()), p(x_scale.data_ptr()), *plan_ptrs, p(a.data_ptr()), p(a_scale.data_ptr()),
                       i32(slots), i32(top_k), i32(K), i32(N), i32(E), i32(max_blocks), i32(splits),
                       p(part.data_ptr()), p(flags.data_ptr()), *zeroing,
                       p(sync.data_ptr() if overlap else 0), i32(down_chunks))
    run2 = bind_launch(k2, grid2, (threads, 1, 1), smem, w2_map, p(w.w2_scale.data_ptr()),
                       p(a.data_ptr()), p(a_scale.data_ptr()), *plan_ptrs, p(route_w.data_ptr()), p(out.data_ptr()),
                       i32(slots), i32(top_k), i32(K), i32(I), i32(E), i32(max_blocks), i32(chunk),
                       p(sync.data_ptr() if overlap else 0), i32(grid1[0]), i32((N // 256) * splits), i32(N // 256),
                       i32(grid1[0] if zero_out else 0), pdl=overlap)
    keep = (x, x_scale, w, plan, topk_weights, route_w, out, a, a_scale, w1_map, w2_map, part, flags, sync)

    def launch() -> None:
        _ = keep  # the pointers and descriptors stay valid while the launch lives
        run1()
        run2()

    return launch, out, module, dict(dims, grids=[list(grid1), list(grid2)], shared_bytes=smem, stages=STAGES, threads=threads,
                                      max_blocks=max_blocks, intermediate=(a, a_scale), splits=splits,
                                      chunk=chunk, flags=flags, overlap=overlap, sync=sync, kernels=list(names),
                                      launches=(run1, run2))  # (each kernel alone, while `launch` lives: the probe)


def prepare_prefill_call(arm_name: str, fx, max_ctas: int | None = None, *, chunk: int | None = None,
                         splits: int | None = None, overlap: bool | None = None, source=None):
    """The arm's prepared call on this path (untimed: plan, views, buffers, build); `chunk`,
    `splits` and `overlap` override the work cut (split_work's and overlap_down's, for the plan's
    real blocks, when None)."""
    from moebench.fixtures import route_plan
    from moebench.kernels.api.arm import KernelDecl, PreparedCall
    s = fx.spec
    plan = route_plan(fx.topk_ids, s.E, BLOCK_M)
    blocks = plan.num_blocks
    plan = plan.to(fx.device)
    w = prefill_weights(fx.w1, fx.w1_scale, fx.w2, fx.w2_scale)
    launch, out, module, dims = make_prefill_launch(fx.x_fp8, fx.x_scale, w, plan, fx.topk_weights,
                                                    max_ctas=max_ctas, blocks=blocks, chunk=chunk, splits=splits,
                                                    overlap=overlap, source=source, zero_out=True)
    res = {label: module.resources(name, fx.device.index) for (label, _), name in zip(KERNELS, dims["kernels"])}
    identity = {
        "path": "prefill", "kernels": dims["kernels"], "source": SOURCE, "block_m": BLOCK_M,
        "block_n": BLOCK_N, "stages": dims["stages"], "shared_bytes": dims["shared_bytes"], "threads": dims["threads"],
        "grids": dims["grids"], "items": list(work_items(blocks, s.N, s.K, dims["splits"], dims["chunk"])),
        "splits": dims["splits"], "chunk": dims["chunk"], "overlap": dims["overlap"],
        "cut_by": "arm options" if chunk or splits or overlap is not None else "split_work",
        "build": module.build.to_dict(),
        "registers": {k: r.registers for k, r in res.items()},
        "spills": sum(r.spill_stores + r.spill_loads for r in res.values()),
        "wgmma_serialized": {k: r.wgmma_serialized for k, r in res.items() if r.wgmma_serialized},
        "resources_from": sorted({r.source for r in res.values()}),
        "mma": "wgmma m64n128k32 e4m3 -> f32, tokens in M",
        # how down walks its tiles (the kernel chooses by I; a build's source may choose otherwise)
        "down_walk": (("two accumulators, one K step a tile" if s.I == GROUP else
                       "one accumulator, promoted over I/128 K steps a tile") if source is None
                      else "the build's source decides"),
        "output": "written: gate_up zeroes it, down adds into it",
    }
    return PreparedCall(arm=arm_name, run=launch, output=out,
                        kernels=tuple(KernelDecl(label, name, 1) for label, name in KERNELS),
                        identity=identity, workspace=dims["intermediate"])
