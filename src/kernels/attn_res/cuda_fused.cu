// kernels/attn_res/cuda_fused.cu: CUDA attn_res_bank and attn_res_merge (contract and byte counts
// in attn_res_fused.h), both simple one-launch kernels with fixed-order sums:
//   bank_kernel, grid (T, ceil(M / G)), 256 threads: CTA (t, g) runs G mixes in turn; for mix m it
//     sums R_j^2 and R_j c_m over token t's n bank rows (per thread, then warps, then warps in
//     order), forms the softmax stats of mix m, and writes acc[m, t, :] = sum_j e_j R_j (bank
//     order). Token t's bank rows come from DRAM once, the other reads hit L1/L2.
//   merge_kernel, grid (T), one CTA per row (one N-vector per thread: 896 threads at D = 7168, at
//     most 1024), the row kept in shared memory (f32 [D]):
//     pass 1 P_new (stored) and its score sums, pass 2 h = merged softmax (stored if asked) and
//     its sum of squares, pass 3 x = RMSNorm(h). Every thread touches the same columns in every
//     pass, so P_new may be written over P_old (or over a) in place, and the shared row needs no
//     barrier beyond those of the block sums.
// N = 8 (16-byte loads) when every row and vector is aligned and D % 8 == 0, else N = 1.
// Small batches (T <= 32) take the cluster form of the merge instead (cuda_merge_cluster.cu,
// registered here; tuning/*.json order them): one row over 2-8 SMs.
// Programmatic dependent launch (rules: kernels/cuda_common.cuh), both kernels: trigger at the top, then
// the token-0 CTAs ask L2 for the weight vectors they read (bank: its mixes' query and norm, 2 x 14,336 B
// per CTA at K3 TP8, 24 CTAs at batch 1: 688 KB; merge: query, norm and the RMSNorm weight, 43 KB, CTA 0),
// then every CTA waits before it reads a bank row, P_old, a, acc or the stats and before any store.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/attn_res/merge_common.cuh"
#include "kernels/attn_res/ops.h"

