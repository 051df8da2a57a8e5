// kernels/moe/cuda_tail_one_launch.cu: cuda_tail_one_launch, moe_tail_combine in ONE kernel for one row
// (kOneLaunchMaxRows, cuda_tail.cuh: why one; the kernel itself takes up to 8)
// (bf16; contract and byte counts: moe_tail.h). Every CTA computes the prologue of all T rows itself,
// into shared memory, then runs the dual GEMM out = round(round(un . W_up^T) + round(s . W_sd^T)) on it:
//   x [T, x_pitch] bf16 in shared memory = [ rmsnorm(u) (or u) at 0..L | situ_glu(gate, up) at L..L+SI ],
//   the prologue's math through the same helpers (cuda_tail.cuh) and the same per-thread chunks and block
//   tree for the sum of squares (SiTU is per element: its units differ), so x holds exactly the two-launch
//   workspace's bits; every CTA computes the same x. The GEMM sums in cuda_tail_mma's order (per 16-row tile: warp w takes latent_up k-blocks
//   w, w + 8, ... then shared_down k-blocks w, w + 8, ... into separate accumulators; the warps meet in
//   shared memory in order 0..7), so out equals cuda_tail_mma's out bit for bit.
//
// Grid ceil(hidden / 32), 256 threads; CTA = 32 weight rows (output columns, two m16 tiles) x T <= 8 rows
// (one n8 tile). Why these numbers (K3 TP8: L 3584, SI 768, hidden 7168; H200: 132 SMs, 64K registers and
// 228 KB shared memory per SM):
//   - Waves. cuda_tail_mma (16 rows per CTA, 448 CTAs) fits 3 CTAs per SM at its register count (as
//     built when measured: docs/perf/kernel-notes.md, moe_tail), 396 slots, so a second wave of 52 CTAs
//     (12% of the bytes) streams on 52 SMs with ~1.7 MB in flight; its measured time fits "15-16 us at
//     full rate + a latency-bound second wave". Here 224 CTAs, __launch_bounds__(256, 2) (<= 128
//     registers) and <= 89 KB of shared memory at T = 8 give 2 CTAs per SM = 264 slots: one wave, every
//     CTA streaming from the start to the end.
//   - Bytes in flight. Each warp keeps a rolling ring of kRing = 4 k-blocks in registers (4 x 32 rows x
//     64 B = 8 KB), reloading a slot as soon as its mma is issued: 64 KB per CTA, 14.7 MB for the grid,
//     against ~4-8 MB that 4.3 TB/s x 1-2 us loaded latency needs, so the ring still saturates HBM when
//     part of the grid has finished. cuda_tail_mma instead issues U = 4 k-blocks, consumes all, then
//     issues the next (the queue drains every step), and its L pass ends half empty (112 k-blocks over
//     32 per step) before a barrier and a separate SI pass of 24 over 32. Here latent_up and shared_down
//     are one stream per warp (14 + 3 k-blocks at K3), no drain between the weights.
//   - Shared memory: x T x (L + SI + 8) x 2 = 8.7 KB per row (69.8 KB at T = 8), plus a staging area
//     (raw up rows T x SI x 2 and the norm weight L x 2 or 4) that the final warp reduction (16 KB)
//     reuses: 89.2 KB at T = 8 with a bf16 norm weight. 16 rows would need 139 KB (one CTA per SM: two
//     waves of 224 CTAs), hence the kernel's capacity of 8 rows (kTileRows).
//     x rows are an odd number of 16-byte units apart, so the 8 rows of a B fragment load hit 8 different
//     bank groups (4 wavefronts per 512-byte warp load, the minimum).
//   - Re-reading the step's inputs per CTA: T x 10.2 KB from L2 (u 7 KB + gate/up 3 KB a row): 2.3 MB at
//     T = 1, 18 MB at T = 8 over 224 CTAs, all issued at once by cp.async; at T = 8 about 2 us of L2 time
//     spread over the kernel's start, while the weight ring and the L2 prefetch keep HBM busy.
// Expected from the above: T = 1 about 16-18 us for the whole tail, T = 8 about 18-21 us. Measured, T = 1
// was slower than that and T = 8 made the layer step slower than the two launches (docs/perf/kernel-notes.md,
// moe_tail): the prologue every CTA redoes costs instructions per CTA, growing with T, before the weight
// ring runs at full depth. Hence kOneLaunchMaxRows = 1 (cuda_tail.cuh).
// Where the time went (ncu warp-state sampling per SASS line, T = 1, K3 TP8; the numbers:
// docs/perf/kernel-notes.md, moe_tail): a large share of the warp time before the GEMM loop (priming, the
// wait for u/gate/up behind ~30 MB of weight requests, SiTU on 3 warps while the others sat at the
// barrier), and a GEMM loop heavy in per-item instructions (64-bit index math, predicates, zeroing),
// mostly issue-bound. Hence the full-tile form (FullLane: far fewer instructions per item; the GEMM loop
// now waits on memory), SiTU in 4-value units (192 threads) and conflict-free partial sums (partial_col),
// same bits.
//
// Programmatic dependent launch (rules: kernels/cuda_common.cuh): trigger at the top; before the wait only
// weights: threads 0..31 ask L2 for latent_up bytes [2048, 2048 + prefetch_row_bytes) of the CTA's 32 rows
// (the primed ring reads bytes 0..2047 of every row itself; pdl_prefetch_row_bytes bounds the grid to
// 16 MiB), the norm weight goes into shared memory by cp.async, and every warp loads its first kRing
// k-blocks into registers. u, gate and up are read and out written only after the wait.
#include "kernels/moe/cuda_tail.cuh"

