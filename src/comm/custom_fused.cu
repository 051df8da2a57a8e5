// comm/custom_fused.cu: the fused step after a row-parallel partial sum (custom_allreduce.h):
// all-reduce (LL push, rank-order fp32 sum) -> to_activation -> residual add -> AttnRes Mix ->
// RMSNorm, in one kernel per rank.
//
// Bit-identical to the unfused CUDA ops on one GPU because it replays their reduction orders:
//   * the grid is the Mix's cluster form (kernels/attn_res/cuda.cu): a cluster of `chunks` blocks of
//     128 threads per token, thread i of block c owning columns [(c*128 + i)*N, +N) (N = 8 for
//     aligned rows with D % 8 == 0, else 1). Each block sums its columns of the partial over the
//     ranks, rounds, adds the prefix, then computes the Mix partials, softmax and output exactly
//     as mix_cluster_kernel does (same expressions, same warp/warp-order/chunk-order sums);
//   * the Mix output h goes to shared memory; every block then replays the RMSNorm kernel's
//     (kernels/norm/cuda.cu) 256-thread reduction: virtual thread u sums columns u*N + k*256*N in
//     order, read from the cluster's shared memory, then its warp tree and warp-order block sum;
//   * each block finally normalises its own columns as rmsnorm_kernel does.
// So x_out equals rmsnorm(attn_res_mix(bank ++ [add(prefix, to_activation(sum))])) bit for bit,
// in fp32 and in bf16 mode; a change to either kernel's reduction order must be mirrored here (the
// test compares them).
#include <cooperative_groups.h>

#include <string>

#include "comm/custom_allreduce.h"
#include "comm/custom_allreduce_kernels.cuh"
#include "kernels/cuda_common.cuh"

