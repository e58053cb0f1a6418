// sm90_fused_moe.cu: the whole FP8 W8A8 MoE layer in one sm_90a kernel.
//
//   out[t] += w[t,k] * down_e( requant128( silu(gate_e(x_t)) * up_e(x_t) ) ),  e = ids[t,k]
//
// Work split. A work item is one (route-plan block, requant group g of 128 intermediate
// columns); it belongs to one thread-block cluster of CLUSTER CTAs (8 or 4), each owning
// COLS = 128/CLUSTER columns (16 or 32), or to one CTA with all 128 (CLUSTER 1: no exchange,
// see below). CTA c of the cluster
//   GEMM1  streams COLS gate rows and COLS up rows of w1[e] (rows 128g+COLS*c.., I+128g+COLS*c..)
//          over the full K: 2*COLS*K bytes; h = x . w1^T with 128x128 block scales, FP32;
//   SwiGLU a = silu(h_gate) * h_up for its COLS columns, stored with st.async into the shared
//          memory of all CLUSTER CTAs (DSMEM), completing on each one's mbarrier: every CTA
//          holds the group's 128 columns;
//   requant per token over the 128 columns (scale = max(amax/448, 1e-10)), FP8 codes, on chip;
//   GEMM2  streams rows [c*K/CLUSTER, (c+1)*K/CLUSTER) of w2[e] restricted to group g:
//          128*K/CLUSTER bytes, and adds route_weight * y into the BF16 output with
//          v4.bf16x2 reductions (8 columns).
// Persistent grid: as many clusters as fit on the GPU at once (the host asks the driver).
// Cluster q does item q first, then takes tickets from a global counter (its rank 0 takes
// each and sends it to the cluster's CTAs): every item streams the same 384*K/CLUSTER bytes a
// CTA, but clusters drift apart over a launch (SMs holding 2 or 3 busy CTAs, their place in
// the memory system), and a queue gives the last items to the clusters that are free first.
//
// Warp roles: warps 0-7 compute (no __syncthreads in the loop: named barrier 1 among them);
// warp 8 is the producer. It reads each item's route-plan entries and scales into one of two
// shared "meta" slots (full/empty mbarriers) and streams the item's weight chunks (and, for
// GEMM1, the block's activation rows) into the ring with cp.async.bulk, running ahead across
// item boundaries, so HBM stays busy through every SwiGLU exchange and item change: the next
// item's meta is built while the current item's chunks stream.
// In launches of one round, past its first ring, the producer keeps at most LAG of its chunks
// waiting to land (few copies queue in the SM's bulk copy engine), unless its SM holds three
// busy CTAs (CROWD_LAG: BLOCK_M 8 at three CTAs an SM), whose copies share that engine.
// The DSMEM exchange needs no cluster barrier per item: writers st.async into the
// readers' `afull`, the reader's mbarrier counts the bytes; a reader that finished its
// requant arrives (release.cluster) on every writer's `aempty` mbarrier, which the writer
// waits on before its next item's stores. One cluster barrier at the start (remote
// mbarriers initialised) and one at the end (no CTA leaves while others may write to it).
//
// Tensor cores: mma.sync m16n8k32 e4m3 in Swap-AB form: weights fill the 16-row A slot,
// the block's tokens are the 8-column B operand (BLOCK_M/8 n-tiles). Compute is far below
// the memory time at every fixture; what matters is the streaming.
//
// Data movement. Weights are re-laid once on the host (prepare_fused_weights) so that each
// CTA's stream is contiguous and each 16x32 A tile is 512 bytes in mma fragment order: one
// conflict-free 16-byte shared load per lane. Within every 128-wide k block the k order is
// permuted, identically for both operands, so that a lane's B fragment for all four k32 steps
// is the 32 contiguous bytes [32t, 32t+32) of its token's row (t = lane % 4):
//     logical k 4t+j    of k-step s  <->  physical 32t + 8s + j
//     logical k 16+4t+j of k-step s  <->  physical 32t + 8s + 4 + j
// The stream is cut into 16 KB chunks (GEMM1: KBC k blocks of the 2*COLS rows, 4 x 32 or
// 2 x 64; GEMM2: 8 m-tiles of 16 rows x 128) in a ring of STAGES buffers; the activation rows of
// a GEMM1 chunk land in the same stage on the same mbarrier.
// CLUSTER 1 (one CTA an item, alone on its SM): 32 KB chunks (GEMM1: one k block of the 256
// gate and up rows; GEMM2: 16 m-tiles). Warp w owns gate m-tile w and up m-tile w, the same 16
// columns, over all of K, so SwiGLU is warp-local and a consumer barrier replaces the exchange.
// It streams no faster than one SM's bulk copy engine, slower than the four SMs of a cluster of
// 4, so it is an option of the host (cluster=1), for BLOCK_M <= 16, not its default.
// Padding rows (no token) are never copied: the
// activation ring is zeroed once at start, so a padding row holds zeros or another item's
// (finite) activations, and its scale is 0: its accumulators stay 0 and nothing is written.
//
// Route plan: moe_align_block_size semantics. Blocks at or past the device-side padded total,
// or whose expert id is outside [0, E), are skipped; sentinel slots (>= num_slots) are
// padding.
//
// Meta-parameters (defines, chosen by the host): BLOCK_M (tokens per plan block, a multiple of
// 8 up to 48: at 56 and 64 the consumers do not fit the 168 registers of 9 warps without
// spilling), STAGES (ring depth), MIN_CTAS_PER_SM (1 to 3: the register budget; the host sizes
// STAGES to match), CLUSTER (8, 4 or 1; the host lays the weights out for it).
//
// DETERMINISTIC (0 or 1, the user's choice: arm cuda-fused-det). At 1 the output is the same bits
// on every run and for every batch a token is in: the kernel stores each (token slot, group)
// contribution as BF16 into its own row of a workspace (`out` is then that workspace,
// [num_slots * G, K], row slot * G + g) instead of reduce-adding it into the output, and
// moebench_fused_moe_combine sums a token's top_k * G rows in that fixed order in FP32 and adds
// the sum into the output once. Everything before the epilogue is already per token (a token's
// column of every mma, its requant over its own 128 values, its route weight), whatever block
// or neighbours the route plan gives it; the one per-build difference, the accumulator chains
// of mma_block, is pinned to two. The combine is launched as this kernel's programmatic
// dependent (PDL): each CTA lets it launch once its items are done, so its launch does not
// follow this grid's end and its CTAs are placed on SMs this grid is leaving (a trigger at the
// CTAs' start, which placed them beside running CTAs, left 1 µs more past this grid's end at A8:
// experiments/cuda-fused-det-late-trigger.json.gz); it waits for that end before it reads.
//
// ZERO_OUT (0 or 1, the host's choice per launch: fused_policy.zeroes_in_kernel). At 1 the launch
// writes its output rather than adding into it, and zeroes it itself: no zeroing kernel ahead.
// Each CTA's consumers zero stripe blockIdx.x of the output once the set-up is done, and one of
// them adds the CTA's share to a count that only grows (work[ZERO_COUNT]: a launch adds ZERO_SPAN
// in all, so between launches it is a multiple of ZERO_SPAN); the producer read it at entry,
// before any share of this launch could be its own CTA's, and before its first GEMM2 chunk may
// complete it waits (acquire) for the launch's multiple: every stripe is zero before any
// reduction. The chunk's copy goes out before the wait, its arrival after it. Like the prefill
// kernels' chained counters, it needs every CTA of the persistent grid resident at once.
//
// FP32_SUM (0 or 1, the host's choice: fused_policy.sums_in_fp32, for launches that write their
// output). At 1 no BF16 rounding happens before the end: the epilogues reduce-add into `acc`, an
// FP32 copy of the output ([M, K], zeroed in the call as the output is otherwise: ZERO_OUT's
// stripes or the zeroing kernel ahead), with one 16-byte v4.f32 reduction a lane (4 columns), and
// the output is stored once from it. An element then takes top_k x I/128 FP32 adds and one BF16
// rounding, where at 0 it takes that many BF16 adds (144 at DeepSeek-V3's whole experts, I 2048):
// four times cuda-swapab's distance from the exact result there (parity.md). The store comes
// after a grid-wide count: each CTA, its items done, adds its share to a count that only grows
// (work[DONE_COUNT], ZERO_SPAN a launch, as ZERO_OUT's), its producer warp waits (acquire) for the
// launch's multiple and then stores stripe blockIdx.x of the output from `acc`. Like ZERO_OUT it
// needs every CTA of the persistent grid resident at once. The host takes it where I > 128: with
// one group an expert an element takes top_k BF16 adds, as cuda-swapab's, and the FP32 path would
// add its doubled reduction bytes and the count's wait at the end for no gain.
//
// The kernel body is the sequence of its stages: set-up, then the producer warp
// (produce_items) and the consumer warps, item by item (gemm1_*, swiglu_*, requant, gemm2 with
// its epilogue reduce_out), then the cluster's final barrier.

#include "sm90_sync.cuh"

#ifndef BLOCK_M
#define BLOCK_M 8
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM (BLOCK_M <= 16 ? 2 : 1)
#endif

#ifndef CLUSTER
#define CLUSTER 8              // CTAs per work item, CLUSTER x COLS intermediate columns = one group
#endif
#define CONSUMERS 256          // warps 0-7 compute
#define THREADS 288            // + warp 8, the producer
#define GROUP 128              // FP8 block-scale granularity
#define CHUNK_BYTES (CLUSTER == 1 ? 32768 : 16384)  // one ring stage of weights
#define CHUNK_TILES (CHUNK_BYTES / 2048)            // 16x128 m-tiles in a chunk: 8 or 16
#define AQ_ROW 144             // shared row of requantized intermediate: 128 bytes + 16
#define STG_ROW 20             // epilogue staging row (floats): 16 + 4, conflict-free
#define NT (BLOCK_M / 8)       // mma n-tiles per block
#define COLS (GROUP / CLUSTER) // intermediate columns per CTA: 16, 32 or 128
#define MT1 (2 * COLS / 16)    // GEMM1 m-tiles per CTA (gate tiles, then up tiles): 2, 4 or 16
#define KBC (CLUSTER == 1 ? 1 : 8 / MT1)  // k blocks per GEMM1 chunk (8 warps = KBC x MT1): 4, 2 or 1
#define X_ROW (KBC * GROUP + 16)  // shared row of a chunk's activations: + 16 bytes (no bank conflicts)
#define RED_FLOATS (CLUSTER == 1 ? 0 : 8 * 16 * BLOCK_M)  // GEMM1's per-warp partials (none alone)
#define LOG2_MT1 (CLUSTER == 8 ? 1 : 2)
#define LOG2_CLUSTER (CLUSTER == 8 ? 3 : 2)
#define LOG2_Q (CLUSTER == 8 ? 2 : 3)  // log2 of COLS / 4 (float4 stores per token and CTA)
// (Index math on these is written with shifts and masks: with signed / and % the
// tight register budgets at 3 CTAs an SM spill.)