namespace k3::kernels::moe_tail_cuda {

namespace {

constexpr int kCtaRows = 2 * kMmaRows;                       // weight rows (output columns) per CTA: two m16 tiles
constexpr int kRing = 4;                                     // k-blocks per warp in flight
constexpr int kRingRowBytes = kWarps * kRing * kKBlock * 2;  // bytes of each latent_up row the primed ring reads
constexpr int kPartialFloats = kWarps * 16 * 32;             // [warp][yr tile 0, 1 x 4 | ys tile 0, 1 x 4][lane]
constexpr int kTileRows = 8;  // rows of the one n8 tile a CTA holds (the kernel's capacity)
static_assert(kThreads == kCtaRows * kTileRows, "the epilogue gives every thread one (column, row) entry");
static_assert(kOneLaunchMaxRows <= kTileRows, "the rows served fit the n8 tile");

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem_src) : "memory");
}
// 4 bf16 of shared memory as floats (exact) and back (round to nearest even, as store_act_n's bf16
// pairs): the situ pass's 8-byte units.
__device__ __forceinline__ void load_bf16x4(const bf16* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(q.x << 16), v[1] = __uint_as_float(q.x & 0xffff0000u);
  v[2] = __uint_as_float(q.y << 16), v[3] = __uint_as_float(q.y & 0xffff0000u);
}
__device__ __forceinline__ void store_bf16x4(bf16* p, const float (&v)[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&a),
                                            *reinterpret_cast<const uint32_t*>(&b));
}
// Waits for all of this thread's cp.async copies (they are then visible to this thread; other threads
// need a barrier).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Warp `warp`'s item i: latent_up k-block warp + 8 i for i < n_up, else shared_down k-block
// warp + 8 (i - n_up) (cuda_tail_mma's k-blocks per warp, in its order).
struct Item {
  bool up;    // latent_up (else shared_down)
  int64_t k;  // this lane's first k: 32 kb + 8 q
  bool k_ok;  // k inside the weight's width (in % 8 == 0: an 8-element chunk is whole)
};
__device__ __forceinline__ Item item_at(const TailParams& p, int warp, int q, int n_up, int i) {
  Item it;
  it.up = i < n_up;
  const int64_t kb = warp + static_cast<int64_t>(kWarps) * (it.up ? i : i - n_up);
  it.k = kb * kKBlock + 8 * q;
  it.k_ok = it.k < (it.up ? p.L : p.SI);
  return it;
}

// load_weight16 when `pred`, else zeros and no memory access (the predicate sits inside the asm, so the
// compiler cannot turn the load into an unconditional one).
__device__ __forceinline__ uint4 load_weight16_if(const bf16* p, bool pred) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      "}\n"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