namespace k3::comm {

using namespace custom_detail;
using namespace kernels::cuda_detail;

namespace {

constexpr int kThreads = 128;      // = kClusterThreads of kernels/attn_res/cuda.cu
constexpr int kNormThreads = 256;  // = kThreads of kernels/norm/cuda.cu (its reduction is replayed)
constexpr int kMaxSources = 16;    // = kMaxSources of kernels/attn_res/cuda.cu
constexpr int kMaxCluster = 8;     // = kMaxCluster there (portable cluster size)
static_assert(kCustomMaxBankRows + 1 <= kMaxSources);

template <class T>
struct FusedParams {
  const float* partial;  // f32 [T, D] this rank's partial, row stride partial_ld
  int64_t partial_ld;
  const T* prefix;  // [T, D] or null (restart)
  int64_t prefix_ld;
  const T* bank[kMaxSources];  // nb bank rows [T, D]
  int64_t bank_ld[kMaxSources];
  int nb;
  const void* query;        // [D] bf16/f32
  const void* mix_norm;     // [D] bf16/f32
  const void* norm_weight;  // [D] bf16/f32
  bool query_bf16, mix_norm_bf16, norm_weight_bf16;
  T* prefix_out;  // [T, D]
  int64_t prefix_out_ld;
  T* x_out;  // [T, D]
  int64_t x_out_ld;
  int64_t D;
  float mix_eps, norm_eps;
  bool moonshot;  // RmsNormStyle::moonshot (round x_hat first)
  bool round;     // Precision::bf16
  Link link;
};

// The value an activation takes once stored (store_act / store_act_n of kernels/cuda_common.cuh).
template <class T>
__device__ __forceinline__ float stored(float v, bool round) {
  if constexpr (sizeof(T) == 2) return round_bf16(v);
  else return round_if(v, round);
}

// Grid (chunks, T) in clusters of (chunks, 1, 1): one cluster per token row t.
template <class T, int N>
__global__ void __launch_bounds__(kThreads) fused_kernel(FusedParams<T> p) {
  namespace cg = cooperative_groups;
  constexpr int kCols = kThreads * N;  // columns per block
  __shared__ uint32_t s_seq;
  __shared__ float red[kThreads / 32][kMaxSources][2];
  __shared__ float2 part[kMaxSources];
  __shared__ float alpha[kMaxSources];
  __shared__ float hbuf[kCols];
  __shared__ float norm_red[kNormThreads / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const Link& k = p.link;
  const uint32_t seq = seq_begin(k, &s_seq);
  const int64_t D = p.D, t = blockIdx.y, chunk = blockIdx.x;
  const int64_t row_lines = (D + 1) / 2, src_lines = int64_t{gridDim.y} * row_lines;
  const int64_t c0 = chunk * kCols, c1 = c0 + kCols < D ? c0 + kCols : D;
  const int64_t l0 = c0 / 2, l1 = (c1 + 1) / 2;  // c0 is even: a line never spans two blocks
  const int64_t par = (seq & 1u) * k.parity_lines;
  const float* prow = p.partial + t * p.partial_ld;
  uint4* mine = k.buffers[k.rank] + par + t * row_lines;  // + q * src_lines: source rank q's row t

  // 1. This block's columns of the partial to every peer (2 f32 per line).
  for (int64_t l = l0 + threadIdx.x; l < l1; l += kThreads) {
    const float a = prow[2 * l], b = 2 * l + 1 < D ? prow[2 * l + 1] : 0.0f;
    const uint4 line = ll_line(make_uint2(__float_as_uint(a), __float_as_uint(b)), seq);
    for (int i = 1; i < k.n; ++i) {
      const int q = (k.rank + i) % k.n;
      ll_store(k.buffers[q] + par + k.rank * src_lines + t * row_lines + l, line);
    }
  }

  // 2. a = to_activation(rank-order sum); prefix_out = add(prefix, a) (or a on restart).
  const int64_t h = c0 + threadIdx.x * N;
  const bool active = h < D;  // N = 8 only when D % 8 == 0: the whole vector is in range
  float pv[N];
#pragma unroll
  for (int i = 0; i < N; ++i) pv[i] = 0.0f;
  if (active) {
    float acc[N];
    for (int q = 0; q < k.n; ++q) {
      float v[N];
      if (q == k.rank) {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = prow[h + i];
      } else {
        const uint4* src = mine + q * src_lines;
        if constexpr (N == 8) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint2 d = ll_wait(src + h / 2 + i, seq);
            v[2 * i] = __uint_as_float(d.x), v[2 * i + 1] = __uint_as_float(d.y);
          }
        } else {
          const uint2 d = ll_wait(src + h / 2, seq);
          v[0] = __uint_as_float((h & 1) ? d.y : d.x);
        }
      }
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = q == 0 ? v[i] : __fadd_rn(acc[i], v[i]);
    }
    if (p.prefix) {
      float pr[N];
      load_act_n<N>(p.prefix + t * p.prefix_ld + h, pr);
#pragma unroll
      for (int i = 0; i < N; ++i) pv[i] = stored<T>(pr[i] + stored<T>(acc[i], p.round), p.round);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) pv[i] = stored<T>(acc[i], p.round);
    }
    store_act_n<N>(p.prefix_out + t * p.prefix_out_ld + h, pv, p.round);
  }
  __syncthreads();  // every line of this block's columns was read (N = 1: two threads per line)
  for (int64_t l = l0 + threadIdx.x; l < l1; l += kThreads)
    for (int q = 0; q < k.n; ++q)
      if (q != k.rank) ll_store(mine + q * src_lines + l, make_uint4(0, 0, 0, 0));

