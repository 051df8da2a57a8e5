// kernels/mla/cuda_mla_decode.cu: the fused MLA decode op on CUDA (mla_decode.h): its registration
// (two strategies) and the CUDA-core split_kv of strategy "cuda_decode_splitkv": any dims the
// op allows, f32 or bf16 activations, f32 / bf16 / fp8 caches; the exact-ish fp32 path for f32 activations
// and the fallback for whatever "cuda_decode_splitkv_mma" (cuda_mla_decode_mma.cu) refuses.
// q_absorb, combine and w_uv_gate are shared (cuda_mla_decode_stages.cu).
//   split_kv grid (splits, Q), 256 threads: tiles of 32 cache entries staged (dequantised to f32) in shared
//            memory once for ALL heads (<= 16); scores: 4 threads per (2 positions x 4 heads), float4 reads
//            over the E-wide entry; online softmax: a warp per head; P.V: a thread per 4 latent dims x
//            every other head. Writes unnormalised o [kv_lora] and (m, l) per head and split.
// fp32 on CUDA cores: 12 x (576 + 512) FMA per position, every operand from shared memory (issue-bound).
#include "kernels/mla/cuda_mla_decode.cuh"

#include <algorithm>
#include <string>

#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;                   // positions per staged tile (= warp size: the softmax step's lanes)
constexpr int kMaxHeads = kDecodeMaxHeads;  // 4 head quads for the scores, 8 heads per thread in P.V
constexpr int kPvGroups = 128;              // P.V: float4 column groups (4 * 128 = 512 = kMlaMaxLatent)
static_assert(kTile == 32 && kMlaDecodeTile % kTile == 0 && 4 * kPvGroups == kMlaMaxLatent && kMaxHeads == 16);
static_assert(kThreads == 4 * (kTile / 2) * (kMaxHeads / 4) && kThreads == 2 * kPvGroups);

struct SplitParams {
  SeqTables sq;
  PagesRef pg;
  const float* qc;  // [Q][H][E]
  float* part_o;    // [Q][H][splits][L]
  float* part_m;    // [Q][H][splits]
  float* part_l;    // [Q][H][splits]
  float k_scale, scale;
  int H, L, rope;
  int E4;  // E = L + rope rounded up to a multiple of 4 (zeros past E in the tile and Qc)
  int ld;  // tile row stride in floats: E4 or E4 + 4, so ld / 4 is odd (conflict-free float4 rows)
  int splits;
  int64_t split_len;
  bool vec4;  // the cache can be read 4 elements at a time (E % 4 == 0, rows aligned)
};

inline int split_ld(int E4) { return (E4 / 4) % 2 == 1 ? E4 : E4 + 4; }
inline size_t split_smem_bytes(int E4, int H) {
  return (static_cast<size_t>(kTile) * split_ld(E4) + static_cast<size_t>(H) * E4 + static_cast<size_t>(H) * kTile) *
         sizeof(float);
}

// Elements c .. c+3 of the cache row at element offset `off` as f32 (zeros at and past E).
__device__ __forceinline__ float fp8_value(uint32_t code, float k_scale) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xffu), __NV_E4M3))) *
         k_scale;
}
template <class CacheT>
__device__ __forceinline__ float4 load4(const CacheT* pages, int64_t off, int c, int E, float k_scale, bool vec4) {
  if (vec4) {
    if constexpr (sizeof(CacheT) == 1) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(pages + off + c);
      return make_float4(fp8_value(w, k_scale), fp8_value(w >> 8, k_scale), fp8_value(w >> 16, k_scale),
                         fp8_value(w >> 24, k_scale));
    } else if constexpr (sizeof(CacheT) == 2) {
      const uint2 w = *reinterpret_cast<const uint2*>(pages + off + c);
      return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                         __uint_as_float(w.y & 0xffff0000u));
    } else {
      return *reinterpret_cast<const float4*>(pages + off + c);
    }
  }
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = c + k < E ? cache_elem(pages, off + c + k, k_scale) : 0.0f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

