"""How the fused kernel is built and launched for a problem: its meta-parameters (BLOCK_M,
STAGES, CTAs an SM, CLUSTER), the shared memory they need (mirroring the kernel's `carve`),
the occupancy and ring depth that fit an SM, the plan blocks a grid covers, how the
hardware is asked to place the clusters, and who zeroes the output and how its partials are
summed. Pure arithmetic: no GPU, no compiler."""

from __future__ import annotations

import re

from moebench.errors import UserError
from moebench.kernels.cuda.fused_layout import DEFAULT_CLUSTER, GROUP

THREADS = 288  # 8 consumer warps + 1 producer warp
AQ_ROW, STG_ROW = 144, 20
MAX_BLOCK_M = 48  # BLOCK_M 56 and 64 do not fit the consumers in the 168 registers of 9 warps without spilling
MAX_BLOCK_M_ALONE = 16  # one CTA an item holds gate and up sums: from BLOCK_M 32 they spill
SMEM_PER_SM = 228 * 1024  # H100/H200: shared memory per SM; 1 KB of it reserved per CTA
SMEM_PER_CTA = 227 * 1024
MAX_STAGES = 8


def meta_bytes(block_m: int, K: int) -> int:
    KB = K // GROUP
    return (16 + 3 * block_m * 4 + block_m * (KB + 4) * 4 + 3 * KB * 4 + 15) & ~15


def chunk_bytes(cluster: int) -> int:
    """One ring stage of weights (the kernel's CHUNK_BYTES): 16 KB, or 32 KB (one k block of
    the group's 256 gate and up rows) for one CTA an item."""
    return 32768 if cluster == 1 else 16384