// Lane (g, q)'s 16 bytes of item i for weight rows r0 + g + 8h, h = 0..3 (tile 0 lo, hi; tile 1 lo, hi);
// zeros, without a load, past the item list, the width or hidden.
__device__ __forceinline__ void load_item(const TailParams& p, int64_t r0, int warp, int g, int q, int n_up,
                                          int n_items, int i, uint4 (&w)[4]) {
  const Item it = item_at(p, warp, q, n_up, i);
  const bool ok = i < n_items && it.k_ok;
  const bool sd = ok && !it.up;  // pointers stay inside latent_up when nothing is loaded
  const bf16* base = static_cast<const bf16*>(sd ? p.w_sd : p.w_up) + (ok ? it.k : 0);
  const int64_t ld = sd ? p.w_sd_ld : p.w_up_ld;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int64_t row = r0 + g + 8 * h;
    const bool use = ok && row < p.hidden;
    w[h] = load_weight16_if(base + (use ? row : 0) * ld, use);
  }
}

// The full-tile form (FULL, one_launch_full): every item of every warp is a whole k-block inside its
// weight and all 32 weight rows of every CTA exist (hidden % 32 == 0, L and SI multiples of kWarps
// k-blocks = 256; K3 TP8: 7168, 3584, 768). Then a lane's item j of a weight sits j * 256 elements after
// its item 0, and its rows g + 8h h * 8 rows after row g: plain loads from 2 lane pointers, no
// predicates, no zeroing, no 64-bit index math per item (ncu, H200: with the general item the GEMM loop
// was most of the kernel's instructions and mostly issue-bound; docs/perf/kernel-notes.md, moe_tail).
// The same bytes reach the same ring slots and the same mma calls as load_item's.
struct FullLane {
  const bf16* up;      // latent_up row r0 + g at k = 32 warp + 8 q (item 0)
  const bf16* sd;      // shared_down likewise (latent_up's when there are no shared experts: unused)
  int64_t up_h, sd_h;  // 8 rows, in elements
};
constexpr int64_t kItemStride = int64_t{kWarps} * kKBlock;  // elements from a warp's item to its next
__device__ __forceinline__ void load_item_full(const FullLane& f, int n_up, int n_items, int i, uint4 (&w)[4]) {
  if (i >= n_items) return;  // warp-uniform; a slot past the list is never read again
  const bool up = i < n_up;
  const bf16* base = up ? f.up + i * kItemStride : f.sd + (i - n_up) * kItemStride;
  const int64_t hs = up ? f.up_h : f.sd_h;
#pragma unroll
  for (int h = 0; h < 4; ++h) w[h] = load_weight16(base + h * hs);
}

// Whether every CTA's items are full tiles (the FULL form's condition, above).
bool one_launch_full(const TailParams& p) {
  const int64_t span = int64_t{kWarps} * kKBlock;
  return p.hidden % kCtaRows == 0 && p.L % span == 0 && (!p.shared || p.SI % span == 0);
}

