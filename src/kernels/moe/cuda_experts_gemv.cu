// kernels/moe/cuda_experts_gemv.cu: the routed experts (spec §7) for small batches (1..16 tokens) as
// two memory-bound GEMV kernels that read each route's MXFP4 codes straight from global memory
// (16-byte loads, no shared-memory staging of weights, no sort): strategy "cuda_expert_gemv".
//
// Bytes per call at the k3-layer-tp8 shapes (L = 3584, I = 384 per rank, top-16, MXFP4): one route
// reads gate + up 2 x 384 x (1792 B codes + 112 B scales) = 1,462,272 B and down 3584 x (192 + 12)
// = 731,136 B: 2,193,408 B. Batch 1 = 16 routes = 35.1 MB (floor 8.2 us at 4.3 TB/s); batch 8 =
// 128 routes = 280.8 MB (about 120 distinct experts: 263 MB when a repeated expert is served by
// L2; floor 61-65 us). Activations (z 7 KB, h 12 KB, out 7 KB per token) are noise.
//
// A. gemv_gate_up_kernel, grid (I / 16, T * k), 256 threads: a block per (route, 16 intermediate
//    rows). The 8 warps are 2 row groups x 4 slices of the latent width: warp (group, slice) sums 8
//    gate rows and the same 8 up rows over its slice of the chunks (a chunk = 32 codes = 16 bytes =
//    one E8M0 scale). Lane (g, c) owns gate row g and up row g; in step s of its slice it takes
//    chunk 4 s + c (the 4 lanes of a row read 64 contiguous bytes), kSteps steps of 2 x 16 bytes
//    in flight per lane. z_t is staged once per block in shared memory. bf16 z: each chunk is
//    decoded to exact bf16 weights (value * scale, a power of two) and multiplied on the tensor
//    cores (mma m16n8k16: A = 8 gate rows over 8 up rows, B column 0 = z_t, the other 7 columns
//    zero; a few integer ops per weight instead of decode + widen + FMA). f32 z: the same walk on
//    CUDA cores (decode_word + FMA). The 4 slices meet in shared memory in slice order, then
//    h = round(SiTU(round(W1 z), round(W3 z))) goes to the scratch h [T * k, I] (bf16 when rounded).
// B. gemv_down_kernel, grid (L / 16, T), 256 threads: a block per (token, 16 latent rows). The
//    token's k h rows are staged in shared memory; warp w takes the routes j = w, w + 8, ... and,
//    for each, the 16 rows' dot products over I (lane (g, c): rows g and g + 8, chunk 4 s + c), the
//    same tensor-core (bf16 h) or CUDA-core (f32 h) walk; e_tj = round(W2_j h_tj) (not rounded
//    without round_output) goes to shared memory, and one thread per row sums p_tj * e_tj in route
//    order j = 0..k-1 in fp32 (separate multiply and add, as the reference), rounds (or not) and
//    writes out[t][row]. A token with an id outside [0, E) gets a NaN row (gate/up skips its bad
//    routes); the down blocks of that token read nothing.
// Every sum runs in an order fixed by (L, I, k) alone, never by the grid or the batch, so results
// are identical run to run. Grids come from host integers, scratch from the context pool: the two
// launches are graph-capturable.
//
// Expected time (H200): every block of A fits at once at batch 1 (384 blocks, 3 per SM), each
// warp keeping 4 KB of codes in flight (~90 KB per SM): ~6.5 us for A's 23.4 MB; B's 224 blocks
// (11.7 MB, two rounds of loads per warp) ~3.5 us: ~10-12 us at batch 1 against 48 us for the
// rowdot MMA kernels. The decode costs ~0.1 warp instructions per weight (13 integer ops and 4
// bf16x2 multiplies per 8 codes), ~6 us of issue at batch 1, so compute runs close behind the
// memory floor; batch 8 ~70-80 us (280 MB). The token bound is kMaxTokens = 16: every route reads
// its expert again (repeats come from L2), which the rowdot strategy also does up to 16 tokens of
// top-16 (its route form); beyond that its sorted form reads each expert once for all its routes.
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/moe/cuda_experts_checks.cuh"
#include "kernels/moe/cuda_experts_mma.cuh"
#include "kernels/moe/cuda_experts_mxfp4.cuh"
#include "kernels/moe/experts.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = 16;   // supports(): T <= this (see the file comment)
constexpr int kMaxRoutes = 64;   // supports(): k <= this (the down block's e table)
constexpr int kSteps = 4;        // steps (2 x 16 bytes per lane each) loaded before they are used
constexpr int kGuSlices = 4;     // warps sharing one gate/up row group's latent width
constexpr int kGuGroups = kWarps / kGuSlices;
constexpr int kGuRows = 8 * kGuGroups;  // intermediate rows per gate/up block
constexpr int kDnRows = 16;             // latent rows per down block (one mma's rows)
constexpr size_t kSmemBudget = 40 * 1024;  // staged z row / h rows: under the 48 KB default

