// sm90_fused_prefill.cu: the `cuda-fused` arm's path for prefill-sized expert groups (sm_90a).
//
//   moebench_prefill_gate_up   a[pos, 128g..] , a_scale[pos, g] = requant128(silu(x . w1_gate^T) * (x . w1_up^T))
//   moebench_prefill_down      out[token(pos), :] += route_w[slot(pos)] * (a[pos] . w2[e]^T)   BF16 reduce-add
// where pos = 64 b + r is row r of route-plan block b and slot(pos) the plan's entry there. The
// intermediate is kept in plan order, in the tiles down's wgmma reads: a is [blocks][I/128] tiles
// of 64 rows x 128 bytes, each already in the 128-byte swizzle (16-byte chunk c of row r at chunk
// c ^ (r % 8)), and a_scale [blocks][I/128][64]; so down loads a K step's activations and their
// scales by two bulk copies, with no gather. Padding rows are never written, and never reduced.
// gate_up also zeroes `out` when the launch writes it rather than adding into it (bulk copies from
// shared memory, one a K step: the output's write traffic spread under the GEMM).
//
// The decode kernel (sm90_fused_moe.cu) runs mma.sync m16n8k32 e4m3, which sm_90 executes as
// unpacked F16 HMMAs: free while it waits on HBM, the limit once expert groups hold hundreds
// of tokens. Here both GEMMs run FP8 wgmma (QGMMA in the SASS) with tokens in the 64-row slot.
//
// Work and roles. Each kernel is a persistent grid (one CTA an SM) whose CTAs walk work items
// item = blockIdx.x + i * gridDim.x over route-plan blocks of BLOCK_M = 64 slots (one expert each):
//   gate_up: (block, requant group g, K range), block fastest (the blocks of one expert share w1
//            tiles in L2 while they run at once); one tile: gate rows 128g.. and up rows
//            I + 128g.., 128 each, over 1/splits of the K/128 steps; the K ranges of a
//            (block, group) chain their FP32 sums through global memory, the last runs the epilogue
//   down:    (block, chunk of tiles), block fastest, streaming `chunk` 256-row tiles of w2[e]
//            (output columns), I/128 steps each, so an item's plan reads are paid once a chunk
// The host cuts the work (splits, chunk) so that the items fill the persistent grid's last round:
// with one item a block, 267 blocks on 132 SMs (A512) leave three CTAs streaming a third round.
// The overlap (the host's choice, fused_prefill.overlap_down; the kernels' _overlap builds, the
// others compiled without any of it): down is launched as gate_up's programmatic dependent on a grid of the SMs that gate_up's last round leaves idle, and runs
// beside that round. Nothing orders the two kernels' memory but flags: gate_up counts each done
// (block, group) of the blocks before that round and each CTA's zeroed stripe of the output in one
// counter, which down's CTAs wait for before their first item, and raises a flag a (late block,
// down chunk), which down's item waits for; down takes the late blocks' items last. Every counter
// and flag is 0 between launches (each flag has one reader, which lowers it; the last of down's
// CTAs lowers the counters).
// Plan entries are read one item ahead by every role. 384 threads: two consumer warpgroups
// (warps 0-7) and a producer warpgroup whose warp 8 works (warps 9-11 leave at once). Per
// 128-wide K step the producer fills one of STAGES ring stages:
//   - weights, 256 rows x 128 B by four TMA boxes of 64 rows (128-byte swizzle), completing on
//     the stage's full mbarrier by bytes. Consumer warpgroup h takes rows 128h..128h+127; in
//     gate_up those are gate columns 64h..64h+63 of the group, then the same up columns, so a
//     thread holds each column's gate and up sums side by side;
//   - gate_up: the block's 64 x rows (by token), gathered with 16-byte cp.async into the same
//     swizzled layout, eight lanes a 128-byte row (each sector read once), zero for padding slots,
//     and their 64 row scales (0 for padding); down: the block's a tile and its 64 row scales, one
//     bulk copy each, completing on the stage's full barrier by bytes like the boxes;
//   - the two weight-block scales. Each lane's cp.async copies arrive on the stage's
//     full barrier as they land (cp.async.mbarrier.arrive.noinc): the producer never waits on its
//     own copies, only on the empty barriers, so it runs up to STAGES steps ahead; the consumers'
//     proxy fence after their wait hands the copies to wgmma.
// Each consumer warpgroup runs four m64n128k32 wgmma a stage into a fresh accumulator, waits,
// and folds it into the FP32 accumulator times weight scale x row scale (block-scale promotion:
// a tensor-core FP8 sum never runs past one 128-wide scale block).
//
// Epilogues. gate_up: SwiGLU in registers, the row's amax over the 128 columns of the group
// (a quad shuffle, then the other warpgroup's half through shared memory), scale =
// max(amax / 448, 1e-10), e4m3 codes by cvt.rn.satfinite, stored per real slot (the oracle's
// rule). down: acc x route weight to BF16 pairs, staged per warpgroup in shared memory, then
// 16-byte red.global.add.noftz.v4.bf16x2 into the token's output row (the combine; the sum's
// last bit depends on the order the reductions land, as in the decode kernel), issued while the
// next tile's wgmma run: a warpgroup stages tile t, and reduces it after issuing tile t + 1's.
// Where I = 128 (both families' slices) a down tile is one K step with no promotion, and down
// walks its tiles with two accumulators (consume_down_one_step): tile t + 1's wgmma also run
// while tile t is scaled and staged, not only while tile t - 1 is reduced.
//
// Blocks at or past the device-side padded total, or with an expert outside [0, E), are
// skipped by both kernels (their slots' intermediate rows are never written or read).
//
// Bytes and FLOPs per K step: 32 KB of weights (from HBM, or from L2 when another block of the
// expert reads the same tile at once) + 8 KB of activations (gathered, or one tile) + 264 B of scales, for
// 2 x 64 x 256 x 128 = 4.2 MFLOP: 2 x BLOCK_M FLOP a weight byte.

#include "sm90_common.cuh"
#include "sm90_sync.cuh"

#ifndef STAGES
#define STAGES 4
#endif