  // 3. Mix partials over sources bank[0..nb) then prefix_out (block_partials of attn_res/cuda.cu).
  const int n_src = p.nb + 1;
  float sum_sq[kMaxSources], dot[kMaxSources];
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) sum_sq[j] = dot[j] = 0.0f;
  if (active) {
    float c[N], qv[N];
    load_vec_n<N>(p.mix_norm, p.mix_norm_bf16, h, c);
    load_vec_n<N>(p.query, p.query_bf16, h, qv);
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] *= qv[i];  // c = norm * query in fp32
#pragma unroll
    for (int j = 0; j < kMaxSources; ++j) {
      if (j < n_src) {
        float r[N];
        if (j < p.nb) {
          load_act_n<N>(p.bank[j] + t * p.bank_ld[j] + h, r);
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i) r[i] = pv[i];
        }
#pragma unroll
        for (int i = 0; i < N; ++i) sum_sq[j] += r[i] * r[i], dot[j] += r[i] * c[i];
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kMaxSources; ++j) {
    if (j < n_src) {
      const float a = warp_sum(sum_sq[j]), b = warp_sum(dot[j]);
      if (lane == 0) red[warp][j][0] = a, red[warp][j][1] = b;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < n_src) {
    const int j = static_cast<int>(threadIdx.x);
    float ss = 0.0f, dd = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) ss += red[w][j][0], dd += red[w][j][1];
    part[j] = make_float2(ss, dd);
  }
  cluster.sync();  // every block's partials are written

  // 4. alpha = softmax of the scores, chunks in order (softmax_alpha of attn_res/cuda.cu).
  if (threadIdx.x < 32) {
    const int j = static_cast<int>(threadIdx.x);
    float s = -INFINITY;
    if (j < n_src) {
      float ss = 0.0f, dd = 0.0f;
      for (unsigned c = 0; c < gridDim.x; ++c) {
        const float2 v = cluster.map_shared_rank(part, c)[j];
        ss += v.x, dd += v.y;
      }
      const float rho = 1.0f / sqrtf(ss / static_cast<float>(D) + p.mix_eps);
      s = rho * dd;
    }
    const float m = warp_max(s);
    const float e = j < n_src ? expf(s - m) : 0.0f;
    float denom = 0.0f;
    for (int i = 0; i < n_src; ++i) denom += __shfl_sync(kFullMask, e, i);  // source order
    if (j < n_src) alpha[j] = e / denom;
  }
  cluster.sync();  // alpha visible; no block leaves while another still reads its partials

  // 5. h = round(sum_j alpha_j R_j) in source order (mix_columns of attn_res/cuda.cu), to smem.
  float hv[N];
#pragma unroll
  for (int i = 0; i < N; ++i) hv[i] = 0.0f;
  if (active) {
    float acc[N], r[N];
    if (p.nb > 0) {
      load_act_n<N>(p.bank[0] + t * p.bank_ld[0] + h, r);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) r[i] = pv[i];
    }
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = alpha[0] * r[i];  // one source: exactly R_0
#pragma unroll
    for (int j = 1; j < kMaxSources; ++j) {
      if (j < n_src) {
        if (j < p.nb) {
          load_act_n<N>(p.bank[j] + t * p.bank_ld[j] + h, r);
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i) r[i] = pv[i];
        }
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] += alpha[j] * r[i];
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) hbuf[threadIdx.x * N + i] = hv[i] = stored<T>(acc[i], p.round);
  }
  cluster.sync();  // the whole row of h is in the cluster's shared memory

  // 6. sum(h^2) exactly as rmsnorm_kernel's 256 threads take it: this thread plays threads
  //    u = threadIdx.x and u + 128 (same lanes, warps w and w + 4), then the block sum.
  float norm_part[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t u = threadIdx.x + half * kThreads;
    float s = 0.0f;
    for (int64_t c = u * N; c < D; c += int64_t{kNormThreads} * N) {
      const float* src = cluster.map_shared_rank(hbuf, static_cast<unsigned>(c / kCols)) + c % kCols;
      float v[N];
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = src[i];
#pragma unroll
      for (int i = 0; i < N; ++i) s += v[i] * v[i];
    }
    norm_part[half] = s;
  }
  {
    const float a = warp_sum(norm_part[0]), b = warp_sum(norm_part[1]);
    if (lane == 0) norm_red[warp] = a, norm_red[warp + kThreads / 32] = b;
  }
  __syncthreads();
  const float sum_h2 = warp_sum(lane < kNormThreads / 32 ? norm_red[lane] : 0.0f);
  const float inv_rms = 1.0f / sqrtf(sum_h2 / static_cast<float>(D) + p.norm_eps);
  cluster.sync();  // no block leaves while another still reads its h

  // 7. x = RMSNorm(h) on this thread's columns (rmsnorm_kernel's second loop).
  if (active) {
    float wv[N], y[N];
    load_vec_n<N>(p.norm_weight, p.norm_weight_bf16, h, wv);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float x_hat = hv[i] * inv_rms;
      if (p.moonshot) x_hat = round_if(x_hat, p.round);
      y[i] = wv[i] * x_hat;
    }
    store_act_n<N>(p.x_out + t * p.x_out_ld + h, y, p.round);
  }
  seq_end(k, seq);
}