// What both kernels read (one struct, so the launches stay short).
struct GemvParams {
  ExpertTable tab;     // per-expert w1 / w3 / w2 codes and scales, one layout for all
  const int32_t* ids;  // [T, k] expert ids, rows ids_ld apart
  int64_t ids_ld;
  const float* p;  // [T, k] route weights, rows p_ld apart
  int64_t p_ld;
  const void* z;  // [T, L] XT latent input, rows z_ld apart (16-byte aligned rows)
  int64_t z_ld;
  void* h;  // [T * k, I] HT scratch: SiTU outputs per route (route = t * k + j)
  void* out;  // [T, L] OT, rows out_ld apart
  int64_t out_ld;
  int64_t L, I;
  int k, E;
  float beta, linear_beta;
  bool round;    // Precision::bf16: gate/up sums and SiTU rounded
  bool round_e;  // round && round_output: e_tj and out rounded
};

// ---------------------------------------------------------------- decode

// The 4 bf16 pairs of a code word: pair i holds nibbles i (low half) and i + 4 (high half) as
// value * 2^-126 (magnitude bits e1 e0 m at bf16 bits 6..8, so code 1 = 0.5 lands on the bf16
// subnormal 2^-127; sign at bit 15). The magnitude masks need no pre-masked word (only the wanted
// nibble's 3 bits land in kMag after each shift); the sign words are split even/odd so that every
// unwanted sign bit lands inside kMag, where the 3-input select drops it. 13 integer ops per word.
__device__ __forceinline__ void code_pairs(uint32_t w, uint32_t (&p)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u;
  const uint32_t s_even = w & 0x08080808u, s_odd = w & 0x80808080u;
  p[0] = ((w << 6) & kMag) | ((s_even << 12) & ~kMag);
  p[1] = ((w << 2) & kMag) | ((s_odd << 8) & ~kMag);
  p[2] = ((w >> 2) & kMag) | ((s_even << 4) & ~kMag);
  p[3] = ((w >> 6) & kMag) | (s_odd & ~kMag);
}

// The bf16x2 multipliers that turn code pairs into exact weights value * 2^(e - 127): 2^(e - 1)
// (a bf16 while e <= 128: one multiply), else 2^126 then 2^(e - 127) (`second`, 1.0 otherwise);
// e = 255 (NaN scale) gives NaN. Returns whether the second multiply is needed.
__device__ __forceinline__ bool scale_factors(uint32_t e, uint32_t& first, uint32_t& second) {
  const bool big = e > 128 && e < 255;
  first = e == 255 ? 0x7FC07FC0u : big ? 0x7E807E80u : ((e + 126) << 7) * 0x10001u;
  second = big ? (e << 7) * 0x10001u : 0x3F803F80u;
  return big;
}
__device__ __forceinline__ void scale_pairs_by(uint32_t (&p)[4], uint32_t factor) {
  const __nv_bfloat162 f = *reinterpret_cast<const __nv_bfloat162*>(&factor);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&p[i]), f);
    p[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// ---------------------------------------------------------------- one step of one lane

// A lane's partial sums of its two rows (lo: gate row / first latent row, hi: up row / latent row
// + 8). Tensor-core form: the mma accumulators (column 0 holds the sums: d[0] row lo, d[2] row hi,
// in lanes c = 0); CUDA-core form: two floats per lane, summed over the 4 lanes of a row at the end.
template <bool MMA>
struct RowSums;
template <>
struct RowSums<true> {
  float d0[4], d1[4];  // two chains (pairs 0-1 and 2-3 of each word) for more mma in flight
  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i) d0[i] = d1[i] = 0.0f;
  }
  // Valid in lanes with c == 0.
  __device__ void result(float& lo, float& hi) const { lo = d0[0] + d1[0], hi = d0[2] + d1[2]; }
};
template <>
struct RowSums<false> {
  float lo_sum, hi_sum;
  __device__ void zero() { lo_sum = hi_sum = 0.0f; }
  // Every lane calls it (shuffles); the sums are valid in every lane.
  __device__ void result(float& lo, float& hi) const {
    lo = lo_sum, hi = hi_sum;
    lo += __shfl_xor_sync(kFullMask, lo, 1), hi += __shfl_xor_sync(kFullMask, hi, 1);
    lo += __shfl_xor_sync(kFullMask, lo, 2), hi += __shfl_xor_sync(kFullMask, hi, 2);
  }
};

