// kernels/mla/cuda_naive_flash.cu: the tensor-core MLA prefill (naive form, spec §6.1), strategy
// "cuda_expand_gemm_flash" of mla_naive (cuda_naive.cu's "cuda_expand_online_softmax" stays for
// Precision::fp32, f32 caches and every shape refused here). Three launches per call, every sequence of the
// batch in each (grids and scratch from the host integers num_seqs, max_rows, max_tokens, H: graph-replayable):
//   1. latent_bf16_kernel: the cache of sequence s, positions 0 .. max_tokens-1, as bf16 rows at
//      s * max_tokens + j: latent [rows, kv_lora] and k_pe [rows, rope] (zeros past the sequence's end).
//      bf16 caches are copied; fp8 e4m3 codes times k_scale are exact in bf16 when k_scale is a power of two
//      (3-bit mantissa times 2^k), which supports() demands: the GEMM's inputs are then the reference's
//      dequantised f32 values bit for bit (another k_scale goes to the old strategy).
//   2. KV = round_bf16(latent kv_b^T) [rows, H * (nope + v)] with one cuBLASLt GEMM (linear_cublaslt_run:
//      bf16 x bf16, fp32 accumulation, one rounding on output = the reference's round_act of k_nope and v).
//   3. flash_kernel: a CTA per (tile of 16 * kWarps query rows, head h, sequence s), kWarps warps of 16 rows;
//      Q in registers as mma A fragments (bf16 mode: q holds bf16 values, exact). K tiles of 64 keys
//      ([k_nope | k_pe], row j = key j) and V tiles stream through shared memory with cp.async, 2 stages,
//      each tile loaded once per CTA for all its rows. Per tile: S = Q K^T (mma m16n8k16 bf16, fp32
//      accumulation), s = scale * S, causal mask (row i, at position p_s + i, sees keys j <= p_s + i),
//      online softmax in fp32 with expf, P = bf16(e^{s - m}) for P V, O rounded once at the end.
// Rows of q / out that belong to no sequence are neither read nor written; row tiles past a sequence's
// num_rows exit at once; keys past the tile's last visible key are zero-filled and masked.
//
// Per call, a 512-row chunk of one sequence at context n (TP8: H 12, nope 128, rope 64, v 128, kv_lora 512):
//                         n = 8192                           n = 46080
//   1. latent/k_pe     read 4.7 MB (fp8), write 9.4 MB     read 27 MB, write 53 MB
//   2. GEMM            n * 3072 * 512 * 2 = 25.8 GFLOP       145 GFLOP; KV written 283 MB (bf16)
//                      (+ 50 MB KV written)
//   3. flash           grid (8, 12, 1) = 96 CTAs x 128 thr,  same grid;
//                      512 * n * 12 * (192 + 128) * 2        181 GFLOP; K/V read 96 x 29.5 MB = 2.8 GB
//                      = 32 GFLOP (causal: each row sees     from L2 (DRAM: ~300 MB once)
//                      ~n keys); K/V read per CTA n * 640 B
//                      = 5.2 MB, 503 MB in all from L2
//   expected (H200: cuBLASLt ~500 TFLOP/s bf16; an mma.sync CTA of 4 warps ~2.5 TFLOP/s, one per SM, an
//   estimate to check): n = 8K: 0.05 + 0.34 GFLOP/CTA / 2.5 TF = 0.14 ms -> ~0.2 ms;
//   n = 46K: 0.3 ms GEMM + 1.89 GFLOP/CTA / 2.5 TF = 0.75 ms -> ~1.1 ms (measured: docs/perf/ops_gpu.md).
//   96 CTAs leave 36 of 132 SMs idle; a split of the keys over CTAs (flash-decoding) is the next step.
//
// Numerics against the reference: K/V and O rounded at the reference's points; S and the softmax in fp32
// (tensor-core sums in another order: rounding-level differences); P rounded to bf16 before P V (relative
// error <= 2^-9 per weight; l sums the rounded weights, so O is an exact convex combination of the V rows
// of those weights: |O - O_ref| <= 2^-8 * max_j |v_j| in the worst case, ~2^-9 / sqrt(n) typical).
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (PTX ISA "Matrix fragments for mma.m16n8k16
// with floating point type"): lane = 4 g + t (g = lane >> 2, t = lane & 3); each b32 holds 2 bf16, the lower
// column / k index in the low 16 bits.
//   A [16 x 16] row-major: a0 = A[g][2t, 2t+1]  a1 = A[g+8][2t, 2t+1]  a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B [16 x 8]  (k x n):   b0 = B[2t, 2t+1][g]  b1 = B[2t+8, 2t+9][g]
//   C [16 x 8]  f32:       c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// ldmatrix.m8n8.x4.b16: lanes 8i .. 8i+7 give the 8 row addresses (16 B each) of matrix i; register d_i gets
// matrix i's row g, elements 2t, 2t+1. With .trans: d_i gets elements (row 2t, col g) and (row 2t+1, col g).
//   S = Q K^T: B[k][n] = K[key n][dim k]: K rows in shared memory are B's columns, so plain ldmatrix of
//     matrices (keys +0, dims +0), (keys +0, dims +8), (keys +8, dims +0), (keys +8, dims +8) gives b0, b1 of
//     n-tile 2np and b0, b1 of n-tile 2np + 1: lane address key = 16 np + (lane & 7) + 8 (lane >> 4),
//     dim = 16 ks + 8 ((lane >> 3) & 1).
//   O += P V: A = P: the C fragments of n-tiles 2kk, 2kk+1 (keys 16kk .. 16kk+15) are, pairwise packed,
//     a0 = (c0, c1) of 2kk, a1 = (c2, c3) of 2kk, a2 = (c0, c1) of 2kk+1, a3 = (c2, c3) of 2kk+1.
//     B[k][n] = V[key k][col n] is stored k-major: ldmatrix.trans of matrices (keys +0, cols +0), (keys +8,
//     cols +0), (keys +0, cols +8), (keys +8, cols +8) gives b0, b1 of n-tile 2vp and of 2vp + 1: lane
//     address key = 16 kk + (lane & 7) + 8 ((lane >> 3) & 1), col = 16 vp + 8 (lane >> 4).
// Shared rows are padded to 400 B (K) and 272 B (V): both 4 words mod 32, so the 8 rows of one 8x8 matrix
// fall on 8 distinct 16-byte bank groups (conflict-free ldmatrix).
#include "kernels/mla/cuda_naive_flash.cuh"

#include <cmath>
#include <string>

#include "kernels/linear/cuda_linear.h"
#include "kernels/mla/cuda_mla_common.cuh"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kKeys = 64;         // keys per K/V tile (one cp.async stage)
constexpr int kMaxQk = 192;       // nope + rope limit (K3: 128 + 64): 12 k-steps of Q fragments in registers
constexpr int kMaxVd = 128;       // v_head_dim limit (K3: 128): 16 n-tiles of O accumulators in registers
constexpr int kKLd = kMaxQk + 8;  // shared row stride of a K tile, bf16 elements (400 B)
constexpr int kVLd = kMaxVd + 8;  // of a V tile (272 B)
constexpr int kStageElems = kKeys * (kKLd + kVLd);
constexpr size_t kSmemBytes = 2 * static_cast<size_t>(kStageElems) * sizeof(bf16);  // 2 stages: 86016 B

// ---------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; !valid writes 16 zero bytes and reads nothing (src-size 0).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], uint32_t addr) {
  asm("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(addr)
      : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&d)[4], uint32_t addr) {
  asm("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(addr)
      : "memory");
}
// c += A B (m16n8k16, bf16 in, fp32 accumulation).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as a bf16 pair (round to nearest even), lo in the low 16 bits.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// ---------------------------------------------------------------- 1. latent and k_pe as bf16