namespace k3::kernels {

using namespace cuda_detail;
using namespace attn_res_fused_detail;

namespace {

constexpr int kThreads = 256;  // bank_kernel
constexpr int kWarps = kThreads / 32;
constexpr int kMaxMergeThreads = 1024;  // merge_kernel: one N-vector per thread up to D = 8192
constexpr int kMaxRows = kAttnResFusedMaxBankRows;
constexpr int kMaxMixes = kAttnResFusedMaxMixes;

// ---------------------------------------------------------------- attn_res_bank

template <class T>
struct BankParams {
  const T* rows[kMaxRows];  // bank row j: act [T, D], row t at rows[j] + t * ld[j]
  int64_t ld[kMaxRows];
  int n;                         // bank rows
  const void* query[kMaxMixes];  // mix m: bf16/f32 [D]
  const void* norm[kMaxMixes];   // mix m: bf16/f32 [D]
  bool query_bf16[kMaxMixes];
  bool norm_bf16[kMaxMixes];
  float* acc;         // f32 [M, T, D] contiguous
  float* stats;       // f32 [M, T, 2] contiguous
  int64_t tokens, D;  // T, hidden
  int mixes;          // M
  int mixes_per_cta;  // G: CTA (t, g) runs mixes g*G .. min(M, (g+1)*G) - 1
  float eps;
};

// Mix m of token t: scores of the n bank rows against c_m, the softmax stats, acc[m, t, :].
// `red` and `score` are the CTA's shared scratch.
template <class T, int N>
__device__ __forceinline__ void bank_one_mix(const BankParams<T>& p, int64_t t, int m, float (*red)[kMaxRows][2],
                                             float* score) {
  const int n = p.n;
  const int64_t D = p.D;
  const void* query = p.query[m];
  const void* norm = p.norm[m];
  const bool q_bf16 = p.query_bf16[m], n_bf16 = p.norm_bf16[m];

  // Pass 1: this thread's partial sums of R_j^2 and R_j c over its columns, for every row j.
  float sum_sq[kMaxRows], dot[kMaxRows];
#pragma unroll
  for (int j = 0; j < kMaxRows; ++j) sum_sq[j] = dot[j] = 0.0f;
  for (int64_t h = static_cast<int64_t>(threadIdx.x) * N; h < D; h += int64_t{kThreads} * N) {
    float c[N], q[N];
    load_vec_n<N>(norm, n_bf16, h, c);
    load_vec_n<N>(query, q_bf16, h, q);
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] *= q[i];  // c = norm * query in fp32
#pragma unroll
    for (int j = 0; j < kMaxRows; ++j) {  // unrolled: the row table stays in parameter space
      if (j < n) {
        float r[N];
        load_act_n<N>(p.rows[j] + t * p.ld[j] + h, r);
#pragma unroll
        for (int i = 0; i < N; ++i) sum_sq[j] += r[i] * r[i], dot[j] += r[i] * c[i];
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kMaxRows; ++j) {
    if (j < n) {
      const float a = warp_sum(sum_sq[j]), b = warp_sum(dot[j]);
      if (lane == 0) red[warp][j][0] = a, red[warp][j][1] = b;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < n) {  // thread j: row j's score from the warps' sums in warp order
    const int j = static_cast<int>(threadIdx.x);
    float ss = 0.0f, dd = 0.0f;
    for (int w = 0; w < kWarps; ++w) ss += red[w][j][0], dd += red[w][j][1];
    const float rho = 1.0f / sqrtf(ss / static_cast<float>(D) + p.eps);
    score[j] = rho * dd;
  }
  __syncthreads();

  // Softmax stats, computed identically by every thread (n <= 16: cheaper than a broadcast).
  float max_s = score[0];
  for (int j = 1; j < n; ++j) max_s = fmaxf(max_s, score[j]);
  float e[kMaxRows];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxRows; ++j) {
    e[j] = j < n ? expf(score[j] - max_s) : 0.0f;
    sum += e[j];  // j >= n adds 0: the sum is still in bank order
  }
  float* stats = p.stats + (static_cast<int64_t>(m) * p.tokens + t) * 2;
  if (threadIdx.x == 0) stats[0] = max_s, stats[1] = sum;

  // Pass 2: acc[m, t, h] = sum_j e_j R_j[t, h], e_0 R_0 first, unrounded fp32.
  float* acc = p.acc + (static_cast<int64_t>(m) * p.tokens + t) * D;
  for (int64_t h = static_cast<int64_t>(threadIdx.x) * N; h < D; h += int64_t{kThreads} * N) {
    float v[N], r[N];
    load_act_n<N>(p.rows[0] + t * p.ld[0] + h, r);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = e[0] * r[i];
#pragma unroll
    for (int j = 1; j < kMaxRows; ++j) {
      if (j < n) {
        load_act_n<N>(p.rows[j] + t * p.ld[j] + h, r);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] += e[j] * r[i];
      }
    }
    store_act_n<N>(acc + h, v, /*round=*/false);
  }
}

// Grid (T, ceil(M / G)): CTA (t, g) runs mixes g*G .. min(M, (g+1)*G) - 1 one after another, so
// token t's bank rows come from L1/L2 after the first. `red` / `score` are reused without an
// extra barrier: mix m + 1 writes `red` only after every thread passed m's second barrier (the
// last reads of `red`), and `score` only after every thread reached m + 1's first barrier (every
// read of m's `score` comes before it).
template <class T, int N>
__global__ void __launch_bounds__(kThreads) bank_kernel(const BankParams<T> p) {
  __shared__ float red[kWarps][kMaxRows][2];
  __shared__ float score[kMaxRows];
  const int m_begin = static_cast<int>(blockIdx.y) * p.mixes_per_cta;
  const int m_end = min(p.mixes, (static_cast<int>(blockIdx.y) + 1) * p.mixes_per_cta);
  // PDL: thread 2 i (2 i + 1) of a token-0 CTA prefetches mix m_begin + i's query (norm), G <= 32 mixes.
  pdl_launch_dependents();
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < 2 * (m_end - m_begin)) {
    const int m = m_begin + static_cast<int>(threadIdx.x >> 1);
    const bool q = (threadIdx.x & 1) == 0;
    const bool is_bf16 = q ? p.query_bf16[m] : p.norm_bf16[m];
    prefetch_l2_within(q ? p.query[m] : p.norm[m], static_cast<uint64_t>(p.D) * (is_bf16 ? 2 : 4));
  }
  pdl_wait();
  for (int m = m_begin; m < m_end; ++m) bank_one_mix<T, N>(p, static_cast<int64_t>(blockIdx.x), m, red, score);
}

core::Status bank_supports(const CudaOps& ops, const AttnResBankArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"acc", &a.acc}, {"stats", &a.stats}}); !s) return s;
  for (size_t j = 0; j < a.bank.size(); ++j) {
    const std::string name = "bank[" + std::to_string(j) + "]";
    if (auto s = on_cuda({{name.c_str(), &a.bank[j]}}); !s) return s;
    if (auto s = same_act({{"bank[0]", &a.bank[0]}, {name.c_str(), &a.bank[j]}}, a.precision); !s) return s;
  }
  for (size_t m = 0; m < a.queries.size(); ++m) {
    const std::string qn = "queries[" + std::to_string(m) + "]", nn = "norms[" + std::to_string(m) + "]";
    if (auto s = on_cuda({{qn.c_str(), &a.queries[m]}, {nn.c_str(), &a.norms[m]}}); !s) return s;
  }
  if (a.bank[0].dim(0) > 0x7fffffff) return core::Status::fail("more than 2^31 - 1 rows");
  return core::Status::ok();
}

