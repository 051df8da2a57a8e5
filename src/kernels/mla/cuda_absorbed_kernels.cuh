// kernels/mla/cuda_absorbed_kernels.cuh: internal to kernels/mla: the kernels of the absorbed MLA
// decode form (spec §6.2), shared by mla_absorbed (cuda_absorbed.cu) and the four decode-context-
// parallel ops (cuda_mla_cp.cu, kernels/mla/mla_cp.h), so both run the same code and give the same
// numbers. Queries are numbered by slot qi = s * max_rows + i (slots with i >= num_rows[s] exit):
//   1. q_absorb_kernel: qc = [round(W_UK[h]^T q_nope); q_pe], written by slot (absorbed scratch) or
//      by activation row (kOutByRow: mla_q_absorb's [T, H, E] output)
//   2. split_kv_kernel: the cache is one shared 576-wide key/value head (MQA), so a block takes a
//      range of positions (a split) for a group of heads, stages each tile of cache rows in shared
//      memory once for all of them: s = scale * Qc . [c_n; k_pe], running max/sum over tiles,
//      partial o = sum e^{s-m} c_n. Splits past the query's last position exit at once.
//   3. combine_kernel: o = sum over the query's non-empty splits, rescaled, / Z (rounded for the
//      absorbed form; unrounded plus lse = M + log Z for DCP)
//   4. w_uv_kernel: o = round(W_UV[h] o_lat), one weight row per warp segment (the row-dot form)
// The kCp variants address qc / o_part / lse as [G, T, H, ...] by activation row (head index
// hh = g * H + h over every owner's heads) and see LOCAL positions j with j * cp + rank <= P.
// Everything sits in an anonymous namespace: each .cu that includes it gets its own kernels.
#pragma once
#include <algorithm>

#include "kernels/cuda_rowdot.cuh"
#include "kernels/mla/cuda_mla_common.cuh"