// latent[(s * max_tokens + j) * L + i], k_pe[(s * max_tokens + j) * rope + r]: cache values of position j of
// sequence s (fp8: code * k_scale, exact in bf16 for a power-of-two k_scale), zeros past its end.
template <class CacheT>
__global__ void latent_bf16_kernel(SeqTables sq, const CacheT* pages, PagesRef pg, float k_scale, bf16* latent,
                                   bf16* k_pe, int L, int rope) {
  const int64_t E = L + rope;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(sq.num_seqs) * sq.max_tokens * E) return;
  const int64_t slot = idx / E;
  const int i = static_cast<int>(idx % E);
  const int s = static_cast<int>(slot / sq.max_tokens);
  const int64_t j = slot % sq.max_tokens;
  const int64_t end = static_cast<int64_t>(sq.position[s]) + sq.num_rows[s];
  const float v = j < end ? cache_elem(pages, position_offset(pg, sq.block_table + s * sq.bt_ld, j) + i, k_scale)
                          : 0.0f;
  const bf16 b = __float2bfloat16_rn(v);
  if (i < L) latent[slot * L + i] = b;
  else k_pe[slot * rope + (i - L)] = b;
}

// ---------------------------------------------------------------- 3. flash attention

struct FlashArgs {
  SeqTables sq;
  const bf16* kv = nullptr;    // [num_seqs * max_tokens, H * (nope + vd)]: per head k_nope then v
  const bf16* k_pe = nullptr;  // [num_seqs * max_tokens, rope]
  int64_t q_ld = 0, out_ld = 0;
  int heads = 0, nope = 0, rope = 0, vd = 0;
  float scale = 0.0f;
  bool round = true;
};

