// kernels/attn_res/cuda.cu: CUDA AttnRes depth-attention Mix (spec §3.1) with many blocks per token
// (a token's 9 x 7168 values are too few bytes for one block to read at full bandwidth):
//   partials: a block per (column chunk, token) sums R_j^2 and R_j c (c = norm * query, fp32) over
//             its columns for every source j;
//   alpha:    the chunks' partials added in chunk order, rho_j = 1/sqrt(mean(R_j^2) + eps),
//             s_j = rho_j sum(R_j c), alpha = softmax(s) (max-subtracted, expf, sum in source order);
//   mix:      each block writes its columns of out = round(sum_j alpha_j R_j) in source order.
// Up to kMaxCluster chunks (every K3 width) it is one kernel: the token's blocks form a thread block
// cluster and read each other's partials from shared memory. Wider rows take two kernels with the
// partials in global scratch. Every sum has a fixed order (thread, warp tree, warps in order, chunks
// in order): the result does not change between runs. A block reads and writes only its own
// columns after the partials: out may alias a source.
#include <cooperative_groups.h>

#include "kernels/attn_res/mix.h"
#include "kernels/attn_res/ops.h"
#include "kernels/cuda_common.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kMaxSources = 16;  // K3 mixes at most 9 (8 bank rows + the prefix)

template <class T>
struct Sources {
  const T* data[kMaxSources];
  int64_t ld[kMaxSources];
  int n;
};

constexpr int kChunkThreads = 64;     // two-pass form: columns per block 64 * N
constexpr int kClusterThreads = 128;  // cluster form: columns per block 128 * N (1024 on the vector path)
constexpr int kMaxCluster = 8;        // blocks of one token in a (portable) cluster

// The block's (sum R_j^2, sum R_j c) over its N columns per thread from column h0 = (chunk *
// blockDim.x + thread) * N, for every source j < n: warp sums, then the warps in order; thread j
// writes source j's pair to dst[j]. N = 8 (16-byte vectors) when every row and weight is aligned.
template <class T, int N, int THREADS>
__device__ __forceinline__ void block_partials(const Sources<T>& src, const void* query, bool query_bf16,
                                               const void* norm, bool norm_bf16, int64_t D, int64_t t, int64_t chunk,
                                               float2* dst) {
  __shared__ float red[THREADS / 32][kMaxSources][2];
  const int64_t h = (chunk * THREADS + threadIdx.x) * N;
  const int n = src.n;
  float sum_sq[kMaxSources], dot[kMaxSources];
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) sum_sq[j] = dot[j] = 0.0f;
  if (h < D) {  // N = 8 only when D % 8 == 0: the whole vector is in range
    float c[N], q[N];
    load_vec_n<N>(norm, norm_bf16, h, c);
    load_vec_n<N>(query, query_bf16, h, q);
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] *= q[i];  // c = norm * query in fp32
#pragma unroll
    for (int j = 0; j < kMaxSources; ++j) {  // unrolled: the source table stays in parameter space
      if (j < n) {
        float r[N];
        load_act_n<N>(src.data[j] + t * src.ld[j] + h, r);
#pragma unroll
        for (int i = 0; i < N; ++i) sum_sq[j] += r[i] * r[i], dot[j] += r[i] * c[i];
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) {
    if (j < n) {
      const float a = warp_sum(sum_sq[j]), b = warp_sum(dot[j]);
      if (lane == 0) red[warp][j][0] = a, red[warp][j][1] = b;
    }
  }
  __syncthreads();
  const int j = static_cast<int>(threadIdx.x);
  if (j < n) {
    float ss = 0.0f, dd = 0.0f;
    for (int w = 0; w < THREADS / 32; ++w) ss += red[w][j][0], dd += red[w][j][1];
    dst[j] = make_float2(ss, dd);
  }
}