namespace k3::kernels::cuda_detail::absorbed {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroupHeads = 8;  // heads per block (one warp each in the softmax step)
constexpr int kTile = 64;          // positions per tile
constexpr int kLatPerThread = kMlaMaxLatent / kThreads;
constexpr int kQaChunks = 8;      // q_absorb: column chunks per block (64 columns of 8)
constexpr int kCombineCols = 64;  // combine: latent columns per block

// DCP addressing of the kCp kernels: qc [G][T][H][E], o_part [G][T][H][L] and lse [G][T][H], where
// T = rows and H = owner_heads; the kernels' head index hh runs over all G * H heads.
struct CpLayout {
  int64_t rows = 0;
  int owner_heads = 1;
  int cp_size = 1, cp_rank = 0;
};
// Index of (head hh, activation row t) in the [G, T, H] layout.
__device__ __forceinline__ int64_t cp_row(const CpLayout& c, int hh, int64_t t) {
  return (static_cast<int64_t>(hh / c.owner_heads) * c.rows + t) * c.owner_heads + hh % c.owner_heads;
}
// How many local positions a row at global position P sees: j with j * cp + rank <= P.
__device__ __forceinline__ int64_t cp_visible(const CpLayout& c, int64_t P) {
  return P < c.cp_rank ? 0 : (P - c.cp_rank) / c.cp_size + 1;
}

// N consecutive entries of row r of a dense (f32 / bf16) weight from column c.
template <WFmt F, int N>
__device__ __forceinline__ void load_w_n(const WeightRef& w, int64_t r, int64_t c, float (&v)[N]) {
  if constexpr (F == WFmt::bf16) load_act_n<N>(static_cast<const bf16*>(w.data) + r * w.ld + c, v);
  else load_act_n<N>(static_cast<const float*>(w.data) + r * w.ld + c, v);
}

// Grid (query slot qi, head, column block): a block owns kQaChunks chunks of N columns of q_lat; its
// threads split the nope sum into `groups` (d = g, g + groups, ...), so each has a few independent
// loads in flight and many blocks share the weight reads; the groups' partial sums are then
// added in group order. Output row: slot qi, or activation row t when kOutByRow.
template <class T, WFmt F, int N, bool kOutByRow>
__global__ void __launch_bounds__(kThreads)
    q_absorb_kernel(SeqTables sq, const T* q, int64_t q_ld, WeightRef kv_b, float* qc, int H, int nope, int rope,
                    int vd, int L, int groups, bool round) {
  extern __shared__ float sm[];
  float* qn = sm;                          // [padded_floats(nope)], zeros past nope
  float* part = sm + padded_floats(nope);  // [groups][kQaChunks * N]
  const int64_t qi = blockIdx.x;
  const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
  if (i_row >= sq.num_rows[seq]) return;                              // the whole block: an unused row slot
  const int64_t t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;  // q row
  const int h = blockIdx.y;
  const int c_begin = blockIdx.z * kQaChunks, chunks = min(kQaChunks, L / N - c_begin);
  const T* qh = q + t * q_ld + static_cast<int64_t>(h) * (nope + rope);
  for (int d = threadIdx.x; d < padded_floats(nope); d += blockDim.x) qn[d] = d < nope ? to_f32(qh[d]) : 0.0f;
  __syncthreads();                                             // qn complete before any group reads it
  const int64_t row0 = static_cast<int64_t>(h) * (nope + vd);  // W_UK[h] = kv_b rows row0 .. row0+nope
  for (int e = threadIdx.x; e < chunks * groups; e += blockDim.x) {
    const int c = e % chunks, g = e / chunks;
    float acc[N] = {};
#pragma unroll 4
    for (int d = g; d < nope; d += groups) {
      float w[N];
      load_w_n<F, N>(kv_b, row0 + d, static_cast<int64_t>(c_begin + c) * N, w);
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += w[i] * qn[d];
    }
#pragma unroll
    for (int i = 0; i < N; ++i) part[g * kQaChunks * N + c * N + i] = acc[i];
  }
  __syncthreads();  // every group's partial sums written before they are added
  float* out = qc + ((kOutByRow ? t : qi) * H + h) * static_cast<int64_t>(L + rope);
  for (int i = threadIdx.x; i < chunks * N; i += blockDim.x) {
    float acc = part[i];
    for (int g = 1; g < groups; ++g) acc += part[g * kQaChunks * N + i];
    out[c_begin * N + i] = round_if(acc, round);
  }
  if (blockIdx.z == 0)
    for (int r = threadIdx.x; r < rope; r += blockDim.x) out[L + r] = to_f32(qh[nope + r]);
}

struct SplitParams {
  SeqTables sq;
  PagesRef pg;
  const float* qc;  // [Q][H][L + rope] by slot (Q = num_seqs * max_rows); kCp: [G][T][H / G][E] by row
  float k_scale, scale;
  float* part_o;                                   // [Q][H][splits][L]
  float* part_m;                                   // [Q][H][splits]
  float* part_l;                                   // [Q][H][splits]
  int H, L, rope, group_heads, splits, split_len;  // H: every head the kernel serves (kCp: G * owner_heads)
  bool vec_copy;                                   // cache rows can be staged with 16-byte copies
  CpLayout cp;                                     // kCp only
};

// Shared memory of split_kv_kernel: the staged tile [kTile][E] of raw cache elements (first, so it
// is 16-byte aligned), then Qc of the group [G][E] and the tile's scores [G][kTile], in floats.
template <class CacheT>
__host__ __device__ inline size_t split_tile_bytes(int E) {
  return (static_cast<size_t>(kTile) * E * sizeof(CacheT) + 15) / 16 * 16;
}
template <class CacheT>
inline size_t split_smem_bytes(int E, int G) {
  return split_tile_bytes<CacheT>(E) + static_cast<size_t>(G) * (E + kTile) * sizeof(float);
}
// The same for a pages dtype (supports()).
inline size_t split_smem_bytes_for(core::DType pages, int E, int G) {
  return pages == core::DType::f8_e4m3 ? split_smem_bytes<uint8_t>(E, G)
         : pages == core::DType::bf16  ? split_smem_bytes<bf16>(E, G)
                                       : split_smem_bytes<float>(E, G);
}
// 16-byte staging copies: every cache row starts 16-byte aligned and is whole 16-byte groups.
inline bool split_vec_copy(const core::TensorView& pages, const PagesRef& pg, int E) {
  const size_t elem = core::dtype_size(pages.dtype);
  return aligned16(pages.data) && (static_cast<size_t>(E) * elem) % 16 == 0 &&
         (static_cast<size_t>(pages.dim(0) > 1 ? pg.page_ld : 0) * elem) % 16 == 0 &&
         (static_cast<size_t>(pages.dim(1) > 1 ? pg.row_ld : 0) * elem) % 16 == 0;
}

// Grid (splits, Q, head groups). A split with no visible position exits at once (combine skips it).
template <class CacheT, bool kCp>
__global__ void __launch_bounds__(kThreads) split_kv_kernel(SplitParams p, const CacheT* pages) {
  extern __shared__ float4 sm4[];
  const int E = p.L + p.rope, G = p.group_heads;
  CacheT* tile = reinterpret_cast<CacheT*>(sm4);                                                     // [kTile][E]
  float* qs = reinterpret_cast<float*>(reinterpret_cast<char*>(sm4) + split_tile_bytes<CacheT>(E));  // [G][E]
  float* sc = qs + G * E;                                                                            // [G][kTile]
  __shared__ float m_run[kMaxGroupHeads], l_run[kMaxGroupHeads], factor[kMaxGroupHeads];
  __shared__ int64_t row_off[kTile];  // element offset of each staged position's cache row
  const int split = blockIdx.x, h0 = blockIdx.z * G;
  const int64_t qi = blockIdx.y;
  const int seq = static_cast<int>(qi / p.sq.max_rows), i_row = static_cast<int>(qi % p.sq.max_rows);
  if (i_row >= p.sq.num_rows[seq]) return;  // the whole block: an unused row slot
  int64_t visible;                          // positions 0 .. visible-1 (local ones for kCp)
  if constexpr (kCp) visible = cp_visible(p.cp, static_cast<int64_t>(p.sq.position[seq]) + i_row);
  else visible = static_cast<int64_t>(p.sq.position[seq]) + i_row + 1;  // positions 0 .. position + i
  const int64_t j_begin = static_cast<int64_t>(split) * p.split_len;
  if (j_begin >= visible) return;  // the whole block: nothing to attend to in this split
  const int64_t j_end = j_begin + p.split_len < visible ? j_begin + p.split_len : visible;
  const int32_t* table = p.sq.block_table + seq * p.sq.bt_ld;
  const int hg = min(G, p.H - h0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if constexpr (kCp) {
    const int64_t t = static_cast<int64_t>(p.sq.row_begin[seq]) + i_row;
    for (int e = tid; e < hg * E; e += blockDim.x) qs[e] = p.qc[cp_row(p.cp, h0 + e / E, t) * E + e % E];
  } else {
    for (int e = tid; e < hg * E; e += blockDim.x)
      qs[e] = p.qc[(qi * p.H + h0 + e / E) * static_cast<int64_t>(E) + e % E];
  }
  if (tid < kMaxGroupHeads) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;
  float acc[kMaxGroupHeads][kLatPerThread] = {};
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
    const int n = static_cast<int>(j_end - j0 < kTile ? j_end - j0 : kTile);
    for (int jj = tid; jj < n; jj += blockDim.x) row_off[jj] = position_offset(p.pg, table, j0 + jj);
    __syncthreads();  // row_off (and, first time round, qs / m_run / l_run) visible to all
    // Stage the tile: every thread copies, all loads independent (the latency is paid once).
    if (p.vec_copy) {
      const int per_row = E * static_cast<int>(sizeof(CacheT)) / 16;
      for (int e = tid; e < n * per_row; e += blockDim.x) {
        const int jj = e / per_row, c = e % per_row;
        reinterpret_cast<uint4*>(tile + static_cast<int64_t>(jj) *
                                            E)[c] = reinterpret_cast<const uint4*>(pages + row_off[jj])[c];
      }
    } else {
      for (int e = tid; e < n * E; e += blockDim.x) tile[e] = pages[row_off[e / E] + e % E];
    }
    __syncthreads();  // the tile is staged before any warp scores it
    // Scores: a warp per position, lanes over the 576-wide entry, every head of the group at once.
    for (int jj = warp; jj < n; jj += kWarps) {
      float part[kMaxGroupHeads] = {};
      for (int i = lane; i < E; i += 32) {
        const float x = cache_value(tile, E, jj, i, p.k_scale);
#pragma unroll
        for (int g = 0; g < kMaxGroupHeads; ++g)
          if (g < hg) part[g] += qs[g * E + i] * x;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroupHeads; ++g) {
        const float s = warp_sum(part[g]);
        if (g < hg && lane == 0) sc[g * kTile + jj] = p.scale * s;
      }
    }
    __syncthreads();  // every score of the tile written before the softmax warps read them
    // Softmax bookkeeping: warp g owns head g.
    if (warp < hg) {
      float mx = -INFINITY;
      for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, sc[warp * kTile + jj]);
      const float m_new = fmaxf(m_run[warp], warp_max(mx));
      float sum = 0.0f;
      for (int jj = lane; jj < n; jj += 32) {
        const float e = expf(sc[warp * kTile + jj] - m_new);
        sc[warp * kTile + jj] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = expf(m_run[warp] - m_new);
        factor[warp] = corr;
        l_run[warp] = l_run[warp] * corr + sum;
        m_run[warp] = m_new;
      }
    }
    __syncthreads();  // e^{s-m} in sc and factor[] published to every thread
                      // o += p c_n: threads over latent dims, every head of the group.
#pragma unroll
    for (int u = 0; u < kLatPerThread; ++u) {
      const int i = tid + u * kThreads;
      if (i < p.L) {
#pragma unroll
        for (int g = 0; g < kMaxGroupHeads; ++g) acc[g][u] *= g < hg ? factor[g] : 1.0f;
        for (int jj = 0; jj < n; ++jj) {
          const float x = cache_value(tile, E, jj, i, p.k_scale);
#pragma unroll
          for (int g = 0; g < kMaxGroupHeads; ++g)
            if (g < hg) acc[g][u] += sc[g * kTile + jj] * x;
        }
      }
    }
    __syncthreads();  // the tile, sc and factor are rewritten by the next tile
  }
  // (every path through the loop ends at a barrier after m_run / l_run were last written)
#pragma unroll
  for (int g = 0; g < kMaxGroupHeads; ++g) {  // unrolled: acc stays in registers
    if (g >= hg) break;
    const int64_t base = (qi * p.H + h0 + g) * p.splits + split;
#pragma unroll
    for (int u = 0; u < kLatPerThread; ++u) {
      const int i = tid + u * kThreads;
      if (i < p.L) p.part_o[base * p.L + i] = acc[g][u];
    }
    if (tid == 0) p.part_m[base] = m_run[g], p.part_l[base] = l_run[g];
  }
}

