// kernels/moe/cuda_experts_gemv_step.cuh: the pieces of the small-batch expert GEMV
// (cuda_experts_gemv.cu, strategy "cuda_expert_gemv"; design and byte counts there) below the two
// kernels: the block shape constants, the E2M1 -> bf16 pair decode, the staged scale tables, one
// step (16 rows x 4 chunks) of one lane on tensor cores or CUDA cores, and the staging of z / h rows
// in shared memory. Included by cuda_experts_gemv.cu only (its anonymous namespace: one translation
// unit).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/moe/cuda_experts_mxfp4.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGuSlices = 4;  // warps sharing one gate/up row group's latent width
constexpr int kGuGroups = kWarps / kGuSlices;
constexpr int kGuRows = 8 * kGuGroups;  // intermediate rows per gate/up block
constexpr int kDnRows = 16;             // latent rows per down block (one mma's rows)
constexpr int kStepChunks = 4;          // chunks per step: one per lane of a quad
constexpr int kStepValues = 32 * kStepChunks;

// ---------------------------------------------------------------- decode

// (a & mask) | (b & ~mask) in one LOP3, and a & mask, in PTX: written in C++, the compiler folds
// code_pairs' shared sign masks into two ANDs and an OR per pair (~16 ops per word, not 13).
__device__ __forceinline__ uint32_t select_bits(uint32_t mask, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "r"(mask));
  return d;
}
__device__ __forceinline__ uint32_t and_bits(uint32_t a, uint32_t mask) {
  uint32_t d;
  asm("and.b32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(mask));
  return d;
}

// The 4 bf16 pairs of a code word: pair i holds nibbles i (low half) and i + 4 (high half) as
// value * 2^-126 (magnitude bits e1 e0 m at bf16 bits 6..8, so code 1 = 0.5 lands on the bf16
// subnormal 2^-127; sign at bit 15). The magnitude masks need no pre-masked word (only the wanted
// nibble's 3 bits land in kMag after each shift); the sign words are split even/odd so that every
// unwanted sign bit lands inside kMag, where the 3-input select drops it: 13 integer ops per word
// (2 masks, 7 shifts, 4 selects). Any word gives finite pairs (exponent field <= 3).
__device__ __forceinline__ void code_pairs(uint32_t w, uint32_t (&p)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u;
  const uint32_t s_even = and_bits(w, 0x08080808u), s_odd = and_bits(w, 0x80808080u);
  p[0] = select_bits(kMag, w << 6, s_even << 12);
  p[1] = select_bits(kMag, w << 2, s_odd << 8);
  p[2] = select_bits(kMag, w >> 2, s_even << 4);
  p[3] = select_bits(kMag, w >> 6, s_odd);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^(e - 1) in both halves of a bf16 pair: the multiplier that turns raw pairs (value * 2^-126)
// into value * 2^(e - 127), exact; one IMAD. Valid for e <= 128 (the fast path takes e < 128).
__device__ __forceinline__ uint32_t pair_factor(uint32_t e) { return e * 0x00800080u + 0x3F003F00u; }

// The slow path's multiplier, from a staged f = pair_factor(e) (low half (e + 126) << 7 for any
// e): 2^(e - 127), applied after the exact 2^126 that makes raw pairs values; e = 0 gives the bf16
// subnormal 2^-127, e = 255 NaN, f = 0 (a pad chunk) 0.
__device__ __forceinline__ uint32_t slow_factor(uint32_t f) {
  const uint32_t e = ((f & 0xFFFFu) >> 7) - 126u;
  const uint32_t bits = f == 0 ? 0u : e == 255 ? 0x7FC0u : e == 0 ? 0x0040u : e << 7;
  return bits * 0x10001u;
}

// What the staged scale tables hold for exponent e: the bf16 pair 2^(e - 1) for the tensor-core
// walk, the f32 bits of 2^(e - 127) for the CUDA-core walk; 0 for a chunk past the row end.
template <bool MMA>
__device__ __forceinline__ uint32_t scale_entry(uint32_t e, bool pad) {
  return pad ? 0u : MMA ? pair_factor(e) : __float_as_uint(e8m0_value(static_cast<uint8_t>(e)));
}

// The scale bytes of chunks 4 S .. 4 S + 3 of a scale row as one word (byte c = chunk 4 S + c, 0
// past the row end): one 4-byte load when the rows allow it (`word`: 4-byte aligned) and the step
// lies inside the row, else bytewise.
__device__ __forceinline__ uint32_t step_scale_word(const uint8_t* row, int S, int chunks, bool word) {
  const int q0 = S * kStepChunks;
  if (word && q0 + kStepChunks <= chunks) return __ldg(reinterpret_cast<const uint32_t*>(row + q0));
  uint32_t v = 0;
#pragma unroll
  for (int c = 0; c < kStepChunks; ++c)
    if (q0 + c < chunks) v |= static_cast<uint32_t>(__ldg(row + q0 + c)) << (8 * c);
  return v;
}

// The staged scale tables hold one 32-byte entry per (step, row pair): 4 uint2 {lo, hi}, chunk c's at
// uint2 c. Entry `it` is written by thread `it` of a staging loop as two 16-byte stores; entries are
// 32 bytes apart, so with the halves in place the 8 lanes of a store phase hit only 4 of the 8 16-byte
// bank groups (2 wavefronts a phase: the several-way shared-store conflicts ncu reported for
// gate/up / down). Entries with bit 2 of `it` set keep their halves swapped: the 8 lanes then cover
// all 8 bank groups. Readers take chunk c of entry it at uint2 c ^ scale_swap(it); a reader's entries
// are it = 8 m + g for its row pair g (any m), so its swap is a per-lane constant.
__device__ __forceinline__ int scale_swap(int it) { return ((it >> 2) & 1) << 1; }

// Stages one step's scale bytes of rows lo and hi (step_scale_word's vl, vh) as entry `it` of the
// table at `table` (4 uint2 {lo, hi}, chunk c's at uint2 c ^ scale_swap(it)); returns whether some
// e >= 128 there needs the slow path (a scale of 2 or more, or NaN).
template <bool MMA>
__device__ __forceinline__ bool stage_step_scales(uint2* table, int it, uint32_t vl, uint32_t vh, int S, int chunks) {
  uint32_t v[8];
#pragma unroll
  for (int c = 0; c < kStepChunks; ++c) {
    const bool pad = S * kStepChunks + c >= chunks;
    v[2 * c] = scale_entry<MMA>((vl >> (8 * c)) & 0xFFu, pad);
    v[2 * c + 1] = scale_entry<MMA>((vh >> (8 * c)) & 0xFFu, pad);
  }
  uint4* dst = reinterpret_cast<uint4*>(table + it * kStepChunks);
  const int swap = scale_swap(it) >> 1;  // chunks 0, 1 go to half `swap`, chunks 2, 3 to the other
  dst[swap] = make_uint4(v[0], v[1], v[2], v[3]);
  dst[swap ^ 1] = make_uint4(v[4], v[5], v[6], v[7]);
  return ((vl | vh) & 0x80808080u) != 0;
}

// d += A B on the tensor cores (m16n8k16, bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The B fragment pairs of 8 bf16 activations x[0..7] (one uint4): (x0, x4), (x1, x5), (x2, x6),
// (x3, x7), the order code_pairs gives the nibbles of a word.
__device__ __forceinline__ uint4 fragment_order(const uint4& x) {
  return make_uint4(__byte_perm(x.x, x.z, 0x5410), __byte_perm(x.x, x.z, 0x7632), __byte_perm(x.y, x.w, 0x5410),
                    __byte_perm(x.y, x.w, 0x7632));
}

// ---------------------------------------------------------------- one step of one lane

// One step's code loads of one lane: 16 bytes of rows lo and hi. A skipped load (a chunk past the
// row end, staged scale 0) keeps the slot's previous value, so slots start zeroed: never an
// undefined value the compiler could fold the load's condition away for.
struct Slot {
  uint4 a, b;
  __device__ __forceinline__ void zero() { a = b = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void load(bool ok, const uint8_t* ca, const uint8_t* cb) {
    if (ok) {
      a = __ldg(reinterpret_cast<const uint4*>(ca));
      b = __ldg(reinterpret_cast<const uint4*>(cb));
    }
  }
};

// A lane's running sums of its two rows (lo: gate row / latent row g, hi: up row / latent row g +
// 8). Tensor-core form: the mma accumulators (B's columns are all equal, so d[0] holds row lo and
// d[2] row hi in every lane); CUDA-core form: two floats per lane, summed over the quad at the end.
template <bool MMA>
struct RowSums;
template <>
struct RowSums<true> {
  float d[4];
  __device__ __forceinline__ void zero() { d[0] = d[1] = d[2] = d[3] = 0.0f; }
  __device__ __forceinline__ void result(float& lo, float& hi) const { lo = d[0], hi = d[2]; }
};
template <>
struct RowSums<false> {
  float lo_sum, hi_sum;
  __device__ __forceinline__ void zero() { lo_sum = hi_sum = 0.0f; }
  // Every lane calls it (shuffles); the sums are valid in every lane.
  __device__ __forceinline__ void result(float& lo, float& hi) const {
    lo = lo_sum, hi = hi_sum;
    lo += __shfl_xor_sync(kFullMask, lo, 1), hi += __shfl_xor_sync(kFullMask, hi, 1);
    lo += __shfl_xor_sync(kFullMask, lo, 2), hi += __shfl_xor_sync(kFullMask, hi, 2);
  }
};

// The 4 words of a step on the tensor cores, the raw pairs of rows lo and hi multiplied by fa and fb
// (BIG: first by the exact 2^126, then by fa and fb).
template <bool BIG>
__device__ __forceinline__ void mma_words(const Slot& s, const uint4* x, uint32_t fa, uint32_t fb, float (&d)[4]) {
  const uint32_t wa[4] = {s.a.x, s.a.y, s.a.z, s.a.w}, wb[4] = {s.b.x, s.b.y, s.b.z, s.b.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t lo[4], hi[4];
    code_pairs(wa[w], lo);
    code_pairs(wb[w], hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (BIG) lo[i] = hmul2(lo[i], 0x7E807E80u), hi[i] = hmul2(hi[i], 0x7E807E80u);
      lo[i] = hmul2(lo[i], fa), hi[i] = hmul2(hi[i], fb);
    }
    const uint4 b = x[4 * w];  // word w's B fragment: 16 bytes, [step][word][c] order
    mma16816(d, lo[0], hi[0], lo[1], hi[1], b.x, b.y);
    mma16816(d, lo[2], hi[2], lo[3], hi[3], b.z, b.w);
  }
}

// One step on the tensor cores (every lane of the warp: mma): f = the staged factors {lo, hi} of
// the lane's chunk, x = its B groups (word w at x[4 w]), big (block-uniform) = the slow path.
__device__ __forceinline__ void step_sums(const Slot& s, uint2 f, const uint4* x, bool big, RowSums<true>& acc) {
  if (!big) return mma_words<false>(s, x, f.x, f.y, acc.d);
  mma_words<true>(s, x, slow_factor(f.x), slow_factor(f.y), acc.d);
}

// The same step on CUDA cores (f32 activations or h), f = the f32 scales {lo, hi}, x = the lane's
// 32 activations: exact E2M1 values, the chunk's sum unscaled, then one multiply-add by the scale.
__device__ __forceinline__ void step_sums(const Slot& s, uint2 f, const float* x, bool, RowSums<false>& acc) {
  const uint32_t wa[4] = {s.a.x, s.a.y, s.a.z, s.a.w}, wb[4] = {s.b.x, s.b.y, s.b.z, s.b.w};
  float pa = 0.0f, pb = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float va[8], vb[8], xv[8];
    fp4_experts::decode_word(wa[w], va);
    fp4_experts::decode_word(wb[w], vb);
    load_act_n<8>(x + 8 * w, xv);
#pragma unroll
    for (int n = 0; n < 8; ++n) pa = fmaf(va[n], xv[n], pa), pb = fmaf(vb[n], xv[n], pb);
  }
  acc.lo_sum = fmaf(pa, __uint_as_float(f.x), acc.lo_sum);
  acc.hi_sum = fmaf(pb, __uint_as_float(f.y), acc.hi_sum);
}

// Where a lane's activations of step `step` (counted from the row start) live in a staged row:
// bf16 rows are in fragment order ([step][word][c] groups of 16 bytes), f32 rows in plain order.
template <class T>
__device__ __forceinline__ const auto* step_x(const T* row, int step, int c) {
  if constexpr (std::is_same_v<T, bf16>) return reinterpret_cast<const uint4*>(row) + step * 16 + c;
  else return row + (step * kStepChunks + c) * 32;
}

// Stages `rows` rows of n values (source row r at src + row_of[r] * src_ld, or r * src_ld without
// row_of) in shared memory, each padded with zeros to `steps` whole steps; bf16 in fragment order:
// permuted here from plain order (z) or copied when `ordered` (the h scratch, whose pad chunks are
// never written).
// A thread's groups go B at a time: all their loads issued, then all their stores (one round of
// load latency per batch, not per group: z is 448 groups of 256 threads at L = 3584, B = 2; a
// token's h rows 768 at k = 16, I = 384, B = 3). The same values land in the same places.
template <int B, class T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, int rows, int64_t src_ld, int64_t n, int steps,
                                           bool ordered, const int* row_of = nullptr) {
  const int chunks = static_cast<int>(n / 32);
  if constexpr (std::is_same_v<T, bf16>) {
    const int per_row = steps * 16;  // 16-byte groups G = (step * 4 + word) * 4 + c
#pragma unroll 1
    for (int i0 = static_cast<int>(threadIdx.x); i0 < rows * per_row; i0 += B * kThreads) {
      uint4 v[B];
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const int i = i0 + b * kThreads;
        v[b] = make_uint4(0, 0, 0, 0);
        if (i < rows * per_row) {
          const int r = i / per_row, G = i - r * per_row;
          const int c = G & 3, w = (G >> 2) & 3, q = (G >> 4) * kStepChunks + c;
          const uint4* row = reinterpret_cast<const uint4*>(src + (row_of ? row_of[r] : r) * src_ld);
          if (q < chunks) v[b] = ordered ? row[G] : fragment_order(row[q * 4 + w]);
        }
      }
#pragma unroll
      for (int b = 0; b < B; ++b)
        if (i0 + b * kThreads < rows * per_row) reinterpret_cast<uint4*>(dst)[i0 + b * kThreads] = v[b];
    }
  } else {
    const int per_row = steps * kStepValues / 4;  // float4 groups
#pragma unroll 1
    for (int i0 = static_cast<int>(threadIdx.x); i0 < rows * per_row; i0 += B * kThreads) {
      float4 v[B];
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const int i = i0 + b * kThreads;
        v[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < rows * per_row) {
          const int r = i / per_row, G = i - r * per_row;
          const float4* row = reinterpret_cast<const float4*>(src + (row_of ? row_of[r] : r) * src_ld);
          if (G < chunks * 8) v[b] = row[G];
        }
      }
#pragma unroll
      for (int b = 0; b < B; ++b)
        if (i0 + b * kThreads < rows * per_row) reinterpret_cast<float4*>(dst)[i0 + b * kThreads] = v[b];
    }
  }
}

// Index of intermediate value i in a route's h row: fragment order for bf16, plain for f32.
template <class HT>
__device__ __forceinline__ int h_index(int i) {
  if constexpr (!std::is_same_v<HT, bf16>) return i;
  const int q = i >> 5, w = (i >> 3) & 3, n = i & 7;
  return ((((q >> 2) * 4 + w) * 4 + (q & 3)) << 3) + ((n & 3) << 1) + (n >> 2);
}

// Bytes of the staged scale pairs: 8 per (step, row pair, lane c).
__host__ __device__ inline int gate_up_scale_bytes(int steps_l) { return steps_l * kGuRows * kStepChunks * 8; }
__host__ __device__ inline int down_scale_bytes(int k, int steps_i) { return k * steps_i * 8 * kStepChunks * 8; }

}  // namespace
}  // namespace k3::kernels
