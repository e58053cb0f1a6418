// sm90_wgmma_probe.cu: `moebench probe --op wgmma | wgmma-step`, the ceiling of the prefill
// kernels' tensor-core work (sm_90a).
//
// The prefill kernels (sm90_fused_prefill.cu) run their GEMMs as wgmma m64n128k32 e4m3 with
// both operands in shared memory: two consumer warpgroups a CTA, one CTA an SM, each K step of
// 128 four such instructions a warpgroup on one 64-row tile and its own 128 weight rows. These
// kernels do that and nothing else, on tiles filled once from `src` (an FP8 A tile of 64 x 128
// and a B tile of 256 x 128, in the kernels' 128-byte swizzle) and never refilled, so no load
// from L2 or HBM waits:
//   moebench_probe_wgmma       the instruction's rate: a K step's four wgmma, committed, the
//                              step before waited for (one group in flight), sums kept in place;
//   moebench_probe_wgmma_step  the consumers' step as the kernels run it: four wgmma into fresh
//                              sums, committed and waited for at once, then promoted into the FP32
//                              accumulator times two scales read from shared memory.
// Each thread stores one float of its sums to `sink` at the end (the work is not dead code).

#include "sm90_common.cuh"

constexpr int PROBE_THREADS = 256;        // two warpgroups
constexpr int PROBE_A = 64 * 128;         // bytes
constexpr int PROBE_B = 256 * 128;
constexpr int PROBE_SMEM = PROBE_A + PROBE_B + 16 + 1024;  // tiles, 4 scales, alignment slack

template <bool STEP>
__device__ __forceinline__ void probe_wgmma(const uint4* __restrict__ src, float* __restrict__ sink, int steps) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  for (int i = threadIdx.x; i < (PROBE_A + PROBE_B) / 16; i += PROBE_THREADS)
    reinterpret_cast<uint4*>(smem)[i] = src[i];
  float* scales = reinterpret_cast<float*>(smem + PROBE_A + PROBE_B);
  if (threadIdx.x < 4) scales[threadIdx.x] = 0.5f + 0.25f * threadIdx.x;
  fence_proxy_async_smem();  // the tiles' generic stores -> wgmma's reads (async proxy)
  __syncthreads();
  const int wg = threadIdx.x / 128, r = (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4;
  const uint64_t a_desc = wgmma_desc_sw128(smem);
  const uint64_t b_desc = wgmma_desc_sw128(smem + PROBE_A + wg * 128 * 128);
  float part[64], acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = 0.f;
  for (int s = 0; s < steps; ++s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      Wgmma<128>::mma(part, a_desc + 2 * kk, b_desc + 2 * kk, STEP ? kk > 0 : s > 0 || kk > 0);
    wgmma_commit();
    if (STEP) {
      wgmma_wait<0>();
      const float t0 = scales[r & 3], t1 = scales[(r + 1) & 3], w = scales[wg];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        acc[4 * j + 0] += part[4 * j + 0] * (w * t0);
        acc[4 * j + 1] += part[4 * j + 1] * (w * t0);
        acc[4 * j + 2] += part[4 * j + 2] * (w * t1);
        acc[4 * j + 3] += part[4 * j + 3] * (w * t1);
      }
    } else {
      wgmma_wait<1>();
    }
  }
  wgmma_wait<0>();
  float t = 0.f;
#pragma unroll
  for (int j = 0; j < 64; ++j) t += STEP ? acc[j] : part[j];
  sink[blockIdx.x * PROBE_THREADS + threadIdx.x] = t;
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS, 1)
moebench_probe_wgmma(const uint4* __restrict__ src, float* __restrict__ sink, int steps) {
  probe_wgmma<false>(src, sink, steps);
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS, 1)
moebench_probe_wgmma_step(const uint4* __restrict__ src, float* __restrict__ sink, int steps) {
  probe_wgmma<true>(src, sink, steps);
}