// Grid (Q x head, latent blocks of kCombineCols): the split weights w_s = e^{m_s - M}
// (M = max m_s) go to shared memory (each block computes them, all threads at once); the block's
// threads are kCombineCols columns x (kThreads / kCombineCols) split groups, whose partial sums are
// added in group order: o[i] = sum_s w_s o_s[i] / sum_s w_s l_s, rounded when `round`. Only the
// query's non-empty splits (s * split_len < visible) were written and are read; a split whose l is
// not positive gets weight 0.
// Absorbed form: out = o_lat [Q][H][L] by slot, lse unused. kCp: out = o_part [G][T][H][L] by row,
// lse[G][T][H] = M + log(Z); a row that sees no local position gets o = 0 and lse = -inf.
template <bool kCp>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(SeqTables sq, const float* part_o, const float* part_m, const float* part_l, int H, int splits,
                   int split_len, float* out, int L, bool round, CpLayout cp, float* lse) {
  extern __shared__ float weight[];  // [padded_floats(splits)], zeros past the used splits
  __shared__ float red[32];
  __shared__ float partial[kThreads];
  const int64_t qh = blockIdx.x, qi = qh / H;  // blockIdx.x = qi * H + h
  const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
  if (i_row >= sq.num_rows[seq]) return;  // the whole block: an unused row slot
  int64_t visible;
  float* dst;  // this query-head's output row [L]
  int64_t lse_at = 0;
  if constexpr (kCp) {
    visible = cp_visible(cp, static_cast<int64_t>(sq.position[seq]) + i_row);
    lse_at = cp_row(cp, static_cast<int>(qh % H), static_cast<int64_t>(sq.row_begin[seq]) + i_row);
    dst = out + lse_at * L;
    if (visible == 0) {  // the whole block (no barrier passed yet): no local position is old enough
      const int i = blockIdx.y * kCombineCols + threadIdx.x;
      if (threadIdx.x < kCombineCols && i < L) dst[i] = 0.0f;
      if (blockIdx.y == 0 && threadIdx.x == 0) lse[lse_at] = -INFINITY;
      return;
    }
  } else {
    visible = static_cast<int64_t>(sq.position[seq]) + i_row + 1;
    dst = out + qh * L;
  }
  const int64_t nonempty = (visible + split_len - 1) / split_len;  // splits with a visible position
  const int used = nonempty < splits ? static_cast<int>(nonempty) : splits;
  const int64_t base = qh * splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x)
    if (part_l[base + s] > 0.0f) m = fmaxf(m, part_m[base + s]);
  const float M = block_max(m, red);
  float z = 0.0f;
  for (int s = threadIdx.x; s < padded_floats(splits); s += blockDim.x) {
    const float l = s < used ? part_l[base + s] : 0.0f;
    const float w = l > 0.0f ? expf(part_m[base + s] - M) : 0.0f;
    weight[s] = w;
    z += w * l;
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
  __syncthreads();  // every split group's partial sum written before group 0 adds them
  if (g == 0 && i < L) {
    float sum = partial[col];
#pragma unroll
    for (int q = 1; q < kGroups; ++q) sum += partial[q * kCombineCols + col];
    dst[i] = round_if(sum / Z, round);
  }
  if constexpr (kCp)
    if (blockIdx.y == 0 && threadIdx.x == 0) lse[lse_at] = M + logf(Z);
}

