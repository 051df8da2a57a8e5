// kernels/mla/cuda_absorbed.cu: CUDA MLA attention in the absorbed (decode) form (spec §6.2), also
// for several queries of one sequence (speculative-verify rows, query t at position S-T+t):
//   1. q_absorb: q_lat = round(W_UK[h]^T q_nope) [kv_lora], beside q_pe: Qc[t][h] = [q_lat; q_pe]
//   2. split_kv: the cache is one shared 576-wide key/value head (MQA), so a block takes a range
//      of positions (a split) for a group of heads, stages each tile of cache rows in shared memory
//      once for all of them: s = scale * Qc . [c_n; k_pe], running max/sum over tiles, partial
//      o = sum e^{s-m} c_n
//   3. combine: o_lat = round(sum over splits, rescaled, / Z)
//   4. w_uv: o = round(W_UV[h] o_lat), one weight row per warp segment (the row-dot kernel's form)
// Splits are sized so that about two blocks per multiprocessor run (decode reads the cache once).
#include <algorithm>

#include "kernels/cuda_rowdot.cuh"
#include "kernels/mla/cuda_mla_common.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroupHeads = 8;  // heads per block (one warp each in the softmax step)
constexpr int kTile = 64;          // positions per tile
constexpr int kLatPerThread = kMlaMaxLatent / kThreads;
constexpr int kQaChunks = 8;       // q_absorb: column chunks per block (64 columns of 8)

// N consecutive entries of row r of a dense (f32 / bf16) weight from column c.
template <WFmt F, int N>
__device__ __forceinline__ void load_w_n(const WeightRef& w, int64_t r, int64_t c, float (&v)[N]) {
  if constexpr (F == WFmt::bf16)
    load_act_n<N>(static_cast<const bf16*>(w.data) + r * w.ld + c, v);
  else
    load_act_n<N>(static_cast<const float*>(w.data) + r * w.ld + c, v);
}

// Grid (query, head, column block): a block owns kQaChunks chunks of N columns of q_lat; its
// threads split the nope sum into `groups` (d = g, g + groups, ...), so each has a few independent
// loads in flight and many blocks share the weight reads; the groups' partial sums are then
// added in group order.
template <class T, WFmt F, int N>
__global__ void __launch_bounds__(kThreads) q_absorb_kernel(const T* q, int64_t q_ld, WeightRef kv_b, float* qc,
                                                            int H, int nope, int rope, int vd, int L, int groups,
                                                            bool round) {
  extern __shared__ float sm[];
  float* qn = sm;                          // [padded_floats(nope)], zeros past nope
  float* part = sm + padded_floats(nope);  // [groups][kQaChunks * N]
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int c_begin = blockIdx.z * kQaChunks, chunks = min(kQaChunks, L / N - c_begin);
  const T* qh = q + t * q_ld + static_cast<int64_t>(h) * (nope + rope);
  for (int d = threadIdx.x; d < padded_floats(nope); d += blockDim.x) qn[d] = d < nope ? to_f32(qh[d]) : 0.0f;
  __syncthreads();
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
  __syncthreads();
  float* out = qc + (t * H + h) * static_cast<int64_t>(L + rope);
  for (int i = threadIdx.x; i < chunks * N; i += blockDim.x) {
    float acc = part[i];
    for (int g = 1; g < groups; ++g) acc += part[g * kQaChunks * N + i];
    out[c_begin * N + i] = round_if(acc, round);
  }
  if (blockIdx.z == 0)
    for (int r = threadIdx.x; r < rope; r += blockDim.x) out[L + r] = to_f32(qh[nope + r]);
}