constexpr int BLOCK_M = 64;     // slots per route-plan block: wgmma's M
constexpr int BLOCK_N = 256;    // weight rows per item: 128 per consumer warpgroup (wgmma N)
constexpr int WG_N = 128;
constexpr int BLOCK_K = 128;    // K per step: one FP8 scale block, one 128-byte swizzled row
constexpr int BOX_ROWS = 64;    // rows per TMA box
constexpr int CONSUMERS = 256;  // two warpgroups
// The producer is a warpgroup of which warp 0 works: setmaxnreg is a warpgroup's, and with it
// ptxas allocates each role's registers apart (gate_up's K loop: 146 instructions and 8
// uniform-register moves a step, against 164 and 16 with one producer warp among 288 threads).
constexpr int THREADS = CONSUMERS + 128;
constexpr int PRODUCER_REGS = 88, CONSUMER_REGS = 200;
static_assert(128 * PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= 65536, "one CTA an SM");

constexpr int A_TILE = BLOCK_M * BLOCK_K;  // 8 KB
constexpr int B_TILE = BLOCK_N * BLOCK_K;  // 32 KB
constexpr int SCALES = BLOCK_M + 4;        // 64 row scales, then 2 weight scales (padded to 16 B)
constexpr int C_ROW = WG_N * 2 + 16;       // one staged BF16 output row of a warpgroup, padded
constexpr int ZERO_COPY = 4096;            // (gate_up) bytes of output zeroed by one bulk copy

// Dynamic shared memory, from a 1024-aligned base (swizzled tiles need it).
constexpr int OFF_A = 0;
constexpr int OFF_B = OFF_A + STAGES * A_TILE;
constexpr int OFF_S = OFF_B + STAGES * B_TILE;
constexpr int OFF_AMAX = OFF_S + STAGES * SCALES * 4;      // [2 item parities][2 warpgroups][64 rows]
constexpr int OFF_C = OFF_AMAX + 2 * 2 * BLOCK_M * 4;      // [2 warpgroups][64 rows][C_ROW]
constexpr int OFF_ROWS = OFF_C + 2 * BLOCK_M * C_ROW;     // (down) [2 warpgroups][2 item parities][64] token rows
constexpr int OFF_BAR = OFF_ROWS + 2 * 2 * BLOCK_M * 4;
constexpr int SMEM_USED = OFF_BAR + 2 * STAGES * 8;
static_assert(ZERO_COPY <= 2 * BLOCK_M * C_ROW, "gate_up's zero source lies in down's staging space");
constexpr int SMEM_BYTES = SMEM_USED + 1024;  // what the host must pass (alignment slack)
static_assert(SMEM_BYTES <= 227 * 1024, "STAGES too deep for one CTA an SM");

__device__ __forceinline__ uint32_t dynamic_smem_size() {
  uint32_t v;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}

// __expf and __fdividef, as the decode kernel: no IEEE division slow path. For v below about
// -88, __expf(-v) is inf and the quotient 0, silu's limit.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// out[0..7] += v: one 16-byte v4.bf16x2 reduction in L2 (out 16-byte aligned).
__device__ __forceinline__ void red_add_bf16x8(uint16_t* out, uint4 v) {
  asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};"
               :: "l"(out), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Spins until *p >= target; every lane that calls it reads the value with acquire semantics.
__device__ __forceinline__ void wait_at_least(const int* p, int target) {
  while (ld_acquire_gpu(p) < target) __nanosleep(128);
}

__device__ __forceinline__ bool real_slot(int slot, int num_slots) { return slot >= 0 && slot < num_slots; }

// What one kernel's items are: the plan's blocks times `tiles` weight tiles, K steps each.
struct Problem {
  // weights: TMA over [E * rows_per_expert, k_dim] FP8 (box 64 x 128), block scales
  // [E, rows_per_expert / 128, k_dim / 128]
  const TmaDescriptor* w_map;
  const float* w_scale;
  int rows_per_expert, k_dim;
  // activations. gate_up: x [rows, k_dim] FP8 and [rows, k_dim / 128] FP32, row = slot / row_div;
  // down: a and a_scale in plan order, a tile (and 64 scales) a (block, K step)
  const uint8_t* act;
  const float* act_scale;
  int row_div;
  // route plan
  const int* sorted_ids;
  const int* expert_ids;
  int num_slots, num_experts, blocks, tiles;
  // how an item's work is cut (the host picks both from the plan's size, fused_prefill.split_work):
  // gate_up runs a (block, group) as `splits` K ranges, chained through `part` (FP32 partial sums,
  // 64 floats a consumer thread) and `flags` (one a (block, group), 0 between launches); down runs
  // a block's tiles in chunks of `chunk`
  int splits, chunk;
  float* part;
  int* flags;
  // (gate_up) the output down reduce-adds into, zeroed by this launch when not null: `zero_bytes`
  // from `zero_out`, a stripe a CTA
  uint8_t* zero_out;
  long long zero_bytes;
  // The overlap (`sync` not null): down is launched as gate_up's programmatic dependent and runs
  // while gate_up's last round does (its grid leaves those CTAs' SMs to them). Plan blocks whose
  // gate_up items all lie before that round are "early", the last `late_blocks` "late". sync[0]
  // counts what down waits for at its start: each early (block, group) done, and (with the
  // zeroing) each gate_up CTA's stripe zeroed; sync[1] counts down's CTAs past that wait, the last
  // of which lowers both to 0; sync[2 + l * down_chunks + c] counts the groups done of late block
  // l, read and lowered to 0 by down's one item (late block l, chunk c).
  int* sync;
  int gu_grid, gu_per_block, groups, down_chunks, zero_ctas;
  int late;  // late_blocks(), 0 without the overlap (set at the kernel's entry)
};

// How many of the plan's last blocks have a gate_up item in the grid's last round (the late
// blocks): items run block fastest, so the last round's L = items % grid items are those of the
// last min(L, blocks) blocks. None when that round is full or the only one.
__device__ __forceinline__ int late_blocks(const Problem& p) {
  const int items = p.blocks * p.gu_per_block;
  const int last = items % p.gu_grid;
  return items <= p.gu_grid || last == 0 ? 0 : min(last, p.blocks);
}

// What one item covers: its plan block, tiles [tile0, tile1), K steps [kb0, kb1), and (gate_up)
// its K range's place in the chain. Items run block fastest, then tile (or chunk), then split, so
// split s of a (block, group) always has a larger item number than split s - 1: a CTA that waits
// for a smaller item number never waits in a cycle (every CTA of the persistent grid is resident
// and walks its items in increasing order).
struct Span {
  int block, tile0, tile1, kb0, kb1, split;
};