// out[t][h*vd + e] = round(W_UV[h][e] . o_lat[qi][h]) for the q row t of query slot qi: a warp
// segment per weight row, rows of all heads spread over the grid (grid: rows / segments, Q).
template <class T, WFmt F, bool VEC>
__global__ void __launch_bounds__(kRowdotThreads)
    w_uv_kernel(SeqTables sq, WeightRef kv_b, const float* o_lat, T* out, int64_t out_ld, int H, int nope, int vd,
                int L, int width, bool round) {
  const int64_t qi = blockIdx.y;
  const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
  if (i_row >= sq.num_rows[seq]) return;  // the whole block: an unused row slot
  const int64_t t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;
  const int sub = threadIdx.x % width;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / width) + threadIdx.x / width;
  const bool row_ok = r < static_cast<int64_t>(H) * vd;
  const int h = row_ok ? static_cast<int>(r / vd) : 0, e = row_ok ? static_cast<int>(r % vd) : 0;
  const float* x[1] = {o_lat + (qi * H + h) * static_cast<int64_t>(L)};
  float acc[1];
  segment_row_dot<F, VEC, float, 1>(kv_b, static_cast<int64_t>(h) * (nope + vd) + nope + e, L, x, 1, sub, width, row_ok,
                                    acc);
  if (row_ok && sub == 0) store_act(out + t * out_ld + r, acc[0], round);
}