void bank_run(const CudaOps& ops, const AttnResBankArgs& a) {
  const int64_t T = a.bank[0].dim(0), D = a.bank[0].dim(1);
  const int M = static_cast<int>(a.queries.size());
  if (T == 0) return;
  with_act(a.bank[0].dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    BankParams<E> p{};
    p.n = static_cast<int>(a.bank.size());
    bool vec = aligned16(a.acc.data);  // acc rows are D * 4 bytes apart: 32-byte multiples when D % 8 == 0
    for (int j = 0; j < p.n; ++j) {
      p.rows[j] = a.bank[j].as<const E>();
      p.ld[j] = a.bank[j].strides[0];
      vec = vec && rows_vec8(a.bank[j]);
    }
    for (int m = 0; m < M; ++m) {
      p.query[m] = a.queries[m].data;
      p.norm[m] = a.norms[m].data;
      p.query_bf16[m] = a.queries[m].dtype == core::DType::bf16;
      p.norm_bf16[m] = a.norms[m].dtype == core::DType::bf16;
      vec = vec && aligned16(p.query[m]) && aligned16(p.norm[m]);
    }
    p.acc = a.acc.as<float>();
    p.stats = a.stats.as<float>();
    p.tokens = T;
    p.D = D;
    p.eps = a.eps;
    // Enough CTAs to fill the GPU about twice (1 mix per CTA up to T = 11 on 132 SMs), and no
    // more mixes per CTA than that: each mix after the first re-reads the rows from L1/L2 only.
    const int64_t want_ctas = 2 * static_cast<int64_t>(ops.ctx->info().sm_count);
    p.mixes = M;
    p.mixes_per_cta = static_cast<int>(std::clamp<int64_t>(T * M / std::max<int64_t>(want_ctas, 1), 1, M));
    const unsigned groups = static_cast<unsigned>((M + p.mixes_per_cta - 1) / p.mixes_per_cta);
    const dim3 grid(static_cast<unsigned>(T), groups);
    if (vec) {
      launch_dependent(bank_kernel<E, 8>, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    } else {
      launch_dependent(bank_kernel<E, 1>, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    }
    K3_CUDA_CHECK_LAUNCH("attn_res_bank_kernel");
  });
}

// ---------------------------------------------------------------- attn_res_merge

// MergeParams, merge_params and merge_supports: merge_common.cuh (shared with the cluster form).

template <class T, int N>
__global__ void __launch_bounds__(kMaxMergeThreads) merge_kernel(const MergeParams<T> p) {
  extern __shared__ float row[];  // [D]: P_new after pass 1, h after pass 2
  __shared__ float red[32];
  const int64_t t = blockIdx.x, D = p.D;
  const T* p_old = p.prefix + t * p.prefix_ld;
  const T* sub = p.sub ? p.sub + t * p.sub_ld : nullptr;
  T* p_out = p.prefix_out ? p.prefix_out + t * p.prefix_out_ld : nullptr;
  const bool has_bank = p.acc != nullptr;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * N, step = static_cast<int64_t>(blockDim.x) * N;
  // PDL: CTA 0's threads 0..2 prefetch the query, norm and RMSNorm weight vectors; then wait.
  pdl_launch_dependents();
  if (blockIdx.x == 0 && (threadIdx.x == 2 || (has_bank && threadIdx.x < 2))) {  // query, norm: with a bank
    const void* vec = threadIdx.x == 0 ? p.query : threadIdx.x == 1 ? p.norm : p.weight;
    const bool is_bf16 = threadIdx.x == 0 ? p.query_bf16 : threadIdx.x == 1 ? p.norm_bf16 : p.weight_bf16;
    prefetch_l2_within(vec, static_cast<uint64_t>(D) * (is_bf16 ? 2 : 4));
  }
  pdl_wait();

  // Pass 1: P_new = P_old | a | round(P_old + a); stored, kept in `row`, scored against c.
  float sum_sq = 0.0f, dot = 0.0f;
  for (int64_t h = first; h < D; h += step) {
    float v[N];
    if (sub && p.restart) {
      load_act_n<N>(sub + h, v);  // the prefix restarts from the sublayer output (P_old not read)
    } else {
      load_act_n<N>(p_old + h, v);
      if (sub) {
        float a[N];
        load_act_n<N>(sub + h, a);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = round_if(v[i] + a[i], p.round);  // the standard add
      }
    }
    if (p_out) store_act_n<N>(p_out + h, v, p.round);  // already an activation value: exact
    if (has_bank) {
      float c[N], q[N];
      load_vec_n<N>(p.norm, p.norm_bf16, h, c);
      load_vec_n<N>(p.query, p.query_bf16, h, q);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        c[i] *= q[i];
        sum_sq += v[i] * v[i];
        dot += v[i] * c[i];
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) row[h + i] = v[i];
  }

  // The merged softmax weights of the bank partials (B) and of the prefix (E).
  float scale_b = 0.0f, scale_p = 1.0f, denom = 1.0f;
  if (has_bank) {
    const float ss = block_sum(sum_sq, red);
    const float dd = block_sum(dot, red);
    const float s_p = (1.0f / sqrtf(ss / static_cast<float>(D) + p.mix_eps)) * dd;
    const float max_b = p.stats[t * p.stats_ld], sum_b = p.stats[t * p.stats_ld + 1];
    const float mx = fmaxf(max_b, s_p);
    scale_b = expf(max_b - mx);
    scale_p = expf(s_p - mx);
    denom = scale_b * sum_b + scale_p;
  }

  // Pass 2: h (rounded as the Mix output; P_new itself without a bank), and its sum of squares.
  T* h_out = p.mixed_out ? p.mixed_out + t * p.mixed_ld : nullptr;
  const float* acc = has_bank ? p.acc + t * p.acc_ld : nullptr;
  float h_sq = 0.0f;
  for (int64_t h = first; h < D; h += step) {
    float v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = row[h + i];
    if (has_bank) {
      float b[N];
      load_act_n<N>(acc + h, b);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = round_if((scale_b * b[i] + scale_p * v[i]) / denom, p.round);
    }
    if (h_out) store_act_n<N>(h_out + h, v, p.round);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      row[h + i] = v[i];
      h_sq += v[i] * v[i];
    }
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(h_sq, red) / static_cast<float>(D) + p.rms_eps);

  // Pass 3: x = round(w * x_hat), x_hat = h * inv_rms (rounded first in the moonshot style).
  T* x_out = p.normed_out + t * p.normed_ld;
  for (int64_t h = first; h < D; h += step) {
    float v[N], w[N];
    load_vec_n<N>(p.weight, p.weight_bf16, h, w);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float x_hat = row[h + i] * inv_rms;
      if (p.moonshot) x_hat = round_if(x_hat, p.round);
      v[i] = w[i] * x_hat;
    }
    store_act_n<N>(x_out + h, v, p.round);
  }
}

