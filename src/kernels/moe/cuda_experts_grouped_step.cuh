// kernels/moe/cuda_experts_grouped_step.cuh: the pieces of the grouped expert kernels
// (cuda_experts_grouped.cu, strategy "cuda_expert_grouped"; design, byte and instruction counts
// there) below the three kernels: the block shape constants, the E2M1 code word -> exact bf16 pair
// decode and its E8M0 scaling, one lane-step on the tensor cores, the ring of code steps in flight,
// the group-record walk, and the staging of z / h rows in B-fragment order. Included by
// cuda_experts_grouped.cu only (its anonymous namespace: one translation unit).
#pragma once
#include <cstdint>

#include "kernels/moe/cuda_experts_mma.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = 64;  // supports(): T <= this (more tokens: rowdot's pieces)
constexpr int kMaxK = 64;       // supports(): k <= this
constexpr int kPass = 8;        // routes per pass: the mma's n
constexpr int kGuRing = 4;      // steps of codes in flight per lane: gate/up
constexpr int kDnRing = 3;      // down (more state beside the ring: tiles, route outputs)
constexpr int kEarlySlots = 2;  // ring slots loaded before the activations are staged
constexpr int kGuSlices = 2;    // warps sharing one gate/up row group's latent width
constexpr int kGuGroups = kWarps / kGuSlices;
constexpr int kGuRows = 8 * kGuGroups;           // intermediate rows per gate/up item (32)
constexpr int kDnTiles = 4;                      // 16-row tiles per warp per down item
constexpr int kDnRows = 16 * kWarps * kDnTiles;  // latent rows per down item (512)
constexpr int kBlocksPerSm = 3;                  // __launch_bounds__: <= 80 registers

// Shared bytes of one staged activation row (z: width L, h: width I) in B-fragment order: `steps`
// blocks of 256 bytes (4 words x 4 lanes x 16 B) and a 64-byte pad, so rows sit 64 bytes off a
// 128-byte multiple apart (two rows in one 8-lane phase of a 128-bit load hit disjoint banks).
__host__ __device__ constexpr int staged_pitch(int steps) { return steps * 256 + 64; }
inline int steps_of(int64_t width) { return static_cast<int>((width / 32 + 3) / 4); }

// ---------------------------------------------------------------- decode

// The 4 bf16 pairs of a code word: pair i holds nibbles i (low half) and i + 4 (high half) as
// value * 2^-126 (magnitude bits e1 e0 m at bf16 bits 6..8, so code 1 = 0.5 lands on the bf16
// subnormal 2^-127; sign at bit 15). Only the wanted nibble's 3 bits land in kMag after each shift;
// the signs are split even/odd so that every unwanted sign lands inside kMag, where the 3-input
// select (a & kMag) | (b & ~kMag) drops it. 13 integer ops per 8 codes: 2 masks, 7 shifts, 4 lop3.
// Written in PTX because the compiler otherwise re-forms the selects as (x & K1) | (y & K2), which
// takes two logic ops each (a lop3 has room for one constant).
__device__ __forceinline__ void code_pairs(uint32_t w, uint32_t (&p)[4]) {
  asm("{\n\t"
      ".reg .b32 se, so, ta, tb;\n\t"
      "and.b32 se, %4, 0x08080808;\n\t"
      "and.b32 so, %4, 0x80808080;\n\t"
      "shl.b32 ta, %4, 6;\n\t"
      "shl.b32 tb, se, 12;\n\t"
      "lop3.b32 %0, ta, tb, %5, 0xE4;\n\t"
      "shl.b32 ta, %4, 2;\n\t"
      "shl.b32 tb, so, 8;\n\t"
      "lop3.b32 %1, ta, tb, %5, 0xE4;\n\t"
      "shr.b32 ta, %4, 2;\n\t"
      "shl.b32 tb, se, 4;\n\t"
      "lop3.b32 %2, ta, tb, %5, 0xE4;\n\t"
      "shr.b32 ta, %4, 6;\n\t"
      "lop3.b32 %3, ta, so, %5, 0xE4;\n\t"
      "}"
      : "=r"(p[0]), "=r"(p[1]), "=r"(p[2]), "=r"(p[3])
      : "r"(w), "r"(0x01C001C0u));
}

