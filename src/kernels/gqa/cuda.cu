// kernels/gqa/cuda.cu: CUDA rope_gqa_attention (see gqa.h for the math).
//   rope_write_kernel  one block per (new row, head of q then of k): rotate-half RoPE in place, and
//                      for a KV head its key and value rows into the caches
//   attention_kernel   one block per (new row, query head), kWarps warps: each warp takes keys
//                      j = warp, warp + kWarps, ... with a running (max, sum, weighted values) over
//                      its keys, a lane holding dims lane, lane + 32, ...; the warps' partial
//                      softmaxes merge in shared memory at the end
#include "kernels/cuda_common.cuh"
#include "kernels/gqa/gqa.h"
#include "kernels/gqa/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

template <class T>
__global__ void rope_write_kernel(T* q, int64_t q_ld, T* k, int64_t k_ld, const T* v, int64_t v_ld, float* k_cache,
                                  float* v_cache, const float* inv_freq, int64_t past, int64_t position, int NH,
                                  int NKV, int d, bool round) {
  const int64_t i = blockIdx.x;
  const int head = blockIdx.y;  // [0, NH): q heads, [NH, NH + NKV): kv heads
  const bool is_q = head < NH;
  const int h = is_q ? head : head - NH;
  T* x = is_q ? q + i * q_ld + int64_t{h} * d : k + i * k_ld + int64_t{h} * d;
  const float pos = static_cast<float>(position + i);
  const int half = d / 2;
  const int64_t kvw = int64_t{NKV} * d;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float angle = pos * inv_freq[j];
    const float c = cosf(angle), s = sinf(angle);
    const float a = to_f32(x[j]), b = to_f32(x[j + half]);
    const float ac = __fmul_rn(a, c), bs = __fmul_rn(b, s), as = __fmul_rn(a, s), bc = __fmul_rn(b, c);
    store_act(x + j, __fsub_rn(ac, bs), round);
    store_act(x + j + half, __fadd_rn(bc, as), round);
    if (!is_q) {
      float* kc = k_cache + (past + i) * kvw + int64_t{h} * d;
      kc[j] = to_f32(x[j]);
      kc[j + half] = to_f32(x[j + half]);
      const T* vr = v + i * v_ld + int64_t{h} * d;
      float* vc = v_cache + (past + i) * kvw + int64_t{h} * d;
      vc[j] = to_f32(vr[j]);
      vc[j + half] = to_f32(vr[j + half]);
    }
  }
}

template <class T>
__global__ void attention_kernel(const T* q, int64_t q_ld, const float* k_cache, const float* v_cache, T* out,
                                 int64_t out_ld, int64_t past, int NH, int NKV, int d, float scale, bool round) {
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y, group = NH / NKV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kvw = int64_t{NKV} * d, off = int64_t{h / group} * d, keys = past + i + 1;
  float qv[kPerLane], acc[kPerLane];
  for (int r = 0; r < kPerLane; ++r) {
    const int e = lane + 32 * r;
    qv[r] = e < d ? to_f32(q[i * q_ld + int64_t{h} * d + e]) : 0.0f;
    acc[r] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const float* kj = k_cache + j * kvw + off;
    float dot = 0.0f;
    for (int r = 0; r < kPerLane; ++r) {
      const int e = lane + 32 * r;
      if (e < d) dot += qv[r] * kj[e];
    }
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = dot * scale, m_new = fmaxf(m, s);
    const float old = expf(m - m_new), p = expf(s - m_new);
    l = l * old + p;
    const float* vj = v_cache + j * kvw + off;
    for (int r = 0; r < kPerLane; ++r) {
      const int e = lane + 32 * r;
      if (e < d) acc[r] = acc[r] * old + p * vj[e];
    }
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int r = 0; r < kPerLane; ++r) {
    const int e = lane + 32 * r;
    if (e < d) sacc[warp][e] = acc[r];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.0f) L += sl[w] * expf(sm[w] - M);
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.0f) o += sacc[w][e] * expf(sm[w] - M);
    store_act(out + i * out_ld + int64_t{h} * d + e, o / L, round);
  }
}

}  // namespace

void register_gqa_cuda(GqaOps& r, const CudaOps& ops) {
  r.rope_gqa_attention.add(
      {"cuda_warp_split", core::Device::cuda,
       [ops](const RopeGqaAttentionArgs& a) {
         return all_of({ops.usable(),
                        on_cuda({{"q", &a.q},
                                 {"k", &a.k},
                                 {"v", &a.v},
                                 {"k_cache", &a.k_cache},
                                 {"v_cache", &a.v_cache},
                                 {"inv_freq", &a.inv_freq},
                                 {"out", &a.out}}),
                        same_act({{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}}, a.precision),
                        a.head_dim <= kMaxHeadDim
                            ? core::Status::ok()
                            : core::Status::fail("head_dim above " + std::to_string(kMaxHeadDim))});
       },
       [ops](const RopeGqaAttentionArgs& a) {
         const int64_t n = a.q.dim(0);
         if (n == 0) return;
         const bool round = a.precision == Precision::bf16;
         with_act(a.q.dtype, [&](auto tag) {
           using E = typename decltype(tag)::type;
           rope_write_kernel<E><<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(a.num_heads + a.num_kv_heads)),
                                  64, 0, ops.ctx->stream()>>>(a.q.as<E>(), a.q.strides[0], a.k.as<E>(), a.k.strides[0],
                                                              a.v.as<const E>(), a.v.strides[0], a.k_cache.as<float>(),
                                                              a.v_cache.as<float>(), a.inv_freq.as<const float>(),
                                                              a.past, a.position, a.num_heads, a.num_kv_heads,
                                                              a.head_dim, round);
           K3_CUDA_CHECK_LAUNCH("rope_write_kernel");
           attention_kernel<E><<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(a.num_heads)), 32 * kWarps, 0,
                                 ops.ctx->stream()>>>(a.q.as<const E>(), a.q.strides[0], a.k_cache.as<const float>(),
                                                      a.v_cache.as<const float>(), a.out.as<E>(), a.out.strides[0],
                                                      a.past, a.num_heads, a.num_kv_heads, a.head_dim,
                                                      1.0f / sqrtf(static_cast<float>(a.head_dim)), round);
           K3_CUDA_CHECK_LAUNCH("attention_kernel");
         });
       }});
}

}  // namespace k3::kernels
