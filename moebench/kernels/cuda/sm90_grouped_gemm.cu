// sm90_grouped_gemm.cu: the kernels of the `cuda-gemm` and `cuda-swapab` arms (sm_90a).
//
//   moe_grouped_gemm1   h[slot, :N]  = x[token(slot)] . w1[e]^T            FP8 block scales, FP32 out
//   moe_swiglu_quant    a[slot, :I]  = requant(silu(gate) * up)            per slot, groups of 128
//                       out[:, :]    = 0                                   (GEMM2 reduces into it)
//   moe_grouped_gemm2   out[token(slot), :K] += w[slot] * (a[slot] . w2[e]^T)
//                                                                          FP8 block scales, BF16 reduce-add
//
// The combine over top_k is GEMM2's epilogue: each slot's row goes into its token's output
// row by 16-byte bf16x2 reductions in L2 (so the sum is in BF16 and its last bit depends
// on the order the reductions land, as in cuda-fused).
//
// The two GEMMs are one kernel over the route plan (moe_align_block_size layout): CTA
// (x, y) takes token block x (BLOCK_T slots of one expert, sentinel-padded) and
// TILES_PER_CTA consecutive 64-row tiles of that expert's weight, starting at tile
// y * tiles_per_cta. Per 128-wide K step a producer warp brings one weight tile
// (64 rows x 128 B, TMA, 128-byte swizzle) and the block's activation rows (gathered by
// slot with cp.async into the same swizzled layout, zero for sentinel slots) into one of
// STAGES shared-memory stages (the TMA completes on the stage's mbarrier by bytes; each
// producer lane publishes its cp.async copies LAG steps later, after wait_group and a
// proxy fence, so the generic-proxy writes are ordered before wgmma's async-proxy reads); one consumer warpgroup runs four k32 wgmma on it, then
// folds the partial sum into FP32 accumulators with the weight block's scale and each
// token's scale (DeepGEMM's promotion: tensor-core FP8 sums never run past 128 of K).
//
// SWAP_AB is the only difference between the arms (what the 64-row wgmma slot holds):
//   SWAP_AB=0 (cuda-gemm):   D[token, row] = X[64 tokens] . W[64 rows]^T,  wgmma m64n64k32,
//                            so a token block is 64 slots (BLOCK_T = 64) however few are real;
//   SWAP_AB=1 (cuda-swapab): D[row, token] = W[64 rows] . X[BLOCK_T]^T,    wgmma m64nBLOCK_Tk32,
//                            so a token block is as small as wgmma's N allows (8..64).
// Tiles (64 weight rows x 128 K per step), stages, pipeline and epilogue are the same code.
//
// Memory traffic per CTA and step: 8 KiB of weight (streamed from HBM once per token
// block: the whole point) + BLOCK_T * 128 B of activations (L2-resident) + scales.
// FLOPs per step: 2 * 64 * BLOCK_T * 128 — never the limit at decode sizes.

#include "sm90_common.cuh"

#ifndef SWAP_AB
#define SWAP_AB 1
#endif
#ifndef BLOCK_T
#define BLOCK_T 16
#endif
#ifndef STAGES
#define STAGES 5
#endif

constexpr int BLOCK_R = 64;   // weight rows per tile: the wgmma M of the swapped form
constexpr int BLOCK_K = 128;  // K per step: one FP8 scale block, one 128-byte swizzled row
constexpr int MMA_N = SWAP_AB ? BLOCK_T : BLOCK_R;
constexpr int ACC = 64 * MMA_N / 128;  // FP32 accumulators per consumer thread
constexpr int CONSUMERS = 128;         // one warpgroup: warps 0-3
constexpr int THREADS = CONSUMERS + 32;  // + one producer warp (warp 4)
constexpr int W_TILE_BYTES = BLOCK_R * BLOCK_K;
constexpr int X_TILE_BYTES = BLOCK_T * BLOCK_K;
constexpr int SCALES = (BLOCK_T + 1 + 3) / 4 * 4;  // BLOCK_T token scales, then the weight scale
constexpr int C_STRIDE = BLOCK_R + 4;              // epilogue tile row (floats), padded
constexpr int X_CHUNKS = BLOCK_T * 8 / 32;         // 16-byte activation chunks per producer lane
constexpr int T_PER_LANE = (BLOCK_T + 31) / 32;
constexpr int LAG = 2;  // producer steps between issuing a stage's cp.async and publishing it
static_assert(LAG < STAGES, "the producer would wait on a stage it has not published");