// Items: gate_up's are (block, group), block fastest, one tile each; down's are blocks, each
// streaming all of its tiles (so the plan reads of an item are amortized over K/256 tiles).
template <bool GATE_UP>
__device__ __forceinline__ int num_items(const Problem& p) {
  return GATE_UP ? p.blocks * p.tiles * p.splits : p.blocks * ((p.tiles + p.chunk - 1) / p.chunk);
}

// An item's plan block and its r (gate_up: group + tiles x split; down: chunk). down's order under
// the overlap: every chunk of the early blocks (block fastest), then the late blocks' (block
// fastest), so the items that wait for gate_up's last round come last; without it, late = 0.
template <bool GATE_UP, bool OV>
__device__ __forceinline__ int2 item_place(const Problem& p, int item) {
  if (GATE_UP || !OV || p.late == 0) return make_int2(item % p.blocks, item / p.blocks);
  const int early = p.blocks - p.late, n_early = early * ((p.tiles + p.chunk - 1) / p.chunk);
  if (item < n_early) return make_int2(item % early, item / early);
  return make_int2(early + (item - n_early) % p.late, (item - n_early) / p.late);
}

template <bool GATE_UP, bool OV>
__device__ __forceinline__ Span item_span(const Problem& p, int item) {
  const int k_steps = p.k_dim / BLOCK_K;
  const int2 br = item_place<GATE_UP, OV>(p, item);
  const int block = br.x, r = br.y;
  if (GATE_UP) {
    const int tile = r % p.tiles, split = r / p.tiles;
    return Span{block, tile, tile + 1, split * k_steps / p.splits, (split + 1) * k_steps / p.splits, split};
  }
  return Span{block, r * p.chunk, min(p.tiles, (r + 1) * p.chunk), 0, k_steps, 0};
}

// First weight row (within the expert) of TMA box `i` (0..3) of tile `tile`: gate_up boxes are
// gate 0-63, up 0-63, gate 64-127, up 64-127 of the group; down boxes are consecutive rows.
__device__ __forceinline__ int box_row(bool gate_up, int tile, int i, int inter) {
  return gate_up ? (i & 1) * inter + tile * 128 + (i >> 1) * 64 : tile * BLOCK_N + i * BOX_ROWS;
}

// ---------------------------------------------------------------------------------- producer