// Grid (ceil(max_rows / (16 kWarps)), H, num_seqs); dynamic shared memory kSmemBytes.
template <int kWarps, class T>
__global__ void __launch_bounds__(kWarps * 32) flash_kernel(FlashArgs f, const T* __restrict__ q, T* __restrict__ out) {
  constexpr int kRows = 16 * kWarps, kThreads = 32 * kWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);  // 2 stages of K [kKeys][kKLd] then V [kKeys][kVLd]
  const int s = blockIdx.z, h = blockIdx.y;
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // last row tiles (most keys) first
  const int nr = f.sq.num_rows[s], r0 = tile * kRows;
  if (r0 >= nr) return;  // the whole block, before any barrier
  const int64_t pos = f.sq.position[s], row_begin = f.sq.row_begin[s];
  const int64_t kend = pos + min(r0 + kRows, nr);  // the tile's rows see keys 0 .. kend-1
  const int n_tiles = static_cast<int>((kend + kKeys - 1) / kKeys);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int qk = f.nope + f.rope, head_width = f.nope + f.vd;
  const int64_t kv_ld = static_cast<int64_t>(f.heads) * head_width;
  const int64_t seq_row0 = static_cast<int64_t>(s) * f.sq.max_tokens;
  const bf16* kv_head = f.kv + seq_row0 * kv_ld + static_cast<int64_t>(h) * head_width;
  const bf16* pe_seq = f.k_pe + seq_row0 * f.rope;

  // Stage `stage` <- key tile kt: K row r = [k_nope | k_pe] of key 64 kt + r, V row r = its v; 16-byte
  // chunks (every dim a multiple of 16: rows and offsets 16-byte aligned); keys >= kend zero-filled.
  const int nope_chunks = f.nope / 8, k_chunks = qk / 8, v_chunks = f.vd / 8;
  auto load_tile = [&](int stage, int kt) {
    bf16* ks = smem + stage * kStageElems;
    bf16* vs = ks + kKeys * kKLd;
    const int64_t j0 = static_cast<int64_t>(kt) * kKeys;
    for (int c = tid; c < kKeys * k_chunks; c += kThreads) {
      const int r = c / k_chunks, ch = c % k_chunks;
      const int64_t j = j0 + r;
      const bool valid = j < kend;
      const bf16* src = !valid             ? f.kv
                        : ch < nope_chunks ? kv_head + j * kv_ld + ch * 8
                                           : pe_seq + j * f.rope + (ch - nope_chunks) * 8;
      cp_async16(smem_addr(ks + r * kKLd + ch * 8), src, valid);
    }
    for (int c = tid; c < kKeys * v_chunks; c += kThreads) {
      const int r = c / v_chunks, ch = c % v_chunks;
      const int64_t j = j0 + r;
      const bool valid = j < kend;
      const bf16* src = valid ? kv_head + j * kv_ld + f.nope + ch * 8 : f.kv;
      cp_async16(smem_addr(vs + r * kVLd + ch * 8), src, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  // This thread's query rows (sequence-relative): row_a = warp's row g, row_b = row g + 8. Rows past nr
  // are zeros (never stored); they still see key 0, so their softmax stays finite.
  const int row_a = r0 + 16 * warp + g, row_b = row_a + 8;
  const bool warp_active = r0 + 16 * warp < nr;
  const int64_t last_a = pos + row_a, last_b = pos + row_b;  // last key each row sees (causal)
  const int64_t warp_last = pos + min(r0 + 16 * warp + 15, nr - 1);
  uint32_t qf[kMaxQk / 16][4];
  {
    const T* qa = q + (row_begin + min(row_a, nr - 1)) * f.q_ld + static_cast<int64_t>(h) * qk;
    const T* qb = q + (row_begin + min(row_b, nr - 1)) * f.q_ld + static_cast<int64_t>(h) * qk;
    const bool in_a = row_a < nr, in_b = row_b < nr;
#pragma unroll
    for (int ks = 0; ks < kMaxQk / 16; ++ks) {
      const int c = ks * 16 + 2 * t;
      const bool in_k = ks < qk / 16;
      qf[ks][0] = in_k && in_a ? pack_bf16(to_f32(qa[c]), to_f32(qa[c + 1])) : 0u;
      qf[ks][1] = in_k && in_b ? pack_bf16(to_f32(qb[c]), to_f32(qb[c + 1])) : 0u;
      qf[ks][2] = in_k && in_a ? pack_bf16(to_f32(qa[c + 8]), to_f32(qa[c + 9])) : 0u;
      qf[ks][3] = in_k && in_b ? pack_bf16(to_f32(qb[c + 8]), to_f32(qb[c + 9])) : 0u;
    }
  }

  float o[kMaxVd / 8][4];
#pragma unroll
  for (int vn = 0; vn < kMaxVd / 8; ++vn) o[vn][0] = o[vn][1] = o[vn][2] = o[vn][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this thread's columns only
  const int mi = lane >> 3;                                        // the 8x8 matrix this lane addresses in ldmatrix.x4

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      load_tile((kt + 1) & 1, kt + 1);  // the stage tile kt - 1 used: freed by the barrier ending it
      cp_async_commit();
      cp_async_wait<1>();  // tile kt's group has landed (this thread's copies)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile kt visible
    const int64_t j0 = static_cast<int64_t>(kt) * kKeys;
    if (warp_active && j0 <= warp_last) {  // warp-uniform: tiles past the warp's last key are skipped
      const bf16* ks_tile = smem + (kt & 1) * kStageElems;
      const bf16* vs_tile = ks_tile + kKeys * kKLd;
      float sc[kKeys / 8][4];
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
        // S = Q K^T over the qk dims (nope, then rope columns of the K row).
#pragma unroll
      for (int ks = 0; ks < kMaxQk / 16; ++ks) {
        if (ks < qk / 16) {
#pragma unroll
          for (int np = 0; np < kKeys / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(ks_tile + (np * 16 + (lane & 7) + 8 * (mi >> 1)) * kKLd + ks * 16 + 8 * (mi & 1)));
            mma_bf16(sc[2 * np], qf[ks], b[0], b[1]);
            mma_bf16(sc[2 * np + 1], qf[ks], b[2], b[3]);
          }
        }
      }
      // Scale, causal mask, row maxima (a row's 64 keys live in the 4 lanes of its quad).
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t j = j0 + nt * 8 + 2 * t + e;
          sc[nt][e] = j <= last_a && j < kend ? f.scale * sc[nt][e] : -INFINITY;
          sc[nt][2 + e] = j <= last_b && j < kend ? f.scale * sc[nt][2 + e] : -INFINITY;
          mx_a = fmaxf(mx_a, sc[nt][e]);
          mx_b = fmaxf(mx_b, sc[nt][2 + e]);
        }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 2));
      // Tile 0 holds key 0, visible to every row: m is finite from then on (no inf - inf).
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      const float corr_a = expf(m_a - mn_a), corr_b = expf(m_b - mn_b);  // 0 on the first tile
      m_a = mn_a;
      m_b = mn_b;
      l_a *= corr_a;
      l_b *= corr_b;
#pragma unroll
      for (int vn = 0; vn < kMaxVd / 8; ++vn) {
        o[vn][0] *= corr_a;
        o[vn][1] *= corr_a;
        o[vn][2] *= corr_b;
        o[vn][3] *= corr_b;
      }
      // P = bf16(e^{s - m}) straight into A fragments; l sums the rounded weights.
      uint32_t pf[kKeys / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float(&c)[4] = sc[2 * kk + half];
          const __nv_bfloat162 pa = __floats2bfloat162_rn(expf(c[0] - m_a), expf(c[1] - m_a));
          const __nv_bfloat162 pb = __floats2bfloat162_rn(expf(c[2] - m_b), expf(c[3] - m_b));
          l_a += __low2float(pa) + __high2float(pa);
          l_b += __low2float(pb) + __high2float(pb);
          pf[kk][2 * half] = *reinterpret_cast<const uint32_t*>(&pa);
          pf[kk][2 * half + 1] = *reinterpret_cast<const uint32_t*>(&pb);
        }
        // O += P V.
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
        for (int vp = 0; vp < kMaxVd / 16; ++vp) {
          if (vp < f.vd / 16) {
            uint32_t b[4];
            ldmatrix_x4_trans(
                b, smem_addr(vs_tile + (kk * 16 + (lane & 7) + 8 * (mi & 1)) * kVLd + vp * 16 + 8 * (mi >> 1)));
            mma_bf16(o[2 * vp], pf[kk], b[0], b[1]);
            mma_bf16(o[2 * vp + 1], pf[kk], b[2], b[3]);
          }
        }
    }
    __syncthreads();  // the stage of tile kt is overwritten by the load of tile kt + 2
  }
  if (!warp_active) return;  // no barrier follows
  l_a += __shfl_xor_sync(kFullMask, l_a, 1);
  l_a += __shfl_xor_sync(kFullMask, l_a, 2);
  l_b += __shfl_xor_sync(kFullMask, l_b, 1);
  l_b += __shfl_xor_sync(kFullMask, l_b, 2);
  T* out_a = out + (row_begin + min(row_a, nr - 1)) * f.out_ld + static_cast<int64_t>(h) * f.vd;
  T* out_b = out + (row_begin + min(row_b, nr - 1)) * f.out_ld + static_cast<int64_t>(h) * f.vd;