// Shared memory (dynamic): x [T][x_pitch] bf16, then the staging area at T * x_pitch * 2 bytes: raw up rows
// [T][SI] bf16 (shared) and the norm weight [L] (use_norm), reused after the GEMM loop as the warps'
// partial sums [kWarps][16][32] f32.
template <bool FULL>
__global__ void __launch_bounds__(kThreads, 2) tail_one_launch_kernel(TailParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red[kTileRows][kWarps];
  const int T = static_cast<int>(p.T);
  const int64_t P = p.x_pitch;
  bf16* xs = reinterpret_cast<bf16*>(smem);
  uint8_t* stage = smem + p.T * P * 2;
  bf16* up_s = reinterpret_cast<bf16*>(stage);
  uint8_t* norm_s = stage + (p.shared ? p.T * p.SI * 2 : 0);
  float* partial = reinterpret_cast<float*>(stage);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kCtaRows;
  const int64_t c0 = threadIdx.x * int64_t{8};  // this thread's prologue chunks: c0 + 2048 j
  constexpr int64_t kChunkStride = kThreads * int64_t{8};
  const int kb_up = static_cast<int>((p.L + kKBlock - 1) / kKBlock);
  const int kb_sd = p.shared ? static_cast<int>((p.SI + kKBlock - 1) / kKBlock) : 0;
  const int n_up = warp < kb_up ? (kb_up - warp + kWarps - 1) / kWarps : 0;
  const int n_items = n_up + (warp < kb_sd ? (kb_sd - warp + kWarps - 1) / kWarps : 0);

  // ---- before the wait: weights only
  pdl_launch_dependents();
  if (threadIdx.x < kCtaRows && r0 + threadIdx.x < p.hidden) {
    const int64_t row_bytes = p.L * 2, first = row_bytes < kRingRowBytes ? row_bytes : kRingRowBytes;
    const int64_t bytes = p.prefetch_row_bytes < row_bytes - first ? int64_t{p.prefetch_row_bytes} : row_bytes - first;
    if (bytes > 0)
      prefetch_l2_within(static_cast<const bf16*>(p.w_up) + (r0 + threadIdx.x) * p.w_up_ld + first / 2,
                         static_cast<uint64_t>(bytes));
  }
  if (p.use_norm) {  // this thread's chunks of the norm weight (bf16: 16 bytes, f32: 32 bytes each)
    const int64_t esize = p.norm_w_bf16 ? 2 : 4;
    for (int64_t c = c0; c < p.L; c += kChunkStride)
      for (int64_t b = 0; b < 8 * esize; b += 16)
        cp_async16(norm_s + c * esize + b, static_cast<const uint8_t*>(p.norm_w) + c * esize + b);
  }
  FullLane fl{};
  if constexpr (FULL) {
    const int64_t k0 = warp * kKBlock + 8 * q;
    fl.up = static_cast<const bf16*>(p.w_up) + (r0 + g) * p.w_up_ld + k0;
    fl.sd = p.shared ? static_cast<const bf16*>(p.w_sd) + (r0 + g) * p.w_sd_ld + k0 : fl.up;
    fl.up_h = 8 * p.w_up_ld, fl.sd_h = 8 * p.w_sd_ld;
  }
  uint4 ring[kRing][4];
#pragma unroll
  for (int s = 0; s < kRing; ++s) {
    if constexpr (FULL) {
#pragma unroll
      for (int h = 0; h < 4; ++h) ring[s][h] = make_uint4(0u, 0u, 0u, 0u);
      load_item_full(fl, n_up, n_items, s, ring[s]);
    } else {
      load_item(p, r0, warp, g, q, n_up, n_items, s, ring[s]);
    }
  }
  pdl_wait();

  // ---- the prologue into shared memory. Each thread copies and later reads only its own pieces, so its
  // own wait suffices until the barrier: u in the prologue kernel's chunks (c0 + 2048 j of every row: the
  // sum of squares' order), gate and up in 4-value units c4 + 1024 j. situ_glu is per element, so its
  // units may be any; 4-value units spread its tanh/exp work over 192 threads at SI = 768 instead of 96
  // (ncu, H200: the warps waited at the barrier below for the 3 warps doing all of SiTU).
  const int64_t c4 = threadIdx.x * int64_t{4};
  constexpr int64_t kUnitStride = kThreads * int64_t{4};
  for (int t = 0; t < T; ++t) {
    bf16* x = xs + t * P;
    const bf16* u = static_cast<const bf16*>(p.u) + t * p.u_ld;
    for (int64_t c = c0; c < p.L; c += kChunkStride) cp_async16(x + c, u + c);
    if (p.shared) {
      const bf16* gate = static_cast<const bf16*>(p.gate) + t * p.gate_ld;
      const bf16* up = static_cast<const bf16*>(p.up) + t * p.up_ld;
      for (int64_t c = c4; c < p.SI; c += kUnitStride) {
        cp_async8(x + p.Lp + c, gate + c);
        cp_async8(up_s + t * p.SI + c, up + c);
      }
    }
  }
  cp_async_wait_all();
  // The rows run one after another (`unroll 1` here and below: the prologue runs once per CTA, so its
  // code stays small rather than fast). bf16 storage rounds every SiTU value (store_act_n's rule).
  if (p.shared) {
#pragma unroll 1
    for (int t = 0; t < T; ++t)
#pragma unroll 1
      for (int64_t c = c4; c < p.SI; c += kUnitStride) {
        float gv[4], v[4];
        load_bf16x4(xs + t * P + p.Lp + c, gv);
        load_bf16x4(up_s + t * p.SI + c, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = situ_value(gv[i], v[i], p);
        store_bf16x4(xs + t * P + p.Lp + c, v);
      }
  }
  if (p.use_norm) {  // without it x holds u itself (the prologue's copy of bf16 u is exact)
                     // Sum of squares of each row: exactly block_sum()'s tree (each thread's chunks in order, the warp
    // butterfly, the 8 warp sums in warp order through `red`, the butterfly over them), one barrier for
    // all rows.
#pragma unroll 1
    for (int t = 0; t < T; ++t) {
      float part = 0.0f;
#pragma unroll 1
      for (int64_t c = c0; c < p.L; c += kChunkStride) {
        float v[8];
        load_act_n<8>(xs + t * P + c, v);
        add_squares<8>(part, v);
      }
      part = warp_sum(part);
      if (lane == 0) red[t][warp] = part;
    }
    __syncthreads();
#pragma unroll 1
    for (int t = 0; t < T; ++t) {
      const float inv_rms = inv_rms_of(warp_sum(lane < kWarps ? red[t][lane] : 0.0f), p);
#pragma unroll 1
      for (int64_t c = c0; c < p.L; c += kChunkStride) {
        float v[8], w[8];
        load_act_n<8>(xs + t * P + c, v);
        load_vec_n<8>(norm_s, p.norm_w_bf16, c, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = norm_value(v[i], w[i], inv_rms, p);
        store_act_n<8>(xs + t * P + c, v, p.round);
      }
    }
  }
  __syncthreads();  // x complete; the staging area is free from here on

  // ---- the dual GEMM: consume ring slot s (item i), then refill it with item i + kRing.
  float acc_up[2][4], acc_sd[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_up[j][e] = acc_sd[j][e] = 0.0f;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const bf16* x_row = xs + (g < T ? g : 0) * P;  // rows past T are zero columns of the n8 tile
  for (int i0 = 0; i0 < n_items; i0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int i = i0 + s;
      if (i >= n_items) break;  // warp-uniform
      Item it{};
      uint4 xv;
      if constexpr (FULL) {  // k inside the width by the FULL condition
        it.up = i < n_up;
        const int64_t k = (warp + kWarps * (it.up ? i : i - n_up)) * int64_t{kKBlock} + 8 * q;
        const uint4 xq = *reinterpret_cast<const uint4*>(x_row + (it.up ? 0 : p.Lp) + k);
        xv = g < T ? xq : zero;
      } else {
        it = item_at(p, warp, q, n_up, i);
        const uint4 xq = *reinterpret_cast<const uint4*>(x_row + (it.up ? 0 : p.Lp) + (it.k_ok ? it.k : 0));
        xv = g < T && it.k_ok ? xq : zero;
      }
      if (it.up) {
        mma_kblock(acc_up[0], ring[s][0], ring[s][1], xv);
        mma_kblock(acc_up[1], ring[s][2], ring[s][3], xv);
      } else {
        mma_kblock(acc_sd[0], ring[s][0], ring[s][1], xv);
        mma_kblock(acc_sd[1], ring[s][2], ring[s][3], xv);
      }
      if constexpr (FULL) load_item_full(fl, n_up, n_items, i + kRing, ring[s]);
      else load_item(p, r0, warp, g, q, n_up, n_items, i + kRing, ring[s]);
    }
  }

  // ---- the warps' partial sums meet in warp order 0..7; thread = (column r0 + rl, row tl).
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    partial[(warp * 16 + v) * 32 + partial_col(v, lane)] = acc_up[v >> 2][v & 3];
    partial[(warp * 16 + 8 + v) * 32 + partial_col(8 + v, lane)] = acc_sd[v >> 2][v & 3];
  }
  __syncthreads();
  const int rl = threadIdx.x & 31, tl = threadIdx.x >> 5;
  // Entry (weight row r16 of tile rl / 16, token tl) sits at lane (r16 % 8) * 4 + tl / 2, element
  // (r16 / 8) * 2 + tl % 2 of the c fragment (cuda_tail_mma's reduce_warps map).
  const int r16 = rl & 15;
  // Rows v (latent_up) and 8 + v (shared_down) of a warp's 16 take the same partial_col swizzle.
  const int row = (rl >> 4) * 4 + (r16 >> 3) * 2 + (tl & 1);
  const int src = row * 32 + partial_col(row, (r16 & 7) * 4 + (tl >> 1));
  float yr = 0.0f, ys = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) yr += partial[w * 512 + src];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) ys += partial[w * 512 + 256 + src];
  const int64_t o = r0 + rl;
  if (tl < T && o < p.hidden) {
    // The standard rounding points: round(yr), round(ys), round(round(yr) + round(ys)) on store.
    float f = round_if(yr, p.round);
    if (p.shared) f += round_if(ys, p.round);
    static_cast<bf16*>(p.out)[tl * p.out_ld + o] = __float2bfloat16_rn(f);
  }
}