template <bool GATE_UP, bool OV>
__device__ __forceinline__ void produce(const Problem& p, uint8_t* smem, uint64_t* full, uint64_t* empty) {
  const int lane = threadIdx.x % 32;
  const int k_steps = p.k_dim / BLOCK_K;
  const int items = num_items<GATE_UP>(p);
  const int scale_rows = p.rows_per_expert / 128;
  if (lane == 0) tma_prefetch_descriptor(p.w_map);
  // An item's plan entries (its expert, this lane's rows `lane` and `lane + 32`) are read one
  // item ahead, so their latency hides behind the current item's stream.
  int item = blockIdx.x, expert = -1, slot_lo = -1, slot_hi = -1;
  if (item < items) {
    const int b = item_place<GATE_UP, OV>(p, item).x;
    expert = p.expert_ids[b];
    slot_lo = p.sorted_ids[b * BLOCK_M + lane];
    slot_hi = p.sorted_ids[b * BLOCK_M + lane + 32];
  }
  // gate_up zeroes the output for down: this CTA's stripe [zero, zero_end), 16-byte aligned, by
  // bulk copies of ZERO_COPY zeroed bytes of down's staging space (unused here), one a K step
  // after the step's loads, the rest after the last item; lane 0 issues them
  // Under the overlap the stripe is done before the CTA's last item (copies enough a step) and
  // counted in sync[0] at that item's first step: down, beside that item, waits for every stripe.
  long long zero = 0, zero_end = 0;
  int zero_per_step = 1;
  bool zero_count = false;  // the stripe is yet to be counted
  if (GATE_UP && p.zero_out != nullptr) {
    const long long per = (p.zero_bytes / 16 + gridDim.x - 1) / gridDim.x * 16;
    zero = min(p.zero_bytes, blockIdx.x * per);
    zero_end = min(p.zero_bytes, zero + per);
    uint4* src = reinterpret_cast<uint4*>(smem + OFF_C);
    for (int i = lane; i < ZERO_COPY / 16; i += 32) src[i] = make_uint4(0u, 0u, 0u, 0u);
    fence_proxy_async_smem();  // this lane's zeros -> the bulk copies (async proxy)
    __syncwarp();
    if (OV) {
      const int mine = items > int(blockIdx.x) ? (items - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
      const long long before_last = static_cast<long long>(max(mine - 1, 0)) * (k_steps / p.splits);
      const long long copies = (zero_end - zero + ZERO_COPY - 1) / ZERO_COPY;
      if (before_last > 0) zero_per_step = int(max(1ll, (copies + before_last - 1) / before_last));
      zero_count = true;
    }
  }
  auto zero_some = [&]() {
    const int bytes = int(min(static_cast<long long>(ZERO_COPY), zero_end - zero));
    bulk_store(p.zero_out + zero, smem + OFF_C, bytes);
    zero += bytes;
  };
  auto zero_finish = [&]() {  // lane 0: the rest of the stripe, its copies' end, then its count
    while (zero < zero_end) zero_some();
    bulk_wait_all();
    fence_proxy_async_global();  // the copies' writes -> the release
    __threadfence();
    red_release_add_gpu(p.sync, 1);
    zero_count = false;
  };
  // down under the overlap: every early (block, group) done and every stripe of the output zeroed
  // before this CTA gathers anything (its consumers reduce only after its stages' arrivals); the
  // last CTA past this wait lowers the counters at its end
  int passes = -1;
  if (!GATE_UP && OV) {
    wait_at_least(p.sync, (p.blocks - p.late) * p.groups + p.zero_ctas);
    fence_proxy_async_global();  // what gate_up stored (generic proxy) -> this CTA's bulk copies of it
    if (lane == 0) passes = atomicAdd(p.sync + 1, 1);
  }
  int step = 0;
  while (item < items) {
    const Span sp = item_span<GATE_UP, OV>(p, item);
    const int next = item + gridDim.x;
    int next_expert = -1, next_lo = -1, next_hi = -1;
    if (next < items) {
      const int b = item_place<GATE_UP, OV>(p, next).x;
      next_expert = p.expert_ids[b];
      next_lo = p.sorted_ids[b * BLOCK_M + lane];
      next_hi = p.sorted_ids[b * BLOCK_M + lane + 32];
    }
    if (expert >= 0 && expert < p.num_experts) {
      if (!GATE_UP && OV && p.late > 0 && sp.block >= p.blocks - p.late) {
        // a late block: its chunk's flag, raised once a group by gate_up's last round, then lowered
        // (by lane 0 once every lane has read it) for the next launch
        int* flag = p.sync + 2 + (sp.block - (p.blocks - p.late)) * p.down_chunks + sp.tile0 / p.chunk;
        wait_at_least(flag, p.groups);
        fence_proxy_async_global();
        __syncwarp();
        if (lane == 0) *flag = 0;
      }
      const bool real_lo = real_slot(slot_lo, p.num_slots), real_hi = real_slot(slot_hi, p.num_slots);
      // (down) the block's rows up to its last real one, all its tile copies carry: a plan pads an
      // expert's last block at its end, so the padding rows' bytes are not read (their stage rows
      // keep whatever they held; a padding row's output is never reduced)
      int tile_rows = 0;
      if (!GATE_UP) {
        const uint32_t lo = __ballot_sync(~0u, real_lo), hi = __ballot_sync(~0u, real_hi);
        tile_rows = hi ? 64 - __clz(hi) : 32 - __clz(lo);
      }
      const uint32_t a_bytes = tile_rows * BLOCK_K, s_bytes = ((tile_rows + 3) & ~3) * 4;
      const uint32_t row_lo = real_lo ? uint32_t(slot_lo / p.row_div) : 0u, row_hi = real_hi ? uint32_t(slot_hi / p.row_div) : 0u;
      const float* const ssrc[2] = {p.act_scale + size_t(row_lo) * k_steps, p.act_scale + size_t(row_hi) * k_steps};
      const uint32_t bytes[2] = {real_lo ? 4u : 0u, real_hi ? 4u : 0u};
      // The gathers by whole rows: lane l copies 16-byte chunk l % 8 of rows 4i + l / 8 (i < 16), so
      // one copy instruction reads four 128-byte rows and every sector once (16 bytes a lane from 32
      // rows read each sector twice). The row offsets (below 2^31: validate_prefill) come from the
      // lanes holding rows lane and lane + 32, ~0 marking padding.
      uint32_t line_off[16], line_live = 0;
      {
        const uint32_t off_lo = real_lo ? row_lo * uint32_t(p.k_dim) : ~0u;
        const uint32_t off_hi = real_hi ? row_hi * uint32_t(p.k_dim) : ~0u;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint32_t o = __shfl_sync(0xffffffffu, i < 8 ? off_lo : off_hi, (4 * i + (lane >> 3)) & 31);
          line_off[i] = o == ~0u ? 0u : o;
          line_live |= uint32_t(o != ~0u) << i;
        }
      }
      const float* ws = p.w_scale + size_t(expert) * scale_rows * k_steps;
      for (int tile = sp.tile0; tile < sp.tile1; ++tile) {
        // the two weight-block scales of this tile: (gate, up) of group `tile`, or the tile's two
        // 128-row blocks (the second clamped inside the expert where K is no multiple of 256)
        const int sb0 = GATE_UP ? tile : min(2 * tile, scale_rows - 1);
        const int sb1 = GATE_UP ? scale_rows / 2 + tile : min(2 * tile + 1, scale_rows - 1);
        for (int kb = sp.kb0; kb < sp.kb1; ++kb, ++step) {
          const int s = step % STAGES;
          if (step >= STAGES) mbar_wait(&empty[s], ((step / STAGES) - 1) & 1);
          uint8_t* a_stage = smem + OFF_A + s * A_TILE;
          uint8_t* b_stage = smem + OFF_B + s * B_TILE;
          float* sc = reinterpret_cast<float*>(smem + OFF_S) + s * SCALES;
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[s], GATE_UP ? B_TILE : B_TILE + a_bytes + s_bytes);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              tma_load_2d(b_stage + i * BOX_ROWS * BLOCK_K, p.w_map, &full[s], kb * BLOCK_K,
                          expert * p.rows_per_expert + box_row(GATE_UP, tile, i, p.rows_per_expert / 2));
            cp_async_4(&sc[BLOCK_M], ws + sb0 * k_steps + kb, 4);
            cp_async_4(&sc[BLOCK_M + 1], ws + sb1 * k_steps + kb, 4);
            if (!GATE_UP && tile_rows > 0) {  // the (block, K step) tile of a and its row scales, in plan order
              const size_t t = size_t(sp.block) * k_steps + kb;
              bulk_load(a_stage, p.act + t * A_TILE, a_bytes, &full[s]);
              bulk_load(sc, p.act_scale + t * BLOCK_M, s_bytes, &full[s]);
            }
            if (GATE_UP && !OV && zero < zero_end) zero_some();
            for (int z = 0; GATE_UP && OV && z < zero_per_step && zero < zero_end; ++z) zero_some();
            if (GATE_UP && OV && zero_count && next >= items) zero_finish();  // the last item's first step
          }
          if (GATE_UP) {
            const int c = lane & 7;
#pragma unroll
            for (int i = 0; i < 16; ++i) {  // 128-byte swizzle: 16-byte chunk c of row t at chunk c ^ (t % 8)
              const int t = 4 * i + (lane >> 3);
              cp_async_16(a_stage + t * 128 + ((c ^ (t & 7)) << 4), p.act + line_off[i] + kb * BLOCK_K + c * 16,
                          (line_live >> i) & 1u ? 16u : 0u);
            }
            cp_async_4(&sc[lane], ssrc[0] + kb, bytes[0]);  // the row scales of rows lane and lane + 32
            cp_async_4(&sc[lane + 32], ssrc[1] + kb, bytes[1]);
          }
          // this lane's arrival on the stage, once its copies have landed (one of the barrier's 32 + 1)
          cp_async_arrive_noinc(&full[s]);
        }
      }
    }
    item = next, expert = next_expert, slot_lo = next_lo, slot_hi = next_hi;
  }
  cp_async_wait_all();
  if (GATE_UP && OV && lane == 0 && zero_count) {
    zero_finish();
  } else if (GATE_UP && lane == 0 && zero_end > 0) {
    while (zero < zero_end) zero_some();
    bulk_wait_all();  // the copies have read their source and written the output before the CTA ends
  }
  if (!GATE_UP && OV && lane == 0 && passes == int(gridDim.x) - 1) {
    p.sync[0] = 0;
    p.sync[1] = 0;
  }
}

// ---------------------------------------------------------------------------------- consumers

// What a consumer thread reads of an item's plan entries one item ahead: the expert and the
// slots of its two accumulator rows.
struct ItemMeta {
  int expert, slot0, slot1;
};