// The bf16x2 multipliers that make code pairs exact weights value * 2^(e - 127): 2^(e - 1) (a
// bf16 while e <= 128: one multiply), else 2^126 then 2^(e - 127) (`second`, 1.0 otherwise);
// e = 255 (NaN scale) gives NaN. Returns whether the second multiply is needed.
__device__ __forceinline__ bool scale_factors(uint32_t e, uint32_t& first, uint32_t& second) {
  const bool big = e > 128 && e < 255;
  first = e == 255 ? 0x7FC07FC0u : big ? 0x7E807E80u : ((e + 126) << 7) * 0x10001u;
  second = big ? (e << 7) * 0x10001u : 0x3F803F80u;
  return big;
}
__device__ __forceinline__ void scale_by(uint32_t (&p)[4], uint32_t factor) {
  const __nv_bfloat162 f = *reinterpret_cast<const __nv_bfloat162*>(&factor);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&p[i]), f);
    p[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// One step of one lane: chunk codes qa (mma row g) and qb (row g + 8) with E8M0 exponents ea, eb,
// against the staged B fragments at x (word w at x[4 w]: 16 bytes = b0..b3 of route g). Every lane
// of the warp must call it (warp-wide mma and vote).
__device__ __forceinline__ void step_mma(const uint4& qa, const uint4& qb, uint32_t ea, uint32_t eb, const uint4* x,
                                         float (&d0)[4], float (&d1)[4]) {
  uint32_t fa, sa, fb, sb;
  const bool big = scale_factors(ea, fa, sa) | scale_factors(eb, fb, sb);
  const bool any_big = __any_sync(kFullMask, big);  // warp-uniform: the rare second multiply
  const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t lo[4], hi[4];
    code_pairs(wa[w], lo);
    code_pairs(wb[w], hi);
    scale_by(lo, fa);
    scale_by(hi, fb);
    if (any_big) {
      scale_by(lo, sa);
      scale_by(hi, sb);
    }
    const uint4 b = x[4 * w];
    fp4_experts::mma_bf16(d0, lo[0], hi[0], lo[1], hi[1], b.x, b.y);  // pairs 0, 1: k 2c.., 2c+8..
    fp4_experts::mma_bf16(d1, lo[2], hi[2], lo[3], hi[3], b.z, b.w);  // pairs 2, 3
  }
}

// N steps of one lane's codes and E8M0 exponents (the two rows' exponents in one register:
// bits 0..7 row a, 16..23 row b). A chunk past the row's end holds code 0 and exponent 127 (2^0):
// exact zeros.
template <int N>
struct Ring {
  uint4 qa[N], qb[N];
  uint32_t ee[N];
  __device__ __forceinline__ void load(int i, bool ok, const uint8_t* codes_a, const uint8_t* codes_b,
                                       const uint8_t* scales_a, const uint8_t* scales_b, int q) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    qa[i] = ok ? __ldg(reinterpret_cast<const uint4*>(codes_a) + q) : zero;
    qb[i] = ok ? __ldg(reinterpret_cast<const uint4*>(codes_b) + q) : zero;
    ee[i] = ok ? static_cast<uint32_t>(__ldg(scales_a + q)) | (static_cast<uint32_t>(__ldg(scales_b + q)) << 16)
               : 0x007F007Fu;
  }
  __device__ __forceinline__ void step(int i, const uint4* x, float (&d0)[4], float (&d1)[4]) const {
    step_mma(qa[i], qb[i], ee[i] & 0xFFu, ee[i] >> 16, x, d0, d1);
  }
};

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// The first group record of this block's walk (item blockIdx.x) into slot 0; see next_group.
__device__ __forceinline__ void first_group(int4* group_s, const int4* groups, int slabs) {
  if (threadIdx.x == 0) {
    fp4_experts::cp_async16(&group_s[0], groups + blockIdx.x / slabs);
    fp4_experts::cp_async_commit();
  }
}
// At the top of walk iteration `it` (item `item`): waits for its record, then starts the copy of
// the next item's record into the other slot (whose last readers passed the barrier here).
__device__ __forceinline__ int4 next_group(int4* group_s, const int4* groups, int slabs, int it, int item,
                                           int n_items) {
  if (threadIdx.x == 0) cp_async_wait_all();
  __syncthreads();  // the record is visible; the previous item's users of shared memory are done
  const int4 gr = group_s[it & 1];
  const int next = item + static_cast<int>(gridDim.x);
  if (threadIdx.x == 0 && next < n_items) {
    fp4_experts::cp_async16(&group_s[(it + 1) & 1], groups + next / slabs);
    fp4_experts::cp_async_commit();
  }
  return gr;
}