static_assert(SWAP_AB || BLOCK_T == 64, "tokens in the 64-row slot: a token block is 64 slots");
static_assert(BLOCK_T % 8 == 0 && BLOCK_T >= 8 && BLOCK_T <= 64, "BLOCK_T: a multiple of 8 in [8, 64]");
static_assert(X_CHUNKS >= 1, "");

// Dynamic shared memory, from a 1024-aligned base (swizzled tiles need it).
constexpr int OFF_W = 0;
constexpr int OFF_X = OFF_W + STAGES * W_TILE_BYTES;
constexpr int OFF_S = OFF_X + STAGES * X_TILE_BYTES;
constexpr int OFF_C = OFF_S + STAGES * SCALES * 4;
constexpr int OFF_SLOT = OFF_C + BLOCK_T * C_STRIDE * 4;
constexpr int OFF_BAR = (OFF_SLOT + BLOCK_T * 4 + 7) / 8 * 8;
constexpr int SMEM_USED = OFF_BAR + 2 * STAGES * 8;
constexpr int SMEM_BYTES = SMEM_USED + 1024;  // what the host must pass (alignment slack)

__device__ __forceinline__ uint32_t dynamic_smem_size() {
  uint32_t v;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}

// Token and weight-row coordinates of accumulator i in this thread (see Wgmma<N>).
__device__ __forceinline__ int acc_token(int i, int w, int g, int q) {
  return SWAP_AB ? 8 * (i >> 2) + 2 * q + (i & 1) : 16 * w + g + 8 * ((i >> 1) & 1);
}
__device__ __forceinline__ int acc_row(int i, int w, int g, int q) {
  return SWAP_AB ? 16 * w + g + 8 * ((i >> 1) & 1) : 8 * (i >> 2) + 2 * q + (i & 1);
}

// out[0..7] += v[0..7]: one 16-byte v4.bf16x2 reduction in L2 (out 16-byte aligned).
__device__ __forceinline__ void red_add_bf16x8(uint16_t* out, float4 lo, float4 hi) {
  asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};"
               :: "l"(out), "r"(pack_bf16x2(lo.x, lo.y)), "r"(pack_bf16x2(lo.z, lo.w)),
                  "r"(pack_bf16x2(hi.x, hi.y)), "r"(pack_bf16x2(hi.z, hi.w)) : "memory");
}