// One chunk per lane on the tensor cores: codes qa (row lo) and qb (row hi) with exponents ea, eb;
// x = the chunk's 32 bf16 activations in shared memory (read only by lanes g = 0: column 0 of B).
// Every lane of the warp must call it (warp-wide mma and vote).
__device__ __forceinline__ void step_sums(const uint4& qa, const uint4& qb, uint32_t ea, uint32_t eb, const bf16* x,
                                          bool x_ok, int g, RowSums<true>& acc) {
  uint32_t fa, sa, fb, sb;
  const bool big = scale_factors(ea, fa, sa) | scale_factors(eb, fb, sb);
  const bool any_big = __any_sync(kFullMask, big);  // warp-uniform: the rare second multiply
  const bool has_x = x_ok && g == 0;
  const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t lo[4], hi[4], b[4];
    code_pairs(wa[w], lo);
    code_pairs(wb[w], hi);
    scale_pairs_by(lo, fa);
    scale_pairs_by(hi, fb);
    if (any_big) {
      scale_pairs_by(lo, sa);
      scale_pairs_by(hi, sb);
    }
    const uint4 xv = has_x ? reinterpret_cast<const uint4*>(x)[w] : make_uint4(0, 0, 0, 0);
    fp4_experts::act_pairs(xv, b);  // (x0, x4), (x1, x5), (x2, x6), (x3, x7): the code pairs' order
    fp4_experts::mma_bf16(acc.d0, lo[0], hi[0], lo[1], hi[1], b[0], b[1]);
    fp4_experts::mma_bf16(acc.d1, lo[2], hi[2], lo[3], hi[3], b[2], b[3]);
  }
}

// The same chunk on CUDA cores (f32 activations, or f32 h): exact E2M1 values, the chunk's sum on
// unscaled values, then one multiply-add by the (power of two) scale.
__device__ __forceinline__ void step_sums(const uint4& qa, const uint4& qb, uint32_t ea, uint32_t eb, const float* x,
                                          bool x_ok, int, RowSums<false>& acc) {
  const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
  float pa = 0.0f, pb = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float va[8], vb[8], xv[8];
    fp4_experts::decode_word(wa[w], va);
    fp4_experts::decode_word(wb[w], vb);
    if (x_ok) {
      load_act_n<8>(x + 8 * w, xv);
    } else {
#pragma unroll
      for (int n = 0; n < 8; ++n) xv[n] = 0.0f;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) pa = fmaf(va[n], xv[n], pa), pb = fmaf(vb[n], xv[n], pb);
  }
  acc.lo_sum = fmaf(pa, e8m0_value(static_cast<uint8_t>(ea)), acc.lo_sum);
  acc.hi_sum = fmaf(pb, e8m0_value(static_cast<uint8_t>(eb)), acc.hi_sum);
}

// kSteps steps of one lane's codes and scales in registers. A step outside the matrix (past the
// last chunk, a missing row, past the warp's work) holds code 0 and scale 2^0 (adds exact zeros).
struct StepBatch {
  uint4 qa[kSteps], qb[kSteps];
  uint32_t ea[kSteps], eb[kSteps];
  __device__ __forceinline__ void load(int i, bool ok_a, bool ok_b, const uint8_t* codes_a, const uint8_t* codes_b,
                                       const uint8_t* scales_a, const uint8_t* scales_b, int q) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    qa[i] = ok_a ? __ldg(reinterpret_cast<const uint4*>(codes_a) + q) : zero;
    qb[i] = ok_b ? __ldg(reinterpret_cast<const uint4*>(codes_b) + q) : zero;
    ea[i] = ok_a ? static_cast<uint32_t>(__ldg(scales_a + q)) : 127u;
    eb[i] = ok_b ? static_cast<uint32_t>(__ldg(scales_b + q)) : 127u;
  }
};

