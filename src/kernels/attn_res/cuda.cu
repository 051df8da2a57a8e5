// kernels/attn_res/cuda.cu: CUDA AttnRes depth-attention Mix (spec §3.1), one block per token:
//   c = norm * query (fp32); per source j: rho_j = 1/sqrt(mean(R_j^2) + eps), s_j = rho_j sum(R_j c)
//   alpha = softmax(s) (max-subtracted, expf); out = round(sum_j alpha_j R_j) in source order.
// Every thread reads and writes only its own columns, after the reductions: out may alias a source.
#include "kernels/attn_res/mix.h"
#include "kernels/cuda_common.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kMaxSources = 16;  // K3 mixes at most 9 (8 bank rows + the prefix)

template <class T>
struct Sources {
  const T* data[kMaxSources];
  int64_t ld[kMaxSources];
  int n;
};

// N elements per access: 8 (16-byte vectors) when every row and weight is aligned, else 1.
template <class T, int N>
__global__ void __launch_bounds__(kThreads) mix_kernel(Sources<T> src, const void* query, bool query_bf16,
                                                       const void* norm, bool norm_bf16, T* out, int64_t out_ld,
                                                       int64_t D, float eps, bool round) {
  __shared__ float red[2 * kMaxSources][32];
  __shared__ float alpha[kMaxSources];
  const int64_t t = blockIdx.x;
  const int n = src.n;
  float sum_sq[kMaxSources], dot[kMaxSources];
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) sum_sq[j] = dot[j] = 0.0f;
  for (int64_t h = threadIdx.x * int64_t{N}; h < D; h += blockDim.x * int64_t{N}) {
    float c[N], q[N];
    load_vec_n<N>(norm, norm_bf16, h, c);
    load_vec_n<N>(query, query_bf16, h, q);
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] *= q[i];  // c = norm * query in fp32
#pragma unroll
    for (int j = 0; j < kMaxSources; ++j) {
      if (j < n) {
        float r[N];
        load_act_n<N>(src.data[j] + t * src.ld[j] + h, r);
#pragma unroll
        for (int i = 0; i < N; ++i) sum_sq[j] += r[i] * r[i], dot[j] += r[i] * c[i];
      }
    }
  }
  // 2n block sums at once: warp sums, then thread 0 adds the warps in order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) {
    if (j < n) {
      const float a = warp_sum(sum_sq[j]), b = warp_sum(dot[j]);
      if (lane == 0) red[2 * j][warp] = a, red[2 * j + 1][warp] = b;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float s[kMaxSources];
    float m = -INFINITY;
    for (int j = 0; j < n; ++j) {
      float ss = 0.0f, dd = 0.0f;
      for (int w = 0; w < warps; ++w) ss += red[2 * j][w], dd += red[2 * j + 1][w];
      const float rho = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
      s[j] = rho * dd;
      m = fmaxf(m, s[j]);
    }
    float denom = 0.0f;
    for (int j = 0; j < n; ++j) {
      s[j] = expf(s[j] - m);
      denom += s[j];
    }
    for (int j = 0; j < n; ++j) alpha[j] = s[j] / denom;
  }
  __syncthreads();
  for (int64_t h = threadIdx.x * int64_t{N}; h < D; h += blockDim.x * int64_t{N}) {
    float acc[N], r[N];
    load_act_n<N>(src.data[0] + t * src.ld[0] + h, r);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = alpha[0] * r[i];  // one source: exactly R_0
#pragma unroll
    for (int j = 1; j < kMaxSources; ++j) {  // unrolled: the source table stays in parameter space
      if (j < n) {
        load_act_n<N>(src.data[j] + t * src.ld[j] + h, r);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] += alpha[j] * r[i];
      }
    }
    store_act_n<N>(out + t * out_ld + h, acc, round);
  }
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

void register_attn_res_cuda(Registry& r, const CudaOps& ops) {
  r.attn_res_mix.add(
      {"cuda_rowwise", core::Device::cuda, 10, [ops](const AttnResMixArgs& a) { return mix_supports(ops, a); },
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
           const auto launch = [&](auto kernel) {
             kernel<<<static_cast<unsigned>(T), kThreads, 0, ops.ctx->stream()>>>(
                 src, a.query.data, a.query.dtype == core::DType::bf16, a.norm.data,
                 a.norm.dtype == core::DType::bf16, a.out.as<E>(), a.out.strides[0], D, a.eps,
                 a.precision == Precision::bf16);
             K3_CUDA_CHECK_LAUNCH("mix_kernel");
           };
           if (vec)
             launch(mix_kernel<E, 8>);
           else
             launch(mix_kernel<E, 1>);
         });
       }});
}

}  // namespace k3::kernels