template <bool REDUCE_BF16>
__device__ __forceinline__ void grouped_gemm(
    // weights: [E * rows_per_expert, k_dim] FP8, TMA box 64 x 128, 128-byte swizzle
    const TmaDescriptor* w_map, const float* __restrict__ w_scale,
    // activations: [rows, k_dim] FP8 and [rows, k_dim / 128] FP32; slot -> row = slot / row_div
    const uint8_t* __restrict__ act, const float* __restrict__ act_scale,
    // route plan
    const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids,
    // output: FP32 [slots, rows_per_expert], or (REDUCE_BF16) BF16 [tokens, rows_per_expert]
    // that each slot's row times its route weight is added into, at token = slot / out_div
    void* __restrict__ out, const float* __restrict__ route_w, int out_div,
    int k_dim, int rows_per_expert, int row_div, int sentinel, int tiles_per_cta) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uint64_t>(smem_raw) + 1023) & ~uint64_t(1023));
  uint8_t* w_tiles = smem + OFF_W;
  uint8_t* x_tiles = smem + OFF_X;
  float* scales = reinterpret_cast<float*>(smem + OFF_S);
  float* c_tile = reinterpret_cast<float*>(smem + OFF_C);
  int* slots = reinterpret_cast<int*>(smem + OFF_SLOT);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  uint64_t* empty = full + STAGES;

  const int block = blockIdx.x;
  const int expert = expert_ids[block];
  if (expert < 0) return;  // past the plan's end: the whole CTA leaves before any barrier
  if (threadIdx.x == 0 && dynamic_smem_size() < uint32_t(SMEM_BYTES)) __trap();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_steps = k_dim / BLOCK_K;
  const int steps = tiles_per_cta * k_steps;
  const int first_tile = blockIdx.y * tiles_per_cta;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 32 + 1);  // 32 producer lanes (activations landed) + the TMA expect_tx
      mbar_init(&empty[s], CONSUMERS / 32);  // one arrival per consumer warp
    }
    mbar_fence_init();
  }
  if (threadIdx.x < BLOCK_T) slots[threadIdx.x] = sorted_ids[block * BLOCK_T + threadIdx.x];
  __syncthreads();

  if (warp == CONSUMERS / 32) {
    // ---------------------------------------------------------------- producer warp
    if (lane == 0) tma_prefetch_descriptor(w_map);
    const uint8_t* x_src[X_CHUNKS];
    uint32_t x_dst[X_CHUNKS], x_bytes[X_CHUNKS];
#pragma unroll
    for (int j = 0; j < X_CHUNKS; ++j) {
      const int idx = lane + 32 * j, t = idx >> 3, c = idx & 7;
      const int slot = slots[t];
      const bool real = slot >= 0 && slot < sentinel;
      x_src[j] = act + size_t(real ? slot / row_div : 0) * k_dim + c * 16;
      x_bytes[j] = real ? 16 : 0;
      x_dst[j] = t * 128 + ((c ^ (t & 7)) << 4);  // 128-byte swizzle: chunk ^= row % 8
    }
    const float* s_src[T_PER_LANE];
    uint32_t s_bytes[T_PER_LANE];
#pragma unroll
    for (int j = 0; j < T_PER_LANE; ++j) {
      const int t = lane + 32 * j;
      const int slot = t < BLOCK_T ? slots[t] : -1;
      const bool real = slot >= 0 && slot < sentinel;
      s_src[j] = act_scale + size_t(real ? slot / row_div : 0) * k_steps;
      s_bytes[j] = real ? 4 : 0;
    }
    const float* ws_src = w_scale + size_t(expert) * (rows_per_expert / BLOCK_K) * k_steps;
    const int w_row0 = expert * rows_per_expert;

    for (int i = 0; i < steps; ++i) {
      const int s = i % STAGES, round = i / STAGES;
      if (i >= STAGES) mbar_wait(&empty[s], (round - 1) & 1);
      const int tile = first_tile + i / k_steps, kb = i % k_steps;
      if (lane == 0) {
        mbar_arrive_expect_tx(&full[s], W_TILE_BYTES);
        tma_load_2d(w_tiles + s * W_TILE_BYTES, w_map, &full[s], kb * BLOCK_K, w_row0 + tile * BLOCK_R);
        cp_async_4(&scales[s * SCALES + BLOCK_T], ws_src + (tile * BLOCK_R / BLOCK_K) * k_steps + kb, 4);
      }
      uint8_t* x_stage = x_tiles + s * X_TILE_BYTES;
#pragma unroll
      for (int j = 0; j < X_CHUNKS; ++j) cp_async_16(x_stage + x_dst[j], x_src[j] + kb * BLOCK_K, x_bytes[j]);
#pragma unroll
      for (int j = 0; j < T_PER_LANE; ++j) {
        const int t = lane + 32 * j;
        if (t < BLOCK_T) cp_async_4(&scales[s * SCALES + t], s_src[j] + kb, s_bytes[j]);
      }
      cp_async_commit();
      // Publish the activations of step i - LAG: this lane's copies have landed; the proxy
      // fence hands them to the async proxy (wgmma); the arrive releases them.
      if (i >= LAG) {
        cp_async_wait_group<LAG>();
        fence_proxy_async_smem();
        mbar_arrive(&full[(i - LAG) % STAGES]);
      }
    }
    cp_async_wait_all();
    fence_proxy_async_smem();
    for (int i = steps > LAG ? steps - LAG : 0; i < steps; ++i) mbar_arrive(&full[i % STAGES]);
    return;
  }

  // ------------------------------------------------------------------ consumer warpgroup
  const int w = warp, g = lane / 4, q = lane % 4;
  float acc[ACC], part[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) acc[i] = 0.f;

  for (int i = 0; i < steps; ++i) {
    const int s = i % STAGES, round = i / STAGES;
    const int tile = first_tile + i / k_steps, kb = i % k_steps;
    mbar_wait(&full[s], round & 1);
    fence_proxy_async_smem();  // cp.async (generic proxy) results -> wgmma (async proxy)

    const uint64_t w_desc = wgmma_desc_sw128(w_tiles + s * W_TILE_BYTES);
    const uint64_t x_desc = wgmma_desc_sw128(x_tiles + s * X_TILE_BYTES);
    const uint64_t a_desc = SWAP_AB ? w_desc : x_desc;
    const uint64_t b_desc = SWAP_AB ? x_desc : w_desc;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BLOCK_K / 32; ++kk)  // +32 bytes of K = +2 in the descriptor's 16-byte units
      Wgmma<MMA_N>::mma(part, a_desc + 2 * kk, b_desc + 2 * kk, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();

    const float* sc = &scales[s * SCALES];
    const float ws = sc[BLOCK_T];
#pragma unroll
    for (int a = 0; a < ACC; ++a) acc[a] += part[a] * (ws * sc[acc_token(a, w, g, q)]);
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with stage s

    if (kb == k_steps - 1) {
      // Epilogue of one 64-row tile: through shared memory, so each slot's 64 outputs
      // leave as one contiguous row segment (256 B FP32 / 128 B BF16).
      named_barrier(1, CONSUMERS);  // the previous tile's readers are done with c_tile
#pragma unroll
      for (int a = 0; a < ACC; ++a) {
        c_tile[acc_token(a, w, g, q) * C_STRIDE + acc_row(a, w, g, q)] = acc[a];
        acc[a] = 0.f;
      }
      named_barrier(1, CONSUMERS);
      if (REDUCE_BF16) {
        for (int idx = threadIdx.x; idx < BLOCK_T * (BLOCK_R / 8); idx += CONSUMERS) {
          const int t = idx / (BLOCK_R / 8), r8 = (idx % (BLOCK_R / 8)) * 8;
          const int slot = slots[t];
          if (slot < 0 || slot >= sentinel) continue;
          const float rw = route_w[slot];
          float4 lo = *reinterpret_cast<const float4*>(&c_tile[t * C_STRIDE + r8]);
          float4 hi = *reinterpret_cast<const float4*>(&c_tile[t * C_STRIDE + r8 + 4]);
          lo = make_float4(lo.x * rw, lo.y * rw, lo.z * rw, lo.w * rw);
          hi = make_float4(hi.x * rw, hi.y * rw, hi.z * rw, hi.w * rw);
          const size_t o = size_t(slot / out_div) * rows_per_expert + tile * BLOCK_R + r8;
          red_add_bf16x8(reinterpret_cast<uint16_t*>(out) + o, lo, hi);
        }
      } else {
        for (int idx = threadIdx.x; idx < BLOCK_T * (BLOCK_R / 4); idx += CONSUMERS) {
          const int t = idx / (BLOCK_R / 4), r4 = (idx % (BLOCK_R / 4)) * 4;
          const int slot = slots[t];
          if (slot < 0 || slot >= sentinel) continue;
          const size_t o = size_t(slot) * rows_per_expert + tile * BLOCK_R + r4;
          *reinterpret_cast<float4*>(reinterpret_cast<float*>(out) + o) =
              *reinterpret_cast<const float4*>(&c_tile[t * C_STRIDE + r4]);
        }
      }
    }
  }
}

