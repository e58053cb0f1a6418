// sm90_fused_moe.cu: the whole FP8 W8A8 MoE layer in one sm_90a kernel.
//
//   out[t] += w[t,k] * down_e( requant128( silu(gate_e(x_t)) * up_e(x_t) ) ),  e = ids[t,k]
//
// Work split. One thread-block cluster of 8 CTAs per (route-plan block, requant group g of
// 128 intermediate columns). CTA c of the cluster
//   GEMM1  streams 16 gate rows and 16 up rows of w1[e] (rows 128g+16c.., I+128g+16c..) over
//          the full K: 32*K bytes; h = x . w1^T with 128x128 block scales, FP32;
//   SwiGLU a = silu(h_gate) * h_up for its 16 columns, and writes them into the shared memory
//          of all 8 CTAs of the cluster (DSMEM), so every CTA holds the group's 128 columns;
//   requant per token over the 128 columns (scale = max(amax/448, 1e-10)), FP8 codes, on chip;
//   GEMM2  streams rows [c*K/8, (c+1)*K/8) of w2[e] restricted to group g: 16*K bytes, and
//          adds route_weight * y into the BF16 output with bf16x2 reductions.
// Every CTA streams the same 48*K weight bytes, so the bytes in flight cover the chip even
// when only a few dozen experts are routed (A8: ~58 blocks x 8 CTAs).
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
// The stream is cut into 16 KB chunks (GEMM1: 4 k blocks of the 32 rows; GEMM2: 8 m-tiles
// of 16 rows x 128), copied by cp.async.bulk into a ring of STAGES shared buffers that
// complete on mbarriers; the activations of each GEMM1 chunk (BLOCK_M rows x 512 bytes,
// gathered by token) travel the same way on a second set of mbarriers.
//
// Route plan: moe_align_block_size semantics. Blocks at or past the device-side padded total,
// or whose expert id is outside [0, E), exit before touching anything; sentinel slots
// (>= num_slots) are padding: their activation rows are zero and nothing is written for them.
//
// Meta-parameters (defines): BLOCK_M (tokens per plan block, a multiple of 8), STAGES (ring
// depth), MIN_CTAS_PER_SM (register budget).

#ifndef BLOCK_M
#define BLOCK_M 8
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef MIN_CTAS_PER_SM  // two CTAs an SM hide each other's set-up and cluster exchange
#define MIN_CTAS_PER_SM (BLOCK_M <= 32 ? 2 : 1)
#endif

#define CLUSTER 8              // CTAs per cluster: 8 x 16 intermediate columns = one group
#define THREADS 256            // 8 warps
#define GROUP 128              // FP8 block-scale granularity
#define CHUNK_BYTES 16384      // one ring stage of weights
#define X_ROW 528              // shared row of activations: 512 bytes + 16 (no bank conflicts)
#define AQ_ROW 144             // shared row of requantized intermediate: 128 bytes + 16
#define NT (BLOCK_M / 8)       // mma n-tiles per block

static_assert(BLOCK_M % 8 == 0 && BLOCK_M >= 8 && BLOCK_M <= 64, "BLOCK_M: a multiple of 8, at most 64");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES in [2, 8]");

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// ------------------------------------------------------------------------------ PTX helpers

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

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Store one float into the shared memory of CTA `rank` of this cluster, at the offset of
// the local address `local`.
__device__ __forceinline__ void st_cluster_f32(u32 local, u32 rank, float v) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}

// D += A(16x32 e4m3, row) * B(32x8 e4m3, col), FP32 accumulators.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint4& a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Four k32 steps over one 128-wide k block: a[s] are the A fragments, `b` the lane's 32 bytes
// of its token row (words 2s, 2s+1 feed k-step s, see the permutation above).
__device__ __forceinline__ void mma_block(float (&d)[4], const uint4 (&a)[4], const uint4& blo, const uint4& bhi) {
    mma_e4m3(d, a[0], blo.x, blo.y);
    mma_e4m3(d, a[1], blo.z, blo.w);
    mma_e4m3(d, a[2], bhi.x, bhi.y);
    mma_e4m3(d, a[3], bhi.z, bhi.w);
}

// Four floats -> four e4m3 codes (round to nearest even, saturating), low byte first.
__device__ __forceinline__ u32 pack_e4m3x4(float x0, float x1, float x2, float x3) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
}