template <class CacheT>
__global__ void __launch_bounds__(kThreads) split_kv_kernel(SplitParams p, const CacheT* pages) {
  extern __shared__ float4 sm4[];
  float* tile = reinterpret_cast<float*>(sm4);  // [kTile][ld]
  float* qs = tile + kTile * p.ld;              // [H][E4]
  float* sc = qs + p.H * p.E4;                  // [H][kTile]: scores, then e^{s - m}
  __shared__ float m_run[kMaxHeads], l_run[kMaxHeads], factor[kMaxHeads];
  __shared__ int64_t row_off[kTile];
  const int split = blockIdx.x;
  const int64_t qi = blockIdx.y;
  // PDL (kernels/cuda_common.cuh): no weights; the cache (the step's cache write), Qc and the tables are
  // the step's, so the wait comes first, before any early exit.
  pdl_launch_dependents();
  pdl_wait();
  int seq, i_row;
  if (!slot_used(p.sq, qi, seq, i_row)) return;                                  // the whole block: an unused slot
  const int64_t visible = static_cast<int64_t>(p.sq.position[seq]) + i_row + 1;  // positions 0 .. position + i
  const int64_t j_begin = static_cast<int64_t>(split) * p.split_len;
  if (j_begin >= visible) return;  // the whole block: nothing visible in this split
  const int64_t j_end = j_begin + p.split_len < visible ? j_begin + p.split_len : visible;
  const int32_t* table = p.sq.block_table + seq * p.sq.bt_ld;
  const int H = p.H, E = p.L + p.rope, E4 = p.E4, g4 = E4 / 4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < H * E4; e += blockDim.x) {
    const int h = e / E4, c = e % E4;
    qs[e] = c < E ? p.qc[(qi * H + h) * E + c] : 0.0f;
  }
  if (tid < kMaxHeads) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;
  // Scores: thread = (item = tid / 4, ks = tid % 4); item = (position pair p2, head quad hq); ks splits
  // the float4 groups f = ks, ks + 4, ...
  const int ks = tid & 3, item = tid >> 2, p2 = item % (kTile / 2), hq = item / (kTile / 2);
  // P.V: thread = (float4 column group ig, head parity hh): heads hh, hh + 2, ...
  const int ig = tid % kPvGroups, hh = tid / kPvGroups;
  float acc[kMaxHeads / 2][4] = {};
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
    const int n = j_end - j0 < kTile ? static_cast<int>(j_end - j0) : kTile;
    for (int jj = tid; jj < n; jj += blockDim.x) row_off[jj] = position_offset(p.pg, table, j0 + jj);
    __syncthreads();  // row_off ready (and, first time, qs / m_run)
    for (int e = tid; e < n * g4; e += blockDim.x) {
      const int jj = e / g4, c4 = e % g4;
      reinterpret_cast<float4*>(tile + jj * p.ld)[c4] = load4(pages, row_off[jj], 4 * c4, E, p.k_scale, p.vec4);
    }
    __syncthreads();  // tile ready
    {
      const int ja = min(2 * p2, n - 1), jb = min(2 * p2 + 1, n - 1);  // clamped: results of rows >= n unused
      const float4* ta = reinterpret_cast<const float4*>(tile + ja * p.ld);
      const float4* tb = reinterpret_cast<const float4*>(tile + jb * p.ld);
      float s[2][4] = {};
      if (4 * hq < H) {  // warp-uniform (a warp's 8 items share hq)
        for (int f = ks; f < g4; f += 4) {
          const float4 a = ta[f], b = tb[f];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if (4 * hq + k < H) {
              const float4 qv = reinterpret_cast<const float4*>(qs + (4 * hq + k) * E4)[f];
              s[0][k] = dot4(qv, a, s[0][k]);
              s[1][k] = dot4(qv, b, s[1][k]);
            }
          }
        }
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int x = 0; x < 2; ++x) {  // the 4 ks lanes of an item are adjacent: xor 1, 2 (whole warp takes part)
          s[x][k] += __shfl_xor_sync(kFullMask, s[x][k], 1);
          s[x][k] += __shfl_xor_sync(kFullMask, s[x][k], 2);
        }
      if (ks == 0 && 2 * p2 < n) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int h = 4 * hq + k;
          if (h < H) {
            sc[h * kTile + 2 * p2] = p.scale * s[0][k];
            if (2 * p2 + 1 < n) sc[h * kTile + 2 * p2 + 1] = p.scale * s[1][k];
          }
        }
      }
    }
    __syncthreads();                          // scores ready
    for (int h = warp; h < H; h += kWarps) {  // online softmax: a warp per head, a lane per position
      const float x = lane < n ? sc[h * kTile + lane] : -INFINITY;
      const float m_new = fmaxf(m_run[h], warp_max(x));
      const float e = lane < n ? expf(x - m_new) : 0.0f;
      if (lane < n) sc[h * kTile + lane] = e;
      const float sum = warp_sum(e);
      if (lane == 0) {
        const float corr = expf(m_run[h] - m_new);  // 0 on the first tile (m_run = -inf)
        factor[h] = corr;
        l_run[h] = l_run[h] * corr + sum;
        m_run[h] = m_new;
      }
    }
    __syncthreads();  // e and factor ready