// GEMM1: gate/up rows of w1 ([E*N, K]) against tokens; h[slot, N] in FP32.
extern "C" __global__ void __launch_bounds__(THREADS) moe_grouped_gemm1(
    const __grid_constant__ TmaDescriptor w_map, const float* w_scale, const uint8_t* act,
    const float* act_scale, const int* sorted_ids, const int* expert_ids, float* out,
    int k_dim, int rows_per_expert, int row_div, int sentinel, int tiles_per_cta) {
  grouped_gemm<false>(&w_map, w_scale, act, act_scale, sorted_ids, expert_ids, out, nullptr, 1,
                      k_dim, rows_per_expert, row_div, sentinel, tiles_per_cta);
}

// GEMM2: rows of w2 ([E*K, I]) against requantized slots; out[slot / top_k, K] += route
// weight * . in BF16 (the combine; `out` zeroed by moe_swiglu_quant).
extern "C" __global__ void __launch_bounds__(THREADS) moe_grouped_gemm2(
    const __grid_constant__ TmaDescriptor w_map, const float* w_scale, const uint8_t* act,
    const float* act_scale, const int* sorted_ids, const int* expert_ids, uint16_t* out,
    const float* route_w, int top_k, int k_dim, int rows_per_expert, int sentinel, int tiles_per_cta) {
  grouped_gemm<true>(&w_map, w_scale, act, act_scale, sorted_ids, expert_ids, out, route_w, top_k,
                     k_dim, rows_per_expert, 1, sentinel, tiles_per_cta);
}