// Copies `bytes` (a multiple of 16; both ends 16-byte aligned) from global to shared memory.
__device__ __forceinline__ void stage16(void* smem, const void* src, int64_t bytes) {
  const int64_t n = bytes / 16;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    reinterpret_cast<uint4*>(smem)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
}

// ---------------------------------------------------------------- A. gate/up + SiTU

// h[route][row] = round(SiTU(round(W1[row] . z_t), round(W3[row] . z_t))) for the block's 16 rows
// of route blockIdx.y (= t * k + j). Dynamic shared memory: z_t, L values of XT.
template <class XT, class HT>
__global__ void __launch_bounds__(kThreads, 3) gemv_gate_up_kernel(GemvParams p) {
  constexpr bool MMA = std::is_same_v<XT, bf16>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float partial[kGuGroups][kGuSlices][8][2];  // [group][slice][row][gate, up]
  const int route = static_cast<int>(blockIdx.y), t = route / p.k, j = route - t * p.k;
  const int e = p.ids[t * p.ids_ld + j];
  if (e < 0 || e >= p.E) return;  // the whole block: the token's row will be NaN (down kernel)
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3, group = warp / kGuSlices, slice = warp % kGuSlices;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGuRows + group * 8 + g;
  const bool row_ok = row < p.I;
  const int chunks = static_cast<int>(p.L / 32), steps = (chunks + 3) / 4;
  const int per = (steps + kGuSlices - 1) / kGuSlices, first = slice * per;
  const int n_steps = max(0, min(steps, first + per) - first);  // this warp's steps (warp-uniform)
  const int64_t r = row_ok ? row : 0;

  StepBatch b;
  const auto load = [&](int s0) {
    // The row pointers are rebuilt from the (L1-resident) expert table per batch: fewer live registers.
    const WeightRef wg = p.tab.w1(e), wu = p.tab.w3(e);
    const uint8_t* gate_codes = static_cast<const uint8_t*>(wg.data) + r * wg.ld;
    const uint8_t* up_codes = static_cast<const uint8_t*>(wu.data) + r * wu.ld;
    const uint8_t* gate_scales = wg.scale + r * wg.scale_ld;
    const uint8_t* up_scales = wu.scale + r * wu.scale_ld;
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const int q = (first + s0 + i) * 4 + c;
      const bool ok = row_ok && s0 + i < n_steps && q < chunks;
      b.load(i, ok, ok, gate_codes, up_codes, gate_scales, up_scales, q);
    }
  };
  load(0);  // the first codes are in flight while z is staged
  XT* z_s = reinterpret_cast<XT*>(smem);
  stage16(z_s, static_cast<const XT*>(p.z) + t * p.z_ld, p.L * static_cast<int64_t>(sizeof(XT)));
  __syncthreads();

  RowSums<MMA> acc;
  acc.zero();
  for (int s0 = 0; s0 < n_steps; s0 += kSteps) {
    if (s0 > 0) load(s0);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (s0 + i < n_steps) {  // warp-uniform
        const int q = (first + s0 + i) * 4 + c;
        const bool x_ok = q < chunks;
        step_sums(b.qa[i], b.qb[i], b.ea[i], b.eb[i], z_s + static_cast<int64_t>(x_ok ? q : 0) * 32, x_ok, g, acc);
      }
    }
  }
  float gate_sum, up_sum;
  acc.result(gate_sum, up_sum);
  if (c == 0) partial[group][slice][g][0] = gate_sum, partial[group][slice][g][1] = up_sum;
  __syncthreads();
  if (threadIdx.x < kGuRows) {
    const int rg = static_cast<int>(threadIdx.x) / 8, rr = static_cast<int>(threadIdx.x) % 8;
    const int64_t h_row = static_cast<int64_t>(blockIdx.x) * kGuRows + threadIdx.x;
    if (h_row < p.I) {
      float a = 0.0f, u = 0.0f;
#pragma unroll
      for (int s = 0; s < kGuSlices; ++s) a += partial[rg][s][rr][0], u += partial[rg][s][rr][1];
      a = round_if(a, p.round), u = round_if(u, p.round);
      const float gate_act = p.beta * tanhf(a / p.beta) * sigmoid_f32(a);
      const float up_act = p.linear_beta * tanhf(u / p.linear_beta);
      store_act(static_cast<HT*>(p.h) + static_cast<int64_t>(route) * p.I + h_row, gate_act * up_act, p.round);
    }
  }
}

