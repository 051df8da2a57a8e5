// kernels/attn_res/cuda_merge_cluster.cu: the thread-block-cluster form of CUDA
// attn_res_merge ("cuda_merge_cluster") for small batches. The one-CTA form (cuda.cu) moves a
// whole row (~143 KB at K3 TP8, T = 1: P_old, a, acc, the three weight vectors in; P_new, h, x
// out) through one SM; here a row is split over a cluster of S CTAs (S = 8 at D = 7168), each
// owning a contiguous slice of D / S columns, so S SMs share the bytes and the latency.
//
// Grid (S, T), cluster (S, 1, 1): cluster y is row y, CTA rank r owns N-vectors [r * V_cta,
// (r + 1) * V_cta) of the row (V = ceil(D / N) vectors, V_cta = ceil(V / S); the last CTA may own
// fewer, the vectors past V belong to nobody). One N-vector per thread (N = 8: 16-byte vectors,
// D = 7168 -> 896 vectors, 112 per CTA, 128 threads), so the row never leaves registers and
// every load of the row (P_old, a, norm, query, acc, the RMSNorm weight) is issued at once,
// before the first reduction: one DRAM round trip instead of the one-CTA form's three.
//   pass 1: P_new and this CTA's (sum P_new^2, sum P_new c) -> its shared memory; cluster barrier;
//           every CTA adds the S pairs IN RANK ORDER (distributed shared memory) -> s_P, B, E
//           (identical in every CTA, so identical to the bit in every CTA and every run);
//   pass 2: h and this CTA's sum h^2 -> its shared memory (a second buffer: no reuse); cluster
//           barrier; rank-order sum -> inv_rms;
//   pass 3: x; then P_new, h, x are stored (after the last barrier arrival, so no release fence
//           waits on them) and a final cluster wait keeps every CTA alive until no other CTA
//           can still read its shared memory.
// Per element the arithmetic and the rounding points are the one-CTA kernel's (merge_kernel):
// only the order of the three row sums differs (thread, warp tree, warps in order, ranks in
// order), so h and x agree with it to fp32 summation noise and P_new bit for bit.
// Applies when T <= 32 (below: why), V >= 64 (S >= 2) and V_cta <= 256 (D <= 16384 on the
// vector path, D <= 2048 on the scalar one); otherwise supports() says why and the one-CTA form
// runs.
// Programmatic dependent launch (rules: kernels/cuda_common.cuh): launched while the kernel before it
// (o_proj, the experts' tail) still runs; each thread triggers, loads its columns of the three weight
// vectors (norm, query, RMSNorm weight: 3 x 1792 B per CTA, 43 KB per row at K3 TP8) into registers,
// then waits before it reads P_old, a, acc or the stats and before any store.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/attn_res/merge_common.cuh"
#include "kernels/attn_res/ops.h"

namespace k3::kernels::attn_res_fused_detail {

namespace {

namespace cg = cooperative_groups;

constexpr int kClusterMaxThreads = 256;  // one N-vector per thread: V_cta <= 256
constexpr int kClusterMaxWarps = kClusterMaxThreads / 32;
constexpr int kClusterMaxSize = 8;      // the portable cluster size limit
constexpr int kClusterMinVectors = 32;  // S = ceil(V / 32) up to 8: every CTA gets a warp's worth
// Rows above this take the one-CTA form. At S = 8, 32 rows are 256 CTAs of 128 threads: two per
// SM of an H200's 132, i.e. ~2 waves of SMs (several such CTAs fit per SM at once); with more
// rows the one-CTA form's T CTAs (896 threads each) already spread over most SMs.
constexpr int64_t kGridYMax = 65535;  // rows: grid y

// Cluster shape for T rows of D columns; fails with the reason when the form does not apply.
struct ClusterShape {
  int size = 0;             // S: CTAs per row (2..8)
  int vectors_per_cta = 0;  // V_cta
  int threads = 0;          // V_cta rounded up to a warp multiple
};
core::Status cluster_shape(int64_t T, int64_t D, bool vec, ClusterShape* shape) {
  if (T > kGridYMax)
    return core::Status::fail(std::to_string(T) + " rows: more than the grid's " + std::to_string(kGridYMax) +
                              " (a row per grid y)");
  const int n = vec ? 8 : 1;
  const int64_t vectors = (D + n - 1) / n;  // exact on the vector path (D % 8 == 0)
  const int64_t size = std::min<int64_t>(kClusterMaxSize, (vectors + kClusterMinVectors - 1) / kClusterMinVectors);
  if (size < 2)
    return core::Status::fail("hidden " + std::to_string(D) + " is " + std::to_string(vectors) + " " +
                              std::to_string(n) + "-element vectors, fewer than " +
                              std::to_string(2 * kClusterMinVectors) + ": one CTA per row suffices");
  const int64_t per = (vectors + size - 1) / size;
  if (per > kClusterMaxThreads)
    return core::Status::fail("hidden " + std::to_string(D) + " needs " + std::to_string(per) + " " +
                              std::to_string(n) + "-element vectors per CTA over " + std::to_string(size) +
                              " CTAs; at most " + std::to_string(kClusterMaxThreads) + " (one per thread)");
  shape->size = static_cast<int>(size);
  shape->vectors_per_cta = static_cast<int>(per);
  shape->threads = static_cast<int>((per + 31) / 32 * 32);
  return core::Status::ok();
}

// Thread 0 gets the CTA's total of `v` (one value per thread): warp trees, then the warps in order.
// `red` (one float per warp) is used once per kernel launch, so no trailing barrier is needed.
template <int K>
__device__ __forceinline__ void cta_totals_to(const float (&v)[K], float (*red)[K], float (&part)[K]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) w[k] = warp_sum(v[k]);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) red[warp][k] = w[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float total = 0.0f;
      for (int i = 0; i < warps; ++i) total += red[i][k];
      part[k] = total;
    }
  }
}