// SwiGLU and per-slot FP8 requant, one warp per (slot, group of 128 intermediate values):
// reads 2 x 512 B of h, writes 128 B of codes and one scale. Exactly the oracle's rule:
// scale = max(amax / 448, 1e-10), code = e4m3(v / scale), round to nearest even, saturating.
// It also zeroes `out` (out_vecs 16-byte vectors), which GEMM2 then reduces into: the
// kernel between the GEMMs, so no launch of its own.
extern "C" __global__ void __launch_bounds__(128) moe_swiglu_quant(
    const float* __restrict__ h, uint8_t* __restrict__ a, float* __restrict__ a_scale,
    int num_slots, int inter, uint4* __restrict__ out, int out_vecs) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < out_vecs; v += gridDim.x * blockDim.x)
    out[v] = make_uint4(0u, 0u, 0u, 0u);
  const int groups = inter / 128;
  const int item = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = item / groups, grp = item % groups;
  if (slot >= num_slots) return;
  const float* row = h + size_t(slot) * 2 * inter + grp * 128 + lane * 4;
  const float4 gate = *reinterpret_cast<const float4*>(row);
  const float4 up = *reinterpret_cast<const float4*>(row + inter);
  float v[4] = {gate.x, gate.y, gate.z, gate.w};
  const float u[4] = {up.x, up.y, up.z, up.w};
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = v[i] / (1.0f + expf(-v[i])) * u[i];
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const float scale = fmaxf(amax / 448.0f, 1e-10f);
  const uint32_t lo = pack_e4m3x2(v[0] / scale, v[1] / scale);
  const uint32_t hi = pack_e4m3x2(v[2] / scale, v[3] / scale);
  *reinterpret_cast<uint32_t*>(a + size_t(slot) * inter + grp * 128 + lane * 4) = lo | (hi << 16);
  if (lane == 0) a_scale[size_t(slot) * groups + grp] = scale;
}