// ---------------------------------------------------------------- B. down + combine

// out[t][row] = round?(sum_j p_tj * round?(W2_j[row] . h_tj)) for the block's 16 rows of token
// blockIdx.y. Dynamic shared memory: the token's h rows, k * I values of HT.
template <class HT, class OT>
__global__ void __launch_bounds__(kThreads, 3) gemv_down_kernel(GemvParams p) {
  constexpr bool MMA = std::is_same_v<HT, bf16>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float e_s[kMaxRoutes][kDnRows];  // e_tj of the block's rows, route-major
  __shared__ const uint8_t* codes_s[kMaxRoutes];  // W2 codes / scales of the token's routes
  __shared__ const uint8_t* scales_s[kMaxRoutes];
  __shared__ int bad_s;
  const int t = static_cast<int>(blockIdx.y);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kDnRows;
  OT* out = static_cast<OT*>(p.out) + t * p.out_ld;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.k) {
    const int e = p.ids[t * p.ids_ld + threadIdx.x];
    const bool ok = e >= 0 && e < p.E;
    codes_s[threadIdx.x] = ok ? static_cast<const uint8_t*>(p.tab.ptr(e, 4)) : nullptr;
    scales_s[threadIdx.x] = ok ? p.tab.scale(e, 5) : nullptr;
    if (!ok) bad_s = 1;
  }
  __syncthreads();
  if (bad_s) {  // the whole block: a NaN row, as the reference contract says
    if (threadIdx.x < kDnRows && row0 + threadIdx.x < p.L) store_act(out + row0 + threadIdx.x, NAN, false);
    return;
  }
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3;
  const int chunks = static_cast<int>(p.I / 32), steps = (chunks + 3) / 4;
  const int n_routes = warp < p.k ? (p.k - warp + kWarps - 1) / kWarps : 0;
  const int n_units = n_routes * steps;  // (route, step) units of this warp, route-major
  const int64_t lo = row0 + g, hi = lo + 8;
  const bool lo_ok = lo < p.L, hi_ok = hi < p.L;

  StepBatch b;
  const auto load = [&](int u0) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const int u = u0 + i, jr = u / steps, s = u - jr * steps;
      const int q = s * 4 + c;
      const bool ok = u < n_units && q < chunks;
      const int j = ok ? warp + jr * kWarps : 0;
      const uint8_t *codes = codes_s[j], *scales = scales_s[j];
      const int64_t ld = p.tab.ld2, sld = p.tab.sld2;
      b.load(i, ok && lo_ok, ok && hi_ok, codes + (lo_ok ? lo : 0) * ld, codes + (hi_ok ? hi : 0) * ld,
             scales + (lo_ok ? lo : 0) * sld, scales + (hi_ok ? hi : 0) * sld, q);
    }
  };
  load(0);  // the first codes are in flight while h is staged
  HT* h_s = reinterpret_cast<HT*>(smem);
  stage16(h_s, static_cast<const HT*>(p.h) + static_cast<int64_t>(t) * p.k * p.I,
          static_cast<int64_t>(p.k) * p.I * static_cast<int64_t>(sizeof(HT)));
  __syncthreads();

  RowSums<MMA> acc;
  acc.zero();
  for (int u0 = 0; u0 < n_units; u0 += kSteps) {
    if (u0 > 0) load(u0);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const int u = u0 + i;
      if (u < n_units) {  // warp-uniform
        const int jr = u / steps, s = u - jr * steps, j = warp + jr * kWarps;
        const int q = s * 4 + c;
        const bool x_ok = q < chunks;
        step_sums(b.qa[i], b.qb[i], b.ea[i], b.eb[i], h_s + static_cast<int64_t>(j) * p.I + (x_ok ? q : 0) * 32, x_ok,
                  g, acc);
        if (s == steps - 1) {  // route j done: its 16 values e_tj
          float e_lo, e_hi;
          acc.result(e_lo, e_hi);
          if (c == 0) e_s[j][g] = round_if(e_lo, p.round_e), e_s[j][g + 8] = round_if(e_hi, p.round_e);
          acc.zero();
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kDnRows && row0 + threadIdx.x < p.L) {
    const float* pt = p.p + t * p.p_ld;
    float sum = 0.0f;
    for (int j = 0; j < p.k; ++j) sum = __fadd_rn(sum, __fmul_rn(pt[j], e_s[j][threadIdx.x]));
    store_act(out + row0 + threadIdx.x, sum, p.round_e);
  }
}

// ---------------------------------------------------------------- host

core::Status gemv_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = experts_io_supports(ops, a); !s) return s;
  const int64_t T = a.z.dim(0), L = a.z.dim(1), k = a.ids.dim(1);
  if (T < 1 || T > kMaxTokens)
    return core::Status::fail("the expert GEMV takes 1.." + std::to_string(kMaxTokens) +
                              " tokens (each route reads its expert again), got " + std::to_string(T));
  if (k < 1 || k > kMaxRoutes)
    return core::Status::fail("the expert GEMV takes 1.." + std::to_string(kMaxRoutes) + " routes per token, got k = " +
                              std::to_string(k));
  const int64_t I = a.w1[0].out_features();
  if (L % 32 != 0 || I % 32 != 0)
    return core::Status::fail("the expert GEMV needs whole MXFP4 chunks (L and I multiples of 32), got L = " +
                              std::to_string(L) + ", I = " + std::to_string(I));
  const size_t x_bytes = a.z.dtype == core::DType::bf16 ? 2 : 4;
  const size_t h_bytes = a.precision == Precision::bf16 ? 2 : 4;
  if (static_cast<size_t>(L) * x_bytes > kSmemBudget || static_cast<size_t>(k * I) * h_bytes > kSmemBudget)
    return core::Status::fail("the expert GEMV stages z (" + std::to_string(L * x_bytes) + " B) and a token's h rows (" +
                              std::to_string(k * I * h_bytes) + " B) in at most " + std::to_string(kSmemBudget) +
                              " B of shared memory");
  if (!aligned16(a.z.data) || (T > 1 && (static_cast<size_t>(a.z.strides[0]) * x_bytes) % 16 != 0))
    return core::Status::fail("the expert GEMV reads z rows 16 bytes at a time: z must be 16-byte aligned with rows "
                              "a multiple of 16 bytes apart, got " + describe(a.z) + " with row stride " +
                              std::to_string(a.z.strides[0]));
  // MXFP4 everywhere, one layout per matrix (the kernels take one row stride each), code rows
  // 16-byte aligned (16-byte loads straight from global memory).
  const std::span<const LinearWeight> mats[3] = {a.w1, a.w3, a.w2};
  const char* names[3] = {"w1", "w3", "w2"};
  for (int m = 0; m < 3; ++m) {
    const LinearWeight& w0 = mats[m][0];
    if (!w0.is_mxfp4())
      return core::Status::fail(std::string("the expert GEMV reads MXFP4 experts only; ") + names[m] + "[0] is " +
                                describe(w0.weight.view()));
    const int64_t ld = w0.weight.view().strides[0], sld = w0.scale.view().strides[0];
    if (ld % 16 != 0)
      return core::Status::fail(std::string(names[m]) + " code rows are " + std::to_string(ld) +
                                " bytes apart; the expert GEMV needs a multiple of 16");
    for (size_t e = 0; e < mats[m].size(); ++e) {
      const LinearWeight& w = mats[m][e];
      if (auto s = weight_on_cuda(w, names[m]); !s) return s;
      if (!w.is_mxfp4() || w.weight.view().strides[0] != ld || w.scale.view().strides[0] != sld)
        return core::Status::fail(std::string(names[m]) + "[" + std::to_string(e) +
                                  "] differs in format or layout from " + names[m] + "[0]");
      if (!aligned16(w.weight.view().data))
        return core::Status::fail(std::string(names[m]) + "[" + std::to_string(e) +
                                  "] codes are not 16-byte aligned (the expert GEMV loads 16 bytes at a time)");
    }
  }
  return core::Status::ok();
}