// Shared memory of one call: the x pitch (an odd number of 16-byte units, see the file comment) and bytes.
struct OneLaunchLayout {
  int64_t x_pitch = 0;
  size_t bytes = 0;
};
OneLaunchLayout one_launch_layout(const TailParams& p) {
  OneLaunchLayout l;
  int64_t units = (p.Lp + p.SI) / 8;  // L, SI % 8 == 0 (SI = 0 without shared experts)
  if (units % 2 == 0) ++units;
  l.x_pitch = units * 8;
  const int64_t staging = p.T * p.SI * 2 + (p.use_norm ? p.L * (p.norm_w_bf16 ? 2 : 4) : 0);
  const int64_t partial = int64_t{kPartialFloats} * 4;
  l.bytes = static_cast<size_t>(p.T * l.x_pitch * 2 + (staging > partial ? staging : partial));
  return l;
}

}  // namespace

core::Status one_launch_supports(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (a.u.dim(0) > kOneLaunchMaxRows)
    return core::Status::fail("more than " + std::to_string(kOneLaunchMaxRows) + " rows (got " +
                              std::to_string(a.u.dim(0)) + "): cuda_tail_mma / cuda_tail_cublaslt serve them");
  if (auto s = mma_supports(ops, a); !s) return s;  // bf16, L and SI % 8 == 0, aligned bf16 weight rows
  if (!inputs_vec8(a))
    return core::Status::fail(
        "u, shared_gate and shared_up rows and latent_norm must start at 16-byte boundaries (cp.async staging); "
        "cuda_tail_mma takes unaligned rows");
  const size_t smem = one_launch_layout(fill_params(a)).bytes;
  if (smem > ops.ctx->smem_optin())
    return core::Status::fail("needs " + std::to_string(smem) + " bytes of shared memory, the device allows " +
                              std::to_string(ops.ctx->smem_optin()));
  return core::Status::ok();
}

void one_launch_run(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (a.u.dim(0) == 0 || a.latent_up->out_features() == 0) return;
  TailParams p = fill_params(a);
  const OneLaunchLayout layout = one_launch_layout(p);
  p.x_pitch = layout.x_pitch;
  p.prefetch_row_bytes = pdl_prefetch_row_bytes(p.hidden, p.L * 2, ops.ctx->info().l2_bytes);  // bf16 latent_up
  const auto kernel = one_launch_full(p) ? tail_one_launch_kernel<true> : tail_one_launch_kernel<false>;
  allow_smem(ops, kernel, layout.bytes);
  launch_dependent(kernel, dim3(grid_for(p.hidden, kCtaRows)), dim3(kThreads), layout.bytes, ops.ctx->stream(),
                   dim3(1, 1, 1), p);
  K3_CUDA_CHECK_LAUNCH("tail_one_launch_kernel");
}

}  // namespace k3::kernels::moe_tail_cuda