// Warp 0: alpha[j] from the chunks' partials, part(c, j) for chunk c in order (lane j: source j):
// rho_j = 1/sqrt(mean R_j^2 + eps), s_j = rho_j sum R_j c, softmax with the max subtracted and the
// denominator summed in source order.
template <class Part>
__device__ __forceinline__ void softmax_alpha(int n, int chunks, int64_t D, float eps, Part part, float* alpha) {
  const int j = threadIdx.x;
  float s = -INFINITY;
  if (j < n) {
    float ss = 0.0f, dd = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      const float2 v = part(c, j);
      ss += v.x, dd += v.y;
    }
    const float rho = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
    s = rho * dd;
  }
  const float m = warp_max(s);
  const float e = j < n ? expf(s - m) : 0.0f;
  float denom = 0.0f;
  for (int i = 0; i < n; ++i) denom += __shfl_sync(kFullMask, e, i);  // source order
  if (j < n) alpha[j] = e / denom;
}

// out = round(sum_j alpha_j R_j) in source order on this thread's N columns from h.
template <class T, int N>
__device__ __forceinline__ void mix_columns(const Sources<T>& src, const float* alpha, int64_t D, int64_t t, int64_t h,
                                            T* out, int64_t out_ld, bool round) {
  if (h >= D) return;
  float acc[N], r[N];
  load_act_n<N>(src.data[0] + t * src.ld[0] + h, r);
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = alpha[0] * r[i];  // one source: exactly R_0
#pragma unroll
  for (int j = 1; j < kMaxSources; ++j) {
    if (j < src.n) {
      load_act_n<N>(src.data[j] + t * src.ld[j] + h, r);
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += alpha[j] * r[i];
    }
  }
  store_act_n<N>(out + t * out_ld + h, acc, round);
}

// Cluster form, grid (chunks, T), one cluster of `chunks` blocks per token: partials in each
// block's shared memory, read by every block of the cluster in rank (= chunk) order.
template <class T, int N>
__global__ void __launch_bounds__(kClusterThreads)
    mix_cluster_kernel(Sources<T> src, const void* query, bool query_bf16, const void* norm, bool norm_bf16, int64_t D,
                       float eps, T* out, int64_t out_ld, bool round) {
  namespace cg = cooperative_groups;
  __shared__ float2 part[kMaxSources];
  __shared__ float alpha[kMaxSources];
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t t = blockIdx.y, chunk = blockIdx.x;
  block_partials<T, N, kClusterThreads>(src, query, query_bf16, norm, norm_bf16, D, t, chunk, part);
  cluster.sync();  // every block's partials are written
  if (threadIdx.x < 32)
    softmax_alpha(
        src.n, static_cast<int>(gridDim.x), D, eps,
        [&](int c, int j) { return cluster.map_shared_rank(part, static_cast<unsigned>(c))[j]; }, alpha);
  cluster.sync();  // no block leaves while another still reads its partials; alpha is visible
  mix_columns<T, N>(src, alpha, D, t, (chunk * kClusterThreads + threadIdx.x) * N, out, out_ld, round);
}

// Two-pass form (more than kMaxCluster chunks or 65535 tokens), grid (T, chunks). Pass 1: part[(t *
// chunks + chunk) * n + j] = source j's partials over the block's columns.
template <class T, int N>
__global__ void __launch_bounds__(kChunkThreads)
    mix_partials_kernel(Sources<T> src, const void* query, bool query_bf16, const void* norm, bool norm_bf16, int64_t D,
                        float2* part) {
  const int64_t t = blockIdx.x, chunk = blockIdx.y;
  block_partials<T, N, kChunkThreads>(src, query, query_bf16, norm, norm_bf16, D, t, chunk,
                                      part + (t * gridDim.y + chunk) * src.n);
}

// Pass 2: warp 0 turns the partials into alpha, then every thread mixes its N columns.
template <class T, int N>
__global__ void __launch_bounds__(kChunkThreads)
    mix_apply_kernel(Sources<T> src, const float2* part, int64_t D, float eps, T* out, int64_t out_ld, bool round) {
  __shared__ float alpha[kMaxSources];
  const int64_t t = blockIdx.x;
  const int n = src.n, chunks = static_cast<int>(gridDim.y);
  if (threadIdx.x < 32)
    softmax_alpha(
        n, chunks, D, eps, [&](int c, int j) { return part[(t * chunks + c) * n + j]; }, alpha);
  __syncthreads();
  mix_columns<T, N>(src, alpha, D, t, (static_cast<int64_t>(blockIdx.y) * kChunkThreads + threadIdx.x) * N, out, out_ld,
                    round);
}