void gemv_run(const CudaOps& ops, const MoeExpertsArgs& a) {
  const int64_t T = a.z.dim(0), L = a.z.dim(1), I = a.w1[0].out_features();
  const int k = static_cast<int>(a.ids.dim(1)), E = static_cast<int>(a.w1.size());
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;

  std::vector<uint64_t> words(static_cast<size_t>(E) * kWordsPerExpert);
  const auto addr = [](const core::Tensor& t) { return reinterpret_cast<uint64_t>(t.view().data); };
  for (int e = 0; e < E; ++e) {
    const LinearWeight* ws[3] = {&a.w1[e], &a.w3[e], &a.w2[e]};
    for (int m = 0; m < 3; ++m) {
      words[e * kWordsPerExpert + 2 * m] = addr(ws[m]->weight);
      words[e * kWordsPerExpert + 2 * m + 1] = addr(ws[m]->scale);
    }
  }
  GemvParams p{};
  p.tab.words = static_cast<const uint64_t*>(ops.ctx->device_table(words));
  const WeightRef r1 = weight_ref(a.w1[0]), r3 = weight_ref(a.w3[0]), r2 = weight_ref(a.w2[0]);
  p.tab.ld1 = r1.ld, p.tab.sld1 = r1.scale_ld, p.tab.ld3 = r3.ld, p.tab.sld3 = r3.scale_ld;
  p.tab.ld2 = r2.ld, p.tab.sld2 = r2.scale_ld;
  p.ids = a.ids.as<const int32_t>(), p.ids_ld = a.ids.strides[0];
  p.p = a.weights.as<const float>(), p.p_ld = a.weights.strides[0];
  p.z = a.z.data, p.z_ld = a.z.strides[0];
  p.out = a.out.data, p.out_ld = a.out.strides[0];
  p.L = L, p.I = I, p.k = k, p.E = E;
  p.beta = a.beta, p.linear_beta = a.linear_beta;
  p.round = round, p.round_e = round && a.round_output;
  // h is a bf16 value whenever it is rounded: stored as bf16 then (the tensor-core down walk).
  const std::shared_ptr<void> h_buf = ops.ctx->scratch(static_cast<size_t>(T * k * I) * (round ? 2 : 4));
  p.h = h_buf.get();

  const dim3 grid_gu(grid_for(I, kGuRows), static_cast<unsigned>(T * k)), grid_dn(grid_for(L, kDnRows), static_cast<unsigned>(T));
  const auto launch = [&](auto x_tag, auto h_tag, auto o_tag) {
    using XT = typename decltype(x_tag)::type;
    using HT = typename decltype(h_tag)::type;
    using OT = typename decltype(o_tag)::type;
    gemv_gate_up_kernel<XT, HT><<<grid_gu, kThreads, static_cast<size_t>(L) * sizeof(XT), stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("gemv_gate_up_kernel");
    gemv_down_kernel<HT, OT><<<grid_dn, kThreads, static_cast<size_t>(k * I) * sizeof(HT), stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("gemv_down_kernel");
  };
  if (a.z.dtype == core::DType::bf16) {  // bf16 storage implies Precision::bf16 (supports)
    if (a.round_output)
      launch(Tag<bf16>{}, Tag<bf16>{}, Tag<bf16>{});
    else
      launch(Tag<bf16>{}, Tag<bf16>{}, Tag<float>{});
  } else if (round) {
    launch(Tag<float>{}, Tag<bf16>{}, Tag<float>{});
  } else {
    launch(Tag<float>{}, Tag<float>{}, Tag<float>{});
  }
}

}  // namespace

void register_moe_experts_gemv_cuda(Registry& r, const CudaOps& ops) {
  r.moe_experts.add({"cuda_expert_gemv", core::Device::cuda, 20,
                     [ops](const MoeExpertsArgs& a) { return gemv_supports(ops, a); },
                     [ops](const MoeExpertsArgs& a) { gemv_run(ops, a); }});
}

}  // namespace k3::kernels
