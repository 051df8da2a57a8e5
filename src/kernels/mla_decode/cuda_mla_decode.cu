// kernels/mla_decode/cuda_mla_decode.cu: the fused MLA decode op on CUDA (mla_decode.h), strategy
// "cuda_decode_splitkv": four launches per call, grids from host integers only (graph-replayable).
// Query slots qi = s * max_rows + i (i < max_rows); a slot with i >= num_rows[s] exits at once.
//   1. q_absorb  grid (H, ceil(kv_lora / 64), ceil(Q / 16)): W_UK[h]'s 64-column tile [nope][64] staged
//                in shared memory, then its 16 slots: Qc[qi][h] = [round(W_UK[h]^T q_nope); q_pe]  (workspace)
//   2. split_kv  grid (splits, Q): tiles of 32 cache entries staged (dequantised to f32) in shared memory
//                once for ALL heads (<= 16); scores: 4 threads per (2 positions x 4 heads), float4
//                reads over the 576-wide entry; online softmax: a warp per head; P.V: a thread per 4
//                latent dims x every other head. Writes unnormalised o [kv_lora] and (m, l) per head.
//   3. combine   grid (Q * H, ceil(kv_lora / 64)): o_lat = round(sum_s w_s o_s / sum_s w_s l_s),
//                w_s = e^{m_s - max m} over the slot's non-empty splits (into the Qc region: Qc is dead).
//   4. w_uv_gate grid (H * ceil(v / 8), ceil(Q / 8)): a warp per W_UV row (held in registers) against
//                the o_lat of 8 slots (staged in shared memory): out = round(round(W_UV o_lat) * gate').
// Sums run in another order than the reference (splits, partial dots, shuffles; nvcc contracts
// multiply-adds): equal to the CPU reference within attention tolerance (tests/ops/mla_decode_ops_test.cpp).
#include <algorithm>

#include "kernels/mla/cuda_mla_common.cuh"
#include "kernels/mla_decode/mla_decode.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;          // positions per staged tile (= warp size: the softmax step's lanes)
constexpr int kMaxHeads = 16;      // split_kv: 4 head quads for the scores, 8 heads per thread in P.V
constexpr int kMaxNope = 256;      // q_absorb stages [nope][64] f32 of W_UK
constexpr int kQaCols = 64;        // q_absorb columns per CTA
constexpr int kQaSlots = 16;       // q_absorb query slots per CTA (4 per thread)
constexpr int kPvGroups = 128;     // P.V: float4 column groups (4 * 128 = 512 = kMlaMaxLatent)
constexpr int kCombineCols = 64;   // combine columns per CTA
constexpr int kUvRows = kWarps;    // w_uv_gate: W_UV rows per CTA (a warp each)
constexpr int kUvSlots = 8;        // w_uv_gate: query slots per CTA
constexpr int kUvPerLane = kMlaMaxLatent / 32;
static_assert(kTile == 32 && kMlaDecodeTile % kTile == 0 && 4 * kPvGroups == kMlaMaxLatent);
static_assert(kThreads == 4 * (kTile / 2) * (kMaxHeads / 4) && kThreads == 2 * kPvGroups);

__device__ __forceinline__ bool slot_used(const SeqTables& sq, int64_t qi, int& seq, int& i_row) {
  seq = static_cast<int>(qi / sq.max_rows);
  i_row = static_cast<int>(qi % sq.max_rows);
  return i_row < sq.num_rows[seq];
}

// ---------------------------------------------------------------- 1. q_absorb

template <class T, WFmt F>
__global__ void __launch_bounds__(kThreads) q_absorb_kernel(SeqTables sq, const T* q, int64_t q_ld, WeightRef kv_b,
                                                            float* qc, int H, int nope, int rope, int vd, int L,
                                                            bool round) {
  extern __shared__ float w_s[];  // [nope][kQaCols]: W_UK[h][d][c0 + c], zeros past L
  const int h = blockIdx.x, c0 = blockIdx.y * kQaCols, E = L + rope;
  const int64_t row0 = static_cast<int64_t>(h) * (nope + vd);  // W_UK[h] = kv_b rows row0 .. row0 + nope - 1
  for (int e = threadIdx.x; e < nope * kQaCols; e += blockDim.x) {
    const int d = e / kQaCols, c = e % kQaCols;
    w_s[e] = c0 + c < L ? weight_at<F>(kv_b, row0 + d, c0 + c) : 0.0f;
  }
  __syncthreads();
  const int c = threadIdx.x % kQaCols, group = threadIdx.x / kQaCols;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, qi0 = static_cast<int64_t>(blockIdx.z) * kQaSlots;
  const int64_t qi_end = qi0 + kQaSlots < Q ? qi0 + kQaSlots : Q;
  for (int64_t qi = qi0 + group; qi < qi_end; qi += kThreads / kQaCols) {
    int seq, i_row;
    if (!slot_used(sq, qi, seq, i_row)) continue;
    const int64_t t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;
    const T* qh = q + t * q_ld + static_cast<int64_t>(h) * (nope + rope);
    float acc = 0.0f;  // d in order, as the reference
    for (int d = 0; d < nope; ++d) acc += w_s[d * kQaCols + c] * to_f32(qh[d]);
    float* out = qc + (qi * H + h) * E;
    if (c0 + c < L) out[c0 + c] = round_if(acc, round);
    if (blockIdx.y == 0)
      for (int r = c; r < rope; r += kQaCols) out[L + r] = to_f32(qh[nope + r]);
  }
}