// The cluster's total of every CTA's `part` (in its shared memory, written before a cluster
// barrier that every thread has passed): lane r of each warp reads rank r's values, then every
// lane adds them in rank order, so every thread of every CTA gets the identical totals.
template <int K>
__device__ __forceinline__ void cluster_totals(const cg::cluster_group& cluster, float (&part)[K], float (&total)[K]) {
  const unsigned lane = threadIdx.x & 31, ranks = cluster.num_blocks();
  float mine[K];
#pragma unroll
  for (int k = 0; k < K; ++k) mine[k] = 0.0f;
  if (lane < ranks) {
    const float* remote = cluster.map_shared_rank(&part[0], static_cast<int>(lane));
#pragma unroll
    for (int k = 0; k < K; ++k) mine[k] = remote[k];
  }
#pragma unroll
  for (int k = 0; k < K; ++k) total[k] = 0.0f;
  for (unsigned r = 0; r < ranks; ++r) {
#pragma unroll
    for (int k = 0; k < K; ++k) total[k] += __shfl_sync(kFullMask, mine[k], static_cast<int>(r));
  }
}

// Grid (S, T), cluster (S, 1, 1), blockDim.x = the shape's threads (a multiple of 32).
template <class T, int N>
__global__ void __launch_bounds__(kClusterMaxThreads)
    merge_cluster_kernel(const MergeParams<T> p, int vectors_per_cta) {
  __shared__ float red_score[kClusterMaxWarps][2];  // pass 1 warp sums (sum P_new^2, sum P_new c)
  __shared__ float red_norm[kClusterMaxWarps][1];   // pass 2 warp sums (sum h^2)
  __shared__ float score_part[2];                   // this CTA's pass 1 sums, read by the cluster
  __shared__ float norm_part[1];                    // this CTA's pass 2 sum, read by the cluster
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t t = blockIdx.y, D = p.D;
  const int64_t h0 = (static_cast<int64_t>(cluster.block_rank()) * vectors_per_cta + threadIdx.x) * N;
  const bool mine = static_cast<int>(threadIdx.x) < vectors_per_cta && h0 < D;  // N = 8 only when D % 8 == 0
  const bool has_bank = p.acc != nullptr;
  const T* sub = p.sub ? p.sub + t * p.sub_ld : nullptr;

  // Every load of this thread's columns, all in flight together. P_new = P_old | a | round(P_old
  // + a), exactly merge_kernel's pass 1; c = norm * query in fp32; b: the bank partials; w: the
  // RMSNorm weight; the bank's softmax stats (one broadcast pair per row). Threads owning no
  // columns keep zeros (they add nothing to the sums). The weight vectors (c, w) before the PDL
  // wait, everything a kernel of the step writes after it.
  pdl_launch_dependents();
  float v[N], c[N], b[N], w[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = c[i] = b[i] = w[i] = 0.0f;
  if (mine) {
    if (has_bank) {
      float q[N];
      load_vec_n<N>(p.norm, p.norm_bf16, h0, c);
      load_vec_n<N>(p.query, p.query_bf16, h0, q);
#pragma unroll
      for (int i = 0; i < N; ++i) c[i] *= q[i];
    }
    load_vec_n<N>(p.weight, p.weight_bf16, h0, w);
  }
  pdl_wait();
  float max_b = 0.0f, sum_b = 0.0f;
  if (has_bank) max_b = p.stats[t * p.stats_ld], sum_b = p.stats[t * p.stats_ld + 1];
  if (mine) {
    if (sub && p.restart) {
      load_act_n<N>(sub + h0, v);  // the prefix restarts from the sublayer output (P_old not read)
    } else {
      load_act_n<N>(p.prefix + t * p.prefix_ld + h0, v);
      if (sub) {
        float a[N];
        load_act_n<N>(sub + h0, a);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = round_if(v[i] + a[i], p.round);  // the standard add
      }
    }
    if (has_bank) load_act_n<N>(p.acc + t * p.acc_ld + h0, b);
  }
  float p_new[N];  // stored at the end (v becomes h in pass 2)
#pragma unroll
  for (int i = 0; i < N; ++i) p_new[i] = v[i];

  // Pass 1 (with a bank): s_P from the cluster's rank-ordered sums, then the merged softmax
  // weights of the bank partials (B) and of the prefix (E), identically in every CTA.
  float scale_b = 0.0f, scale_p = 1.0f, denom = 1.0f;
  if (has_bank) {  // the same for every CTA of the cluster: every CTA takes the barrier or none
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < N; ++i) {
      sums[0] += v[i] * v[i];
      sums[1] += v[i] * c[i];
    }
    cta_totals_to<2>(sums, red_score, score_part);
    cluster.sync();  // every CTA's score_part is written (release / acquire at cluster scope)
    float total[2];
    cluster_totals<2>(cluster, score_part, total);
    const float s_p = (1.0f / sqrtf(total[0] / static_cast<float>(D) + p.mix_eps)) * total[1];
    const float mx = fmaxf(max_b, s_p);
    scale_b = expf(max_b - mx);
    scale_p = expf(s_p - mx);
    denom = scale_b * sum_b + scale_p;
  }

  // Pass 2: h (rounded as the Mix output; P_new itself without a bank), and its sum of squares.
  float h_sq[1] = {0.0f};
  if (mine) {
    if (has_bank) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = round_if((scale_b * b[i] + scale_p * v[i]) / denom, p.round);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) h_sq[0] += v[i] * v[i];
  }
  cta_totals_to<1>(h_sq, red_norm, norm_part);
  cluster.sync();  // every CTA's norm_part is written
  float total_sq[1];
  cluster_totals<1>(cluster, norm_part, total_sq);
  // This CTA has read every other CTA's shared memory for the last time (the values are in
  // registers); the matching wait comes after the stores.
  auto done_reading = cluster.barrier_arrive();
  const float inv_rms = 1.0f / sqrtf(total_sq[0] / static_cast<float>(D) + p.rms_eps);

  // Pass 3: x = round(w * x_hat), x_hat = h * inv_rms (rounded first in the moonshot style); then
  // the stores. Each thread stores only the columns it read: P_new over P_old or a is safe.
  if (mine) {
    float x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float x_hat = v[i] * inv_rms;
      if (p.moonshot) x_hat = round_if(x_hat, p.round);
      x[i] = w[i] * x_hat;
    }
    if (p.prefix_out) store_act_n<N>(p.prefix_out + t * p.prefix_out_ld + h0, p_new, p.round);  // exact
    if (p.mixed_out) store_act_n<N>(p.mixed_out + t * p.mixed_ld + h0, v, p.round);
    store_act_n<N>(p.normed_out + t * p.normed_ld + h0, x, p.round);
  }
  // No CTA exits (freeing its shared memory) while another may still read its partials.
  cluster.barrier_wait(std::move(done_reading));
}