struct SplitParams {
  const float* qc;     // [T][H][L + rope]
  int64_t cache_ld;
  float k_scale, scale;
  float* part_o;       // [T][H][splits][L]
  float* part_m;       // [T][H][splits]
  float* part_l;       // [T][H][splits]
  int64_t S, T_len;
  int H, L, rope, group_heads, splits, split_len;
  bool vec_copy;       // cache rows can be staged with 16-byte copies
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

template <class CacheT>
__global__ void __launch_bounds__(kThreads) split_kv_kernel(SplitParams p, const CacheT* cache) {
  extern __shared__ float4 sm4[];
  const int E = p.L + p.rope, G = p.group_heads;
  CacheT* tile = reinterpret_cast<CacheT*>(sm4);  // [kTile][E]
  float* qs = reinterpret_cast<float*>(reinterpret_cast<char*>(sm4) + split_tile_bytes<CacheT>(E));  // [G][E]
  float* sc = qs + G * E;                                                                             // [G][kTile]
  __shared__ float m_run[kMaxGroupHeads], l_run[kMaxGroupHeads], factor[kMaxGroupHeads];
  const int split = blockIdx.x, h0 = blockIdx.z * G;
  const int64_t t = blockIdx.y;
  const int hg = min(G, p.H - h0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < hg * E; e += blockDim.x)
    qs[e] = p.qc[(t * p.H + h0 + e / E) * static_cast<int64_t>(E) + e % E];
  if (tid < kMaxGroupHeads) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;
  const int64_t visible = p.S - p.T_len + t + 1;
  const int64_t j_begin = static_cast<int64_t>(split) * p.split_len;
  const int64_t j_end = j_begin + p.split_len < visible ? j_begin + p.split_len : visible;
  float acc[kMaxGroupHeads][kLatPerThread] = {};
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
    const int n = static_cast<int>(j_end - j0 < kTile ? j_end - j0 : kTile);
    // Stage the tile: every thread copies, all loads independent (the latency is paid once).
    if (p.vec_copy) {
      const int per_row = E * static_cast<int>(sizeof(CacheT)) / 16;
      for (int e = tid; e < n * per_row; e += blockDim.x) {
        const int jj = e / per_row, c = e % per_row;
        reinterpret_cast<uint4*>(tile + static_cast<int64_t>(jj) * E)[c] =
            reinterpret_cast<const uint4*>(cache + (j0 + jj) * p.cache_ld)[c];
      }
    } else {
      for (int e = tid; e < n * E; e += blockDim.x) tile[e] = cache[(j0 + e / E) * p.cache_ld + e % E];
    }
    __syncthreads();
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
    __syncthreads();
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
    __syncthreads();
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
  __syncthreads();  // m_run / l_run of an empty split
#pragma unroll
  for (int g = 0; g < kMaxGroupHeads; ++g) {  // unrolled: acc stays in registers
    if (g >= hg) break;
    const int64_t base = (t * p.H + h0 + g) * p.splits + split;
#pragma unroll
    for (int u = 0; u < kLatPerThread; ++u) {
      const int i = tid + u * kThreads;
      if (i < p.L) p.part_o[base * p.L + i] = acc[g][u];
    }
    if (tid == 0) p.part_m[base] = m_run[g], p.part_l[base] = l_run[g];
  }
}

// Grid (query x head, latent blocks of kCombineCols): the split weights w_s = e^{m_s - M}
// (M = max m_s) go to shared memory (each block computes them, all threads at once); the block's
// threads are kCombineCols columns x (kThreads / kCombineCols) split groups, whose partial sums are
// added in group order: o_lat[i] = round(sum_s w_s o_s[i] / sum_s w_s l_s). Splits with no visible
// position have l = 0 and weight 0.
constexpr int kCombineCols = 64;
__global__ void __launch_bounds__(kThreads) combine_kernel(const float* part_o, const float* part_m,
                                                           const float* part_l, int splits, float* o_lat, int L,
                                                           bool round) {
  extern __shared__ float weight[];  // [padded_floats(splits)], zeros past splits
  __shared__ float red[32];
  __shared__ float partial[kThreads];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * splits;  // blockIdx.x = t * H + h
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += blockDim.x)
    if (part_l[base + s] > 0.0f) m = fmaxf(m, part_m[base + s]);
  const float M = block_max(m, red);
  float z = 0.0f;
  for (int s = threadIdx.x; s < padded_floats(splits); s += blockDim.x) {
    const float l = s < splits ? part_l[base + s] : 0.0f;
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
    for (int s = g; s < splits; s += kGroups) acc += weight[s] * part_o[(base + s) * L + i];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  if (g == 0 && i < L) {
    float sum = partial[col];
#pragma unroll
    for (int q = 1; q < kGroups; ++q) sum += partial[q * kCombineCols + col];
    o_lat[static_cast<int64_t>(blockIdx.x) * L + i] = round_if(sum / Z, round);
  }
}

// out[t][h*vd + e] = round(W_UV[h][e] . o_lat[t][h]): a warp segment per weight row, rows of all
// heads spread over the grid (grid: rows / segments, T).
template <class T, WFmt F, bool VEC>
__global__ void __launch_bounds__(kRowdotThreads) w_uv_kernel(WeightRef kv_b, const float* o_lat, T* out,
                                                              int64_t out_ld, int H, int nope, int vd, int L,
                                                              int width, bool round) {
  const int sub = threadIdx.x % width;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / width) + threadIdx.x / width;
  const int64_t t = blockIdx.y;
  const bool row_ok = r < static_cast<int64_t>(H) * vd;
  const int h = row_ok ? static_cast<int>(r / vd) : 0, e = row_ok ? static_cast<int>(r % vd) : 0;
  const float* x[1] = {o_lat + (t * H + h) * static_cast<int64_t>(L)};
  float acc[1];
  segment_row_dot<F, VEC, float, 1>(kv_b, static_cast<int64_t>(h) * (nope + vd) + nope + e, L, x, 1, sub, width,
                                    row_ok, acc);
  if (row_ok && sub == 0) store_act(out + t * out_ld + r, acc[0], round);
}