bool is_weight_vector(const core::TensorView& v, int64_t D, bool allow_row) {
  const bool dtype_ok = v.dtype == core::DType::bf16 || v.dtype == core::DType::f32;
  const bool shape_ok = (v.rank() == 1 && v.dim(0) == D) ||
                        (allow_row && v.rank() == 2 && v.dim(0) == 1 && v.dim(1) == D);
  return dtype_ok && shape_ok && v.is_contiguous() && v.device == core::Device::cuda && v.data != nullptr;
}

}  // namespace

core::Status CustomAllReduce::fused_check(const FusedResidualMixNormArgs& a) const {
  const auto fail = [](const std::string& m) {
    return core::Status::fail("comm::CustomAllReduce::fused_residual_mix_norm: " + m);
  };
  const core::TensorView& pt = a.partial;
  if (pt.dtype != core::DType::f32 || pt.rank() != 2 || pt.strides[1] != 1 || pt.device != core::Device::cuda ||
      (pt.data == nullptr && pt.numel() > 0))
    return fail("partial must be an f32 CUDA tensor [T, D] with contiguous rows, got " + describe(pt));
  const int64_t T = pt.dim(0), D = pt.dim(1);
  const std::string td = core::Shape{T, D}.str();
  const core::DType act = a.prefix_out.dtype;
  if (act != core::DType::f32 && act != core::DType::bf16)
    return fail("prefix_out must be a bf16 or f32 activation, got " + describe(a.prefix_out));
  if (act == core::DType::bf16 && a.precision != kernels::Precision::bf16)
    return fail("bf16 activations need Precision::bf16 (Precision::fp32 runs on f32 activations)");
  const std::string act_name(core::dtype_name(act));
  const auto act_check = [&](const std::string& name, const core::TensorView& v) {
    if (v.dtype != act || v.rank() != 2 || v.strides[1] != 1 || v.dim(0) != T || v.dim(1) != D ||
        v.device != core::Device::cuda || (v.data == nullptr && v.numel() > 0))
      return fail(name + " must be a " + act_name + " CUDA tensor " + td +
                  " with contiguous rows (the dtype of "
                  "prefix_out, the shape of partial), got " +
                  describe(v));
    return core::Status::ok();
  };
  if (auto s = act_check("prefix_out", a.prefix_out); !s) return s;
  if (auto s = act_check("x_out", a.x_out); !s) return s;
  if (a.prefix.data != nullptr)
    if (auto s = act_check("prefix", a.prefix); !s) return s;
  if (a.bank.size() > static_cast<size_t>(kCustomMaxBankRows))
    return fail("bank has " + std::to_string(a.bank.size()) + " rows, at most " + std::to_string(kCustomMaxBankRows));
  for (size_t j = 0; j < a.bank.size(); ++j)
    if (auto s = act_check("bank[" + std::to_string(j) + "]", a.bank[j]); !s) return s;
  if (!is_weight_vector(a.query, D, true))
    return fail("query must be a bf16/f32 CUDA vector [" + std::to_string(D) + "] or [1, " + std::to_string(D) +
                "], got " + describe(a.query));
  if (!is_weight_vector(a.mix_norm, D, false))
    return fail("mix_norm must be a bf16/f32 CUDA vector [" + std::to_string(D) + "], got " + describe(a.mix_norm));
  if (!is_weight_vector(a.norm_weight, D, false))
    return fail("norm_weight must be a bf16/f32 CUDA vector [" + std::to_string(D) + "], got " +
                describe(a.norm_weight));
  if (!(a.mix_eps >= 0.0f) || !(a.norm_eps >= 0.0f))
    return fail("mix_eps and norm_eps must be >= 0, got " + std::to_string(a.mix_eps) + " and " +
                std::to_string(a.norm_eps));
  if (T > 65535) return fail("at most 65535 rows, got partial " + describe(pt));
  // The layouts the unfused kernels pick (16-byte vectors when D % 8 == 0 and everything is
  // aligned) and the Mix's one-cluster form are the only ones this kernel replays.
  if (D % 8 == 0) {
    if (D > 8 * kThreads * kMaxCluster)
      return fail("D must be <= " + std::to_string(8 * kThreads * kMaxCluster) + " (one cluster of the Mix), got " +
                  std::to_string(D));
    bool aligned = rows_vec8(a.prefix_out) && rows_vec8(a.x_out) && aligned16(a.query.data) &&
                   aligned16(a.mix_norm.data) && aligned16(a.norm_weight.data);
    if (a.prefix.data != nullptr) aligned = aligned && rows_vec8(a.prefix);
    for (const core::TensorView& v : a.bank) aligned = aligned && rows_vec8(v);
    if (!aligned)
      return fail(
          "with D % 8 == 0 every activation row and weight must be 16-byte aligned (the vector form of "
          "the unfused kernels)");
  } else if (D > kThreads * kMaxCluster) {
    return fail("D not a multiple of 8 must be <= " + std::to_string(kThreads * kMaxCluster) + ", got " +
                std::to_string(D));
  }
  const int64_t bytes = T * ((D + 1) / 2) * 8;  // the partial in 8-byte lines
  if (bytes > max_bytes())
    return fail("partial " + td + " needs " + std::to_string(bytes) +
                " bytes of lines, more than the group's max_bytes " + std::to_string(max_bytes()));
  // Outputs: prefix_out may be prefix itself (in-place residual); nothing else may overlap them.
  const bool in_place = a.prefix.data == a.prefix_out.data && a.prefix.data != nullptr &&
                        a.prefix.strides[0] == a.prefix_out.strides[0];
  if (overlaps(a.prefix_out, a.x_out)) return fail("prefix_out and x_out overlap");
  for (const auto& [name, out] : {std::pair{"prefix_out", &a.prefix_out}, std::pair{"x_out", &a.x_out}}) {
    if (overlaps(*out, pt)) return fail(std::string(name) + " overlaps partial");
    for (size_t j = 0; j < a.bank.size(); ++j)
      if (overlaps(*out, a.bank[j])) return fail(std::string(name) + " overlaps bank[" + std::to_string(j) + "]");
  }
  if (a.prefix.data != nullptr && !in_place && overlaps(a.prefix_out, a.prefix))
    return fail("prefix_out overlaps prefix without being the same rows (in place is allowed)");
  if (a.prefix.data != nullptr && overlaps(a.x_out, a.prefix)) return fail("x_out overlaps prefix");
  return core::Status::ok();
}