#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
#ifndef ZERO_OUT
#define ZERO_OUT 0
#endif
#ifndef FP32_SUM
#define FP32_SUM 0
#endif

static_assert(BLOCK_M % 8 == 0 && BLOCK_M >= 8 && BLOCK_M <= 48, "BLOCK_M: a multiple of 8, at most 48");
static_assert(STAGES >= 2 && STAGES <= 10, "STAGES in [2, 10]");
static_assert(CLUSTER == 1 || CLUSTER == 4 || CLUSTER == 8, "CLUSTER: 1, 4 or 8");
static_assert(!(DETERMINISTIC && ZERO_OUT), "the deterministic build's combine writes the output: nothing to zero");
static_assert(!(DETERMINISTIC && FP32_SUM), "the deterministic build's combine sums in FP32 already");

// Behaviour that follows from the meta-parameters (not switches):
// In launches of one round (no more items than clusters) the producer issues chunk g >= STAGES
// only once chunk g - LAG has landed, so that few of its copies wait in the SM's bulk copy
// engine; the first ring goes out at once. Launches of several rounds stream as far ahead as the
// ring allows: there every SM's engine has the next item's chunks to serve.
constexpr int LAG = 2;
// Where an SM holds three busy CTAs (BLOCK_M 8 at three CTAs an SM) its producers do not lag:
// their copies share one engine, which the lag would leave idle. Not at BLOCK_M 16, where the
// count of busy CTAs does not fit the register budget without spilling.
constexpr bool CROWD_LAG = MIN_CTAS_PER_SM >= 3 && BLOCK_M == 8;
// Clusters of 4 (the default) load the producer's first trip at kernel entry, before the set-up;
// the others load it after the set-up, as every later item's: held in registers through the
// set-up, it spills clusters of 8 and one CTA an item at BLOCK_M 16.
constexpr bool FIRST_AT_ENTRY = CLUSTER == 4;
// Item 0's first EARLY_CHUNKS chunks of weights go out as soon as its expert is known, before
// its meta (the ring is empty then; more would delay the meta's copies behind them).
constexpr int EARLY_CHUNKS = 2;
// Independent accumulator chains mma_block spreads its four k steps over, summed at the end:
// each e4m3 step is two dependent HMMA.16816 on sm_90, so one chain is eight HMMAs deep, and the
// consumers' GEMM2 at the end of a launch waits on that latency. One chain at BLOCK_M 16 with
// three CTAs an SM, where two spill.
// The deterministic build keeps two at every BLOCK_M, so a token's sums do not depend on the
// block size the batch picks (it does not build BLOCK_M 16 at three CTAs an SM).
constexpr int MMA_CHAINS = !DETERMINISTIC && BLOCK_M == 16 && MIN_CTAS_PER_SM >= 3 ? 1 : 2;
static_assert(!(DETERMINISTIC && BLOCK_M == 16 && MIN_CTAS_PER_SM >= 3),
              "the deterministic build: two accumulator chains spill at BLOCK_M 16 with three CTAs an SM");
static_assert(LAG <= STAGES && EARLY_CHUNKS <= STAGES, "the lag and the early chunks wait on chunks still in the ring");
// ZERO_OUT: the count of zeroed stripes, after the tickets and the per-SM counts in `work`; what a
// launch adds to it in all (a power of two, at least the grid: CTA 0 adds what the others do not).
constexpr int ZERO_COUNT = 2 + 256;
constexpr int ZERO_SPAN = 1024;
#if FP32_SUM
// The count of CTAs whose items are done, after ZERO_COUNT; a launch adds ZERO_SPAN to it.
constexpr int DONE_COUNT = ZERO_COUNT + 1;
#endif

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// ------------------------------------------------------------------------------ PTX helpers

// An int the compiler cannot see through: what is derived from it is computed where it is used.
__device__ __forceinline__ int launder(int v) {
    asm volatile("" : "+r"(v));
    return v;
}

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ u32 dynamic_smem_size() {
    u32 r;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

// Expect `bytes` more on the current phase of `bar`, without arriving.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

// One contiguous global -> shared copy by the bulk copy engine, completing on `bar`.
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// The same for weights, which a launch reads once: under an L2 evict_first policy, so the lines
// that stream through the L2 go before the ones read again in this launch (activations, the
// output the epilogues reduce into, the DETERMINISTIC workspace the combine reads at the end).
__device__ __forceinline__ void bulk_copy_once(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "{\n"
        ".reg .b64 policy;\n"
        "createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], policy;\n"
        "}\n" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// One line into L2 (no register written; its address translation is filled on the way).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}

// 4 bytes global -> shared by the async copy unit (no register holds the value): the
// producer's gathers of route weights and scales, tracked by cp_async_arrive.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_u32(dst)), "l"(src) : "memory");
}

// The current phase of `bar` also waits for every cp.async this thread issued before
// (the pending count goes up by one now and down when they land; the thread still arrives).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// As mbar_wait, acquiring at cluster scope: for data other CTAs stored with st.async.
__device__ __forceinline__ void mbar_wait_cluster(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

// The shared::cluster address of the local shared address `local` in CTA `rank`.
__device__ __forceinline__ u32 mapa(u32 local, u32 rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}

// 16 bytes into another CTA's shared memory, completing (bytes) on its mbarrier `rbar`.
__device__ __forceinline__ void st_async_v4(u32 raddr, float4 v, u32 rbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 :: "r"(raddr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar) : "memory");
}

// Arrive on an mbarrier of another CTA of the cluster. Relaxed: it only says "my reads of
// afull are done", and those reads already produced the values this CTA stored since (a
// release would wait for this thread's BF16 reductions in flight: MEMBAR.GPU per item).
__device__ __forceinline__ void mbar_arrive_remote(u32 rbar) {
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" :: "r"(rbar) : "memory");
}

__device__ __forceinline__ int atom_add_acq_rel(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// 4 bytes into another CTA's shared memory, completing (bytes) on its mbarrier `rbar`.
__device__ __forceinline__ void st_async_b32(u32 raddr, int v, u32 rbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 :: "r"(raddr), "r"(v), "r"(rbar) : "memory");
}

__device__ __forceinline__ void named_sync_consumers() {
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
}

// D += A(16x32 e4m3, row) * B(32x8 e4m3, col), FP32 accumulators.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint4& a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Four k32 steps over one 128-wide k block: a[s] are the A fragments, `b` the lane's 32 bytes
// of its token row (words 2s, 2s+1 feed k-step s, see the permutation above), spread over
// MMA_CHAINS accumulator chains.
__device__ __forceinline__ void mma_block(float (&d)[4], const uint4 (&a)[4], const uint4& blo, const uint4& bhi) {
    if constexpr (MMA_CHAINS == 1) {
        mma_e4m3(d, a[0], blo.x, blo.y);
        mma_e4m3(d, a[1], blo.z, blo.w);
        mma_e4m3(d, a[2], bhi.x, bhi.y);
        mma_e4m3(d, a[3], bhi.z, bhi.w);
    } else {
        float q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_e4m3(d, a[0], blo.x, blo.y);
        mma_e4m3(q, a[1], blo.z, blo.w);
        mma_e4m3(d, a[2], bhi.x, bhi.y);
        mma_e4m3(q, a[3], bhi.z, bhi.w);
        #pragma unroll
        for (int i = 0; i < 4; ++i) d[i] += q[i];
    }
}

// Four floats -> four e4m3 codes (round to nearest even, saturating), low byte first.
__device__ __forceinline__ u32 pack_e4m3x4(float x0, float x1, float x2, float x3) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
}

// out[0..7] += v[0..7] as one 16-byte v4.bf16x2 reduction in L2 (out 16-byte aligned).
__device__ __forceinline__ void red_add_bf16x8(unsigned short* out, float4 lo, float4 hi) {
    u32 p0, p1, p2, p3;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p0) : "f"(lo.y), "f"(lo.x));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p1) : "f"(lo.w), "f"(lo.z));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p2) : "f"(hi.y), "f"(hi.x));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p3) : "f"(hi.w), "f"(hi.z));
    asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};"
                 :: "l"(out), "r"(p0), "r"(p1), "r"(p2), "r"(p3) : "memory");
}

// out[0..3] += v[0..3] as one 16-byte v4.f32 reduction in L2 (out 16-byte aligned): FP32_SUM.
__device__ __forceinline__ void red_add_f32x4(float* out, float4 v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(out), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

// dst[0..7] = v[0..7] as BF16, one 16-byte store (dst 16-byte aligned): a deterministic build's
// contribution, into its own workspace row; FP32_SUM's output, from its FP32 sums.
__device__ __forceinline__ void store_bf16x8(unsigned short* dst, float4 lo, float4 hi) {
    u32 p0, p1, p2, p3;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p0) : "f"(lo.y), "f"(lo.x));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p1) : "f"(lo.w), "f"(lo.z));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p2) : "f"(hi.y), "f"(hi.x));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p3) : "f"(hi.w), "f"(hi.z));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                 :: "l"(dst), "r"(p0), "r"(p1), "r"(p2), "r"(p3) : "memory");
}