// out[0] += lo, out[1] += hi as one bf16x2 reduction in L2.
__device__ __forceinline__ void red_add_bf16x2(unsigned short* out, float lo, float hi) {
    u32 packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    asm volatile("red.global.add.noftz.bf16x2 [%0], %1;" :: "l"(out), "r"(packed) : "memory");
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// ------------------------------------------------------------------------------ shared layout
// Offsets in bytes from the dynamic shared base; fused_arm.py mirrors this (shared_bytes()).
//   ring   STAGES x 16 KB          weight chunks
//   xring  STAGES x BLOCK_M x 528  activation chunks; after GEMM1 reused for the cross-warp
//                                  partial sums (8 x 16 x BLOCK_M floats) and the FP8
//                                  intermediate (BLOCK_M x 144 bytes)
//   afull  BLOCK_M x 128 floats    the group's SwiGLU output, written by all 8 CTAs
//   xs     KB x BLOCK_M floats     activation scales, [k block][token]
//   w1s    2 x KB floats           gate / up block scales of this CTA's rows
//   w2s    KB floats               down block scales of column group g, by row block
//   tok, rw, tmul  BLOCK_M each    token index (-1: padding), route weight, requant scale * rw
//   bars   2 x STAGES x 8 bytes    full (weights) and xfull (activations) mbarriers

struct Smem {
    u8* ring; u8* xring; float* red; u8* aq; float* afull; float* xs; float* w1s; float* w2s;
    int* tok; float* rw; float* tmul; u32 full; u32 xfull; u32 bytes;
};

__device__ __forceinline__ Smem carve(u8* base, int KB) {
    Smem s;
    u32 off = 0;
    s.ring = base + off;   off += STAGES * CHUNK_BYTES;
    s.xring = base + off;  off += STAGES * BLOCK_M * X_ROW;
    s.red = reinterpret_cast<float*>(s.xring);
    s.aq = s.xring + 8 * 16 * BLOCK_M * 4;
    s.afull = reinterpret_cast<float*>(base + off);  off += BLOCK_M * GROUP * 4;
    s.xs = reinterpret_cast<float*>(base + off);     off += KB * BLOCK_M * 4;
    s.w1s = reinterpret_cast<float*>(base + off);    off += 2 * KB * 4;
    s.w2s = reinterpret_cast<float*>(base + off);    off += KB * 4;
    s.tok = reinterpret_cast<int*>(base + off);      off += BLOCK_M * 4;
    s.rw = reinterpret_cast<float*>(base + off);     off += BLOCK_M * 4;
    s.tmul = reinterpret_cast<float*>(base + off);   off += BLOCK_M * 4;
    off = (off + 7) & ~7u;
    s.full = smem_u32(base + off);                   off += STAGES * 8;
    s.xfull = smem_u32(base + off);                  off += STAGES * 8;
    s.bytes = off;
    return s;
}

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
    // BF16 output [M, K], accumulated into
    unsigned short* __restrict__ out,
    int num_slots, int top_k, int K, int E)
{
    extern __shared__ __align__(128) u8 smem_base[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gq = lane >> 2, tq = lane & 3;  // mma groupID, threadID_in_group
    const int block = blockIdx.x / CLUSTER;
    const u32 rank = cluster_ctarank();
    const int g = blockIdx.y, G = gridDim.y;  // requant group of the intermediate, group count
    const int KB = K / GROUP;

    // The whole cluster leaves together, before any cluster barrier, when its block is
    // padding or garbage past the padded total.
    if (block * BLOCK_M >= __ldg(num_tokens_post_padded)) return;
    const int e = __ldg(expert_ids + block);
    if (e < 0 || e >= E) return;

    Smem sm = carve(smem_base, KB);
    if (tid == 0 && dynamic_smem_size() < sm.bytes) __trap();  // host and device disagree

    const int n1 = (KB + 3) / 4;        // GEMM1 chunks: 4 k blocks x 32 rows
    const int n2 = (KB + 7) / 8;        // GEMM2 chunks: 8 m-tiles x 16 rows (K/8 rows = KB m-tiles)
    const int total = n1 + n2;
    const size_t cta = (static_cast<size_t>(e) * G + g) * CLUSTER + rank;
    const u8* w1_cta = w1f + cta * 32 * static_cast<size_t>(K);   // 32 rows x K
    const u8* w2_cta = w2f + cta * 16 * static_cast<size_t>(K);   // K/8 rows x 128

    auto issue_weights = [&](int j) {
        const int st = j % STAGES;
        const u32 bytes = j < n1 ? min(4, KB - 4 * j) * 4096 : min(8, KB - 8 * (j - n1)) * 2048;
        const u8* src = j < n1 ? w1_cta + static_cast<size_t>(j) * CHUNK_BYTES
                               : w2_cta + static_cast<size_t>(j - n1) * CHUNK_BYTES;
        mbar_arrive_expect_tx(sm.full + 8 * st, bytes);
        bulk_copy(smem_u32(sm.ring + st * CHUNK_BYTES), src, bytes, sm.full + 8 * st);
    };
    auto issue_acts = [&](int j) {  // GEMM1 chunks only: BLOCK_M rows x (128 x blocks) bytes
        const int st = j % STAGES;
        const u32 bytes = min(4, KB - 4 * j) * GROUP;
        int valid = 0;
        for (int r = 0; r < BLOCK_M; ++r) valid += sm.tok[r] >= 0;
        mbar_arrive_expect_tx(sm.xfull + 8 * st, valid * bytes);
        for (int r = 0; r < BLOCK_M; ++r) {
            const int t = sm.tok[r];
            if (t >= 0)
                bulk_copy(smem_u32(sm.xring + (st * BLOCK_M + r) * X_ROW),
                          x + static_cast<size_t>(t) * K + j * 512, bytes, sm.xfull + 8 * st);
        }
    };

    // ---- set-up: barriers and the first weight chunks as soon as the expert is known
    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(sm.full + 8 * st, 1);
            mbar_init(sm.xfull + 8 * st, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (int j = 0; j < min(STAGES, total); ++j) issue_weights(j);
    }
    if (tid < BLOCK_M) {
        const int slot = __ldg(sorted_token_ids + block * BLOCK_M + tid);
        const bool valid = slot >= 0 && slot < num_slots;
        sm.tok[tid] = valid ? slot / top_k : -1;
        sm.rw[tid] = valid ? __ldg(topk_weights + slot) : 0.0f;
    }
    for (int i = tid; i < KB; i += THREADS) {
        sm.w1s[i] = __ldg(w1_scale + (static_cast<size_t>(e) * 2 * G + g) * KB + i);
        sm.w1s[KB + i] = __ldg(w1_scale + (static_cast<size_t>(e) * 2 * G + G + g) * KB + i);
        sm.w2s[i] = __ldg(w2_scale + (static_cast<size_t>(e) * KB + i) * G + g);
    }
    cluster_arrive_relaxed();  // "this CTA runs": waited on before the first DSMEM store
    __syncthreads();

    if (tid == 0)
        for (int j = 0; j < min(STAGES, n1); ++j) issue_acts(j);
    for (int i = tid; i < KB * BLOCK_M; i += THREADS) {
        const int kb = i / BLOCK_M, r = i % BLOCK_M, t = sm.tok[r];
        sm.xs[i] = t >= 0 ? __ldg(x_scale + static_cast<size_t>(t) * KB + kb) : 0.0f;
    }
    for (int i = tid; i < STAGES * BLOCK_M * 32; i += THREADS) {  // padding rows: zero, never copied
        const int st = i / (BLOCK_M * 32), r = (i / 32) % BLOCK_M, q = i % 32;
        if (sm.tok[r] < 0)
            *reinterpret_cast<uint4*>(sm.xring + (st * BLOCK_M + r) * X_ROW + q * 16) = make_uint4(0, 0, 0, 0);
    }
    __syncthreads();

    // ---- GEMM1: h[32 rows, BLOCK_M] over K. Warp w: rows of mt = w & 1 (gate, up), the
    // k block w >> 1 of every chunk. Per chunk and warp: 2 KB of weights, 4*NT mma.
    const int mt = warp & 1, kb_in_chunk = warp >> 1;
    float acc[NT][4];
    #pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    int j = 0;
    for (; j < n1; ++j) {
        const int st = j % STAGES;
        const u32 parity = (j / STAGES) & 1;
        mbar_wait(sm.full + 8 * st, parity);
        mbar_wait(sm.xfull + 8 * st, parity);
        const int kb = 4 * j + kb_in_chunk;
        if (kb < KB) {
            const u8* wa = sm.ring + st * CHUNK_BYTES + (kb_in_chunk * 2 + mt) * 2048 + lane * 16;
            uint4 a[4];
            #pragma unroll
            for (int s = 0; s < 4; ++s) a[s] = *reinterpret_cast<const uint4*>(wa + s * 512);
            const float sw = sm.w1s[mt * KB + kb];
            #pragma unroll
            for (int n = 0; n < NT; ++n) {
                const u8* xb = sm.xring + (st * BLOCK_M + n * 8 + gq) * X_ROW + kb_in_chunk * GROUP + tq * 32;
                const uint4 blo = *reinterpret_cast<const uint4*>(xb);
                const uint4 bhi = *reinterpret_cast<const uint4*>(xb + 16);
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_block(p, a, blo, bhi);
                const float s0 = sw * sm.xs[kb * BLOCK_M + n * 8 + 2 * tq];
                const float s1 = sw * sm.xs[kb * BLOCK_M + n * 8 + 2 * tq + 1];
                acc[n][0] += p[0] * s0;
                acc[n][1] += p[1] * s1;
                acc[n][2] += p[2] * s0;
                acc[n][3] += p[3] * s1;
            }
        }
        __syncthreads();  // stage st is free
        if (tid == 0 && j + STAGES < total) {
            issue_weights(j + STAGES);
            if (j + STAGES < n1) issue_acts(j + STAGES);
        }
    }

    // ---- reduce the four k-block partials per row, SwiGLU, all-gather in the cluster
    #pragma unroll
    for (int n = 0; n < NT; ++n) {
        float* r = sm.red + (warp * 16 + gq) * BLOCK_M + n * 8 + 2 * tq;
        *reinterpret_cast<float2*>(r) = make_float2(acc[n][0], acc[n][1]);
        *reinterpret_cast<float2*>(r + 8 * BLOCK_M) = make_float2(acc[n][2], acc[n][3]);
    }
    __syncthreads();
    cluster_wait_acquire();  // every CTA of the cluster is running: DSMEM is safe to write
    for (int i = tid; i < 16 * BLOCK_M; i += THREADS) {
        const int row = i / BLOCK_M, t = i % BLOCK_M;
        float hg = 0.0f, hu = 0.0f;
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            hg += sm.red[((2 * q) * 16 + row) * BLOCK_M + t];
            hu += sm.red[((2 * q + 1) * 16 + row) * BLOCK_M + t];
        }
        const float a = silu(hg) * hu;
        const u32 dst = smem_u32(sm.afull + t * GROUP + rank * 16 + row);
        #pragma unroll
        for (int c = 0; c < CLUSTER; ++c) st_cluster_f32(dst, c, a);
    }
    cluster_arrive_release();
    cluster_wait_acquire();  // the group's 128 columns are in every CTA

    // ---- requant per token over the group: warp w takes tokens w, w+8, ...
    for (int t = warp; t < BLOCK_M; t += 8) {
        const float4 v = *reinterpret_cast<const float4*>(sm.afull + t * GROUP + lane * 4);
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = fmaxf(amax / 448.0f, 1e-10f);
        *reinterpret_cast<u32*>(sm.aq + t * AQ_ROW + lane * 4) =
            pack_e4m3x4(v.x / scale, v.y / scale, v.z / scale, v.w / scale);
        if (lane == 0) sm.tmul[t] = scale * sm.rw[t];
    }
    __syncthreads();

    // ---- GEMM2: y[K/8 rows, BLOCK_M] for this CTA's rows, group g's 128 columns.
    // Warp w: m-tile w of every chunk (16 rows); per chunk and warp 2 KB, 4*NT mma.
    const int row0 = rank * (K / CLUSTER);
    for (; j < total; ++j) {
        const int st = j % STAGES;
        const u32 parity = (j / STAGES) & 1;
        mbar_wait(sm.full + 8 * st, parity);
        const int m = 8 * (j - n1) + warp;  // m-tile within this CTA's rows
        if (m < KB) {
            const u8* wa = sm.ring + st * CHUNK_BYTES + warp * 2048 + lane * 16;
            uint4 a[4];
            #pragma unroll
            for (int s = 0; s < 4; ++s) a[s] = *reinterpret_cast<const uint4*>(wa + s * 512);
            const int row = row0 + m * 16 + gq;  // this lane's rows: row, row + 8
            const float sw = sm.w2s[row / GROUP];
            const bool odd = gq & 1;
            #pragma unroll
            for (int n = 0; n < NT; ++n) {
                const u8* ab = sm.aq + (n * 8 + gq) * AQ_ROW + tq * 32;
                const uint4 blo = *reinterpret_cast<const uint4*>(ab);
                const uint4 bhi = *reinterpret_cast<const uint4*>(ab + 16);
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_block(p, a, blo, bhi);
                const int t0 = n * 8 + 2 * tq, t1 = t0 + 1;
                const float f0 = sw * sm.tmul[t0], f1 = sw * sm.tmul[t1];
                const float v00 = p[0] * f0, v01 = p[1] * f1;  // (row, t0), (row, t1)
                const float v10 = p[2] * f0, v11 = p[3] * f1;  // (row+8, t0), (row+8, t1)
                // Pair rows (2i, 2i+1) of one token for a bf16x2 add: the even-row lane keeps
                // token t0, the odd-row lane (lane ^ 4) token t1; each sends the other its half.
                const float got_lo = __shfl_xor_sync(0xffffffffu, odd ? v00 : v01, 4);
                const float got_hi = __shfl_xor_sync(0xffffffffu, odd ? v10 : v11, 4);
                const int tok = sm.tok[odd ? t1 : t0];
                if (tok >= 0) {
                    unsigned short* o = out + static_cast<size_t>(tok) * K + (odd ? row - 1 : row);
                    red_add_bf16x2(o, odd ? got_lo : v00, odd ? v01 : got_lo);
                    red_add_bf16x2(o + 8, odd ? got_hi : v10, odd ? v11 : got_hi);
                }
            }
        }
        __syncthreads();
        if (tid == 0 && j + STAGES < total) issue_weights(j + STAGES);
    }
}