void CustomAllReduce::fused_residual_mix_norm(const FusedResidualMixNormArgs& a, cudaStream_t stream) {
  if (auto s = fused_check(a); !s) throw core::Error(s.reason());
  if (a.partial.dim(0) == 0) return;
  enter();
  fused_launch(a, stream);
}

namespace {

// cudaLaunchKernelEx's configuration of the fused kernel: grid (chunks, T), clusters of a row.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  ClusterLaunch(unsigned chunks, unsigned rows, cudaStream_t stream) {
    cfg.gridDim = dim3(chunks, rows);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = chunks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
};

int fused_key(unsigned chunks, bool vec, bool bf16) {
  return static_cast<int>(chunks) * 4 + (vec ? 2 : 0) + (bf16 ? 1 : 0);
}

}  // namespace

void CustomAllReduce::query_fused_occupancy() {
  for (unsigned chunks = 1; chunks <= static_cast<unsigned>(kMaxCluster); ++chunks) {
    ClusterLaunch l(chunks, 1, nullptr);
    const auto query = [&](auto kernel, bool vec, bool bf16) {
      int clusters = 0;
      // A form the device cannot run is recorded as 0 clusters: its calls then fail with the reason,
      // the rest of the group still works.
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &l.cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        clusters = 0;
      }
      fused_max_clusters_[fused_key(chunks, vec, bf16)] = clusters;
    };
    query(fused_kernel<float, 1>, false, false);
    query(fused_kernel<float, 8>, true, false);
    query(fused_kernel<bf16, 1>, false, true);
    query(fused_kernel<bf16, 8>, true, true);
  }
}