void absorbed_run(const CudaOps& ops, const MlaAttentionArgs& a) {
  const int64_t T = a.q.dim(0), S = a.cache.dim(0);
  if (T == 0) return;
  const int H = a.num_heads, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim, L = a.kv_lora;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const int groups = (H + kMaxGroupHeads - 1) / kMaxGroupHeads;
  const int group_heads = (H + groups - 1) / groups;
  // About two blocks per multiprocessor, at least kTile positions per split.
  const int64_t target = std::max<int64_t>(1, 2 * ops.ctx->info().sm_count / std::max<int64_t>(1, T * groups));
  const int64_t max_splits = (S + kTile - 1) / kTile;
  const int splits = static_cast<int>(std::clamp<int64_t>(target, 1, max_splits));
  const int split_len = static_cast<int>((S + splits - 1) / splits);

  const size_t qc_floats = static_cast<size_t>(T * H * (L + rope));
  const size_t part_floats = static_cast<size_t>(T * H * splits) * (static_cast<size_t>(L) + 2);
  const size_t lat_floats = static_cast<size_t>(T * H * L);
  std::shared_ptr<void> scratch = ops.ctx->scratch((qc_floats + part_floats + lat_floats) * sizeof(float));
  SplitParams p;
  float* qc = static_cast<float*>(scratch.get());
  p.qc = qc;
  p.part_o = qc + qc_floats;
  p.part_m = p.part_o + static_cast<int64_t>(T) * H * splits * L;
  p.part_l = p.part_m + static_cast<int64_t>(T) * H * splits;
  float* o_lat = p.part_l + static_cast<int64_t>(T) * H * splits;
  p.cache_ld = a.cache.strides[0];
  p.k_scale = a.k_scale, p.scale = a.scale;
  p.S = S, p.T_len = T, p.H = H, p.L = L, p.rope = rope;
  p.group_heads = group_heads, p.splits = splits, p.split_len = split_len;
  const size_t elem = core::dtype_size(a.cache.dtype);
  p.vec_copy = aligned16(a.cache.data) && (static_cast<size_t>(L + rope) * elem) % 16 == 0 &&
               (static_cast<size_t>(S > 1 ? a.cache.strides[0] : 0) * elem) % 16 == 0;

  const WeightRef w = weight_ref(*a.kv_b);
  const int n8 = (L % 8 == 0 && aligned16(w.data) && (static_cast<size_t>(w.ld) *
                  core::dtype_size(a.kv_b->weight.dtype())) % 16 == 0) ? 8 : 1;
  const int chunks = L / n8, col_blocks = (chunks + kQaChunks - 1) / kQaChunks;
  const int d_groups = std::clamp(kThreads / std::min(chunks, kQaChunks), 1, std::max(1, nope));
  const size_t qa_smem =
      (static_cast<size_t>(padded_floats(nope)) + static_cast<size_t>(d_groups) * kQaChunks * n8) * sizeof(float);
  with_act(a.q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    with_wfmt(weight_format(*a.kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {
        const auto launch_qa = [&](auto kernel) {
          allow_smem(kernel, qa_smem);
          kernel<<<dim3(static_cast<unsigned>(T), H, col_blocks), kThreads, qa_smem, stream>>>(
              a.q.as<const E>(), a.q.strides[0], w, qc, H, nope, rope, vd, L, d_groups, round);
          K3_CUDA_CHECK_LAUNCH("q_absorb_kernel");
        };
        if (n8 == 8)
          launch_qa(q_absorb_kernel<E, FC, 8>);
        else
          launch_qa(q_absorb_kernel<E, FC, 1>);
        with_cache(a.cache, [&](const auto* cache) {
          using CacheT = std::remove_cv_t<std::remove_pointer_t<decltype(cache)>>;
          const size_t smem = split_smem_bytes<CacheT>(L + rope, group_heads);
          allow_smem(split_kv_kernel<CacheT>, smem);
          split_kv_kernel<CacheT><<<dim3(splits, static_cast<unsigned>(T), groups), kThreads, smem, stream>>>(p, cache);
          K3_CUDA_CHECK_LAUNCH("split_kv_kernel");
        });
        const size_t combine_smem = static_cast<size_t>(padded_floats(splits)) * sizeof(float);
        allow_smem(combine_kernel, combine_smem);
        combine_kernel<<<dim3(static_cast<unsigned>(T * H), grid_for(L, kCombineCols)), kThreads, combine_smem,
                         stream>>>(p.part_o, p.part_m, p.part_l, splits, o_lat, L, round);
        K3_CUDA_CHECK_LAUNCH("combine_kernel");
        const bool vec = vector_ok(FC, w, L, o_lat, L, sizeof(float));
        const auto launch_uv = [&](auto kernel, int width) {
          const dim3 grid(grid_for(static_cast<int64_t>(H) * vd, kRowdotThreads / width), static_cast<unsigned>(T));
          kernel<<<grid, kRowdotThreads, 0, stream>>>(w, o_lat, a.out.as<E>(), a.out.strides[0], H, nope, vd, L, width,
                                                      round);
          K3_CUDA_CHECK_LAUNCH("w_uv_kernel");
        };
        if (vec)
          launch_uv(w_uv_kernel<E, FC, true>, segment_width<FC, true>(L));
        else
          launch_uv(w_uv_kernel<E, FC, false>, segment_width<FC, false>(L));
      }
    });
  });
}

}  // namespace