template <bool GATE_UP, bool OV>
__device__ __forceinline__ ItemMeta load_meta(const Problem& p, int item, int r0) {
  const int block = item_place<GATE_UP, OV>(p, item).x;
  return ItemMeta{p.expert_ids[block], p.sorted_ids[block * BLOCK_M + r0], p.sorted_ids[block * BLOCK_M + r0 + 8]};
}

// down's token-row table of warpgroup `wg` for items of parity `parity`: row r of the block at
// (r % 8) * 8 + r / 8, so that a reducing thread's 8 rows (tid / 16 + 8i) are contiguous
__device__ __forceinline__ int* row_table(uint8_t* smem, int wg, int parity) {
  return reinterpret_cast<int*>(smem + OFF_ROWS) + (wg * 2 + parity) * BLOCK_M;
}

// down: reduce-add the warpgroup's staged tile into output columns n0.., 8 rows a thread (tid / 16
// + 8i; `rows` their token rows, < 0 for padding) and 8 columns (tid % 16)
__device__ __forceinline__ void reduce_staged(const uint8_t* c_tile, const int* rows, int tid, uint16_t* out,
                                              int out_cols, int n0) {
  const int c8 = tid % 16;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (rows[i] < 0) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(c_tile + (tid / 16 + 8 * i) * C_ROW + c8 * 16);
    red_add_bf16x8(out + size_t(rows[i]) * out_cols + n0 + 8 * c8, v);
  }
}

// A consumer warpgroup's K step `step`: wait for its stage, then the stage's four wgmma into d (fresh
// sums), committed as one batch; the caller waits for it.
__device__ __forceinline__ void issue_step(uint8_t* smem, uint64_t* full, int step, int wg, float* d) {
  const int s = step % STAGES;
  mbar_wait(&full[s], (step / STAGES) & 1);
  fence_proxy_async_smem();  // cp.async (generic proxy) results -> wgmma (async proxy)
  const uint64_t a_desc = wgmma_desc_sw128(smem + OFF_A + s * A_TILE);
  const uint64_t b_desc = wgmma_desc_sw128(smem + OFF_B + s * B_TILE + wg * WG_N * BLOCK_K);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BLOCK_K / 32; ++kk)  // +32 bytes of K = +2 in the descriptor's 16-byte units
    Wgmma<128>::mma(d, a_desc + 2 * kk, b_desc + 2 * kk, kk > 0);
  wgmma_commit();
}