core::Status mix_supports(const CudaOps& ops, const AttnResMixArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (a.sources.size() > static_cast<size_t>(kMaxSources))
    return core::Status::fail("at most " + std::to_string(kMaxSources) + " sources, got " +
                              std::to_string(a.sources.size()));
  if (auto s = on_cuda({{"query", &a.query}, {"norm", &a.norm}, {"out", &a.out}}); !s) return s;
  for (size_t j = 0; j < a.sources.size(); ++j) {
    const std::string name = "sources[" + std::to_string(j) + "]";
    if (auto s = on_cuda({{name.c_str(), &a.sources[j]}}); !s) return s;
    if (auto s = same_act({{"out", &a.out}, {name.c_str(), &a.sources[j]}}, a.precision); !s) return s;
  }
  return same_act({{"out", &a.out}}, a.precision);
}

}  // namespace

void register_attn_res_cuda(AttnResOps& r, const CudaOps& ops) {
  r.attn_res_mix.add(
      {"cuda_chunked_rows", core::Device::cuda, [ops](const AttnResMixArgs& a) { return mix_supports(ops, a); },
       [ops](const AttnResMixArgs& a) {
         const int64_t T = a.sources[0].dim(0), D = a.sources[0].dim(1);
         if (T == 0) return;
         with_act(a.out.dtype, [&](auto tag) {
           using E = typename decltype(tag)::type;
           Sources<E> src{};
           src.n = static_cast<int>(a.sources.size());
           for (int j = 0; j < src.n; ++j) {
             src.data[j] = a.sources[j].as<const E>();
             src.ld[j] = a.sources[j].strides[0];
           }
           bool vec = rows_vec8(a.out) && aligned16(a.query.data) && aligned16(a.norm.data);
           for (const core::TensorView& v : a.sources) vec = vec && rows_vec8(v);
           const int N = vec ? 8 : 1;
           const cudaStream_t stream = ops.ctx->stream();
           const bool round = a.precision == Precision::bf16;
           const bool q_bf16 = a.query.dtype == core::DType::bf16, n_bf16 = a.norm.dtype == core::DType::bf16;
           const unsigned cluster = grid_for(D, kClusterThreads * N);
           if (cluster <= static_cast<unsigned>(kMaxCluster) && T <= 65535) {
             const auto launch = [&](auto kernel) {
               cudaLaunchConfig_t cfg = {};
               cfg.gridDim = dim3(cluster, static_cast<unsigned>(T));
               cfg.blockDim = dim3(kClusterThreads);
               cfg.stream = stream;
               cudaLaunchAttribute attr[1];
               attr[0].id = cudaLaunchAttributeClusterDimension;
               attr[0].val.clusterDim.x = cluster;
               attr[0].val.clusterDim.y = 1;
               attr[0].val.clusterDim.z = 1;
               cfg.attrs = attr;
               cfg.numAttrs = 1;
               K3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, src, a.query.data, q_bf16, a.norm.data, n_bf16, D, a.eps,
                                                a.out.as<E>(), a.out.strides[0], round));
             };
             if (vec) launch(mix_cluster_kernel<E, 8>);
             else launch(mix_cluster_kernel<E, 1>);
             return;
           }
           const unsigned chunks = grid_for(D, kChunkThreads * N);
           std::shared_ptr<void> part = ops.ctx->scratch(sizeof(float2) * static_cast<size_t>(T) * chunks * src.n);
           const dim3 grid(static_cast<unsigned>(T), chunks);  // T in x: no 65535 limit
           const auto launch = [&](auto partials, auto apply) {
             partials<<<grid, kChunkThreads, 0, stream>>>(src, a.query.data, q_bf16, a.norm.data, n_bf16, D,
                                                          static_cast<float2*>(part.get()));
             K3_CUDA_CHECK_LAUNCH("mix_partials_kernel");
             apply<<<grid, kChunkThreads, 0, stream>>>(src, static_cast<const float2*>(part.get()), D, a.eps,
                                                       a.out.as<E>(), a.out.strides[0], round);
             K3_CUDA_CHECK_LAUNCH("mix_apply_kernel");
           };
           if (vec) launch(mix_partials_kernel<E, 8>, mix_apply_kernel<E, 8>);
           else launch(mix_partials_kernel<E, 1>, mix_apply_kernel<E, 1>);
         });
       }});
}

}  // namespace k3::kernels