def x_row(cluster: int) -> int:
    """Bytes of one activation row of a GEMM1 chunk in shared memory (the kernel's X_ROW):
    the chunk's k blocks (4 at clusters of 8, 2 at 4, 1 alone) + 16, so the B loads hit every
    bank once."""
    return max(cluster // 2, 1) * GROUP + 16


def shared_bytes(block_m: int, stages: int, K: int, cluster: int) -> int:
    """Dynamic shared memory of one CTA: mirrors `carve` in the kernel (which checks it)."""
    red = 0 if cluster == 1 else 8 * 16 * block_m * 4  # GEMM1's partials of the cluster's warps
    n = stages * chunk_bytes(cluster) + stages * block_m * x_row(cluster) + block_m * GROUP * 4 + red
    n += block_m * AQ_ROW
    n = (n + 15) & ~15
    n += 8 * 8 * STG_ROW * 4 + 2 * meta_bytes(block_m, K)
    return n + 2 * stages * 8 + 4 * 8 + 2 * 8 + 4 * 8 + 2 * 4  # ring, meta, exchange, ticket barriers; tickets


def ctas_per_sm(block_m: int, cluster: int = DEFAULT_CLUSTER) -> int:
    """CTAs an SM holds (the kernel's MIN_CTAS_PER_SM default): two small ones hide each
    other's SwiGLU exchange; from BLOCK_M 32 the per-item buffers leave room for one. One CTA
    an item runs alone on its SM, with the deepest ring."""
    return 2 if block_m <= 16 and cluster > 1 else 1


def occupancies(block_m: int, cluster: int = DEFAULT_CLUSTER) -> tuple[int, ...]:
    """CTAs an SM the arm may launch at: the default and, up to BLOCK_M 16 in clusters, one
    more (from BLOCK_M 32 on, the register budget of one more CTA does not hold the consumers
    without spilling under nvcc 13.0's ptxas, the H200's)."""
    base = ctas_per_sm(block_m, cluster)
    return (base, base + 1) if base == 2 else (base,)


def pick_occupancy(items: int, options: list[tuple[int, int]]) -> int:
    """Index into `options` ((CTAs an SM, resident clusters), fewest CTAs an SM first) of
    the launch to use: one more CTA an SM (shallower ring, more consumer warps) only where its
    extra clusters take whole rounds of items off, since each round is slower; where the
    rounds stay the same the fewer, deeper-ringed CTAs are faster
    (results/h200/experiments/cuda-fused-stages-*, cuda-fused-clusters-*)."""
    rounds = [-(-items // max(c, 1)) for _, c in options]
    return rounds.index(min(rounds))  # the first (fewest CTAs an SM) of those with fewest rounds


WIDE_K = 4096  # hidden sizes at which an item streams long enough for clusters of 8 to pay
TAIL_ROUNDS = (2.0, 2.5)  # rounds of clusters of 4 (three CTAs an SM) whose last is at most half full
TAIL_CLUSTER = 8


def tail_launch(items: int, K: int, per_sm: int, clusters: int) -> tuple[int, int | None] | None:
    """Where clusters of 4 at three CTAs an SM would end in a third round at most half full:
    (cluster size, most clusters) to launch instead, else None. At a wide K clusters of 8; below it
    clusters of 4, no more than fill three whole rounds. Measured on an H100
    (results/h100/experiments/decode-clusters-*): in that band clusters of 8 took family A at M =
    48-72 6-11% faster and whole rounds 5-10%, and whole rounds took Q24 (K = 2048) 8.6% and Q32
    1.3% faster, where clusters of 8 were 0.5% faster and 3% slower; outside it neither was faster
    by more than 2% (docs/kernels.md, "Clusters of 8 where a launch ends in a thin third round")."""
    rounds = items / max(clusters, 1)
    lo, hi = TAIL_ROUNDS
    if per_sm != 3 or not lo < rounds <= hi:
        return None
    return (TAIL_CLUSTER, None) if K >= WIDE_K else (DEFAULT_CLUSTER, -(-items // 3))  # three whole rounds


def choose_stages(block_m: int, K: int, per_sm: int | None, cluster: int) -> int:
    """The deepest ring (up to MAX_STAGES) that keeps `per_sm` CTAs (None: `ctas_per_sm`)
    resident on an SM."""
    per_sm = ctas_per_sm(block_m, cluster) if per_sm is None else per_sm
    per_cta = min(SMEM_PER_CTA, SMEM_PER_SM // per_sm - 1024)
    for stages in range(MAX_STAGES, 1, -1):
        if shared_bytes(block_m, stages, K, cluster) <= per_cta:
            return stages
    raise UserError(f"cuda-fused: block_m={block_m} with K={K} needs "
                    f"{shared_bytes(block_m, 2, K, cluster)} B of shared memory, more than an SM has")


def default_block_m(num_slots: int, num_experts: int) -> int:
    """Tokens per plan block: decode-sized groups get 8 (Swap-AB n-tile), larger ones more."""
    per_expert = num_slots / max(num_experts, 1)
    for bm in (8, 16, 32):
        if per_expert <= 0.75 * bm:
            return bm
    return MAX_BLOCK_M


def launch_blocks(num_slots: int, num_experts: int, block_m: int, capacity: int) -> int:
    """Plan blocks the grid covers: the most that any routing can fill, whatever the plan
    buffers hold. Only experts with slots get blocks (moe_align_block_size), so at most
    min(E, slots) experts each waste up to block_m - 1 slots: at A8 72 blocks, not the 234 the
    buffers are sized for; every block past the device-side padded total exits at once."""
    worst = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return min(capacity // block_m, (worst + block_m - 1) // block_m)


def kernel_defines(block_m: int, stages: int, per_sm: int, cluster: int,
                   deterministic: bool = False, zero_out: bool = False, fp32_sum: bool = False) -> dict[str, str]:
    """The .cu's meta-parameters for one build (DETERMINISTIC, ZERO_OUT and FP32_SUM only where
    chosen, so the default build's identity does not change)."""
    d = {"BLOCK_M": str(block_m), "STAGES": str(stages), "MIN_CTAS_PER_SM": str(per_sm), "CLUSTER": str(cluster)}
    if deterministic:
        d["DETERMINISTIC"] = "1"
    if zero_out:
        d["ZERO_OUT"] = "1"
    if fp32_sum:
        d["FP32_SUM"] = "1"
    return d


SUMS = ("fp32", "bf16")  # how the decode kernel sums an output element's partials (the arm's `sums` option)


def sums_in_fp32(I: int) -> bool:  # noqa: E741 - the standard name for the intermediate size
    """Whether a decode launch that writes its output sums its partials in FP32 (the kernel's
    FP32_SUM: reductions into an FP32 copy of the output, one BF16 rounding at the end) rather than
    reduce-adding them into the BF16 output. Each (plan block, 128 columns of I) item adds one
    partial to an element, top_k x I/128 of them: with I = 128 that is top_k BF16 adds, as
    cuda-swapab's slots make, and FP32 sums would double the reductions' bytes and wait at the end
    for every CTA, for no gain; from I = 256 the BF16 adds multiply (144 at DeepSeek-V3's whole
    experts, four times cuda-swapab's distance from the exact result: docs/parity.md), and FP32
    sums remove all but the last rounding."""
    return I > GROUP


_FP32_SUM_RE = re.compile(r"^\s*#\s*ifndef\s+FP32_SUM\b", re.MULTILINE)


def can_sum_fp32(source_text: str) -> bool:
    """Whether a source of the decode kernel has the FP32_SUM meta-parameter (a --build of an older
    copy has not: it reduce-adds into the BF16 output, as it did)."""
    return _FP32_SUM_RE.search(source_text) is not None


def check_sums(sums: str | None, deterministic: bool) -> None:
    """The `sums` option's user errors: an unknown mode, or any mode for the deterministic build."""
    who = "cuda-fused-det" if deterministic else "cuda-fused"
    if sums is not None and sums not in SUMS:
        raise UserError(f"{who}: sums={sums!r} must be one of {', '.join(SUMS)}")
    if sums is not None and deterministic:
        raise UserError(f"{who}: sums={sums} does not apply (the combine sums BF16 rows in FP32)")


def summing_mode(sums: str | None, I: int, source_text: str, origin: str,  # noqa: E741
                 deterministic: bool, writes: bool) -> str | None:
    """How a decode launch sums its partials: "fp32" (FP32_SUM) or "bf16" (reductions into the
    BF16 output); None for the deterministic build (its combine sums BF16 rows in FP32). `sums`
    forces one, else `sums_in_fp32`. FP32 sums need a launch that writes its output (`writes`:
    the call zeroes them; a launch adding into a given output keeps BF16 reductions) and a source
    with FP32_SUM."""
    check_sums(sums, deterministic)
    if deterministic:
        return None
    if sums is None:
        return "fp32" if writes and sums_in_fp32(I) and can_sum_fp32(source_text) else "bf16"
    if sums == "fp32" and not writes:
        raise UserError("cuda-fused: sums=fp32 needs a call that writes its output (it zeroes the FP32 sums)")
    if sums == "fp32" and not can_sum_fp32(source_text):
        raise UserError(f"{origin}: no FP32_SUM meta-parameter (sums=fp32 needs the kernel to sum in FP32)")
    return sums


ZERO_MODES = ("kernel", "launch")  # who zeroes an output the call writes: the fused kernel, or a kernel ahead


def zeroes_in_kernel(per_sm: int, cluster: int) -> bool:
    """Whether a decode launch that writes its output zeroes it itself (the kernel's ZERO_OUT)
    rather than behind a zeroing kernel it is the programmatic dependent of. At three CTAs an SM
    the kernel's own stripes were faster (Q8, A128, Q128); at two slower (A1, A8, Q1), by more
    than the zeroing kernel costs, for a reason not located (docs/kernels.md, "The output,
    written in the call"). Clusters of 8 at three CTAs an SM keep the zeroing kernel: their
    ZERO_OUT build spills (4 bytes each way, an 8-byte frame) under NVRTC 13.0, the H200's."""
    return per_sm >= 3 and cluster <= 4


def deterministic_occupancies(block_m: int, cluster: int = DEFAULT_CLUSTER) -> tuple[int, ...]:
    """`occupancies` of the deterministic build: it keeps two accumulator chains at every
    BLOCK_M (a token's sums do not follow the block size), which spill at BLOCK_M 16 with three
    CTAs an SM, so there it launches at two."""
    return tuple(ps for ps in occupancies(block_m, cluster) if not (block_m == 16 and ps >= 3))


def fp32_occupancies(block_m: int, cluster: int = DEFAULT_CLUSTER) -> tuple[int, ...]:
    """`occupancies` of the FP32_SUM build: at BLOCK_M 16 with three CTAs an SM its consumers spill
    under nvcc 13.0's ptxas (not NVRTC 13.0's), so there it launches at two, as the deterministic
    build does. (The decode path's own block size is 8: BLOCK_M 16 comes from options.)"""
    return tuple(ps for ps in occupancies(block_m, cluster) if not (block_m == 16 and ps >= 3))


def build_occupancies(block_m: int, cluster: int, deterministic: bool = False, fp32: bool = False) -> tuple[int, ...]:
    """The occupancies a build may launch at: the deterministic build's, the FP32_SUM build's, or the default's."""
    pick = deterministic_occupancies if deterministic else fp32_occupancies if fp32 else occupancies
    return pick(block_m, cluster)


def cluster_policy(one_round: bool) -> str:
    """How the hardware is asked to place the clusters on SMs (cuda_launch.CLUSTER_POLICIES).
    Persistent launches (more work items than the default placement keeps resident) take
    "load-balancing": it puts clusters of 4 on every SM of an H200 where the default leaves
    some without one, so more clusters are resident and a launch needs fewer rounds. Launches
    of one round keep the default placement, which was faster there."""
    return "default" if one_round else "load-balancing"
