// kernels/mla/cuda_mla_decode_mma.cu: the tensor-core split_kv of the fused MLA decode op, strategy
// "cuda_decode_splitkv_mma" (mla_decode.h has the op's design, cuda_mla_decode.cuh the split).
// For bf16 activations over an fp8 e4m3 or bf16 latent cache; heads <= 16, kv_lora a multiple of 64 up to
// 512, kv_lora + rope a multiple of 16 up to 576, 16-byte aligned cache rows (supports() names the rest).
//
// Grid (splits, Q), 256 threads = 8 warps, a CTA per (query slot, split): every head of the slot (MQA: one
// shared [c_n | k_pe] entry per position). The split's positions stream through shared memory in stages
// of 64 positions (cp.async 16-byte copies, 2 stages: the next stage loads while this one is used; 37 KB a
// stage for the fp8 cache), the raw cache bytes as stored. Per stage:
//   scores  S[16 heads x 64 pos] = Qc[16 x E] C^T, mma M = heads (padded to 16, zero rows), N = positions,
//           K = E. Warp w: positions 32 (w >> 2) .. + 31 (4 n-tiles) x K quarter w & 3 (<= 9 k-steps),
//           its Qc fragments in registers for the whole split (bf16: q_lat is bf16-rounded, q_pe bf16:
//           exact), cache codes -> bf16 in registers (e4m3 values are bf16 values: exact). The four K
//           quarters' partial scores meet in shared memory and are added in quarter order.
//   softmax 16 threads per head, 4 positions each: s = scale * k_scale * S, online max / sum in fp32 (expf),
//           P = e^{s - m} rounded to the P.V operand type (f16 for fp8 codes, bf16 for a bf16 cache),
//           l sums the rounded P (the weights the P.V applies), factor = e^{m_old - m_new}.
//   P.V     O[16 x L] = factor O + P[16 x 64] Cn[64 x L], mma M = heads, N = latent columns, K = positions.
//           Warp w owns columns 64 w .. 64 w + 63 (8 n-tiles) in registers for the whole split. fp8:
//           B = the raw codes as f16 (exact), P in f16 (|P| <= 1, 11 bits), k_scale applied at the end;
//           bf16 cache: B and P in bf16. Products are exact, sums fp32 on the tensor core.
// Out: unnormalised o = k_scale * O (f32), m and l per head, as the CUDA-core kernel writes them.
// DCP form (kCp = true, mla_partial_attention, cuda_partial_via_decode.cu): grid (splits, Q, head groups) for
// G * H > 16 heads in balanced groups of <= 16 (each CTA streams its split once for its group), Qc read by
// activation row from [G][T][H][E], LOCAL positions j visible iff j * cp + rank <= P. The decode op's
// instantiations (kCp = false) compile to the same code as before the form existed (same register count:
// docs/perf/kernel-notes.md, mla_decode).
//
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 fragments (PTX ISA, "Matrix fragments for
// mma.m16n8k16"): lane = 4 * g + t (g = groupID = lane >> 2, t = threadID_in_group = lane & 3).
//   A [16 x 16] (row major), 4 x b32, each 2 elements, lower index in the low 16 bits:
//     a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B [16 x 8] ("col"), 2 x b32:   b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C/D [16 x 8] f32, 4 x f32:     c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// Index permutations used (a sum does not depend on the order of its terms, and an output column can
// be written anywhere as long as the store knows where):
//   scores K: logical k = 2t + i (i = 0, 1) and 2t + 8 + i of k-step s are cache element 16 s + 4 t + i and
//     16 s + 4 t + 2 + i, for Qc (A) and the cache (B) alike: a thread reads 4 consecutive entry elements
//     (one 32-bit fp8 / 64-bit bf16 load) per k-step.
//   P.V N: logical column g of n-tile b (0..7) of warp w is latent column 64 w + 8 g + b: a thread reads
//     its 8 columns of one position with one 64-bit (fp8) / 128-bit (bf16) load; so c0 / c1 of n-tile b
//     are columns 64 w + 16 t + b and 64 w + 16 t + 8 + b.
// Shared-memory row stride of the stage: the entry bytes rounded up to 16, plus 16 when that is an even
// number of 16-byte units, so stride / 4 = 4 (mod 8): the fp8 score loads (8 rows x 4 words) and P.V
// loads (4 rows 2 apart x 8 words) hit 32 distinct banks; the bf16 score loads have 2-way conflicts.
#include <cuda_fp16.h>

#include <string>

#include "kernels/mla/cuda_absorbed_kernels.cuh"
#include "kernels/mla/cuda_mla_decode.cuh"
#include "kernels/mla/mla_cp.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kStagePos = kMlaDecodeMmaStage;  // positions per cp.async stage (64)
constexpr int kStages = 2;
constexpr int kHeadsPad = 16;            // M of every mma: heads padded with zero rows
constexpr int kKQuarters = 4;            // scores: warp w & 3 owns a quarter of the k-steps
constexpr int kPosHalf = kStagePos / 2;  // scores: warp w >> 2 owns 32 positions (4 n-tiles)
constexpr int kMaxE = 576;               // entry width limit: 36 k-steps
constexpr int kMaxKsPerWarp = (kMaxE / 16 + kKQuarters - 1) / kKQuarters;  // 9 Qc fragments in registers
constexpr int kPvCols = 64;  // P.V: latent columns per warp (8 n-tiles of 8)
constexpr int kPvTiles = kPvCols / 8;
constexpr int kRedLd = kStagePos + 8;  // f32 row stride of the partial scores (conflict-free float2)
constexpr int kPLd = kStagePos + 8;    // 16-bit row stride of P (conflict-free 32-bit A loads)
static_assert(kThreads == 32 * kKQuarters * 2 && kStagePos == 64);
static_assert(kThreads == kHeadsPad * (kStagePos / 4));  // softmax: 16 threads per head, 4 positions each
static_assert(kWarps * kPvCols == kMlaMaxLatent && kHeadsPad == kDecodeMaxHeads);
static_assert(kThreads / 4 == kStagePos);  // loader: 4 threads per staged position

// ---------------------------------------------------------------- device helpers

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack_f16(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
// Two e4m3 codes (low byte first) -> f16x2 (low half first); exact.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t codes) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(codes & 0xffffu)));
  return h2;
}
// Two e4m3 codes -> bf16x2; exact (every e4m3 value is an f16 and a bf16 value).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t codes) {
  const float2 f = unpack_f16(fp8x2_to_f16x2(codes));
  return pack_bf16(f.x, f.y);
}