// The divisions here and in the requant are __fdividef (x times an approximate reciprocal, 2 ulp
// at most) and the exponential is __expf: IEEE division branches, for some operands, to a
// slow-path subroutine, which stalls the SwiGLU behind the weight stream. 2 ulp of FP32 moves an
// E4M3 code (3 mantissa bits) only at a rounding tie, far inside the parity tolerance. For v
// below about -88, __expf(-v) is inf and the quotient 0, as silu's limit.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// ------------------------------------------------------------------------------ shared layout
// Offsets in bytes from the dynamic shared base; fused_arm.py mirrors this (shared_bytes()).
//   ring   STAGES x CHUNK_BYTES    weight chunks (16 KB, 32 KB alone)
//   xring  STAGES x BLOCK_M x X_ROW  activation rows of GEMM1 chunks
//   afull  BLOCK_M x 128 floats    the group's SwiGLU output, stored by all CLUSTER CTAs
//   red    8 x 16 x BLOCK_M floats GEMM1's per-warp partial sums (none at CLUSTER 1)
//   aq     BLOCK_M x 144 bytes     the FP8 intermediate
//   stg    8 x 8 x 20 floats       per-warp epilogue staging (rows -> 8 columns per lane)
//   meta   2 x META bytes          per item: expert, group, (ZERO_OUT, slot 0: the count of zeroed
//                                  stripes item 0's first GEMM2 chunk waits for), valid tokens; token (its
//                                  slot from the requant on, DETERMINISTIC), route weight,
//                                  requant scale x route weight (DETERMINISTIC: the slot until
//                                  the requant) [BLOCK_M]; activation scales
//                                  [BLOCK_M][KB + 4] (rows 16-byte aligned when KB % 4 == 0, and
//                                  conflict-free for GEMM1's reads); gate/up scales [2][KB];
//                                  down scales [KB]
//   bars   full, empty [STAGES]; mfull, mempty [2]; afull, aempty; tfull, tempty [2]
//   tick   2 x int                 work tickets from the cluster's rank 0

__host__ __device__ constexpr u32 meta_bytes(int KB) {
    return (16 + 3 * BLOCK_M * 4 + BLOCK_M * (KB + 4) * 4 + 3 * KB * 4 + 15) & ~15u;
}

// Item 0's plan slot ids: one a producer lane (and one more for each 32 rows of BLOCK_M past 32).
struct Sids { int v[(BLOCK_M + 31) / 32]; };

struct Meta {
    int* hdr; int* tok; float* rw; float* tmul; float* xs; float* w1s; float* w2s;
};

__device__ __forceinline__ Meta meta_at(u8* p, int KB) {
    Meta m;
    m.hdr = reinterpret_cast<int*>(p);
    m.tok = reinterpret_cast<int*>(p + 16);
    m.rw = reinterpret_cast<float*>(p + 16 + BLOCK_M * 4);
    m.tmul = reinterpret_cast<float*>(p + 16 + 2 * BLOCK_M * 4);
    m.xs = reinterpret_cast<float*>(p + 16 + 3 * BLOCK_M * 4);
    m.w1s = m.xs + BLOCK_M * (KB + 4);
    m.w2s = m.w1s + 2 * KB;
    return m;
}

struct Smem {
    u8* ring; u8* xring; float* afull; float* red; u8* aq; float* stg; u8* meta;
    u32 full; u32 empty; u32 mfull; u32 mempty; u32 abar; u32 aempty; u32 tfull; u32 tempty; int* tick; u32 bytes;
};

__device__ __forceinline__ Smem carve(u8* base, int KB) {
    Smem s;
    u32 off = 0;
    s.ring = base + off;   off += STAGES * CHUNK_BYTES;
    s.xring = base + off;  off += STAGES * BLOCK_M * X_ROW;
    s.afull = reinterpret_cast<float*>(base + off);  off += BLOCK_M * GROUP * 4;
    s.red = reinterpret_cast<float*>(base + off);    off += RED_FLOATS * 4;
    s.aq = base + off;                               off += BLOCK_M * AQ_ROW;
    off = (off + 15) & ~15u;
    s.stg = reinterpret_cast<float*>(base + off);    off += 8 * 8 * STG_ROW * 4;
    s.meta = base + off;                             off += 2 * meta_bytes(KB);
    s.full = smem_u32(base + off);                   off += STAGES * 8;
    s.empty = smem_u32(base + off);                  off += STAGES * 8;
    s.mfull = smem_u32(base + off);                  off += 2 * 8;
    s.mempty = smem_u32(base + off);                 off += 2 * 8;
    s.abar = smem_u32(base + off);                   off += 8;
    s.aempty = smem_u32(base + off);                 off += 8;
    s.tfull = smem_u32(base + off);                  off += 2 * 8;
    s.tempty = smem_u32(base + off);                 off += 2 * 8;
    s.tick = reinterpret_cast<int*>(base + off);     off += 2 * 4;
    s.bytes = off;
    return s;
}

// ------------------------------------------------------------------------------ the stages

// K-derived sizes of one CTA's work.
struct Dims {
    int KB;     // k blocks of 128
    int n1;     // GEMM1 chunks: KBC k blocks x 2*COLS rows
    int mt2;    // GEMM2 m-tiles of this CTA: K/CLUSTER rows
    int total;  // chunks an item: n1 + GEMM2's (CHUNK_TILES m-tiles x 16 rows each)
    u32 MB;     // bytes of one meta slot
};

__device__ __forceinline__ Dims dims_of(int K) {
    Dims d;
    d.KB = K / GROUP;
    d.n1 = (d.KB + KBC - 1) / KBC;
    d.mt2 = d.KB * (8 / CLUSTER);
    d.total = d.n1 + (d.mt2 + CHUNK_TILES - 1) / CHUNK_TILES;
    d.MB = meta_bytes(d.KB);
    return d;
}

// The kernel's arguments, as one record for the stages (see moebench_fused_moe).
struct Args {
    const u8* x; const float* x_scale;
    const u8* w1f; const float* w1_scale;
    const u8* w2f; const float* w2_scale;
    const int* sorted_token_ids; const int* expert_ids;
    const int* num_tokens_post_padded; const float* topk_weights;
    unsigned short* out;
    int* work;
    int num_slots, top_k, K, E, max_blocks, G;
#if FP32_SUM
    float* acc;  // the output's FP32 sums [M, K]
#endif
};

// Where this CTA is: its rank in the cluster, its cluster and the clusters of the grid.
struct Place {
    int tid, warp, lane;
    u32 rank;
    int cid, ncl;
};

// The producer's first trip to memory: the padded total, item 0's expert id and its slot ids.
struct FirstTrip {
    int ntpp = 0, expert = -1;
    Sids sid;
};

// ---- kernel entry (clusters of 4: FIRST_AT_ENTRY). The producer's first trip goes out before
// the set-up, which takes a long part of a cold launch: into registers (block cid / G <
// max_blocks, see the producer). And one line of each buffer whose address is known now,
// prefetched to L2.
__device__ __forceinline__ void first_trip_at_entry(FirstTrip& f, const Args& a, const Place& p) {
    f.ntpp = __ldg(a.num_tokens_post_padded);
    f.expert = __ldg(a.expert_ids + p.cid / a.G);
    #pragma unroll
    for (int q = 0; q < (BLOCK_M + 31) / 32; ++q) {
        const int r = p.lane + 32 * q;
        f.sid.v[q] = r < BLOCK_M ? __ldg(a.sorted_token_ids + static_cast<size_t>(p.cid / a.G) * BLOCK_M + r) : -1;
    }
    const int lane = p.lane;
    const void* warm = lane == 0 ? static_cast<const void*>(a.x) : lane == 1 ? static_cast<const void*>(a.x_scale)
                     : lane == 2 ? static_cast<const void*>(a.w1_scale) : lane == 3 ? static_cast<const void*>(a.w2_scale)
                     : lane == 4 ? static_cast<const void*>(a.topk_weights) : lane == 5 ? static_cast<const void*>(a.out) : nullptr;
    if (warm != nullptr) prefetch_l2(warm);
}

// ---- set-up: barriers, the zeroed activation ring, the start of the cluster barrier. The
// K-derived sizes and the shared layout are derived again in each warp role, from a K the
// compiler cannot see through: values computed once here would live across both roles' loops
// and crowd the consumers' register budget (they spill).
__device__ __forceinline__ void set_up(u8* smem_base, int K, int tid) {
    const Smem sm = carve(smem_base, K / GROUP);
    if (tid == 0 && dynamic_smem_size() < sm.bytes) __trap();  // host and device disagree

    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(sm.full + 8 * st, 1);
            mbar_init(sm.empty + 8 * st, CONSUMERS); // every consumer thread arrives
        }
        for (int b = 0; b < 2; ++b) {
            mbar_init(sm.mfull + 8 * b, 32);         // the producer warp's lanes
            mbar_init(sm.mempty + 8 * b, CONSUMERS);
        }
        mbar_init(sm.abar, 1);                       // local expect_tx; bytes from CLUSTER CTAs
        mbar_init(sm.aempty, CLUSTER);               // one arrival per reading CTA
        for (int b = 0; b < 2; ++b) {
            mbar_init(sm.tfull + 8 * b, 1);          // local expect_tx; 4 bytes from rank 0
            mbar_init(sm.tempty + 8 * b, CLUSTER);   // one arrival per CTA that read the ticket
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // The activation ring starts zeroed: padding rows are never copied (see the header).
    for (int i = tid; i < STAGES * BLOCK_M * X_ROW / 16; i += THREADS)
        reinterpret_cast<uint4*>(sm.xring)[i] = make_uint4(0, 0, 0, 0);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    cluster_arrive_relaxed();  // "this CTA's barriers exist": waited on before the first DSMEM store
}

// ---- ZERO_OUT. At entry the producer warp reads the count of zeroed stripes (no share of this
// launch is its own CTA's yet: the consumers add it after the set-up's barrier) and keeps the
// multiple of ZERO_SPAN that this launch's shares complete (the count wraps at 2^32: compared by
// difference).
__device__ __forceinline__ int zero_target_at_entry(const Args& a) {
    const u32 base = static_cast<u32>(ld_relaxed_gpu(a.work + ZERO_COUNT)) & ~(ZERO_SPAN - 1u);
    return static_cast<int>(base + ZERO_SPAN);
}