#pragma unroll
  for (int vn = 0; vn < kMaxVd / 8; ++vn) {
    if (vn < f.vd / 8) {
      const int col = vn * 8 + 2 * t;
      if (row_a < nr) {
        store_act(out_a + col, o[vn][0] / l_a, f.round);
        store_act(out_a + col + 1, o[vn][1] / l_a, f.round);
      }
      if (row_b < nr) {
        store_act(out_b + col, o[vn][2] / l_b, f.round);
        store_act(out_b + col + 1, o[vn][3] / l_b, f.round);
      }
    }
  }
}

// ---------------------------------------------------------------- host

bool is_power_of_two(float x) {
  int e = 0;
  return std::isfinite(x) && x > 0.0f && std::frexp(x, &e) == 0.5f;
}

// The expansion GEMM latent [rows, L] x kv_b^T -> KV [rows, H (nope + v)], both bf16 and dense.
LinearArgs expansion_args(const MlaAttentionArgs& a, void* latent, void* kv, int64_t rows) {
  const int64_t kv_width = static_cast<int64_t>(a.num_heads) * (a.qk_nope + a.v_head_dim);
  LinearArgs la;
  la.x = core::TensorView::contiguous(latent, core::DType::bf16, {rows, a.kv_lora}, core::Device::cuda);
  la.w = a.kv_b;
  la.out = core::TensorView::contiguous(kv, core::DType::bf16, {rows, kv_width}, core::Device::cuda);
  la.round_output = true;
  la.precision = Precision::bf16;
  return la;
}