template <bool GATE_UP, bool OV>
__device__ __forceinline__ void consume(const Problem& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                        // gate_up's outputs
                                        uint8_t* __restrict__ a_out, float* __restrict__ a_scale_out,
                                        // down's
                                        const float* __restrict__ route_w, uint16_t* __restrict__ out,
                                        int top_k) {
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int w = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int r0 = 16 * w + g, r1 = r0 + 8;  // this thread's two rows of the block
  const int items = num_items<GATE_UP>(p);
  float acc[64], part[64];
  int step = 0, parity = 0;
  // (down) the staged tile not yet reduced: its first output column (-1: none) and its item's
  // row-table parity; the parity of the item being run
  int pend_n0 = -1, pend_par = 0, row_par = 0;
  // gate_up under the overlap: a (block, group) is done (its codes and scales stored, or nothing to
  // store: an expert outside the range), for down: the count of early ones, or the late block's flags
  auto item_done = [&](int block) {
    named_barrier(5, CONSUMERS);  // every thread's codes and scales are stored
    const int early = p.blocks - p.late;
    if (block < early) {
      if (threadIdx.x == 0) {
        __threadfence();
        red_release_add_gpu(p.sync, 1);
      }
    } else {
      for (int c = threadIdx.x; c < p.down_chunks; c += CONSUMERS) {
        __threadfence();
        red_release_add_gpu(p.sync + 2 + (block - early) * p.down_chunks + c, 1);
      }
    }
  };
  int item = blockIdx.x;
  ItemMeta meta;
  if (item < items) meta = load_meta<GATE_UP, OV>(p, item, r0);
  while (item < items) {
    const Span sp = item_span<GATE_UP, OV>(p, item);
    const int next = item + gridDim.x;
    const ItemMeta m = meta;
    const int block = sp.block;
    if (next < items) meta = load_meta<GATE_UP, OV>(p, next, r0);  // one item ahead
    item = next;
    if (m.expert < 0 || m.expert >= p.num_experts) {
      // (down skips the block too: counted if early, its flags left down if late)
      if (GATE_UP && OV && sp.split == p.splits - 1 && block < p.blocks - p.late) item_done(block);
      continue;
    }
    const bool real0 = real_slot(m.slot0, p.num_slots), real1 = real_slot(m.slot1, p.num_slots);
    const float rw0 = !GATE_UP && real0 ? route_w[m.slot0] : 0.f;
    const float rw1 = !GATE_UP && real1 ? route_w[m.slot1] : 0.f;
    if (!GATE_UP) {
      // the item's token rows into the warpgroup's table of the other parity (the tile pending
      // reduction may still read this item's predecessor's); the staging barrier publishes them
      row_par ^= 1;
      if (tid < BLOCK_M) {
        const int sl = p.sorted_ids[block * BLOCK_M + tid];
        row_table(smem, wg, row_par)[(tid % 8) * 8 + tid / 8] = real_slot(sl, p.num_slots) ? sl / top_k : -1;
      }
    }
    for (int tile = sp.tile0; tile < sp.tile1; ++tile) {
      // One K step. The first is peeled: it sets the sums rather than adding to zeros, so nothing
      // of the tile before is held live while its wgmma run (and down reduces that tile then).
      auto k_step = [&](const int kb, const bool first) {
        const int s = step % STAGES;
        issue_step(smem, full, step, wg, part);
        if (!GATE_UP && first && pend_n0 >= 0) {
          // down: the tile staged before, reduced into the output while this one's wgmma run
          reduce_staged(smem + OFF_C + wg * BLOCK_M * C_ROW, row_table(smem, wg, pend_par) + (tid / 16) * 8, tid,
                        out, p.rows_per_expert, pend_n0);
          named_barrier(2 + wg, 128);  // its readers are done before this tile's staging
          pend_n0 = -1;
        }
        wgmma_wait<0>();
        const float* sc = reinterpret_cast<const float*>(smem + OFF_S) + s * SCALES;
        const float t0 = sc[r0], t1 = sc[r1];
        const float wlo = GATE_UP ? sc[BLOCK_M] : sc[BLOCK_M + wg];
        const float whi = GATE_UP ? sc[BLOCK_M + 1] : wlo;
        mbar_arrive(&empty[s]);  // this thread's reads of stage s are done (every reader arrives)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float ws = j < 8 ? wlo : whi;  // gate_up: columns 0-63 gate, 64-127 up
          acc[4 * j + 0] = (first ? 0.f : acc[4 * j + 0]) + part[4 * j + 0] * (ws * t0);
          acc[4 * j + 1] = (first ? 0.f : acc[4 * j + 1]) + part[4 * j + 1] * (ws * t0);
          acc[4 * j + 2] = (first ? 0.f : acc[4 * j + 2]) + part[4 * j + 2] * (ws * t1);
          acc[4 * j + 3] = (first ? 0.f : acc[4 * j + 3]) + part[4 * j + 3] * (ws * t1);
        }
        ++step;
      };
      k_step(sp.kb0, true);
      for (int kb = sp.kb0 + 1; kb < sp.kb1; ++kb) k_step(kb, false);

      if (GATE_UP && p.splits > 1) {
        // ---------------------------------------------- the K-range chain of a (block, group)
        // Split s adds split s - 1's running sum (once its flag says s) and, unless it is the
        // last, stores the new sum and raises the flag to s + 1; the last runs the epilogue and
        // lowers the flag to 0 for the next launch. Threads whose two rows are both padding
        // neither store nor add (their rows are never written out).
        const int cell = block * p.tiles + tile;
        float4* mine = reinterpret_cast<float4*>(p.part + (size_t(cell) * CONSUMERS + threadIdx.x) * 64);
        const bool live = real0 || real1;
        if (sp.split > 0) {
          if (threadIdx.x == 0)
            while (ld_acquire_gpu(p.flags + cell) < sp.split) __nanosleep(64);
          named_barrier(4, CONSUMERS);
          if (live) {
#pragma unroll
            for (int i = 0; i < 16; ++i) {
              const float4 v = __ldcg(mine + i);
              acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
            }
          }
        }
        if (sp.split < p.splits - 1) {
          if (live) {
#pragma unroll
            for (int i = 0; i < 16; ++i) __stcg(mine + i, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
          }
          named_barrier(4, CONSUMERS);  // every store of the sum is issued before the flag's release
          if (threadIdx.x == 0) {
            __threadfence();
            st_release_gpu(p.flags + cell, sp.split + 1);
          }
          continue;
        }
        if (threadIdx.x == 0) p.flags[cell] = 0;  // every reader of this cell has passed its wait
      }
      if (GATE_UP) {
        // ---------------------------------------------- SwiGLU, per-token requant over the group
        const int inter = p.rows_per_expert / 2, groups = inter / 128;
        float* amax_buf = reinterpret_cast<float*>(smem + OFF_AMAX) + parity * 2 * BLOCK_M;
        float h[32];
        float m0 = 0.f, m1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            h[2 * j + x] = silu(acc[4 * j + x]) * acc[4 * (j + 8) + x];
            h[16 + 2 * j + x] = silu(acc[4 * j + 2 + x]) * acc[4 * (j + 8) + 2 + x];
            m0 = fmaxf(m0, fabsf(h[2 * j + x]));
            m1 = fmaxf(m1, fabsf(h[16 + 2 * j + x]));
          }
        }
#pragma unroll
        for (int d = 1; d <= 2; d <<= 1) {
          m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, d));
          m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, d));
        }
        if (q == 0) {
          amax_buf[wg * BLOCK_M + r0] = m0;
          amax_buf[wg * BLOCK_M + r1] = m1;
        }
        named_barrier(1, CONSUMERS);  // both halves of the group's amax are in
        m0 = fmaxf(m0, amax_buf[(1 - wg) * BLOCK_M + r0]);
        m1 = fmaxf(m1, amax_buf[(1 - wg) * BLOCK_M + r1]);
        const float s0 = fmaxf(__fdividef(m0, 448.0f), 1e-10f), s1 = fmaxf(__fdividef(m1, 448.0f), 1e-10f);
        // into the (block, group) tile, plan order, pre-swizzled: this thread's bytes 64 wg + 2q + 8j
        // of the row lie in 16-byte chunk 4 wg + j / 2, at byte 2q + 8 (j % 2) of it
        const size_t cell = size_t(block) * groups + tile;
        uint8_t* const t_out = a_out + cell * A_TILE;
        if (real0) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            *reinterpret_cast<uint16_t*>(t_out + r0 * 128 + (((4 * wg + j / 2) ^ (r0 & 7)) << 4) + 2 * q + 8 * (j % 2)) =
                pack_e4m3x2(__fdividef(h[2 * j], s0), __fdividef(h[2 * j + 1], s0));
          if (wg == 0 && q == 0) a_scale_out[cell * BLOCK_M + r0] = s0;
        }
        if (real1) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            *reinterpret_cast<uint16_t*>(t_out + r1 * 128 + (((4 * wg + j / 2) ^ (r1 & 7)) << 4) + 2 * q + 8 * (j % 2)) =
                pack_e4m3x2(__fdividef(h[16 + 2 * j], s1), __fdividef(h[16 + 2 * j + 1], s1));
          if (wg == 0 && q == 0) a_scale_out[cell * BLOCK_M + r1] = s1;
        }
        parity ^= 1;
        if (OV) item_done(block);
      } else {
        // ---------------------------------------------- route weight, BF16, reduce-add
        const int n0 = tile * BLOCK_N + wg * WG_N;  // this warpgroup's first output column
        uint8_t* c_tile = smem + OFF_C + wg * BLOCK_M * C_ROW;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<uint32_t*>(c_tile + r0 * C_ROW + (8 * j + 2 * q) * 2) =
              pack_bf16x2(acc[4 * j] * rw0, acc[4 * j + 1] * rw0);
          *reinterpret_cast<uint32_t*>(c_tile + r1 * C_ROW + (8 * j + 2 * q) * 2) =
              pack_bf16x2(acc[4 * j + 2] * rw1, acc[4 * j + 3] * rw1);
        }
        named_barrier(2 + wg, 128);  // the warpgroup's tile (and its item's row table) is staged
        if (n0 < p.rows_per_expert) pend_n0 = n0, pend_par = row_par;  // reduced under the next tile's wgmma
      }
    }
  }
  if (!GATE_UP && pend_n0 >= 0)  // the last tile staged
    reduce_staged(smem + OFF_C + wg * BLOCK_M * C_ROW, row_table(smem, wg, pend_par) + (tid / 16) * 8, tid, out,
                  p.rows_per_expert, pend_n0);
}