// The consumers zero this CTA's stripe of the output (16-byte stores), then one of them adds the
// CTA's share to the count: the consumers' barrier orders every consumer's stores before that
// thread's release (cumulative), so no fence of its own (a sequentially consistent one would hold
// warp 0, and the CTA's first chunks with it, until its stores are acknowledged).
// FP32_SUM: the stripe of the FP32 sums (the output itself is stored once at the end).
__device__ __forceinline__ void zero_stripe(const Args& a, int tid) {
#if FP32_SUM
    const u32 n16 = static_cast<u32>(a.num_slots / a.top_k) * static_cast<u32>(a.K >> 2);  // [M, K] FP32 in 16 B
    uint4* o = reinterpret_cast<uint4*>(a.acc);
#else
    const u32 n16 = static_cast<u32>(a.num_slots / a.top_k) * static_cast<u32>(a.K >> 3);  // [M, K] BF16 in 16 B
    uint4* o = reinterpret_cast<uint4*>(a.out);
#endif
    const u32 per = (n16 + gridDim.x - 1) / gridDim.x;
    const u32 lo = min(n16, blockIdx.x * per), hi = min(n16, lo + per);
    for (u32 i = lo + tid; i < hi; i += CONSUMERS) o[i] = make_uint4(0u, 0u, 0u, 0u);
    named_sync_consumers();
    if (tid == 0)
        red_release_add_gpu(a.work + ZERO_COUNT, blockIdx.x == 0 ? ZERO_SPAN - static_cast<int>(gridDim.x - 1) : 1);
}

// The producer, before its first GEMM2 chunk may complete: every stripe of this launch is zero.
// The whole warp waits (a lane spinning alone stalls compute-sanitizer).
__device__ __forceinline__ void wait_for_zeroed_output(const Args& a, int target) {
    while (static_cast<int>(static_cast<u32>(ld_acquire_gpu(a.work + ZERO_COUNT)) - static_cast<u32>(target)) < 0)
        __nanosleep(32);
    __syncwarp();
}

// ---- the producer warp (warp 8). Item n's chunks stream into the ring while item n + 1's meta
// is built in steps, one step after each chunk issued (from chunk STAGES on, when the consumers
// have left item n - 1 and freed its meta slot): its ticket, its expert id, its tokens with the
// weight scales, then the activation scales and route weights in batches. Each step is one trip
// to memory, shorter than the STAGES chunks the ring holds, so the meta is ready before the
// consumers need it and the next item's chunks follow the last ones without a gap. Item 0 is
// built first, in the same steps; the padded total, its expert id and its slot ids come from the
// first trip (block cid / G < max_blocks: the host launches at most max_blocks * G clusters; the
// plan buffers hold max_blocks).
struct Producer {
    static constexpr int RW = (BLOCK_M + 31) / 32;    // BLOCK_M may exceed the warp
    static constexpr int XB = BLOCK_M >= 32 ? 4 : 8;  // scale loads in flight a lane (4 from 32: no spill)

    Args a;
    const FirstTrip& first;
    int lane, cid, ncl;
    u32 rank;
    int KB, n1, mt2, total;
    u32 MB;
    Smem sm;
    int ntpp, first_e, nblocks, items, nx, nsteps;
    bool rows;     // item 0's meta by async copies (scale rows 16-byte aligned)
    u32 gc = 0;    // chunks issued
    u32 tk = 0;    // tickets taken
    // CROWD_LAG: each busy CTA of a one-round launch adds 1 to its SM's count in work[2 + smid]
    // as its first ring goes out, and takes it back at its end. The producer reads the count once
    // a chunk of its first ring has landed (chunk STAGES's lag), after every CTA's first ring
    // went out, and uses it from chunk 2 * STAGES on, so that no issue waits for the load; before
    // that it lags.
    int* sm_count = nullptr;
    int crowd = 0;         // lane 0: the count
    bool counted = false;
    // The item being built: its index and expert (-1: no more work). Everything else of it
    // lives in its meta slot between steps (the register budget is the consumers').
    int w, e = -1;
    // Work after each cluster's first item comes from the `work` counter: rank 0 takes a
    // ticket (the atomic goes out one step before its value is needed) and sends it to
    // every CTA of the cluster (st.async into `tick`, completing on each one's `tfull`);
    // each reader arrives on rank 0's `tempty` before the slot is reused. Every wait is
    // taken by the whole warp (a lane spinning alone stalls compute-sanitizer).
    // With no more items than clusters every ticket would say "no more work": none is taken.
    bool queue;
    int ticket = 0;  // rank 0: the counter's value, in flight

    __device__ __forceinline__ Producer(const Args& args, u8* smem_base, const FirstTrip& f, const Place& p)
        : a(args), first(f), lane(p.lane), cid(p.cid), ncl(p.ncl), rank(p.rank) {
        const Dims d = dims_of(launder(a.K));
        KB = d.KB; n1 = d.n1; mt2 = d.mt2; total = d.total;
        MB = d.MB;
        sm = carve(smem_base, KB);
        ntpp = FIRST_AT_ENTRY ? first.ntpp : __ldg(a.num_tokens_post_padded);
        first_e = FIRST_AT_ENTRY ? first.expert : __ldg(a.expert_ids + cid / a.G);
        nblocks = min((ntpp + BLOCK_M - 1) / BLOCK_M, a.max_blocks);
        items = max(nblocks, 0) * a.G;
        nx = (KB * BLOCK_M + 32 * XB - 1) / (32 * XB);  // activation-scale batches
        nsteps = 4 + nx;  // ticket out, ticket in, expert id, tokens + weight scales, nx batches
        rows = (KB & 3) == 0 &&
            ((reinterpret_cast<size_t>(a.x_scale) | reinterpret_cast<size_t>(a.w1_scale)) & 15) == 0;
        if constexpr (CROWD_LAG) {
            u32 sm_id;
            asm("mov.u32 %0, %%smid;" : "=r"(sm_id));
            sm_count = a.work + 2 + (sm_id & 255);
        }
        w = cid;
        queue = items > ncl;
    }

    __device__ __forceinline__ bool lag_here() const {
        if constexpr (CROWD_LAG) return gc < 2 * STAGES || __shfl_sync(0xffffffffu, crowd, 0) < 3;
        return true;
    }

    __device__ __forceinline__ void request_ticket() {
        if (queue && rank == 0 && lane == 0) ticket = atomicAdd(a.work, 1);
    }

    __device__ __forceinline__ void receive_ticket() {
        if (!queue) { w += ncl; return; }
        if (tk == 0) cluster_wait_acquire();  // every CTA's barriers exist: tickets may be sent
        const u32 b = tk & 1, par = (tk >> 1) & 1;
        if (rank == 0) mbar_wait(sm.tempty + 8 * b, par ^ 1);  // every CTA read ticket tk - 2
        if (lane == 0) {
            mbar_arrive_expect_tx(sm.tfull + 8 * b, 4);
            if (rank == 0)
                for (u32 r = 0; r < CLUSTER; ++r)
                    st_async_b32(mapa(smem_u32(sm.tick + b), r), ncl + ticket, mapa(sm.tfull + 8 * b, r));
        }
        mbar_wait_cluster(sm.tfull + 8 * b, par);
        w = *reinterpret_cast<volatile int*>(sm.tick + b);
        __syncwarp();
        if (lane == 0) mbar_arrive_remote(mapa(sm.tempty + 8 * b, 0));
        ++tk;
    }

    // w -> the next valid item from w on (e < 0: none left).
    __device__ __forceinline__ void find_item() {
        for (;;) {
            if (w >= items) { e = -1; return; }
            e = __ldg(a.expert_ids + w / a.G);
            if (e >= 0 && e < a.E) return;
            request_ticket();
            receive_ticket();
        }
    }