#pragma unroll
    for (int k = 0; k < kMaxHeads / 2; ++k) {
      const int h = hh + 2 * k;
      const float f = h < H ? factor[h] : 1.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[k][c] *= f;
    }
    if (4 * ig < p.L) {
      for (int jj = 0; jj < n; ++jj) {
        const float4 x = reinterpret_cast<const float4*>(tile + jj * p.ld)[ig];
#pragma unroll
        for (int k = 0; k < kMaxHeads / 2; ++k) {
          const int h = hh + 2 * k;
          if (h < H) {
            const float pj = sc[h * kTile + jj];
            acc[k][0] = fmaf(pj, x.x, acc[k][0]);
            acc[k][1] = fmaf(pj, x.y, acc[k][1]);
            acc[k][2] = fmaf(pj, x.z, acc[k][2]);
            acc[k][3] = fmaf(pj, x.w, acc[k][3]);
          }
        }
      }
    }
    __syncthreads();  // tile, sc and factor are rewritten by the next tile
  }
#pragma unroll
  for (int k = 0; k < kMaxHeads / 2; ++k) {
    const int h = hh + 2 * k;
    if (h < H) {
      const int64_t base = (qi * H + h) * p.splits + split;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (4 * ig + c < p.L) p.part_o[base * p.L + 4 * ig + c] = acc[k][c];
    }
  }
  if (tid < H) {  // m_run / l_run were last written before the loop's final barrier
    const int64_t base = (qi * H + tid) * p.splits + split;
    p.part_m[base] = m_run[tid];
    p.part_l[base] = l_run[tid];
  }
}

size_t split_smem_for(const MlaDecodeArgs& a) {
  const int E4 = (a.kv_lora + a.qk_rope + 3) / 4 * 4;
  return split_smem_bytes(E4, a.num_heads);
}

}  // namespace

namespace cuda_detail {

core::Status split_kv_cuda_core_supports(const CudaOps& ops, const MlaDecodeArgs& a) {
  const size_t smem = split_smem_for(a);
  if (smem > ops.ctx->smem_optin())
    return core::Status::fail("split_kv needs " + std::to_string(smem) + " bytes of shared memory, the device allows " +
                              std::to_string(ops.ctx->smem_optin()));
  return core::Status::ok();
}

void launch_split_kv_cuda_core(const CudaOps& ops, const MlaDecodeArgs& a, const DecodePlan& plan) {
  SplitParams p;
  p.sq = seq_tables(a.seqs);
  p.pg = pages_ref(a.pages);
  p.qc = plan.qc;
  p.part_o = plan.part_o;
  p.part_m = plan.part_m;
  p.part_l = plan.part_l;
  p.k_scale = a.k_scale, p.scale = a.scale;
  p.H = plan.H, p.L = plan.L, p.rope = plan.rope;
  p.E4 = (plan.E + 3) / 4 * 4;
  p.ld = split_ld(p.E4);
  p.splits = plan.splits, p.split_len = plan.split_len;
  const size_t elem = core::dtype_size(a.pages.dtype);
  p.vec4 = plan.E % 4 == 0 && reinterpret_cast<uintptr_t>(a.pages.data) % (4 * elem) == 0 &&
           (a.pages.dim(0) <= 1 || p.pg.page_ld % 4 == 0) && (a.pages.dim(1) <= 1 || p.pg.row_ld % 4 == 0);
  with_cache(a.pages, [&](const auto* pages) {
    using CacheT = std::remove_cv_t<std::remove_pointer_t<decltype(pages)>>;
    const size_t smem = split_smem_bytes(p.E4, plan.H);
    allow_smem(ops, split_kv_kernel<CacheT>, smem);
    launch_dependent(split_kv_kernel<CacheT>, dim3(plan.splits, static_cast<unsigned>(plan.Q)), dim3(kThreads), smem,
                     ops.ctx->stream(), dim3(1, 1, 1), p, pages);
    K3_CUDA_CHECK_LAUNCH("mla_decode split_kv_kernel");
  });
}

}  // namespace cuda_detail

void register_mla_decode_cuda(MlaOps& r, const CudaOps& ops) {
  // CUDA-core split_kv: every shape the op allows (f32 activations: the exact-ish path).
  r.mla_decode.add({"cuda_decode_splitkv", core::Device::cuda,
                    [ops](const MlaDecodeArgs& a) {
                      if (auto s = decode_supports_common(ops, a); !s) return s;
                      return split_kv_cuda_core_supports(ops, a);
                    },
                    [ops](const MlaDecodeArgs& a) { decode_run(ops, a, launch_split_kv_cuda_core); }});
  // Tensor-core split_kv: bf16 activations over fp8 / bf16 caches at the dims it names in supports().
  r.mla_decode.add({"cuda_decode_splitkv_mma", core::Device::cuda,
                    [ops](const MlaDecodeArgs& a) {
                      if (auto s = decode_supports_common(ops, a); !s) return s;
                      return split_kv_mma_supports(ops, a);
                    },
                    [ops](const MlaDecodeArgs& a) { decode_run(ops, a, launch_split_kv_mma); }});
}

}  // namespace k3::kernels