// down where I = 128 (one K step a tile, no promotion): two accumulators, so that tile t + 1's
// wgmma run while tile t is scaled, staged and the tile before it reduced. A warpgroup walks its
// CTA's items tile by tile:
//   issue t + 1 (wait its stage, four wgmma into the free accumulator), wait for all but that batch;
//   tile t: its scales, its stage released, the staged tile t - 1 reduced into the output, tile t
//   staged (its item's token rows into the table first, when it opens an item).
// One row table a warpgroup: it is rewritten only after the reductions that read it (the barrier
// between the reduce and the staging), and read only by the tile staged after it.
struct DownTile {
  int n0;          // this warpgroup's first output column
  float rw0, rw1;  // the route weights of the thread's rows r0 and r1 (0 for padding)
  bool opens;      // the first tile of its item: the table is rewritten before it is staged, from
  int row;         // (threads tid < 64) block row tid's token row, -1 for padding
};

template <bool OV>
__device__ __forceinline__ void consume_down_one_step(const Problem& p, uint8_t* smem, uint64_t* full,
                                                      uint64_t* empty, const float* __restrict__ route_w,
                                                      uint16_t* __restrict__ out, int top_k) {
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int w = tid / 32, lane = tid % 32, g = lane / 4;
  const int r0 = 16 * w + g, r1 = r0 + 8;
  const int items = num_items<false>(p);
  uint8_t* c_tile = smem + OFF_C + wg * BLOCK_M * C_ROW;
  int* rows = row_table(smem, wg, 0);
  // the walk: the item being handed out, its span and next tile; the next item's plan entries (the
  // expert, rows r0 and r1, and block row `tid` for the table), read one item ahead
  int item = int(blockIdx.x) - int(gridDim.x), tile = 0, tile1 = 0;
  ItemMeta next{-1, -1, -1};
  int next_row = -1, row = -1;
  float rw0 = 0.f, rw1 = 0.f;
  bool opens = false;
  auto fetch = [&](int it) {
    if (it >= items) return;
    next = load_meta<false, OV>(p, it, r0);
    next_row = tid < BLOCK_M ? p.sorted_ids[item_place<false, OV>(p, it).x * BLOCK_M + tid] : -1;
  };
  fetch(blockIdx.x);
  auto advance = [&](DownTile& t) -> bool {
    while (tile >= tile1) {  // the next item with an expert in range (the producer skips the others)
      item += gridDim.x;
      if (item >= items) return false;
      const ItemMeta m = next;
      const int r = next_row;
      const Span sp = item_span<false, OV>(p, item);
      fetch(item + gridDim.x);
      if (m.expert < 0 || m.expert >= p.num_experts) continue;
      tile = sp.tile0, tile1 = sp.tile1, opens = true;
      rw0 = real_slot(m.slot0, p.num_slots) ? route_w[m.slot0] : 0.f;
      rw1 = real_slot(m.slot1, p.num_slots) ? route_w[m.slot1] : 0.f;
      row = real_slot(r, p.num_slots) ? r / top_k : -1;
    }
    t = DownTile{tile * BLOCK_N + wg * WG_N, rw0, rw1, opens, row};
    ++tile, opens = false;
    return true;
  };
  auto issue = [&](float (&d)[64], int step) { issue_step(smem, full, step, wg, d); };
  int pend_n0 = -1;  // the staged tile not yet reduced: its first output column (-1: none)
  // tile `step` (its wgmma done): scaled, staged, and the tile staged before it reduced
  auto finish = [&](const float (&d)[64], const DownTile& t, int step) {
    const int s = step % STAGES;
    const float* sc = reinterpret_cast<const float*>(smem + OFF_S) + s * SCALES;
    const float ws = sc[BLOCK_M + wg];
    const float f0 = ws * sc[r0], f1 = ws * sc[r1];
    mbar_arrive(&empty[s]);  // this thread's reads of stage s are done (every reader arrives)
    if (pend_n0 >= 0) reduce_staged(c_tile, rows + (tid / 16) * 8, tid, out, p.rows_per_expert, pend_n0);
    named_barrier(2 + wg, 128);  // the staged tile and the table are read: both may be rewritten
    if (t.opens && tid < BLOCK_M) rows[(tid % 8) * 8 + tid / 8] = t.row;
    const int q = lane % 4;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<uint32_t*>(c_tile + r0 * C_ROW + (8 * j + 2 * q) * 2) =
          pack_bf16x2(d[4 * j] * f0 * t.rw0, d[4 * j + 1] * f0 * t.rw0);
      *reinterpret_cast<uint32_t*>(c_tile + r1 * C_ROW + (8 * j + 2 * q) * 2) =
          pack_bf16x2(d[4 * j + 2] * f1 * t.rw1, d[4 * j + 3] * f1 * t.rw1);
    }
    named_barrier(2 + wg, 128);  // the tile (and its table) is staged
    pend_n0 = t.n0 < p.rows_per_expert ? t.n0 : -1;
  };
  float d0[64], d1[64];
  DownTile t0, t1;
  int step = 0;
  // The loop's two halves, one an accumulator, each end in their own wait (all but the batch just
  // issued, or all at the walk's end) right before the tile is read: with one shared tail after
  // a choice of waits, ptxas serialized every wgmma, and it did again with the halves as one
  // lambda called twice, so they are written out. Whether a tile follows is the same for every
  // thread; the vote lets ptxas see that too (on a branch it cannot, it serializes them as well).
  if (__all_sync(~0u, advance(t0))) {
    issue(d0, step);
    for (;;) {
      if (!__all_sync(~0u, advance(t1))) {
        wgmma_wait<0>();
        finish(d0, t0, step);
        break;
      }
      issue(d1, step + 1);
      wgmma_wait<1>();
      finish(d0, t0, step++);
      if (!__all_sync(~0u, advance(t0))) {
        wgmma_wait<0>();
        finish(d1, t1, step);
        break;
      }
      issue(d0, step + 1);
      wgmma_wait<1>();
      finish(d1, t1, step++);
    }
  }
  if (pend_n0 >= 0) reduce_staged(c_tile, rows + (tid / 16) * 8, tid, out, p.rows_per_expert, pend_n0);
}

// ---------------------------------------------------------------------------------- kernels