// d += A B for one m16n8k16 tile (fragments as in the file comment), f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Scores B fragment (k-step elements e = 16 s + 4 t .. + 3 of the staged entry at `p`): b0 = (e, e+1),
// b1 = (e+2, e+3) as bf16 pairs.
__device__ __forceinline__ void score_b(const uint8_t* p, uint32_t& b0, uint32_t& b1) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(p);  // 4 e4m3 codes, element e in the low byte
  b0 = fp8x2_to_bf16x2(w);
  b1 = fp8x2_to_bf16x2(w >> 16);
}
__device__ __forceinline__ void score_b(const bf16* p, uint32_t& b0, uint32_t& b1) {
  const uint2 w = *reinterpret_cast<const uint2*>(p);  // 4 bf16, element e in the low half of .x
  b0 = w.x;
  b1 = w.y;
}

// One P.V k-step (positions k0 .. k0 + 15 of the stage) for the warp's 8 n-tiles. `row` points at the
// thread's 8 columns (64 w + 8 g ..) of position k0 + 2 t; the k rows of b0 are positions k0 + 2t, +1, of
// b1 k0 + 2t + 8, + 9. Byte / half b of each loaded row is n-tile b's column.
__device__ __forceinline__ void pv_step(float (&acc)[kPvTiles][4], const uint32_t (&a)[4], const uint8_t* row,
                                        int stride) {
  const uint2 x0 = *reinterpret_cast<const uint2*>(row);               // position k0 + 2t
  const uint2 x1 = *reinterpret_cast<const uint2*>(row + stride);      // k0 + 2t + 1
  const uint2 x2 = *reinterpret_cast<const uint2*>(row + 8 * stride);  // k0 + 2t + 8
  const uint2 x3 = *reinterpret_cast<const uint2*>(row + 9 * stride);  // k0 + 2t + 9
#pragma unroll
  for (int b = 0; b < kPvTiles; ++b) {
    const uint32_t sel = (b & 3) | ((4 + (b & 3)) << 4);  // byte b & 3 of the first word, then of the second
    const uint32_t w0 = b < 4 ? x0.x : x0.y, w1 = b < 4 ? x1.x : x1.y;
    const uint32_t w2 = b < 4 ? x2.x : x2.y, w3 = b < 4 ? x3.x : x3.y;
    mma_f16(acc[b], a, fp8x2_to_f16x2(__byte_perm(w0, w1, sel)), fp8x2_to_f16x2(__byte_perm(w2, w3, sel)));
  }
}
__device__ __forceinline__ void pv_step(float (&acc)[kPvTiles][4], const uint32_t (&a)[4], const bf16* row,
                                        int stride) {
  const uint8_t* r = reinterpret_cast<const uint8_t*>(row);
  const uint4 x0 = *reinterpret_cast<const uint4*>(r);
  const uint4 x1 = *reinterpret_cast<const uint4*>(r + stride);
  const uint4 x2 = *reinterpret_cast<const uint4*>(r + 8 * stride);
  const uint4 x3 = *reinterpret_cast<const uint4*>(r + 9 * stride);
  const uint32_t v0[4] = {x0.x, x0.y, x0.z, x0.w}, v1[4] = {x1.x, x1.y, x1.z, x1.w};
  const uint32_t v2[4] = {x2.x, x2.y, x2.z, x2.w}, v3[4] = {x3.x, x3.y, x3.z, x3.w};
#pragma unroll
  for (int b = 0; b < kPvTiles; ++b) {
    const uint32_t sel = (b & 1) ? 0x7632u : 0x5410u;  // half b & 1 of the first word, then of the second
    mma_bf16(acc[b], a, __byte_perm(v0[b >> 1], v1[b >> 1], sel), __byte_perm(v2[b >> 1], v3[b >> 1], sel));
  }
}