// Stages the activation rows of routes order[first .. first + nr) (row of route r: src + row_of(r)
// * ld, `chunks` chunks of 32 bf16) into dst [nr][staged_pitch(steps)] in B-fragment order: the
// 16 bytes of (step s, word w, lane c) = chunk 4 s + c, values 8 w .. 8 w + 7 as the pairs
// (x0,x4)(x1,x5)(x2,x6)(x3,x7), at byte s * 256 + w * 64 + c * 16; chunks past the end are zeros.
// First route_s[j] = order[first + j] and src_s[j] = its row (one barrier), then kStageBatch
// 16-byte loads per thread in flight at once (768 per round: a route at L = 3584 is 448 loads,
// two routes are two rounds). steps_magic = division_magic(steps). The caller synchronises
// before (route_s, src_s, dst free) and after (dst complete).
constexpr int kStageBatch = 3;  // 4 spills in the gate/up kernel
template <class RowOf>
__device__ __forceinline__ void stage_rows(uint8_t* dst, int* route_s, const bf16** src_s, const int* order, int first,
                                           int nr, const bf16* src, int64_t ld, int chunks, int steps,
                                           uint32_t steps_magic, RowOf row_of) {
  if (static_cast<int>(threadIdx.x) < nr) {
    const int route = __ldg(order + first + threadIdx.x);
    route_s[threadIdx.x] = route;
    src_s[threadIdx.x] = src + row_of(route) * ld;
  }
  __syncthreads();
  const int units = steps * 16, pitch = staged_pitch(steps), n = nr * units;
  const auto row_of_unit = [&](int i) {  // i / units
    return static_cast<int>(__umulhi(2u * static_cast<uint32_t>(i >> 4), steps_magic));
  };
  for (int i0 = threadIdx.x; i0 < n; i0 += kThreads * kStageBatch) {
    uint4 x[kStageBatch];
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {  // the loads first, all independent
      const int i = i0 + b * kThreads, j = row_of_unit(i), pos = i - j * units;
      const int q = 4 * (pos >> 4) + (pos & 3), w = (pos >> 2) & 3;
      x[b] = make_uint4(0, 0, 0, 0);
      if (i < n && q < chunks) x[b] = __ldg(reinterpret_cast<const uint4*>(src_s[j]) + q * 4 + w);
    }
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = i0 + b * kThreads, j = row_of_unit(i), pos = i - j * units;
      if (i < n) {
        uint32_t v[4];
        fp4_experts::act_pairs(x[b], v);
        *reinterpret_cast<uint4*>(dst + j * pitch + pos * 16) = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
  }
}

// The staged row lane group g reads: its route, or (past the pass's routes: unused columns) a
// staged row of the same parity, so that the 8 lanes of a 128-bit phase stay conflict-free.
__device__ __forceinline__ int staged_row(int g, int nr) { return g < nr ? g : (nr >= 2 ? (g & 1) : 0); }

}  // namespace
}  // namespace k3::kernels