    // The meta of item n: header, tokens, route weights, scales (or the end marker); only the
    // plan's slot ids are waited for here.
    //  - Item 0, with 16-byte aligned scale rows, by async copies that go out before its first
    //    chunks' activation rows, so they do not queue behind every CTA's first STAGES chunks in
    //    HBM: the activation-scale rows and the gate/up scale rows by the bulk copy engine
    //    (completing on the slot's `mfull` with expect_tx), the route weights and down scales as
    //    4-byte cp.async gathers (cp_async_arrive: the phase waits for them too). The meta is
    //    complete when begin_meta returns.
    //  - Every other item (and item 0 without aligned rows) by loads into registers, one trip a
    //    build step: weight scales here, the slot ids stashed as route weights until scale_batch 0
    //    loads them, the activation scales in nx batches, the last of which arrives. (Async copies
    //    would queue in the SM's copy engine behind the ring's chunks.)
    __device__ __forceinline__ void begin_meta(int n) {
        const int slot = n & 1;
        const int G = a.G;
        mbar_wait(sm.mempty + 8 * slot, ((n >> 1) & 1) ^ 1);
        const Meta m = meta_at(sm.meta + slot * MB, KB);
        const int block = w / G, g = w - block * G;
        if (lane == 0) { m.hdr[0] = e; m.hdr[1] = g; }
        if (e < 0) {
            __syncwarp();
            mbar_arrive(sm.mfull + 8 * slot);
            return;
        }
        const bool async = rows && n == 0;
        int sid[RW];
        #pragma unroll
        for (int q = 0; q < RW; ++q) {
            const int r = lane + 32 * q;
            if (FIRST_AT_ENTRY && n == 0 && w == cid) { sid[q] = first.sid.v[q]; continue; }  // the first trip's
            sid[q] = r < BLOCK_M ? __ldg(a.sorted_token_ids + static_cast<size_t>(block) * BLOCK_M + r) : -1;
        }
        const float* s1 = a.w1_scale + (static_cast<size_t>(e) * 2 * G + g) * KB;  // gate row; up row at + G * KB
        const float* s2 = a.w2_scale + static_cast<size_t>(e) * KB * G + g;        // down, stride G
        if (!async) {  // weight scales, one k block a lane at a time
            for (int i = lane; i < KB; i += 32) {
                const float gate = __ldg(s1 + i), up = __ldg(s1 + G * KB + i), down = __ldg(s2 + i * G);
                m.w1s[i] = gate; m.w1s[KB + i] = up; m.w2s[i] = down;
            }
        }
        int tok[RW];
        int valid = 0;
        #pragma unroll
        for (int q = 0; q < RW; ++q) {
            const int r = lane + 32 * q;
            const bool ok = r < BLOCK_M && sid[q] >= 0 && sid[q] < a.num_slots;
            tok[q] = ok ? sid[q] / a.top_k : -1;
            if (r < BLOCK_M) {
                m.tok[r] = tok[q];
                if (DETERMINISTIC) reinterpret_cast<int*>(m.tmul)[r] = ok ? sid[q] : -1;  // the slot, until the requant
                if (!async) reinterpret_cast<int*>(m.rw)[r] = ok ? sid[q] : -1;  // the slot, until its route weight
                else if (ok) cp_async4(m.rw + r, a.topk_weights + sid[q]);
                else m.rw[r] = 0.0f;
            }
            valid += __popc(__ballot_sync(0xffffffffu, ok));
        }
        if (lane == 0) m.hdr[3] = valid;  // tokens with activation rows to copy
        if (async) {
            if (lane == 0) mbar_expect_tx(sm.mfull + 8 * slot, (valid + 2) * KB * 4);
            __syncwarp();
            #pragma unroll
            for (int q = 0; q < RW; ++q) {
                const int r = lane + 32 * q;
                if (r >= BLOCK_M) continue;
                float* row = m.xs + r * (KB + 4);
                if (tok[q] >= 0)
                    bulk_copy(smem_u32(row), a.x_scale + static_cast<size_t>(tok[q]) * KB, KB * 4, sm.mfull + 8 * slot);
                else
                    for (int k = 0; k < KB; k += 4) *reinterpret_cast<float4*>(row + k) = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            if (lane < 2) bulk_copy(smem_u32(m.w1s + lane * KB), s1 + lane * G * KB, KB * 4, sm.mfull + 8 * slot);
            for (int i = lane; i < KB; i += 32) cp_async4(m.w2s + i, s2 + i * G);
            cp_async_arrive(sm.mfull + 8 * slot);
        }
        __syncwarp();
        if (async) mbar_arrive(sm.mfull + 8 * slot);
    }

    // Activation-scale batch x of the register path (the first also loads the route
    // weights); the last arrives.
    __device__ __forceinline__ void scale_batch(int n, int x) {
        const int slot = n & 1;
        const Meta m = meta_at(sm.meta + slot * MB, KB);
        float rw[RW];
        if (x == 0) {
            #pragma unroll
            for (int q = 0; q < RW; ++q) {
                const int r = lane + 32 * q;
                const int sl = r < BLOCK_M ? reinterpret_cast<const int*>(m.rw)[r] : -1;
                rw[q] = sl >= 0 ? __ldg(a.topk_weights + sl) : 0.0f;
            }
        }
        const int base = lane + 32 * XB * x;
        float v[XB];
        #pragma unroll
        for (int u = 0; u < XB; ++u) {
            const int i = base + 32 * u;  // token i % BLOCK_M, k block i / BLOCK_M
            v[u] = 0.0f;
            if (i < KB * BLOCK_M) {
                const int t = m.tok[i % BLOCK_M];
                if (t >= 0) v[u] = __ldg(a.x_scale + static_cast<size_t>(t) * KB + i / BLOCK_M);
            }
        }
        #pragma unroll
        for (int u = 0; u < XB; ++u) {
            const int i = base + 32 * u;
            if (i < KB * BLOCK_M) m.xs[(i % BLOCK_M) * (KB + 4) + i / BLOCK_M] = v[u];
        }
        if (x == 0) {
            #pragma unroll
            for (int q = 0; q < RW; ++q)
                if (lane + 32 * q < BLOCK_M) m.rw[lane + 32 * q] = rw[q];
        }
        if (x == nx - 1) {
            __syncwarp();
            mbar_arrive(sm.mfull + 8 * slot);
        }
    }

    // Step s of building item n > 0 (item 0 is the cluster's own: no ticket).
    __device__ __forceinline__ void build_step(int n, int s) {
        if (s == 0) request_ticket();
        else if (s == 1) receive_ticket();
        else if (s == 2) find_item();
        else if (s == 3) begin_meta(n);
        else if (e >= 0) scale_batch(n, s - 4);
    }

    // Chunk j of item n (expert, group and valid tokens from its meta header, not held in
    // registers): weights, and for GEMM1 the block's activation rows.
    __device__ __forceinline__ void issue(int n, int j) {
        const int K = a.K;
        const u32 st = gc % STAGES;
        if (!queue && gc >= STAGES && lag_here()) {  // one round, past the first ring: chunk gc - LAG has landed
            const u32 pg = gc - LAG;
            mbar_wait(sm.full + 8 * (pg % STAGES), (pg / STAGES) & 1);
        }
        if constexpr (CROWD_LAG) {
            if (gc == STAGES && counted) crowd = *reinterpret_cast<volatile int*>(sm_count);  // (settled: see above)
        }
        mbar_wait(sm.empty + 8 * st, ((gc / STAGES) & 1) ^ 1);
        const Meta m = meta_at(sm.meta + (n & 1) * MB, KB);
        const size_t cta = (static_cast<size_t>(m.hdr[0]) * a.G + m.hdr[1]) * CLUSTER + rank;
        if (j < n1) {
            const u8* w1_cta = a.w1f + cta * (2 * COLS) * static_cast<size_t>(K);  // 2*COLS rows x K
            const int valid = m.hdr[3];
            const u32 wbytes = min(KBC, KB - KBC * j) * MT1 * 2048;
            const u32 abytes = min(KBC, KB - KBC * j) * GROUP;
            if (lane == 0) {
                // item 0's first chunks: their weights are on their way (see start)
                const bool out = n == 0 && j < EARLY_CHUNKS;
                mbar_arrive_expect_tx(sm.full + 8 * st, (out ? 0 : wbytes) + valid * abytes);
                if (!out)
                    bulk_copy_once(smem_u32(sm.ring + st * CHUNK_BYTES), w1_cta + static_cast<size_t>(j) * CHUNK_BYTES,
                                   wbytes, sm.full + 8 * st);
            }
            for (int r = lane; r < BLOCK_M; r += 32) {
                const int t = m.tok[r];
                if (t >= 0)
                    bulk_copy(smem_u32(sm.xring + (st * BLOCK_M + r) * X_ROW),
                              a.x + static_cast<size_t>(t) * K + j * KBC * GROUP, abytes, sm.full + 8 * st);
            }
        } else {
            // ZERO_OUT: the CTA's first GEMM2 chunk (item 0's) goes out now, its arrival once the
            // output is zero
            const bool gate = ZERO_OUT && n == 0 && j == n1;
            if (lane == 0) {
                const u8* w2_cta = a.w2f + cta * (GROUP / CLUSTER) * static_cast<size_t>(K);  // K/CLUSTER rows x 128
                const u32 wbytes = min(CHUNK_TILES, mt2 - CHUNK_TILES * (j - n1)) * 2048;
                if (gate) mbar_expect_tx(sm.full + 8 * st, wbytes);
                else mbar_arrive_expect_tx(sm.full + 8 * st, wbytes);
                bulk_copy_once(smem_u32(sm.ring + st * CHUNK_BYTES), w2_cta + static_cast<size_t>(j - n1) * CHUNK_BYTES,
                               wbytes, sm.full + 8 * st);
            }
            if (gate) {
                wait_for_zeroed_output(a, m.hdr[2]);
                if (lane == 0) mbar_arrive(sm.full + 8 * st);
            }
        }
        ++gc;
    }

    // Item 0: its meta's copies go out before its first chunks' activation rows and its third
    // chunk (the ring is free), so they do not queue behind every CTA's first STAGES chunks in
    // HBM; only the first EARLY_CHUNKS chunks' weights go ahead of them. Its expert id came
    // with the padded total; a bad one falls through to the queue. Returns the chunks of item 0
    // issued.
    __device__ __forceinline__ int start() {
        const int K = a.K, G = a.G;
        if (w < items) {
            e = first_e;
            if (e < 0 || e >= a.E) { request_ticket(); receive_ticket(); find_item(); }
        }
        if (e >= 0 && lane < 2) {  // item 0's weight pages: GEMM1's first chunk, GEMM2's
            const size_t cta = (static_cast<size_t>(e) * G + (w - (w / G) * G)) * CLUSTER + rank;
            prefetch_l2(lane == 0 ? a.w1f + cta * (2 * COLS) * static_cast<size_t>(K)
                                  : a.w2f + cta * (GROUP / CLUSTER) * static_cast<size_t>(K));
        }
        // Item 0's first chunks of weights go out now, before its meta: they need only the
        // expert, and HBM has nothing else to do until the meta's copies and the first chunks
        // would go out (the producer's start is a chain of slow steps). Each is counted on its
        // stage by expect_tx alone, so no stage completes before issue() adds the chunk's
        // activation rows and arrives.
        if (lane == 0 && e >= 0) {  // stages 0.. are free: nothing was issued yet
            const size_t cta = (static_cast<size_t>(e) * G + (w - (w / G) * G)) * CLUSTER + rank;
            const u8* src = a.w1f + cta * (2 * COLS) * static_cast<size_t>(K);
            const u32 wb = min(KBC, KB) * MT1 * 2048;  // chunk 0
            mbar_expect_tx(sm.full, wb);
            bulk_copy_once(smem_u32(sm.ring), src, wb, sm.full);
            if (n1 > 1) {  // chunk 1 (n1 > 1: KB > KBC)
                const u32 wb1 = min(KBC, KB - KBC) * MT1 * 2048;
                mbar_expect_tx(sm.full + 8, wb1);
                bulk_copy_once(smem_u32(sm.ring + CHUNK_BYTES), src + CHUNK_BYTES, wb1, sm.full + 8);
            }
        }
        begin_meta(0);
        int pre = 0;
        if (e >= 0) {
            if (!rows) for (int x = 0; x < nx; ++x) scale_batch(0, x);
            pre = min(STAGES, total);
            if constexpr (CROWD_LAG) {
                if (!queue && lane == 0) { atomicAdd(sm_count, 1); counted = true; }
            }
            for (int j = 0; j < pre; ++j) issue(0, j);
        }
        return pre;
    }

    // Every item's chunks, each next item's meta built between them.
    __device__ __forceinline__ void stream(int pre) {
        for (int n = 0; e >= 0; ++n) {
            // item n's meta is in slot n & 1; e is its expert until its successor's build
            int s = 0;
            for (int j = n == 0 ? pre : 0; j < total; ++j) {
                issue(n, j);
                if (j >= STAGES && s < nsteps) build_step(n + 1, s++);
            }
            for (; s < nsteps; ++s) build_step(n + 1, s);
        }
    }

    // This cluster takes no more tickets; the last one out zeroes the counter for the next
    // launch (its tickets' atomics returned before: their values decided the end).
    __device__ __forceinline__ void finish() {
        if (queue && rank == 0 && lane == 0 && atom_add_acq_rel(a.work + 1, 1) == ncl - 1) {
            atomicExch(a.work, 0);
            atomicExch(a.work + 1, 0);
        }
        if constexpr (CROWD_LAG) {
            if (counted) atomicSub(sm_count, 1);
        }
        if (tk == 0) cluster_wait_acquire();  // (joined at the first ticket otherwise)
    }
};

__device__ __forceinline__ void produce_items(const Args& a, u8* smem_base, const FirstTrip& first, const Place& p,
                                              int zero_target) {
    Producer producer(a, smem_base, first, p);
    if constexpr (ZERO_OUT) {  // kept in item 0's meta slot, not in a register through the stream
        if (p.lane == 0) meta_at(producer.sm.meta, producer.KB).hdr[2] = zero_target;
        __syncwarp();
    }
    const int pre = producer.start();
    producer.stream(pre);
    producer.finish();
}

// ---- the consumer warps (0-7): what every stage of an item needs of this thread and CTA.
struct Consumer {
    Args a;
    int tid, warp, lane;
    u32 rank;
    int KB, n1, mt2, total;
    u32 MB;
    Smem sm;
    int gq, tq;            // mma groupID, threadID_in_group
    int mt, kb_in_chunk;   // GEMM1 of a cluster: this warp's m-tile and k block of each chunk
    int row0;              // GEMM2: this CTA's first output column (row of w2)
    u32 gc = 0;            // chunks consumed