core::Status merge_cluster_supports(const CudaOps& ops, const AttnResMergeArgs& a) {
  if (auto s = merge_supports(ops, a); !s) return s;
  ClusterShape shape;
  return cluster_shape(a.prefix.dim(0), a.prefix.dim(1), merge_rows_vec8(a), &shape);
}

void merge_cluster_run(const CudaOps& ops, const AttnResMergeArgs& a) {
  const int64_t T = a.prefix.dim(0), D = a.prefix.dim(1);
  if (T == 0) return;
  const bool vec = merge_rows_vec8(a);
  ClusterShape shape;
  if (auto s = cluster_shape(T, D, vec, &shape); !s)  // supports() said yes: a contract breach
    throw core::Error("attn_res_merge (cuda_merge_cluster): " + s.reason());
  with_act(a.prefix.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const MergeParams<E> p = merge_params<E>(a);
    const auto launch = [&](auto kernel) {
      // Grid x: a multiple of S; cluster (S, 1, 1): the CTAs of one row; a programmatic dependent.
      launch_dependent(kernel, dim3(static_cast<unsigned>(shape.size), static_cast<unsigned>(T)),
                       dim3(static_cast<unsigned>(shape.threads)), 0, ops.ctx->stream(),
                       dim3(static_cast<unsigned>(shape.size), 1, 1), p, shape.vectors_per_cta);
      K3_CUDA_CHECK_LAUNCH("attn_res_merge_cluster_kernel");
    };
    if (vec) launch(merge_cluster_kernel<E, 8>);
    else launch(merge_cluster_kernel<E, 1>);
  });
}

}  // namespace

void register_attn_res_merge_cluster_cuda(AttnResOps& r, const CudaOps& ops) {
  r.attn_res_merge.add({"cuda_merge_cluster", core::Device::cuda,
                        [ops](const AttnResMergeArgs& a) { return merge_cluster_supports(ops, a); },
                        [ops](const AttnResMergeArgs& a) { merge_cluster_run(ops, a); }});
}

}  // namespace k3::kernels::attn_res_fused_detail