// ---------------------------------------------------------------- host launchers

// Step 1 for every query slot: grid (Q, H, column blocks); the column width (8 when the weight rows
// allow 16-byte loads) and the number of nope groups depend only on L, nope and the weight layout,
// so both callers sum in the same order. MXFP4 kv_b is refused by the callers' supports().
template <bool kOutByRow>
inline void launch_q_absorb(const CudaOps& ops, const SeqTables& sq, int64_t Q, const core::TensorView& q,
                            const LinearWeight& kv_b, float* qc, int H, int nope, int rope, int vd, int L, bool round,
                            cudaStream_t stream) {
  const WeightRef w = weight_ref(kv_b);
  const int n8 = (L % 8 == 0 && aligned16(w.data) &&
                  (static_cast<size_t>(w.ld) * core::dtype_size(kv_b.weight.dtype())) % 16 == 0)
                     ? 8
                     : 1;
  const int chunks = L / n8, col_blocks = (chunks + kQaChunks - 1) / kQaChunks;
  const int d_groups = std::clamp(kThreads / std::min(chunks, kQaChunks), 1, std::max(1, nope));
  const size_t qa_smem = (static_cast<size_t>(padded_floats(nope)) + static_cast<size_t>(d_groups) * kQaChunks * n8) *
                         sizeof(float);
  with_act(q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    with_wfmt(weight_format(kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {
        const auto launch_qa = [&](auto kernel) {
          allow_smem(ops, kernel, qa_smem);
          kernel<<<dim3(static_cast<unsigned>(Q), H, col_blocks), kThreads, qa_smem, stream>>>(
              sq, q.as<const E>(), q.strides[0], w, qc, H, nope, rope, vd, L, d_groups, round);
          K3_CUDA_CHECK_LAUNCH("q_absorb_kernel");
        };
        if (n8 == 8) launch_qa(q_absorb_kernel<E, FC, 8, kOutByRow>);
        else launch_qa(q_absorb_kernel<E, FC, 1, kOutByRow>);
      }
    });
  });
}