    __device__ __forceinline__ Consumer(const Args& args, u8* smem_base, const Place& p)
        : a(args), tid(p.tid), warp(p.warp), lane(p.lane), rank(p.rank) {
        const Dims d = dims_of(launder(a.K));
        KB = d.KB; n1 = d.n1; mt2 = d.mt2; total = d.total;
        MB = d.MB;
        sm = carve(smem_base, KB);
        gq = lane >> 2; tq = lane & 3;
        mt = warp & (MT1 - 1); kb_in_chunk = warp >> LOG2_MT1;
        row0 = rank * (a.K / CLUSTER);
    }
};

// ---- GEMM1, one CTA an item: h[256 rows, BLOCK_M] over K. Warp w: gate m-tile w and up m-tile
// w (the same 16 columns) of every chunk (one k block, 32 KB): per chunk and warp 4 KB, 8*NT
// mma, and SwiGLU needs no other warp's sums.
__device__ __forceinline__ void gemm1_alone(Consumer& c, const Meta& m, float (&acc)[2][NT][4]) {
    const int KB = c.KB, warp = c.warp, lane = c.lane, gq = c.gq, tq = c.tq;
    const Smem& sm = c.sm;
    #pragma unroll
    for (int h = 0; h < 2; ++h)
        #pragma unroll
        for (int t = 0; t < NT; ++t) acc[h][t][0] = acc[h][t][1] = acc[h][t][2] = acc[h][t][3] = 0.0f;
    for (int j = 0; j < c.n1; ++j, ++c.gc) {
        const u32 st = c.gc % STAGES;
        mbar_wait(sm.full + 8 * st, (c.gc / STAGES) & 1);
        const u8* wa = sm.ring + st * CHUNK_BYTES + warp * 2048 + lane * 16;  // up tile at + 8 tiles
        uint4 a[2][4];
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int s = 0; s < 4; ++s) a[h][s] = *reinterpret_cast<const uint4*>(wa + h * 8 * 2048 + s * 512);
        const float sw[2] = {m.w1s[j], m.w1s[KB + j]};  // gate, up
        #pragma unroll
        for (int t = 0; t < NT; ++t) {
            const u8* xb = sm.xring + (st * BLOCK_M + t * 8 + gq) * X_ROW + tq * 32;
            const uint4 blo = *reinterpret_cast<const uint4*>(xb);
            const uint4 bhi = *reinterpret_cast<const uint4*>(xb + 16);
            const float x0 = m.xs[(t * 8 + 2 * tq) * (KB + 4) + j];
            const float x1 = m.xs[(t * 8 + 2 * tq + 1) * (KB + 4) + j];
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_block(p, a[h], blo, bhi);
                const float s0 = sw[h] * x0, s1 = sw[h] * x1;
                acc[h][t][0] += p[0] * s0;
                acc[h][t][1] += p[1] * s1;
                acc[h][t][2] += p[2] * s0;
                acc[h][t][3] += p[3] * s1;
            }
        }
        __syncwarp();
        mbar_arrive(sm.empty + 8 * st);  // this thread is done with stage st
    }
}

// ---- SwiGLU, one CTA an item: from the warp's own gate and up sums into afull (its last
// readers, the requant of the item before, finished before that item's second consumer
// barrier). C fragment i of n-tile t: row gq + 8 (i / 2), token 8t + 2tq + i % 2.
__device__ __forceinline__ void swiglu_alone(const Consumer& c, int n, const float (&acc)[2][NT][4]) {
    #pragma unroll
    for (int t = 0; t < NT; ++t)
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            c.sm.afull[(t * 8 + 2 * c.tq + (i & 1)) * GROUP + c.warp * 16 + c.gq + 8 * (i >> 1)] =
                silu(acc[0][t][i]) * acc[1][t][i];
    if (n == 0) cluster_wait_acquire();  // (the start's cluster barrier: a cluster of one)
    named_sync_consumers();  // the group's 128 columns are here
}

// ---- GEMM1 of a cluster: h[2*COLS rows, BLOCK_M] over K. Warp w: the 16 rows of m-tile
// mt = w % MT1 (gate tiles first, then up), the k block w / MT1 of every chunk. Per chunk and
// warp: 2 KB of weights, 4*NT mma.
__device__ __forceinline__ void gemm1_cluster(Consumer& c, const Meta& m, float (&acc)[NT][4]) {
    const int KB = c.KB, lane = c.lane, gq = c.gq, tq = c.tq, mt = c.mt, kb_in_chunk = c.kb_in_chunk;
    const Smem& sm = c.sm;
    #pragma unroll
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int j = 0; j < c.n1; ++j, ++c.gc) {
        const u32 st = c.gc % STAGES;
        mbar_wait(sm.full + 8 * st, (c.gc / STAGES) & 1);
        const int kb = KBC * j + kb_in_chunk;
        if (kb < KB) {
            const u8* wa = sm.ring + st * CHUNK_BYTES + (kb_in_chunk * MT1 + mt) * 2048 + lane * 16;
            uint4 a[4];
            #pragma unroll
            for (int s = 0; s < 4; ++s) a[s] = *reinterpret_cast<const uint4*>(wa + s * 512);
            const float sw = m.w1s[(mt >= MT1 / 2) * KB + kb];  // gate or up
            #pragma unroll
            for (int t = 0; t < NT; ++t) {
                const u8* xb = sm.xring + (st * BLOCK_M + t * 8 + gq) * X_ROW + kb_in_chunk * GROUP + tq * 32;
                const uint4 blo = *reinterpret_cast<const uint4*>(xb);
                const uint4 bhi = *reinterpret_cast<const uint4*>(xb + 16);
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_block(p, a, blo, bhi);
                const float s0 = sw * m.xs[(t * 8 + 2 * tq) * (KB + 4) + kb];
                const float s1 = sw * m.xs[(t * 8 + 2 * tq + 1) * (KB + 4) + kb];
                acc[t][0] += p[0] * s0;
                acc[t][1] += p[1] * s1;
                acc[t][2] += p[2] * s0;
                acc[t][3] += p[3] * s1;
            }
        }
        // Every thread that read stage st arrives (release), so each read is ordered before
        // the producer's refill by its own arrival: compute-sanitizer's racecheck sees that,
        // where it does not see one lane's arrival after __syncwarp cover the other lanes' reads.
        __syncwarp();
        mbar_arrive(sm.empty + 8 * st);  // this thread is done with stage st
    }
}

// ---- the exchange of a cluster: the KBC k-block partials per row, SwiGLU, st.async to all
// CLUSTER CTAs; returns when the group's 128 columns are here.
__device__ __forceinline__ void swiglu_exchange(const Consumer& c, int n, const float (&acc)[NT][4]) {
    const int warp = c.warp, lane = c.lane, gq = c.gq, tq = c.tq;
    const Smem& sm = c.sm;
    #pragma unroll
    for (int t = 0; t < NT; ++t) {
        float* r = sm.red + (warp * 16 + gq) * BLOCK_M + t * 8 + 2 * tq;
        *reinterpret_cast<float2*>(r) = make_float2(acc[t][0], acc[t][1]);
        *reinterpret_cast<float2*>(r + 8 * BLOCK_M) = make_float2(acc[t][2], acc[t][3]);
    }
    named_sync_consumers();
    if (n == 0) cluster_wait_acquire();  // every CTA's barriers exist
    if (c.tid == 0) mbar_arrive_expect_tx(sm.abar, BLOCK_M * GROUP * 4);
    if (n > 0) mbar_wait_cluster(sm.aempty, (n - 1) & 1);  // every CTA read the last item
    {
        // warp w stores into CTA w % CLUSTER, part w / CLUSTER of the 8 / CLUSTER parts
        constexpr int PARTS = 8 / CLUSTER;
        const u32 dst_rank = warp & (CLUSTER - 1);
        const u32 rbar = mapa(sm.abar, dst_rank);
        const int part = PARTS == 1 ? 0 : warp >> LOG2_CLUSTER;
        for (int i = part * 32 + lane; i < BLOCK_M * (COLS / 4); i += 32 * PARTS) {
            const int t = i >> LOG2_Q, q = i & (COLS / 4 - 1);  // token, 4 of this CTA's COLS columns
            float a[4];
            #pragma unroll
            for (int k4 = 0; k4 < 4; ++k4) {
                const int col = 4 * q + k4, tile = col >> 4, row = col & 15;
                float hg = 0.0f, hu = 0.0f;
                #pragma unroll
                for (int k = 0; k < KBC; ++k) {
                    hg += sm.red[((k * MT1 + tile) * 16 + row) * BLOCK_M + t];
                    hu += sm.red[((k * MT1 + MT1 / 2 + tile) * 16 + row) * BLOCK_M + t];
                }
                a[k4] = silu(hg) * hu;
            }
            const u32 dst = mapa(smem_u32(sm.afull + t * GROUP + c.rank * COLS + 4 * q), dst_rank);
            st_async_v4(dst, make_float4(a[0], a[1], a[2], a[3]), rbar);
        }
    }
    mbar_wait_cluster(sm.abar, n & 1);  // the group's 128 columns are here
}