void CustomAllReduce::fused_launch(const FusedResidualMixNormArgs& a, cudaStream_t stream) {
  const int64_t T = a.partial.dim(0), D = a.partial.dim(1);
  const bool vec = D % 8 == 0;
  const unsigned chunks = grid_for(D, kThreads * (vec ? 8 : 1));
  with_act(a.prefix_out.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    FusedParams<E> p{};
    p.partial = a.partial.as<const float>();
    p.partial_ld = a.partial.strides[0];
    p.prefix = a.prefix.data ? a.prefix.as<const E>() : nullptr;
    p.prefix_ld = a.prefix.data ? a.prefix.strides[0] : 0;
    p.nb = static_cast<int>(a.bank.size());
    for (int j = 0; j < p.nb; ++j) {
      p.bank[j] = a.bank[static_cast<size_t>(j)].as<const E>();
      p.bank_ld[j] = a.bank[static_cast<size_t>(j)].strides[0];
    }
    p.query = a.query.data;
    p.mix_norm = a.mix_norm.data;
    p.norm_weight = a.norm_weight.data;
    p.query_bf16 = a.query.dtype == core::DType::bf16;
    p.mix_norm_bf16 = a.mix_norm.dtype == core::DType::bf16;
    p.norm_weight_bf16 = a.norm_weight.dtype == core::DType::bf16;
    p.prefix_out = a.prefix_out.as<E>();
    p.prefix_out_ld = a.prefix_out.strides[0];
    p.x_out = a.x_out.as<E>();
    p.x_out_ld = a.x_out.strides[0];
    p.D = D;
    p.mix_eps = a.mix_eps;
    p.norm_eps = a.norm_eps;
    p.moonshot = a.style == kernels::RmsNormStyle::moonshot;
    p.round = a.precision == kernels::Precision::bf16;
    p.link = make_link(*shared_, rank_);
    const auto launch = [&](auto kernel) {
      ClusterLaunch l(chunks, static_cast<unsigned>(T), stream);
      // Every row's cluster must be resident at once: a waiting cluster holds its SMs until the
      // peers' matching cluster has pushed, so a grid larger than the GPU could deadlock.
      const auto it = fused_max_clusters_.find(fused_key(chunks, vec, sizeof(E) == 2));
      const int fits = it == fused_max_clusters_.end() ? 0 : it->second;
      K3_CHECK(T <= fits, "comm::CustomAllReduce::fused_residual_mix_norm: " + std::to_string(T) + " rows need " +
                              std::to_string(T) + " clusters of " + std::to_string(chunks) +
                              " blocks resident at once; this GPU holds " + std::to_string(fits));
      K3_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, p));
    };
    if (vec) launch(fused_kernel<E, 8>);
    else launch(fused_kernel<E, 1>);
  });
}

}  // namespace k3::comm