// Step 4 for every query slot, from o_lat [Q][H][L] by slot into out [T, H * vd] (rows of the slots).
inline void launch_w_uv(const SeqTables& sq, int64_t Q, const LinearWeight& kv_b, const float* o_lat,
                        const core::TensorView& out, int H, int nope, int vd, int L, bool round, cudaStream_t stream) {
  const WeightRef w = weight_ref(kv_b);
  with_act(out.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    with_wfmt(weight_format(kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {
        const bool vec = vector_ok(FC, w, L, o_lat, L, sizeof(float));
        const auto launch_uv = [&](auto kernel, int width) {
          const dim3 grid(grid_for(static_cast<int64_t>(H) * vd, kRowdotThreads / width), static_cast<unsigned>(Q));
          kernel<<<grid, kRowdotThreads, 0, stream>>>(sq, w, o_lat, out.as<E>(), out.strides[0], H, nope, vd, L, width,
                                                      round);
          K3_CUDA_CHECK_LAUNCH("w_uv_kernel");
        };
        if (vec) launch_uv(w_uv_kernel<E, FC, true>, segment_width<FC, true>(L));
        else launch_uv(w_uv_kernel<E, FC, false>, segment_width<FC, false>(L));
      }
    });
  });
}

// The split plan of steps 2-3: about two blocks per multiprocessor, at least kTile positions per
// split, sized from max_tokens (S) alone so a captured graph replays for any positions.
struct SplitPlan {
  int groups = 1, group_heads = 1, splits = 1, split_len = 1;
};
inline SplitPlan split_plan(int sm_count, int64_t Q, int heads, int64_t S) {
  SplitPlan p;
  p.groups = (heads + kMaxGroupHeads - 1) / kMaxGroupHeads;
  p.group_heads = (heads + p.groups - 1) / p.groups;
  const int64_t target = std::max<int64_t>(1, 2 * sm_count / std::max<int64_t>(1, Q * p.groups));
  const int64_t max_splits = std::max<int64_t>(1, (S + kTile - 1) / kTile);
  p.splits = static_cast<int>(std::clamp<int64_t>(target, 1, max_splits));
  p.split_len = static_cast<int>((S + p.splits - 1) / p.splits);
  return p;
}

}  // namespace
}  // namespace k3::kernels::cuda_detail::absorbed