// ---- requant per token over the group: warp w takes tokens w, w+8, ...
__device__ __forceinline__ void requant(const Consumer& c, const Meta& m) {
    const int lane = c.lane;
    const Smem& sm = c.sm;
    for (int t = c.warp; t < BLOCK_M; t += 8) {
        // DETERMINISTIC: the token's plan slot, for its workspace row, left in tmul by the
        // producer with the meta (no load here, between GEMM1 and GEMM2); it replaces the token
        // in m.tok, which the producer read last for the item's GEMM1 chunks, all consumed by now
        const int slot = DETERMINISTIC && lane == 0 ? reinterpret_cast<const int*>(m.tmul)[t] : -1;
        const float4 v = *reinterpret_cast<const float4*>(sm.afull + t * GROUP + lane * 4);
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = fmaxf(__fdividef(amax, 448.0f), 1e-10f);
        *reinterpret_cast<u32*>(sm.aq + t * AQ_ROW + lane * 4) =
            pack_e4m3x4(__fdividef(v.x, scale), __fdividef(v.y, scale), __fdividef(v.z, scale),
                        __fdividef(v.w, scale));
        if (lane == 0) m.tmul[t] = scale * m.rw[t];
        if (DETERMINISTIC && slot >= 0) m.tok[t] = slot;
    }
    named_sync_consumers();
}

// ---- epilogue: one n-tile's C fragment p of the m-tile at rows rbase..: (row gq, token 2tq),
// (gq, 2tq+1), (gq+8, 2tq), (gq+8, 2tq+1), times the down scale and requant scale x route
// weight. Staged as [token][16 rows] in the warp's `stg`; lane 2u+h then adds rows 8h..8h+7 of
// token u into the output (one 16-byte BF16 reduction), or (FP32_SUM) lane 4u+q rows 4q..4q+3
// into the FP32 sums (one 16-byte FP32 reduction).
__device__ __forceinline__ void reduce_out(const Consumer& c, const Meta& m, float* stg, const float (&p)[4],
                                           int t, float sw, int rbase) {
    const int lane = c.lane, gq = c.gq, tq = c.tq;
    const float f0 = sw * m.tmul[t * 8 + 2 * tq], f1 = sw * m.tmul[t * 8 + 2 * tq + 1];
    stg[(2 * tq) * STG_ROW + gq] = p[0] * f0;
    stg[(2 * tq + 1) * STG_ROW + gq] = p[1] * f1;
    stg[(2 * tq) * STG_ROW + gq + 8] = p[2] * f0;
    stg[(2 * tq + 1) * STG_ROW + gq + 8] = p[3] * f1;
    __syncwarp();
#if FP32_SUM
    {  // lane 4u + q adds rows 4q..4q+3 of token u into the FP32 sums (u, q derived here: kept
       // across the loop they crowd the consumers' registers)
        const int l = launder(lane), u = l >> 2, q = l & 3;
        const int tok = m.tok[t * 8 + u];
        if (tok >= 0)
            red_add_f32x4(c.a.acc + static_cast<size_t>(tok) * c.a.K + rbase + 4 * q,
                          *reinterpret_cast<const float4*>(stg + u * STG_ROW + 4 * q));
    }
#else
    if (lane < 16) {
        const int u = lane >> 1, h = lane & 1;
        const int tok = m.tok[t * 8 + u];  // DETERMINISTIC: the slot
        if (tok >= 0) {
            const float* sv = stg + u * STG_ROW + 8 * h;
            if constexpr (DETERMINISTIC)
                store_bf16x8(c.a.out + (static_cast<size_t>(tok) * c.a.G + m.hdr[1]) * c.a.K + rbase + 8 * h,
                             *reinterpret_cast<const float4*>(sv), *reinterpret_cast<const float4*>(sv + 4));
            else
                red_add_bf16x8(c.a.out + static_cast<size_t>(tok) * c.a.K + rbase + 8 * h,
                               *reinterpret_cast<const float4*>(sv),
                               *reinterpret_cast<const float4*>(sv + 4));
        }
    }
#endif
    __syncwarp();
}

// One n-tile t of an m-tile whose A fragments are a[]: p = a . aq^T (FP32, unscaled).
__device__ __forceinline__ void mma_aq(const Consumer& c, float (&p)[4], const uint4 (&a)[4], int t) {
    const u8* ab = c.sm.aq + (t * 8 + c.gq) * AQ_ROW + c.tq * 32;
    const uint4 blo = *reinterpret_cast<const uint4*>(ab);
    const uint4 bhi = *reinterpret_cast<const uint4*>(ab + 16);
    p[0] = p[1] = p[2] = p[3] = 0.0f;
    mma_block(p, a, blo, bhi);
}

// ---- GEMM2: y[K/CLUSTER rows, BLOCK_M] for this CTA's rows, group g's 128 columns, each tile
// through the epilogue. Warp w: m-tile w of every chunk (16 rows; and w + 8 of the 32 KB chunks
// of CLUSTER 1); per tile 2 KB, 4*NT mma.
__device__ __forceinline__ void gemm2(Consumer& c, const Meta& m) {
    const int warp = c.warp, lane = c.lane;
    const Smem& sm = c.sm;
    float* stg = sm.stg + warp * 8 * STG_ROW;
    for (int j = c.n1; j < c.total; ++j, ++c.gc) {
        const u32 st = c.gc % STAGES;
        mbar_wait(sm.full + 8 * st, (c.gc / STAGES) & 1);
        const int mtile = CHUNK_TILES * (j - c.n1) + warp;  // m-tile within this CTA's rows
        if constexpr (CLUSTER == 1) {
            const u8* wa = sm.ring + st * CHUNK_BYTES + warp * 2048 + lane * 16;  // tile mtile + 8 at + 8 tiles
            uint4 a[2][4];
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                if (mtile + 8 * h < c.mt2)
                    #pragma unroll
                    for (int s = 0; s < 4; ++s) a[h][s] = *reinterpret_cast<const uint4*>(wa + h * 8 * 2048 + s * 512);
            __syncwarp();
            mbar_arrive(sm.empty + 8 * st);  // a[] holds the stage's tiles: it may be refilled
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (mtile + 8 * h >= c.mt2) continue;
                const int rbase = c.row0 + (mtile + 8 * h) * 16;  // the tile's 16 rows share one scale block
                const float sw = m.w2s[rbase / GROUP];
                #pragma unroll
                for (int t = 0; t < NT; ++t) {
                    float p[4];
                    mma_aq(c, p, a[h], t);
                    reduce_out(c, m, stg, p, t, sw, rbase);
                }
            }
        } else {
            if (mtile < c.mt2) {
                const u8* wa = sm.ring + st * CHUNK_BYTES + warp * 2048 + lane * 16;
                uint4 a[4];
                #pragma unroll
                for (int s = 0; s < 4; ++s) a[s] = *reinterpret_cast<const uint4*>(wa + s * 512);
                const int rbase = c.row0 + mtile * 16;  // the tile's 16 rows share one scale block
                const float sw = m.w2s[rbase / GROUP];
                #pragma unroll
                for (int t = 0; t < NT; ++t) {
                    float p[4];
                    mma_aq(c, p, a, t);
                    if (t == 0) {  // a[] is consumed: the stage may be refilled before the reductions
                        __syncwarp();
                        mbar_arrive(sm.empty + 8 * st);
                    }
                    reduce_out(c, m, stg, p, t, sw, rbase);
                }
            }
            if (mtile >= c.mt2) {  // no tile of this chunk for this warp
                __syncwarp();
                mbar_arrive(sm.empty + 8 * st);
            }
        }
    }
}