// P (two positions) in the P.V operand type (f16 beside fp8 codes, else bf16), and those rounded values
// back as floats.
template <class CacheT>
__device__ __forceinline__ uint32_t pack_p(float lo, float hi, float2& rounded) {
  if constexpr (sizeof(CacheT) == 1) {
    const uint32_t w = pack_f16(lo, hi);
    rounded = unpack_f16(w);
    return w;
  } else {
    const uint32_t w = pack_bf16(lo, hi);
    rounded = unpack_bf16(w);
    return w;
  }
}

struct MmaParams {
  SeqTables sq;
  PagesRef pg;
  const float* qc;    // [Q][H][E]: bf16 values (kCp: [G][T][H / G][E] by activation row, cp below)
  float* part_o;      // [Q][H][splits][L]
  float* part_m;      // [Q][H][splits]
  float* part_l;      // [Q][H][splits]
  float score_scale;  // scale * k_scale (fp8) or scale
  float o_scale;      // k_scale (fp8) or 1
  int H, L, E;        // H: every head the kernel serves (kCp: G * owner heads, in head groups)
  int ks_total;       // E / 16 k-steps
  int row_bytes;      // E * sizeof(cache element): bytes staged per position (a multiple of 16)
  int stride;         // shared row stride in bytes (mma_row_stride)
  int splits;
  int64_t split_len;
  bool vec_out;     // part_o is 16-byte aligned (float4 stores)
  int group_heads;  // kCp: heads per CTA (<= 16): blockIdx.z owns heads group_heads * z .. (the last group may be short)
  absorbed::CpLayout cp;  // kCp: qc's [G][T][H / G] row layout and the rank's LOCAL positions (j * cp + rank <= P)
};