void merge_run(const CudaOps& ops, const AttnResMergeArgs& a) {
  const int64_t T = a.prefix.dim(0), D = a.prefix.dim(1);
  if (T == 0) return;
  with_act(a.prefix.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const MergeParams<E> p = merge_params<E>(a);
    const bool vec = merge_rows_vec8(a);
    const size_t smem = static_cast<size_t>(D) * sizeof(float);
    // One N-vector per thread where it fits (D = 7168: 896 threads): a lone row (T = 1) then has
    // all its loads in flight at once; a multiple of 32 for the block sums.
    const int64_t vectors = (D + (vec ? 8 : 1) - 1) / (vec ? 8 : 1);
    const auto threads = static_cast<unsigned>(std::clamp<int64_t>((vectors + 31) / 32 * 32, 32, kMaxMergeThreads));
    const auto launch = [&](auto kernel) {
      allow_smem(ops, kernel, smem);
      launch_dependent(kernel, dim3(static_cast<unsigned>(T)), dim3(threads), smem, ops.ctx->stream(), dim3(1, 1, 1),
                       p);
      K3_CUDA_CHECK_LAUNCH("attn_res_merge_kernel");
    };
    if (vec) launch(merge_kernel<E, 8>);
    else launch(merge_kernel<E, 1>);
  });
}

}  // namespace

void register_attn_res_fused_cuda(AttnResOps& r, const CudaOps& ops) {
  r.attn_res_bank.add({"cuda_bank_per_mix", core::Device::cuda,
                       [ops](const AttnResBankArgs& a) { return bank_supports(ops, a); },
                       [ops](const AttnResBankArgs& a) { bank_run(ops, a); }});
  r.attn_res_merge.add({"cuda_merge_rowwise", core::Device::cuda,
                        [ops](const AttnResMergeArgs& a) { return merge_supports(ops, a); },
                        [ops](const AttnResMergeArgs& a) { merge_run(ops, a); }});
  register_attn_res_merge_cluster_cuda(r, ops);  // 2-8 CTAs per row: small batches
}

}  // namespace k3::kernels