core::Status flash_supports(const CudaOps& ops, const MlaAttentionArgs& a) {
  using core::Status;
  if (auto s = mla_supports(ops, a); !s) return s;
  if (a.precision != Precision::bf16)
    return Status::fail(
        "Precision::fp32 keeps f32 keys and values (bf16 tensor cores would round them): "
        "cuda_expand_online_softmax runs it");
  const bool fp8 = a.pages.dtype == core::DType::f8_e4m3;
  if (!fp8 && a.pages.dtype != core::DType::bf16)
    return Status::fail("pages must be a bf16 or f8_e4m3 cache, got " + describe(a.pages));
  if (fp8 && !is_power_of_two(a.k_scale))
    return Status::fail("k_scale " + std::to_string(a.k_scale) +
                        " is not a power of two: fp8 * k_scale would not be exact in bf16");
  if (a.kv_b->is_mxfp4() || a.kv_b->weight.dtype() != core::DType::bf16)
    return Status::fail("kv_b must be a dense bf16 weight for the tensor-core expansion, got " +
                        describe(a.kv_b->weight.view()));
  if (a.qk_nope <= 0 || a.qk_rope <= 0 || a.v_head_dim <= 0 || a.qk_nope % 16 || a.qk_rope % 16 || a.v_head_dim % 16)
    return Status::fail("qk_nope " + std::to_string(a.qk_nope) + ", qk_rope " + std::to_string(a.qk_rope) +
                        " and v_head_dim " + std::to_string(a.v_head_dim) + " must be positive multiples of 16");
  if (a.qk_nope + a.qk_rope > kMaxQk || a.v_head_dim > kMaxVd)
    return Status::fail("qk_nope + qk_rope = " + std::to_string(a.qk_nope + a.qk_rope) + " (limit " +
                        std::to_string(kMaxQk) + ") or v_head_dim " + std::to_string(a.v_head_dim) + " (limit " +
                        std::to_string(kMaxVd) + ") is above the register tiles");
  if (a.kv_lora <= 0 || a.kv_lora % 16)
    return Status::fail("kv_lora " + std::to_string(a.kv_lora) + " must be a positive multiple of 16");
  if (a.num_heads > kMaxGridYZ || a.seqs.num_seqs > kMaxGridYZ)
    return Status::fail("num_heads " + std::to_string(a.num_heads) + " or num_seqs " + std::to_string(a.seqs.num_seqs) +
                        " is above the CUDA grid limit " + std::to_string(kMaxGridYZ));
  const int64_t rows = static_cast<int64_t>(a.seqs.num_seqs) * a.seqs.max_tokens;
  if ((rows * (a.kv_lora + a.qk_rope) + 255) / 256 > int64_t{0x7fffffff})
    return Status::fail("num_seqs * max_tokens = " + std::to_string(rows) + " cache rows is above the grid limit");
  // The GEMM on 256-byte aligned scratch (the pool's alignment; the plan depends only on it).
  auto* aligned = reinterpret_cast<void*>(uintptr_t{256});
  if (auto s = linear_cublaslt_supports(ops, expansion_args(a, aligned, aligned, rows)); !s)
    return Status::fail("the KV expansion GEMM: " + s.reason());
  return Status::ok();
}

