// kernels/mla/cuda_naive.cu: CUDA MLA attention in the naive (prefill) form (spec §6.1):
//   1. the latent part of the cache, dequantised to f32 [S, kv_lora];
//   2. keys and values per position, KV = round(c_n kv_b^T) [S, H*(nope+v)] (row-dot kernel, f32);
//   3. one block per (query t, head h): causal softmax over positions j <= S-T+t in tiles of
//      kTile with a running max and sum (online softmax), o = round(sum_j p_j v_j).
// score(t,j) = scale * (q_nope . k_nope[j] + q_pe . k_pe[j]) in fp32 (nope dims, then rope).
#include "kernels/cuda_rowdot.cuh"
#include "kernels/mla/cuda_mla_common.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kTile = 128;  // positions per tile = threads per block

template <class CacheT>
__global__ void dequant_latent_kernel(const CacheT* cache, int64_t ld, float k_scale, float* out, int64_t S,
                                      int64_t L) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < S * L) out[idx] = cache_value(cache, ld, idx / L, idx % L, k_scale);
}

template <class T, class CacheT>
__global__ void __launch_bounds__(kTile) naive_attention_kernel(const T* q, int64_t q_ld, const float* kv,
                                                                const CacheT* cache, int64_t cache_ld, float k_scale,
                                                                T* out, int64_t out_ld, int64_t S, int64_t T_len,
                                                                int H, int nope, int rope, int vd, int L, float scale,
                                                                bool round) {
  extern __shared__ float q_s[];  // [padded_floats(nope + rope)], zeros past the end
  __shared__ float p_s[kTile];
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, tid = threadIdx.x;
  const int qk = nope + rope, kv_width = H * (nope + vd);
  for (int d = tid; d < padded_floats(qk); d += blockDim.x)
    q_s[d] = d < qk ? to_f32(q[t * q_ld + static_cast<int64_t>(h) * qk + d]) : 0.0f;
  __syncthreads();
  const int64_t visible = S - T_len + t + 1;  // positions 0 .. S-T+t
  float m = -INFINITY, l = 0.0f, acc[kMlaMaxV / kTile] = {};
  for (int64_t j0 = 0; j0 < visible; j0 += kTile) {
    const int64_t j = j0 + tid;
    float s = -INFINITY;
    if (j < visible) {
      const float* kj = kv + j * kv_width + static_cast<int64_t>(h) * (nope + vd);
      float a = 0.0f;
      for (int d = 0; d < nope; ++d) a += q_s[d] * kj[d];
      for (int r = 0; r < rope; ++r) a += q_s[nope + r] * cache_value(cache, cache_ld, j, L + r, k_scale);
      s = scale * a;
    }
    const float m_new = fmaxf(m, block_max(s, red));
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    const float pj = j < visible ? expf(s - m_new) : 0.0f;
    p_s[tid] = pj;
    l = l * corr + block_sum(pj, red);  // block_sum's barriers also publish p_s
    m = m_new;
    const int n = static_cast<int>(visible - j0 < kTile ? visible - j0 : kTile);
#pragma unroll
    for (int u = 0; u < kMlaMaxV / kTile; ++u) {
      const int e = tid + u * kTile;
      if (e < vd) {
        const float* vcol = kv + j0 * kv_width + static_cast<int64_t>(h) * (nope + vd) + nope + e;
        float a = acc[u] * corr;
        for (int jj = 0; jj < n; ++jj) a += p_s[jj] * vcol[static_cast<int64_t>(jj) * kv_width];
        acc[u] = a;
      }
    }
    __syncthreads();  // p_s is rewritten by the next tile
  }
#pragma unroll
  for (int u = 0; u < kMlaMaxV / kTile; ++u) {
    const int e = tid + u * kTile;
    if (e < vd) store_act(out + t * out_ld + static_cast<int64_t>(h) * vd + e, acc[u] / l, round);
  }
}

void naive_run(const CudaOps& ops, const MlaAttentionArgs& a) {
  const int64_t T = a.q.dim(0), S = a.cache.dim(0), L = a.kv_lora;
  if (T == 0) return;
  const int H = a.num_heads, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const int64_t kv_width = static_cast<int64_t>(H) * (nope + vd);
  std::shared_ptr<void> latent = ops.ctx->scratch(static_cast<size_t>(S * L) * sizeof(float));
  std::shared_ptr<void> kv = ops.ctx->scratch(static_cast<size_t>(S * kv_width) * sizeof(float));
  auto* latent_f = static_cast<float*>(latent.get());
  auto* kv_f = static_cast<float*>(kv.get());
  with_cache(a.cache, [&](const auto* cache) {
    dequant_latent_kernel<<<grid_for(S * L, 256), 256, 0, stream>>>(cache, a.cache.strides[0], a.k_scale, latent_f,
                                                                    S, L);
    K3_CUDA_CHECK_LAUNCH("dequant_latent_kernel");
  });
  // Keys and values of every position, rounded like linear outputs (reference: round_act).
  launch_linear_rowdot<float, float>(weight_format(*a.kv_b), weight_ref(*a.kv_b), kv_width, L, latent_f, L, kv_f,
                                     kv_width, S, round, stream);
  with_act(a.q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    with_cache(a.cache, [&](const auto* cache) {
      const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(H));
      const size_t smem = static_cast<size_t>(padded_floats(nope + rope)) * sizeof(float);
      naive_attention_kernel<<<grid, kTile, smem, stream>>>(a.q.as<const E>(), a.q.strides[0], kv_f, cache,
                                                            a.cache.strides[0], a.k_scale, a.out.as<E>(),
                                                            a.out.strides[0], S, T, H, nope, rope, vd,
                                                            static_cast<int>(L), a.scale, round);
      K3_CUDA_CHECK_LAUNCH("naive_attention_kernel");
    });
  });
}

}  // namespace

void register_mla_naive_cuda(Registry& r, const CudaOps& ops) {
  r.mla_naive.add({"cuda_expand_online_softmax", core::Device::cuda, 10,
                   [ops](const MlaAttentionArgs& a) {
                     if (auto s = mla_supports(ops, a); !s) return s;
                     if (a.v_head_dim > kMlaMaxV)
                       return core::Status::fail("v_head_dim " + std::to_string(a.v_head_dim) +
                                                 " is above the CUDA limit " + std::to_string(kMlaMaxV));
                     return core::Status::ok();
                   },
                   [ops](const MlaAttentionArgs& a) { naive_run(ops, a); }});
}

}  // namespace k3::kernels