inline int mma_row_stride(int row_bytes) {
  const int units = (row_bytes + 15) / 16;
  return 16 * (units % 2 == 1 ? units : units + 1);
}
inline size_t mma_smem_bytes(int stride) {
  return static_cast<size_t>(kStages) * kStagePos * stride + sizeof(float) * kKQuarters * kHeadsPad * kRedLd +
         sizeof(uint16_t) * kHeadsPad * kPLd + sizeof(float) * kHeadsPad;
}

// kCp (mla_partial_attention under DCP): grid (splits, Q, head groups); the CTA serves heads h0 .. h0 + nh - 1
// (h0 = group_heads * blockIdx.z), reads their Qc by activation row from the [G][T][H][E] layout, sees the
// LOCAL positions j with j * cp + rank <= P (cuda_absorbed_kernels.cuh's cp_visible, as the CUDA-core
// split_kv_kernel<.., true>) and writes partials of heads h0 + h of [Q][H][splits]. !kCp is the decode op's
// kernel: h0 = 0 and nh = H fold to the constants it always had.
template <class CacheT, bool kCp>
__global__ void __launch_bounds__(kThreads, 2) split_kv_mma_kernel(MmaParams p, const CacheT* pages) {
  extern __shared__ uint4 mma_sm4[];
  uint8_t* stages = reinterpret_cast<uint8_t*>(mma_sm4);                              // [kStages][kStagePos][stride]
  float* red = reinterpret_cast<float*>(stages + kStages * kStagePos * p.stride);     // [kKQuarters][16][kRedLd]
  uint16_t* pm = reinterpret_cast<uint16_t*>(red + kKQuarters * kHeadsPad * kRedLd);  // [16][kPLd]: P bits
  float* factor = reinterpret_cast<float*>(pm + kHeadsPad * kPLd);                    // [16]
  const int split = blockIdx.x;
  const int64_t qi = blockIdx.y;
  const int h0 = kCp ? static_cast<int>(blockIdx.z) * p.group_heads : 0;  // first head of this CTA
  const int nh = kCp ? min(p.group_heads, p.H - h0) : p.H;                // heads of this CTA (<= 16)
  // PDL (kernels/cuda_common.cuh): no weights; the cache (the step's cache write), Qc and the tables are
  // the step's, so the wait comes first, before any early exit.
  pdl_launch_dependents();
  pdl_wait();
  int seq, i_row;
  if (!slot_used(p.sq, qi, seq, i_row)) return;  // the whole block: an unused slot
  int64_t visible;                               // (local) positions 0 .. visible - 1
  if constexpr (kCp)
    visible = absorbed::cp_visible(p.cp, static_cast<int64_t>(p.sq.position[seq]) + i_row);  // may be 0
  else visible = static_cast<int64_t>(p.sq.position[seq]) + i_row + 1;  // positions 0 .. position + i
  const int64_t j_begin = static_cast<int64_t>(split) * p.split_len;
  if (j_begin >= visible) return;  // the whole block: nothing visible in this split (combine skips it)
  const int64_t j_end = j_begin + p.split_len < visible ? j_begin + p.split_len : visible;
  const int num_tiles = static_cast<int>((j_end - j_begin + kStagePos - 1) / kStagePos);
  const int32_t* table = p.sq.block_table + seq * p.sq.bt_ld;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

  // Stage loader: thread -> position tid / 4 of the stage, 16-byte chunks tid % 4, + 4, ...; positions past
  // the split's end are zero rows (their scores are masked, their P is 0: 0 * 0 adds nothing). One commit
  // group per call, empty past the last tile, so "wait_group 1" below always means "tile t has landed".
  const auto issue_tile = [&](int tile) {
    if (tile < num_tiles) {
      const int64_t j0 = j_begin + static_cast<int64_t>(tile) * kStagePos;
      const int n = static_cast<int>(j_end - j0 < kStagePos ? j_end - j0 : kStagePos);
      const int r = tid >> 2;
      uint8_t* dst = stages + ((tile % kStages) * kStagePos + r) * p.stride;
      if (r < n) {
        const uint8_t* src = reinterpret_cast<const uint8_t*>(pages + position_offset(p.pg, table, j0 + r));
        for (int c = tid & 3; c < p.row_bytes / 16; c += 4) cp_async16(dst + 16 * c, src + 16 * c);
      } else {
        for (int c = tid & 3; c < p.row_bytes / 16; c += 4)
          *reinterpret_cast<uint4*>(dst + 16 * c) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  };
  issue_tile(0);
  issue_tile(1);

  // Qc fragments (A of the scores) of this warp's k-steps, for the whole split; zero rows past H.
  const int kq = warp & (kKQuarters - 1), ph = warp / kKQuarters;
  const int ks_begin = kq * p.ks_total / kKQuarters, ks_count = (kq + 1) * p.ks_total / kKQuarters - ks_begin;
  uint32_t qa[kMaxKsPerWarp][4];
  {
    const bool lo_ok = g < nh, hi_ok = g + 8 < nh;
    const float* q_lo;  // head h0 + g
    const float* q_hi;  // head h0 + g + 8
    if constexpr (kCp) {
      const int64_t t_row = static_cast<int64_t>(p.sq.row_begin[seq]) + i_row;  // the slot's activation row
      q_lo = p.qc + absorbed::cp_row(p.cp, h0 + (lo_ok ? g : 0), t_row) * p.E;
      q_hi = p.qc + absorbed::cp_row(p.cp, h0 + (hi_ok ? g + 8 : 0), t_row) * p.E;
    } else {
      q_lo = p.qc + (qi * p.H + (lo_ok ? g : 0)) * p.E;
      q_hi = p.qc + (qi * p.H + (hi_ok ? g + 8 : 0)) * p.E;
    }
#pragma unroll
    for (int i = 0; i < kMaxKsPerWarp; ++i) {
      float lo[4] = {0.0f, 0.0f, 0.0f, 0.0f}, hi[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (i < ks_count) {
        const int e = 16 * (ks_begin + i) + 4 * t;  // logical k 2t, 2t+1, 2t+8, 2t+9 = elements e .. e + 3
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (lo_ok) lo[j] = q_lo[e + j];
          if (hi_ok) hi[j] = q_hi[e + j];
        }
      }
      qa[i][0] = pack_bf16(lo[0], lo[1]);  // exact: Qc holds bf16 values
      qa[i][1] = pack_bf16(hi[0], hi[1]);
      qa[i][2] = pack_bf16(lo[2], lo[3]);
      qa[i][3] = pack_bf16(hi[2], hi[3]);
    }
  }

  const int sh = tid >> 4, sc4 = 4 * (tid & 15);  // softmax: head sh, positions sc4 .. sc4 + 3
  float m_run = -INFINITY, l_run = 0.0f;
  const int pv_col0 = warp * kPvCols;
  const bool pv_active = pv_col0 < p.L;  // L % 64 == 0: a warp's 64 columns are all inside or all outside
  float acc[kPvTiles][4];
#pragma unroll
  for (int b = 0; b < kPvTiles; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int64_t j0 = j_begin + static_cast<int64_t>(tile) * kStagePos;
    const int n = static_cast<int>(j_end - j0 < kStagePos ? j_end - j0 : kStagePos);  // >= 1
    const uint8_t* st = stages + (tile % kStages) * kStagePos * p.stride;
    cp_async_wait<1>();
    __syncthreads();  // A: the stage's copies and zero rows of every thread are visible

    // Scores: this warp's 4 n-tiles x its k-steps; partial sums to red[kq].
    {
      float sacc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxKsPerWarp; ++i) {
        if (i < ks_count) {  // warp-uniform
          const int ebyte = (16 * (ks_begin + i) + 4 * t) * static_cast<int>(sizeof(CacheT));
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int pos0 = kPosHalf * ph + 8 * nt;
            if (pos0 < n) {  // warp-uniform; rows past n are zeros anyway
              uint32_t b0, b1;
              score_b(reinterpret_cast<const CacheT*>(st + (pos0 + g) * p.stride + ebyte), b0, b1);
              mma_bf16(sacc[nt], qa[i], b0, b1);
            }
          }
        }
      }
      float* rq = red + kq * kHeadsPad * kRedLd;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int pos = kPosHalf * ph + 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(rq + g * kRedLd + pos) = make_float2(sacc[nt][0], sacc[nt][1]);
        *reinterpret_cast<float2*>(rq + (g + 8) * kRedLd + pos) = make_float2(sacc[nt][2], sacc[nt][3]);
      }
    }
    __syncthreads();  // B: partial scores ready

    // Online softmax: 16 threads (one half-warp) per head; shuffles stay inside the half-warp.
    {
      float s[4];
      {
        const float4 r0 = *reinterpret_cast<const float4*>(red + (0 * kHeadsPad + sh) * kRedLd + sc4);
        const float4 r1 = *reinterpret_cast<const float4*>(red + (1 * kHeadsPad + sh) * kRedLd + sc4);
        const float4 r2 = *reinterpret_cast<const float4*>(red + (2 * kHeadsPad + sh) * kRedLd + sc4);
        const float4 r3 = *reinterpret_cast<const float4*>(red + (3 * kHeadsPad + sh) * kRedLd + sc4);
        s[0] = ((r0.x + r1.x) + r2.x) + r3.x;  // quarters in order
        s[1] = ((r0.y + r1.y) + r2.y) + r3.y;
        s[2] = ((r0.z + r1.z) + r2.z) + r3.z;
        s[3] = ((r0.w + r1.w) + r2.w) + r3.w;
      }
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[j] = sc4 + j < n ? s[j] * p.score_scale : -INFINITY;
        mx = fmaxf(mx, s[j]);
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
      const float m_new = fmaxf(m_run, mx);  // finite: position 0 of the stage is always visible
      float e[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) e[j] = sc4 + j < n && sh < nh ? expf(s[j] - m_new) : 0.0f;
      float2 r01, r23;
      const uint32_t w01 = pack_p<CacheT>(e[0], e[1], r01);
      const uint32_t w23 = pack_p<CacheT>(e[2], e[3], r23);
      float lsum = (r01.x + r01.y) + (r23.x + r23.y);
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) lsum += __shfl_xor_sync(kFullMask, lsum, o);
      const float corr = expf(m_run - m_new);  // 0 on the first tile (m_run = -inf)
      l_run = l_run * corr + lsum;
      m_run = m_new;
      *reinterpret_cast<uint2*>(pm + sh * kPLd + sc4) = make_uint2(w01, w23);
      if ((tid & 15) == 0) factor[sh] = corr;
    }
    __syncthreads();  // C: P and factor ready

    // P.V: rescale the running O, then add this stage.
    if (pv_active) {  // warp-uniform
      const float f_lo = factor[g], f_hi = factor[g + 8];
#pragma unroll
      for (int b = 0; b < kPvTiles; ++b) acc[b][0] *= f_lo, acc[b][1] *= f_lo, acc[b][2] *= f_hi, acc[b][3] *= f_hi;
#pragma unroll
      for (int kk = 0; kk < kStagePos / 16; ++kk) {
        if (16 * kk < n) {  // warp-uniform
          const uint16_t* prow = pm + g * kPLd + 16 * kk + 2 * t;
          const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(prow),             // head g, positions 2t, 2t+1
                                 *reinterpret_cast<const uint32_t*>(prow + 8 * kPLd),  // head g + 8
                                 *reinterpret_cast<const uint32_t*>(prow + 8),         // head g, positions 2t+8, +9
                                 *reinterpret_cast<const uint32_t*>(prow + 8 * kPLd + 8)};  // head g + 8
          const uint8_t* row = st + (16 * kk + 2 * t) * p.stride + (pv_col0 + 8 * g) * static_cast<int>(sizeof(CacheT));
          pv_step(acc, a, reinterpret_cast<const CacheT*>(row), p.stride);
        }
      }
    }
    __syncthreads();  // D: this stage, red, P and factor may be rewritten
    issue_tile(tile + 2);
  }

  // Out: c0 / c1 of n-tile b are columns pv_col0 + 16 t + b and + 8 + b of head g (c2 / c3: head g + 8).
  if (pv_active) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = g + 8 * hh;
      if (h < nh) {
        float* dst = p.part_o + ((qi * p.H + h0 + h) * p.splits + split) * p.L + pv_col0 + 16 * t;
        float v[16];
#pragma unroll
        for (int b = 0; b < kPvTiles; ++b) v[b] = acc[b][2 * hh] * p.o_scale, v[8 + b] = acc[b][2 * hh + 1] * p.o_scale;
        if (p.vec_out) {
#pragma unroll
          for (int k = 0; k < 4; ++k)
            reinterpret_cast<float4*>(dst)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        } else {
#pragma unroll
          for (int k = 0; k < 16; ++k) dst[k] = v[k];
        }
      }
    }
  }
  if ((tid & 15) == 0 && sh < nh) {
    const int64_t base = (qi * p.H + h0 + sh) * p.splits + split;
    p.part_m[base] = m_run;
    p.part_l[base] = l_run;
  }
}

}  // namespace