template <bool GATE_UP, bool OV>
__device__ __forceinline__ void run(const Problem& p, uint8_t* a_out, float* a_scale_out, const float* route_w,
                                    uint16_t* out, int top_k) {
  extern __shared__ uint8_t smem_raw[];
  // the first 1024-aligned byte as an offset into the shared array, not through an integer: the
  // compiler then keeps the accesses it derives in the shared space (LDS/STS, not generic LD/ST)
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + OFF_BAR);
  uint64_t* empty = full + STAGES;
  if (threadIdx.x == 0) {
    if (dynamic_smem_size() < uint32_t(SMEM_BYTES)) __trap();
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 32 + 1);           // 32 producer lanes (activations landed) + the TMA expect_tx
      mbar_init(&empty[s], CONSUMERS);       // one arrival per consumer thread
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x >= CONSUMERS) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (threadIdx.x < CONSUMERS + 32) produce<GATE_UP, OV>(p, smem, full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    if (!GATE_UP && p.k_dim == BLOCK_K)
      consume_down_one_step<OV>(p, smem, full, empty, route_w, out, top_k);
    else
      consume<GATE_UP, OV>(p, smem, full, empty, a_out, a_scale_out, route_w, out, top_k);
  }
}

__device__ __forceinline__ int plan_blocks(const int* num_post_padded, int max_blocks) {
  return min((num_post_padded[0] + BLOCK_M - 1) / BLOCK_M, max_blocks);
}

// The kernels, each in two builds: apart (down launched after gate_up ends) and _overlap (down
// beside gate_up's last round; sync is then not null). The parameters of both builds are the same.
// (DESC: the descriptor's declaration, a __grid_constant__ parameter of the kernels, a reference to it
// in the bodies: its address is what the TMA loads take)
#define GATE_UP_PARAMS(DESC)                                                                              \
  DESC w1_map, const float *w1_scale, const uint8_t *x, const float *x_scale, const int *sorted_ids,      \
      const int *expert_ids, const int *num_post_padded, uint8_t *a, float *a_scale, int num_slots,       \
      int top_k, int k_dim, int n_dim, int num_experts, int max_blocks, int splits, float *part,          \
      int *flags, uint16_t *zero_out, long long zero_bytes, int *sync, int down_chunks
#define DOWN_PARAMS(DESC)                                                                                 \
  DESC w2_map, const float *w2_scale, const uint8_t *a, const float *a_scale, const int *sorted_ids,      \
      const int *expert_ids, const int *num_post_padded, const float *route_w, uint16_t *out,             \
      int num_slots, int top_k, int k_dim, int inter, int num_experts, int max_blocks, int chunk,         \
      int *sync, int gu_grid, int gu_per_block, int groups, int zero_ctas
#define KERNEL_DESC const __grid_constant__ TmaDescriptor

// GEMM1 + SwiGLU + requant: x [M, K] FP8 (scales [M, K/128]) against w1 [E * 2I, K] (gate rows
// first); writes a [slots, I] FP8 and a_scale [slots, I/128] for every real slot of a done block.
// (sync: the overlap's counters and flags; down_chunks: down's chunks a block.)
template <bool OV>
__device__ __forceinline__ void gate_up(GATE_UP_PARAMS(const TmaDescriptor&)) {
  Problem p{&w1_map, w1_scale, n_dim, k_dim, x, x_scale, top_k, sorted_ids, expert_ids,
            num_slots, num_experts, plan_blocks(num_post_padded, max_blocks), n_dim / 256,
            splits, 1, part, flags, reinterpret_cast<uint8_t*>(zero_out), zero_bytes,
            sync, int(gridDim.x), (n_dim / 256) * splits, n_dim / 256, down_chunks, 0, 0};
  if (OV) {
    p.late = late_blocks(p);
    // down (launched as this grid's programmatic dependent) may be scheduled now: it takes the SMs
    // this grid's CTAs leave, and it waits on sync for what it reads
    asm volatile("griddepcontrol.launch_dependents;");
  }
  run<true, OV>(p, a, a_scale, nullptr, nullptr, top_k);
}

// GEMM2 + combine: a [slots, I] against w2 [E * K, I]; out[slot / top_k, :K] += route_w[slot] * .
// in BF16 (out is accumulated into; gate_up zeroed it when the launch writes it). (sync: gate_up's
// counters and flags; gu_grid, gu_per_block: gate_up's grid and items a block; groups: its requant
// groups; zero_ctas: its CTAs that zero the output, 0 for none.)
template <bool OV>
__device__ __forceinline__ void down(DOWN_PARAMS(const TmaDescriptor&)) {
  const int tiles = (k_dim + BLOCK_N - 1) / BLOCK_N;
  Problem p{&w2_map, w2_scale, k_dim, inter, a, a_scale, 1, sorted_ids, expert_ids,
            num_slots, num_experts, plan_blocks(num_post_padded, max_blocks), tiles,
            1, chunk, nullptr, nullptr, nullptr, 0,
            sync, max(gu_grid, 1), max(gu_per_block, 1), groups, (tiles + chunk - 1) / chunk, zero_ctas, 0};
  if (OV) p.late = late_blocks(p);
  run<false, OV>(p, nullptr, nullptr, route_w, out, top_k);
}

#define GATE_UP_ARGS w1_map, w1_scale, x, x_scale, sorted_ids, expert_ids, num_post_padded, a, a_scale, num_slots, \
  top_k, k_dim, n_dim, num_experts, max_blocks, splits, part, flags, zero_out, zero_bytes, sync, down_chunks
#define DOWN_ARGS w2_map, w2_scale, a, a_scale, sorted_ids, expert_ids, num_post_padded, route_w, out, num_slots, \
  top_k, k_dim, inter, num_experts, max_blocks, chunk, sync, gu_grid, gu_per_block, groups, zero_ctas

extern "C" __global__ void __launch_bounds__(THREADS, 1) moebench_prefill_gate_up(GATE_UP_PARAMS(KERNEL_DESC)) {
  gate_up<false>(GATE_UP_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) moebench_prefill_gate_up_overlap(GATE_UP_PARAMS(KERNEL_DESC)) {
  gate_up<true>(GATE_UP_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) moebench_prefill_down(DOWN_PARAMS(KERNEL_DESC)) {
  down<false>(DOWN_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) moebench_prefill_down_overlap(DOWN_PARAMS(KERNEL_DESC)) {
  down<true>(DOWN_ARGS);
}