template <int kWarps, class E>
void launch_flash(const CudaOps& ops, const FlashArgs& f, const E* q, E* out, cudaStream_t stream) {
  constexpr int kRows = 16 * kWarps;
  allow_smem(ops, flash_kernel<kWarps, E>, kSmemBytes);
  const dim3 grid(grid_for(f.sq.max_rows, kRows), static_cast<unsigned>(f.heads), static_cast<unsigned>(f.sq.num_seqs));
  flash_kernel<kWarps, E><<<grid, kWarps * 32, kSmemBytes, stream>>>(f, q, out);
  K3_CUDA_CHECK_LAUNCH("flash_kernel");
}

void flash_run(const CudaOps& ops, const MlaAttentionArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0 || sq.max_rows == 0 || sq.max_tokens == 0) return;
  const int64_t L = a.kv_lora, rope = a.qk_rope, rows = static_cast<int64_t>(sq.num_seqs) * sq.max_tokens;
  const int64_t kv_width = static_cast<int64_t>(a.num_heads) * (a.qk_nope + a.v_head_dim);
  const cudaStream_t stream = ops.ctx->stream();
  std::shared_ptr<void> latent = ops.ctx->scratch(static_cast<size_t>(rows * L) * sizeof(bf16));
  std::shared_ptr<void> k_pe = ops.ctx->scratch(static_cast<size_t>(rows * rope) * sizeof(bf16));
  std::shared_ptr<void> kv = ops.ctx->scratch(static_cast<size_t>(rows * kv_width) * sizeof(bf16));
  auto* latent_b = static_cast<bf16*>(latent.get());
  auto* k_pe_b = static_cast<bf16*>(k_pe.get());
  const PagesRef pg = pages_ref(a.pages);
  with_cache(a.pages, [&](const auto* pages) {
    latent_bf16_kernel<<<grid_for(rows * (L + rope), 256), 256, 0, stream>>>(
        sq, pages, pg, a.k_scale, latent_b, k_pe_b, static_cast<int>(L), static_cast<int>(rope));
    K3_CUDA_CHECK_LAUNCH("latent_bf16_kernel");
  });
  linear_cublaslt_run(ops, expansion_args(a, latent.get(), kv.get(), rows));

  FlashArgs f;
  f.sq = sq;
  f.kv = static_cast<const bf16*>(kv.get());
  f.k_pe = k_pe_b;
  f.q_ld = a.q.strides[0];
  f.out_ld = a.out.strides[0];
  f.heads = a.num_heads;
  f.nope = a.qk_nope;
  f.rope = a.qk_rope;
  f.vd = a.v_head_dim;
  f.scale = a.scale;
  f.round = true;  // Precision::bf16 only
  with_act(a.q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const E* q = a.q.as<const E>();
    E* out = a.out.as<E>();
    // 64-row tiles for prefill chunks; 16 / 32 rows when no sequence has more (short continuations).
    if (sq.max_rows > 32) launch_flash<4>(ops, f, q, out, stream);
    else if (sq.max_rows > 16) launch_flash<2>(ops, f, q, out, stream);
    else launch_flash<1>(ops, f, q, out, stream);
  });
}

}  // namespace

void register_mla_naive_flash_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_naive.add({"cuda_expand_gemm_flash", core::Device::cuda,
                   [ops](const MlaAttentionArgs& a) { return flash_supports(ops, a); },
                   [ops](const MlaAttentionArgs& a) { flash_run(ops, a); }});
}

}  // namespace k3::kernels