void register_mla_absorbed_cuda(Registry& r, const CudaOps& ops) {
  r.mla_absorbed.add({"cuda_split_kv", core::Device::cuda, 10,
                      [ops](const MlaAttentionArgs& a) {
                        if (auto s = mla_supports(ops, a); !s) return s;
                        if (a.kv_lora > kMlaMaxLatent)
                          return core::Status::fail("kv_lora " + std::to_string(a.kv_lora) +
                                                    " is above the CUDA limit " + std::to_string(kMlaMaxLatent));
                        const int E = a.kv_lora + a.qk_rope, G = std::min(a.num_heads, kMaxGroupHeads);
                        const size_t smem = a.cache.dtype == core::DType::f8_e4m3 ? split_smem_bytes<uint8_t>(E, G)
                                            : a.cache.dtype == core::DType::bf16 ? split_smem_bytes<bf16>(E, G)
                                                                                 : split_smem_bytes<float>(E, G);
                        if (smem > ops.ctx->smem_optin())
                          return core::Status::fail("the cache tile needs " + std::to_string(smem) +
                                                    " bytes of shared memory, the device allows " +
                                                    std::to_string(ops.ctx->smem_optin()));
                        return core::Status::ok();
                      },
                      [ops](const MlaAttentionArgs& a) { absorbed_run(ops, a); }});
}

}  // namespace k3::kernels