// ---------------------------------------------------------------- 2. split_kv

struct SplitParams {
  SeqTables sq;
  PagesRef pg;
  const float* qc;   // [Q][H][E]
  float* part_o;     // [Q][H][splits][L]
  float* part_m;     // [Q][H][splits]
  float* part_l;     // [Q][H][splits]
  float k_scale, scale;
  int H, L, rope;
  int E4;            // E = L + rope rounded up to a multiple of 4 (zeros past E in the tile and Qc)
  int ld;            // tile row stride in floats: E4 or E4 + 4, so ld / 4 is odd (conflict-free float4 rows)
  int splits;
  int64_t split_len;
  bool vec4;         // the cache can be read 4 elements at a time (E % 4 == 0, rows aligned)
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
  int seq, i_row;
  if (!slot_used(p.sq, qi, seq, i_row)) return;  // the whole block: an unused slot
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
    __syncthreads();  // scores ready
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

// ---------------------------------------------------------------- 3. combine

// Grid (Q * H, column blocks of kCombineCols); threads = kCombineCols columns x 4 split groups whose
// partial sums are added in group order. Only the slot's non-empty splits were written and are read.
__global__ void __launch_bounds__(kThreads) combine_kernel(SeqTables sq, const float* part_o, const float* part_m,
                                                           const float* part_l, int H, int splits, int64_t split_len,
                                                           float* o_lat, int L, bool round) {
  extern __shared__ float weight[];  // [splits]
  __shared__ float red[32];
  __shared__ float partial[kThreads];
  const int64_t qh = blockIdx.x, qi = qh / H;  // blockIdx.x = qi * H + h
  int seq, i_row;
  if (!slot_used(sq, qi, seq, i_row)) return;  // the whole block: an unused slot
  const int64_t visible = static_cast<int64_t>(sq.position[seq]) + i_row + 1;
  const int64_t nonempty = (visible + split_len - 1) / split_len;  // splits with a visible position
  const int used = nonempty < splits ? static_cast<int>(nonempty) : splits;
  const int64_t base = qh * splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x) m = fmaxf(m, part_m[base + s]);
  const float M = block_max(m, red);
  float z = 0.0f;
  for (int s = threadIdx.x; s < used; s += blockDim.x) {
    const float w = expf(part_m[base + s] - M);
    weight[s] = w;
    z += w * part_l[base + s];
  }
  const float Z = block_sum(z, red);  // its barriers also publish weight[]
  constexpr int kGroups = kThreads / kCombineCols;
  const int col = threadIdx.x % kCombineCols, g = threadIdx.x / kCombineCols;
  const int i = blockIdx.y * kCombineCols + col;
  float acc = 0.0f;
  if (i < L) {
#pragma unroll 4
    for (int s = g; s < used; s += kGroups) acc += weight[s] * part_o[(base + s) * L + i];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  if (g == 0 && i < L) {
    float sum = partial[col];
#pragma unroll
    for (int k = 1; k < kGroups; ++k) sum += partial[k * kCombineCols + col];
    o_lat[qh * L + i] = round_if(sum / Z, round);
  }
}

// ---------------------------------------------------------------- 4. w_uv_gate

// Grid (H * row blocks, slot chunks of kUvSlots): the CTA's rows e = rb * kUvRows + warp all belong to
// head h = blockIdx.x / row_blocks; the o_lat [L] of its slots is staged in shared memory.
template <class T, WFmt F>
__global__ void __launch_bounds__(kThreads) w_uv_gate_kernel(SeqTables sq, WeightRef kv_b, const float* o_lat,
                                                             const T* gate, int64_t gate_ld, T* out, int64_t out_ld,
                                                             int H, int nope, int vd, int L, int row_blocks,
                                                             bool round) {
  extern __shared__ float ol[];  // [kUvSlots][L]
  __shared__ int64_t t_row[kUvSlots];  // q row of each slot of the chunk, -1 when unused
  const int h = blockIdx.x / row_blocks, e = (blockIdx.x % row_blocks) * kUvRows + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, qi0 = static_cast<int64_t>(blockIdx.y) * kUvSlots;
  if (threadIdx.x < kUvSlots) {
    const int64_t qi = qi0 + threadIdx.x;
    int seq = 0, i_row = 0;
    t_row[threadIdx.x] = qi < Q && slot_used(sq, qi, seq, i_row) ? static_cast<int64_t>(sq.row_begin[seq]) + i_row : -1;
  }
  __syncthreads();
  for (int x = threadIdx.x; x < kUvSlots * L; x += blockDim.x) {
    const int s = x / L, i = x % L;
    ol[x] = t_row[s] >= 0 ? o_lat[((qi0 + s) * H + h) * L + i] : 0.0f;
  }
  __syncthreads();
  if (e >= vd) return;  // after the last barrier: a warp with no W_UV row
  float w[kUvPerLane];
  const int64_t r = static_cast<int64_t>(h) * (nope + vd) + nope + e;  // W_UV[h][e] in kv_b
#pragma unroll
  for (int k = 0; k < kUvPerLane; ++k) {
    const int i = lane + 32 * k;
    w[k] = i < L ? weight_at<F>(kv_b, r, i) : 0.0f;
  }
  for (int s = 0; s < kUvSlots; ++s) {
    if (t_row[s] < 0) continue;  // warp-uniform
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kUvPerLane; ++k) {
      const int i = lane + 32 * k;
      if (i < L) acc = fmaf(w[k], ol[s * L + i], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const int64_t col = static_cast<int64_t>(h) * vd + e;
      const float o = round_if(acc, round);  // o = round(W_UV o_lat): the standard op's output
      float v = o;
      if (gate != nullptr) v = o * round_if(sigmoid_f32(to_f32(gate[t_row[s] * gate_ld + col])), round);
      store_act(out + t_row[s] * out_ld + col, v, round);
    }
  }
}

// ---------------------------------------------------------------- host

size_t split_smem_for(const MlaDecodeArgs& a) {
  const int E4 = (a.kv_lora + a.qk_rope + 3) / 4 * 4;
  return split_smem_bytes(E4, a.num_heads);
}

core::Status decode_supports(const CudaOps& ops, const MlaDecodeArgs& a) {
  if (auto s = mla_supports(ops, mla_decode_attention_args(a, a.out)); !s) return s;
  if (a.gate.data != nullptr) {
    if (auto s = on_cuda({{"gate", &a.gate}}); !s) return s;
    if (auto s = same_act({{"q", &a.q}, {"gate", &a.gate}}, a.precision); !s) return s;
    if (overlaps(a.out, a.gate) && a.out.data != a.gate.data)
      return core::Status::fail("out overlaps gate without being the same view");
  }
  if (a.workspace.data != nullptr)
    if (auto s = on_cuda({{"workspace", &a.workspace}}); !s) return s;
  const int64_t slots = static_cast<int64_t>(a.seqs.num_seqs) * a.seqs.max_rows;  // split_kv grid.y
  if (slots > kMaxGridYZ)
    return core::Status::fail("num_seqs * max_rows = " + std::to_string(slots) + " is above the CUDA grid limit " +
                              std::to_string(kMaxGridYZ));
  if (a.num_heads > kMaxHeads)
    return core::Status::fail("num_heads " + std::to_string(a.num_heads) + " is above the split_kv limit " +
                              std::to_string(kMaxHeads) + " (all heads share one CTA)");
  if (a.kv_lora > kMlaMaxLatent)
    return core::Status::fail("kv_lora " + std::to_string(a.kv_lora) + " is above the CUDA limit " +
                              std::to_string(kMlaMaxLatent));
  if (a.qk_nope > kMaxNope)
    return core::Status::fail("qk_nope " + std::to_string(a.qk_nope) + " is above the q_absorb limit " +
                              std::to_string(kMaxNope));
  const size_t smem = split_smem_for(a);
  if (smem > ops.ctx->smem_optin())
    return core::Status::fail("split_kv needs " + std::to_string(smem) + " bytes of shared memory, the device allows " +
                              std::to_string(ops.ctx->smem_optin()));
  return core::Status::ok();
}

void decode_run(const CudaOps& ops, const MlaDecodeArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows;
  const int H = a.num_heads, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim, L = a.kv_lora, E = L + rope;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const int64_t split_len = mla_decode_split_len(a);
  const int splits = static_cast<int>(mla_decode_num_splits(a));

  // Workspace: Qc [Q][H][E] (reused for o_lat [Q][H][L] once split_kv is done), then the partials.
  std::shared_ptr<void> scratch;
  float* ws = nullptr;
  if (a.workspace.data != nullptr) {
    ws = a.workspace.as<float>();
  } else {
    scratch = ops.ctx->scratch(static_cast<size_t>(mla_decode_workspace_floats(a)) * sizeof(float));
    ws = static_cast<float*>(scratch.get());
  }
  SplitParams p;
  p.sq = sq;
  p.pg = pages_ref(a.pages);
  p.qc = ws;
  p.part_o = ws + Q * H * E;
  p.part_m = p.part_o + Q * H * splits * L;
  p.part_l = p.part_m + Q * H * splits;
  p.k_scale = a.k_scale, p.scale = a.scale;
  p.H = H, p.L = L, p.rope = rope;
  p.E4 = (E + 3) / 4 * 4;
  p.ld = split_ld(p.E4);
  p.splits = splits, p.split_len = split_len;
  const size_t elem = core::dtype_size(a.pages.dtype);
  p.vec4 = E % 4 == 0 && reinterpret_cast<uintptr_t>(a.pages.data) % (4 * elem) == 0 &&
           (a.pages.dim(0) <= 1 || p.pg.page_ld % 4 == 0) && (a.pages.dim(1) <= 1 || p.pg.row_ld % 4 == 0);
  float* o_lat = ws;  // the Qc region, dead after split_kv

  const WeightRef w = weight_ref(*a.kv_b);
  const int row_blocks = (vd + kUvRows - 1) / kUvRows;
  with_act(a.q.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_wfmt(weight_format(*a.kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {
        const size_t qa_smem = static_cast<size_t>(nope) * kQaCols * sizeof(float);
        allow_smem(q_absorb_kernel<T, FC>, qa_smem);
        q_absorb_kernel<T, FC><<<dim3(H, grid_for(L, kQaCols), grid_for(Q, kQaSlots)), kThreads, qa_smem, stream>>>(
            sq, a.q.as<const T>(), a.q.strides[0], w, ws, H, nope, rope, vd, L, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode q_absorb_kernel");

        with_cache(a.pages, [&](const auto* pages) {
          using CacheT = std::remove_cv_t<std::remove_pointer_t<decltype(pages)>>;
          const size_t smem = split_smem_bytes(p.E4, H);
          allow_smem(split_kv_kernel<CacheT>, smem);
          split_kv_kernel<CacheT><<<dim3(splits, static_cast<unsigned>(Q)), kThreads, smem, stream>>>(p, pages);
          K3_CUDA_CHECK_LAUNCH("mla_decode split_kv_kernel");
        });

        const size_t combine_smem = static_cast<size_t>(splits) * sizeof(float);
        allow_smem(combine_kernel, combine_smem);
        combine_kernel<<<dim3(static_cast<unsigned>(Q * H), grid_for(L, kCombineCols)), kThreads, combine_smem,
                         stream>>>(sq, p.part_o, p.part_m, p.part_l, H, splits, split_len, o_lat, L, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode combine_kernel");

        const size_t uv_smem = static_cast<size_t>(kUvSlots) * L * sizeof(float);
        allow_smem(w_uv_gate_kernel<T, FC>, uv_smem);
        const T* gate = a.gate.data != nullptr ? a.gate.as<const T>() : nullptr;
        const int64_t gate_ld = a.gate.data != nullptr ? a.gate.strides[0] : 0;
        w_uv_gate_kernel<T, FC><<<dim3(H * row_blocks, grid_for(Q, kUvSlots)), kThreads, uv_smem, stream>>>(
            sq, w, o_lat, gate, gate_ld, a.out.as<T>(), a.out.strides[0], H, nope, vd, L, row_blocks, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode w_uv_gate_kernel");
      }
    });
  });
}

}  // namespace

void register_mla_decode_cuda(Registry& r, const CudaOps& ops) {
  r.mla_decode.add({"cuda_decode_splitkv", core::Device::cuda, 10,
                    [ops](const MlaDecodeArgs& a) { return decode_supports(ops, a); },
                    [ops](const MlaDecodeArgs& a) { decode_run(ops, a); }});
}

}  // namespace k3::kernels