// Item by item until the producer's end marker: GEMM1, SwiGLU (with the exchange in a
// cluster), requant, GEMM2 and its epilogue.
__device__ __forceinline__ void consume_items(const Args& a, u8* smem_base, const Place& p) {
    Consumer c(a, smem_base, p);
    int n = 0;  // items done; the first one joined the start's cluster barrier
    for (;; ++n) {
        const int slot = n & 1;
        mbar_wait(c.sm.mfull + 8 * slot, (n >> 1) & 1);
        const Meta m = meta_at(c.sm.meta + slot * c.MB, c.KB);
        if (m.hdr[0] < 0) break;
        if constexpr (CLUSTER == 1) {
            float acc[2][NT][4];
            gemm1_alone(c, m, acc);
            swiglu_alone(c, n, acc);
        } else {
            float acc[NT][4];
            gemm1_cluster(c, m, acc);
            swiglu_exchange(c, n, acc);
        }
        requant(c, m);
        // The output's zeroing kernel, launched ahead of this one (moebench_zero_out), has ended
        // before this thread's first reduction into the output (no-op when there is none)
        if constexpr (!DETERMINISTIC && !ZERO_OUT) {
            if (n == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
        }
        gemm2(c, m);
        // afull may be refilled. After GEMM2, not before: a remote arrival waits in the SM's
        // queue behind the memory traffic in flight, and GEMM2's first chunk would wait behind it.
        if constexpr (CLUSTER > 1) {
            if (c.tid < CLUSTER) mbar_arrive_remote(mapa(c.sm.aempty, c.tid));
        }
        mbar_arrive(c.sm.mempty + 8 * slot);  // this thread is done with the item's meta
    }
    if (n == 0) cluster_wait_acquire();
}

// ---- FP32_SUM: the output, stored once from its FP32 sums after every CTA's items are done, by
// the producer warp (its loop's registers are free by then; code after the consumers' loop
// crowded their budget at three CTAs an SM under NVRTC 13.0, whose ptxas then spilled). The
// consumers, their items done, arrive on named barrier 2, which the producer waits on: every
// consumer's reductions are ordered before lane 0's release of the CTA's share of the count
// (cumulative). The warp waits (acquire) for the launch's multiple and converts stripe blockIdx.x
// of [M, K]: 32 bytes read through L2 (__ldcg) and 16 written per 8 columns, a lane's at a time
// (a stripe is 1 to 3 of them a lane at the decode path's M; loads of several in flight at once
// spilled the consumers at BLOCK_M 48 under nvcc 13.0). The base of the count is read just before
// the share is added: no share of this launch is this CTA's yet, so the count lies within the
// launch's span.
#if FP32_SUM
__device__ __forceinline__ void consumers_done() {
    asm volatile("bar.arrive 2, %0;" :: "n"(THREADS) : "memory");
}

__device__ __forceinline__ void store_output(const Args& a, int lane) {
    asm volatile("bar.sync 2, %0;" :: "n"(THREADS) : "memory");
    int target = 0;
    if (lane == 0) {
        const u32 base = static_cast<u32>(ld_relaxed_gpu(a.work + DONE_COUNT)) & ~(ZERO_SPAN - 1u);
        red_release_add_gpu(a.work + DONE_COUNT, blockIdx.x == 0 ? ZERO_SPAN - static_cast<int>(gridDim.x - 1) : 1);
        target = static_cast<int>(base + ZERO_SPAN);
    }
    target = __shfl_sync(0xffffffffu, target, 0);
    // (CTAs without items wait here the whole launch: one load a warp every ~0.8 us)
    while (static_cast<int>(static_cast<u32>(ld_acquire_gpu(a.work + DONE_COUNT)) - static_cast<u32>(target)) < 0)
        __nanosleep(128);
    __syncwarp();
    // (a CTA without items has not waited for the zeroing kernel ahead: the sums' zeros are its)
    if constexpr (!ZERO_OUT) asm volatile("griddepcontrol.wait;" ::: "memory");
    const u32 n8 = static_cast<u32>(a.num_slots / a.top_k) * static_cast<u32>(a.K >> 3);  // [M, K] in 8 columns
    const u32 per = (n8 + gridDim.x - 1) / gridDim.x;
    const u32 lo = min(n8, blockIdx.x * per), hi = min(n8, lo + per);
    const float4* src = reinterpret_cast<const float4*>(a.acc);
    for (u32 i = lo + lane; i < hi; i += 32)
        store_bf16x8(a.out + 8 * static_cast<size_t>(i), __ldcg(src + 2 * static_cast<size_t>(i)),
                     __ldcg(src + 2 * static_cast<size_t>(i) + 1));
}
#endif

// ------------------------------------------------------------------------------ the kernel

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
moebench_fused_moe(
    // activations: FP8 codes [M, K], FP32 per-token group-128 scales [M, K/128]
    const u8* __restrict__ x, const float* __restrict__ x_scale,
    // gate/up weights re-laid by prepare_fused_weights, and their scales [E, N/128, K/128]
    const u8* __restrict__ w1f, const float* __restrict__ w1_scale,
    // down weights re-laid by prepare_fused_weights, and their scales [E, K/128, I/128]
    const u8* __restrict__ w2f, const float* __restrict__ w2_scale,
    // route plan (moe_align_block_size) and the route weights [M * top_k]
    const int* __restrict__ sorted_token_ids, const int* __restrict__ expert_ids,
    const int* __restrict__ num_tokens_post_padded, const float* __restrict__ topk_weights,
    // BF16 output [M, K], accumulated into (DETERMINISTIC: the workspace [num_slots * G, K],
    // every row of a routed slot written once; FP32_SUM: written once, from `acc`)
    unsigned short* __restrict__ out,
    // work counters: [0] tickets taken, [1] clusters out of work, [2 + smid] busy CTAs on SM smid
    // (one-round launches, CROWD_LAG); zero at launch, zero after. [ZERO_COUNT] (ZERO_OUT): the
    // zeroed stripes, [DONE_COUNT] (FP32_SUM): the CTAs done, multiples of ZERO_SPAN between launches
    int* __restrict__ work,
    // max_blocks: plan blocks any routing can fill (the host's bound on expert_ids reads);
    // G: requant groups of the intermediate (I / 128)
    int num_slots, int top_k, int K, int E, int max_blocks, int G
#if FP32_SUM
    // the output's FP32 sums [M, K], zeroed in the call (ZERO_OUT's stripes or the zeroing kernel
    // ahead); `out` is then written, never read
    , float* __restrict__ acc
#endif
    )
{
    extern __shared__ __align__(128) u8 smem_base[];
    const Args a{x, x_scale, w1f, w1_scale, w2f, w2_scale, sorted_token_ids, expert_ids, num_tokens_post_padded,
                 topk_weights, out, work, num_slots, top_k, K, E, max_blocks, G
#if FP32_SUM
                 , acc
#endif
                 };
    const int tid = threadIdx.x;
    const Place p{tid, tid >> 5, tid & 31, cluster_ctarank(), static_cast<int>(blockIdx.x / CLUSTER),
                  static_cast<int>(gridDim.x / CLUSTER)};
    FirstTrip first;
    if (FIRST_AT_ENTRY && p.warp == 8) first_trip_at_entry(first, a, p);
    const int zero_target = ZERO_OUT && p.warp == 8 ? zero_target_at_entry(a) : 0;
    set_up(smem_base, K, tid);
    if (p.warp == 8) {
        produce_items(a, smem_base, first, p, zero_target);
#if FP32_SUM
        store_output(a, p.lane);
#endif
    } else {
        if constexpr (ZERO_OUT) zero_stripe(a, tid);
        consume_items(a, smem_base, p);
#if FP32_SUM
        consumers_done();
#endif
    }
    if constexpr (DETERMINISTIC) asm volatile("griddepcontrol.launch_dependents;");  // the combine
    // No CTA leaves while another may still store into its shared memory or barriers.
    cluster_arrive_release();
    cluster_wait_acquire();
}

// ------------------------------------------------------------------------------ the output's zeroing

// out[0, n16) = 0 in 16-byte stores, for a launch that writes its output rather than adding into
// it: launched just ahead of the fused kernel, which it lets start at once (a programmatic
// dependent: the fused kernel's consumers wait for this grid's end before they first reduce).
extern "C" __global__ void __launch_bounds__(256) moebench_zero_out(uint4* __restrict__ out, long long n16) {
    asm volatile("griddepcontrol.launch_dependents;");
    const long long stride = 256ll * gridDim.x;
    #pragma unroll 1  // (unrolled, the trip count is a 64-bit division: a subroutine)
    for (long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x; i < n16; i += stride)
        out[i] = make_uint4(0u, 0u, 0u, 0u);
}

#if DETERMINISTIC
// ------------------------------------------------------------------------------ the combine

#define COMBINE_THREADS 128
#define COMBINE_BATCH 10  // rows loaded before the first add: top_k x G of A (9) and Q (10) in one trip

// out[t, 8c..8c+7] += sum over k < top_k, then g < G, of part[(t * top_k + k) * G + g, 8c..]
// (= when `accumulate` is 0: the output written, its old value never read):
// FP32 sums in that order, one BF16 rounding. A thread per 8 columns of a token; reads
// 16 * top_k * G bytes and writes 16 (A8: 1.0 MB read, 115 KB written). The loads of a batch
// all go out before the first add (one L2 round trip a batch, not one a row); the adds keep
// the order. Launched with programmatic stream serialization: its CTAs may start while the
// fused kernel's last CTAs finish (that kernel lets its dependents launch as its CTAs' items
// are done), read the output's old value (accumulating), and wait until that kernel has completed and its
// workspace stores are visible. The workspace is read through L2 (ld.global.cg): the fused
// kernel writes it during this grid's lifetime.
// Two BF16 (low half first) added to s0, s1; and two FP32 sums rounded back to BF16x2.
__device__ __forceinline__ void add_bf16x2(float& s0, float& s1, u32 v) {
    s0 += __uint_as_float(v << 16);
    s1 += __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ u32 bf16x2_plus(u32 v, float s0, float s1) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(v & 0xffff0000u) + s1),
        "f"(__uint_as_float(v << 16) + s0));
    return r;
}

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
moebench_fused_moe_combine(const unsigned short* __restrict__ part, unsigned short* __restrict__ out,
                           int M, int top_k, int G, int K, int accumulate)
{
    const int K8 = K >> 3;
    const long long i = static_cast<long long>(blockIdx.x) * COMBINE_THREADS + threadIdx.x;
    if (i >= static_cast<long long>(M) * K8) return;
    // The output is not the fused kernel's to write (it writes the workspace), so its old value is
    // read before the wait: that load's HBM round trip is off the tail past the fused grid's end.
    uint4* dst = reinterpret_cast<uint4*>(out) + i;
    const uint4 o = accumulate ? *dst : make_uint4(0u, 0u, 0u, 0u);  // (0: the output is written)
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int t = static_cast<int>(i / K8), col = static_cast<int>(i - static_cast<long long>(t) * K8);
    const int rows = top_k * G;
    const uint4* src = reinterpret_cast<const uint4*>(part) + static_cast<size_t>(t) * rows * K8 + col;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    for (int r0 = 0; r0 < rows; r0 += COMBINE_BATCH) {
        uint4 v[COMBINE_BATCH];
        #pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u)
            if (r0 + u < rows) v[u] = __ldcg(src + static_cast<size_t>(r0 + u) * K8);
        #pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u) {
            if (r0 + u >= rows) break;
            add_bf16x2(s0, s1, v[u].x);
            add_bf16x2(s2, s3, v[u].y);
            add_bf16x2(s4, s5, v[u].z);
            add_bf16x2(s6, s7, v[u].w);
        }
    }
    *dst = make_uint4(bf16x2_plus(o.x, s0, s1), bf16x2_plus(o.y, s2, s3), bf16x2_plus(o.z, s4, s5),
                      bf16x2_plus(o.w, s6, s7));
}
#endif