namespace cuda_detail {

namespace {
// What both forms need of the dims and the cache beyond its dtype: kv_lora, the entry width E, 16-byte cache
// rows, shared memory. Empty when they fit, else the reason.
std::string mma_shape_problem(const CudaOps& ops, const core::TensorView& pages, int64_t kv_lora, int64_t E) {
  if (kv_lora % kPvCols != 0 || kv_lora > kMlaMaxLatent)
    return "kv_lora must be a multiple of 64 up to 512 (a warp's P.V columns), got " + std::to_string(kv_lora);
  if (E % 16 != 0 || E > kMaxE)
    return "kv_lora + qk_rope must be a multiple of 16 up to 576 (the score mma's k-steps), got " + std::to_string(E);
  const int64_t elem = static_cast<int64_t>(core::dtype_size(pages.dtype));
  if (!aligned16(pages.data) || (pages.dim(0) > 1 && pages.strides[0] * elem % 16 != 0) ||
      (pages.dim(1) > 1 && pages.strides[1] * elem % 16 != 0))
    return "cache rows must start at 16-byte boundaries (cp.async copies), got pages at " +
           std::to_string(reinterpret_cast<uintptr_t>(pages.data) % 16) + " mod 16 with strides [" +
           std::to_string(pages.strides[0]) + ", " + std::to_string(pages.strides[1]) + "]";
  const size_t smem = mma_smem_bytes(mma_row_stride(static_cast<int>(E * elem)));
  if (smem > ops.ctx->smem_optin())
    return "needs " + std::to_string(smem) + " bytes of shared memory, the device allows " +
           std::to_string(ops.ctx->smem_optin());
  return "";
}
bool mma_cache_dtype(core::DType d) { return d == core::DType::f8_e4m3 || d == core::DType::bf16; }

// The parameters both forms share (cache, scales, dims, strides, splits, partials).
MmaParams mma_params(const core::TensorView& pages, const SeqBatch& seqs, float scale, float k_scale, int H, int L,
                     int E, int splits, int64_t split_len, float* part_o, float* part_m, float* part_l) {
  MmaParams p;
  p.sq = seq_tables(seqs);
  p.pg = pages_ref(pages);
  p.part_o = part_o;
  p.part_m = part_m;
  p.part_l = part_l;
  const bool fp8 = pages.dtype == core::DType::f8_e4m3;
  p.score_scale = fp8 ? scale * k_scale : scale;
  p.o_scale = fp8 ? k_scale : 1.0f;
  p.H = H, p.L = L, p.E = E;
  p.ks_total = E / 16;
  p.row_bytes = E * static_cast<int>(core::dtype_size(pages.dtype));
  p.stride = mma_row_stride(p.row_bytes);
  p.splits = splits, p.split_len = split_len;
  p.vec_out = aligned16(part_o);
  p.group_heads = H;  // the decode form: one group of every head
  return p;
}

// One launch of split_kv_mma_kernel<CacheT, kCp> as a programmatic dependent (every launch site of the
// kernel does so: cuda_common.cuh's PDL rule 4).
template <bool kCp>
void launch_mma(const CudaOps& ops, const core::TensorView& pages, const MmaParams& p, dim3 grid) {
  const size_t smem = mma_smem_bytes(p.stride);
  if (pages.dtype == core::DType::f8_e4m3) {
    allow_smem(ops, split_kv_mma_kernel<uint8_t, kCp>, smem);
    launch_dependent(split_kv_mma_kernel<uint8_t, kCp>, grid, dim3(kThreads), smem, ops.ctx->stream(), dim3(1, 1, 1), p,
                     pages.as<const uint8_t>());
  } else {
    allow_smem(ops, split_kv_mma_kernel<bf16, kCp>, smem);
    launch_dependent(split_kv_mma_kernel<bf16, kCp>, grid, dim3(kThreads), smem, ops.ctx->stream(), dim3(1, 1, 1), p,
                     pages.as<const bf16>());
  }
}
}  // namespace

core::Status split_kv_mma_supports(const CudaOps& ops, const MlaDecodeArgs& a) {
  const auto no = [](const std::string& why) { return core::Status::fail("tensor-core split_kv: " + why); };
  if (a.q.dtype != core::DType::bf16)
    return no("needs bf16 activations (Precision::bf16), got " + std::string(core::dtype_name(a.q.dtype)) +
              " q (f32 activations run on cuda_decode_splitkv)");
  if (!mma_cache_dtype(a.pages.dtype))
    return no("needs an f8_e4m3 or bf16 cache (exact as bf16 mma operands), got " +
              std::string(core::dtype_name(a.pages.dtype)) + " pages");
  if (a.num_heads > kHeadsPad)
    return no("num_heads must be <= 16 (one mma M tile), got " + std::to_string(a.num_heads));
  if (std::string why = mma_shape_problem(ops, a.pages, a.kv_lora, int64_t{a.kv_lora} + a.qk_rope); !why.empty())
    return no(why);
  return core::Status::ok();
}

void launch_split_kv_mma(const CudaOps& ops, const MlaDecodeArgs& a, const DecodePlan& plan) {
  MmaParams p = mma_params(a.pages, a.seqs, a.scale, a.k_scale, plan.H, plan.L, plan.E, plan.splits, plan.split_len,
                           plan.part_o, plan.part_m, plan.part_l);
  p.qc = plan.qc;
  launch_mma<false>(ops, a.pages, p, dim3(plan.splits, static_cast<unsigned>(plan.Q)));
  K3_CUDA_CHECK_LAUNCH("mla_decode split_kv_mma_kernel");
}

core::Status partial_split_kv_mma_supports(const CudaOps& ops, const MlaPartialAttentionArgs& a) {
  const auto no = [](const std::string& why) { return core::Status::fail("tensor-core partial split_kv: " + why); };
  if (a.precision != Precision::bf16)
    return no(
        "needs bf16-valued qc (precision bf16: mla_q_absorb's bf16 mode), got precision fp32 (fp32 runs on "
        "cuda_partial_splitkv)");
  if (!mma_cache_dtype(a.pages.dtype))
    return no("needs an f8_e4m3 or bf16 cache (exact as bf16 mma operands), got " +
              std::string(core::dtype_name(a.pages.dtype)) + " pages");
  if (std::string why = mma_shape_problem(ops, a.pages, a.o_part.dim(3), a.qc.dim(3)); !why.empty()) return no(why);
  return core::Status::ok();
}

void launch_partial_split_kv_mma(const CudaOps& ops, const MlaPartialAttentionArgs& a, const PartialMmaPlan& plan) {
  MmaParams p = mma_params(a.pages, a.seqs, a.scale, a.k_scale, plan.heads, plan.L, plan.E, plan.splits, plan.split_len,
                           plan.part_o, plan.part_m, plan.part_l);
  p.qc = a.qc.as<const float>();
  p.group_heads = plan.group_heads;
  p.cp.rows = a.qc.dim(1);
  p.cp.owner_heads = static_cast<int>(a.qc.dim(2));
  p.cp.cp_size = a.cp_size;
  p.cp.cp_rank = a.cp_rank;
  launch_mma<true>(ops, a.pages, p, dim3(plan.splits, static_cast<unsigned>(plan.Q), plan.groups));
  K3_CUDA_CHECK_LAUNCH("mla_partial_attention split_kv_mma_kernel");
}

}  // namespace cuda_detail

}  // namespace k3::kernels
