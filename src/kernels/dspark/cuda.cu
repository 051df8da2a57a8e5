// kernels/dspark/cuda.cu: CUDA implementations of the dspark family (see dspark.h for the math).
//   rope_pairs           one block per (row, head): a thread per rotated pair
//   mla_block_attention  q_lat_kernel   one block per (row, head): q_lat[i] over the nope dims in order
//                        attend_kernel  one block per (row, head), kWarps warps: each warp takes latent
//                                       rows j = warp, warp + kWarps, ... with a running (max, sum,
//                                       weighted c_n) over them, a lane holding dims lane + 32 r; the
//                                       warps' partial softmaxes merge in shared memory
//                        uv_kernel      one warp per output value: W_UV row . o_lat, lanes over L
//   markov_draft         per step: markov_logits_kernel (a thread per draft id: its Markov dot in
//                        index order, z written, each block's first maximum), markov_pick_kernel
//                        (one block per request: the first maximum of the blocks', d2t-mapped, as the
//                        next step's previous token). The chain stays on the device.
#include "kernels/cuda_common.cuh"
#include "kernels/dspark/dspark.h"
#include "kernels/dspark/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kWarps = 8;
constexpr int kMaxLatent = 512;  // L
constexpr int kMaxRope = 64;     // dr
constexpr int kLatPerLane = kMaxLatent / 32;
constexpr int kRopePerLane = kMaxRope / 32;
constexpr int kMarkovThreads = 256;

__global__ void rope_pairs_kernel(float* x, int64_t ld, const float* inv_freq, int64_t offset, int64_t head_stride,
                                  int dim, int64_t position, bool round) {
  const int64_t r = blockIdx.x;
  float* v = x + r * ld + offset + int64_t{blockIdx.y} * head_stride;
  const float pos = static_cast<float>(position + r);
  for (int i = threadIdx.x; i < dim / 2; i += blockDim.x) {
    const float angle = __fmul_rn(pos, inv_freq[i]);
    const float c = cosf(angle), s = sinf(angle);
    const float u = v[2 * i], w = v[2 * i + 1];
    const float uc = __fmul_rn(u, c), ws = __fmul_rn(w, s), us = __fmul_rn(u, s), wc = __fmul_rn(w, c);
    v[2 * i] = round_if(__fsub_rn(uc, ws), round);
    v[2 * i + 1] = round_if(__fadd_rn(us, wc), round);
  }
}

// q_lat [T, NH, L]: q_lat[t, h, i] = round(sum_d q_nope[t, h, d] * W_UK[h, d, i]).
template <WFmt F>
__global__ void q_lat_kernel(const float* q, int64_t q_ld, WeightRef kv_b, float* q_lat, int NH, int dn, int dr, int dv,
                             int L, bool round) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  extern __shared__ float q_nope[];
  for (int d = threadIdx.x; d < dn; d += blockDim.x) q_nope[d] = q[t * q_ld + int64_t{h} * (dn + dr) + d];
  __syncthreads();
  const int64_t row0 = int64_t{h} * (dn + dv);
  for (int i = threadIdx.x; i < L; i += blockDim.x) {
    float acc = 0.0f;
    for (int d = 0; d < dn; ++d) acc = __fadd_rn(acc, __fmul_rn(q_nope[d], weight_at<F>(kv_b, row0 + d, i)));
    q_lat[(t * NH + h) * L + i] = round_if(acc, round);
  }
}

__global__ void attend_kernel(const float* q, int64_t q_ld, const float* q_lat, const float* context, int64_t ctx_ld,
                              int64_t P, const float* block, int64_t block_ld, int64_t T, float* o_lat, int NH, int dn,
                              int dr, int L, float scale, bool round) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float ql[kLatPerLane], qp[kRopePerLane], acc[kLatPerLane];
  for (int r = 0; r < kLatPerLane; ++r) {
    const int i = lane + 32 * r;
    ql[r] = i < L ? q_lat[(t * NH + h) * L + i] : 0.0f;
    acc[r] = 0.0f;
  }
  for (int r = 0; r < kRopePerLane; ++r) {
    const int i = lane + 32 * r;
    qp[r] = i < dr ? q[t * q_ld + int64_t{h} * (dn + dr) + dn + i] : 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < P + T; j += kWarps) {
    const float* row = j < P ? context + j * ctx_ld : block + (j - P) * block_ld;
    float dot = 0.0f, dot_pe = 0.0f;
    for (int r = 0; r < kLatPerLane; ++r) {
      const int i = lane + 32 * r;
      if (i < L) dot += ql[r] * row[i];
    }
    for (int r = 0; r < kRopePerLane; ++r) {
      const int i = lane + 32 * r;
      if (i < dr) dot_pe += qp[r] * row[L + i];
    }
    dot = warp_sum(dot) + warp_sum(dot_pe);
    const float s = scale * dot, m_new = fmaxf(m, s);
    const float old = expf(m - m_new), p = expf(s - m_new);
    l = l * old + p;
    for (int r = 0; r < kLatPerLane; ++r) {
      const int i = lane + 32 * r;
      if (i < L) acc[r] = acc[r] * old + p * row[i];
    }
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxLatent];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int r = 0; r < kLatPerLane; ++r) {
    const int i = lane + 32 * r;
    if (i < L) sacc[warp][i] = acc[r];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float Lsum = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.0f) Lsum += sl[w] * expf(sm[w] - M);
  for (int i = threadIdx.x; i < L; i += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.0f) o += sacc[w][i] * expf(sm[w] - M);
    o_lat[(t * NH + h) * L + i] = round_if(o / Lsum, round);
  }
}

// out[t, h * dv + e] = round(W_UV[h, e] . o_lat[t, h]): one warp per (t, h, e).
template <WFmt F>
__global__ void uv_kernel(const float* o_lat, WeightRef kv_b, float* out, int64_t out_ld, int64_t T, int NH, int dn,
                          int dv, int L, bool round) {
  const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= T * NH * dv) return;
  const int e = static_cast<int>(w % dv);
  const int h = static_cast<int>((w / dv) % NH);
  const int64_t t = w / (int64_t{dv} * NH);
  const int64_t row = int64_t{h} * (dn + dv) + dn + e;
  const float* ol = o_lat + (t * NH + h) * L;
  float acc = 0.0f;
  for (int i = lane; i < L; i += 32) acc += weight_at<F>(kv_b, row, i) * ol[i];
  acc = warp_sum(acc);
  if (lane == 0) out[t * out_ld + int64_t{h} * dv + e] = round_if(acc, round);
}

// Step k of the chain for request b = blockIdx.y: z over this block's draft ids, and their first maximum.
template <WFmt F, class W1>
__global__ void markov_logits_kernel(const float* base, int64_t base_ld, const int32_t* x0, const W1* w1, int64_t w1_ld,
                                     WeightRef w2, const int32_t* tokens, float* logits, float* best_val,
                                     int32_t* best_id, int64_t Vd, int R, int K, int n, int k) {
  const int b = blockIdx.y;
  const int32_t prev = k == 0 ? x0[b] : tokens[int64_t{b} * n + k - 1];
  __shared__ float e[1024];
  for (int i = threadIdx.x; i < R; i += blockDim.x) e[i] = to_f32(w1[int64_t{prev} * w1_ld + i]);
  __syncthreads();
  const int64_t v = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  float z = -INFINITY;
  if (v < Vd) {
    float m = 0.0f;
    for (int i = 0; i < R; ++i) m = __fadd_rn(m, __fmul_rn(e[i], weight_at<F>(w2, v, i)));
    z = __fadd_rn(base[(int64_t{b} * K + k) * base_ld + v], m);
    logits[(int64_t{b} * n + k) * Vd + v] = z;
  }
  // The block's first maximum: larger value, then smaller id.
  __shared__ float sv[kMarkovThreads];
  __shared__ int64_t si[kMarkovThreads];
  sv[threadIdx.x] = z;
  si[threadIdx.x] = v < Vd ? v : INT64_MAX;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float ov = sv[threadIdx.x + s];
      const int64_t oi = si[threadIdx.x + s];
      if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    best_val[int64_t{b} * gridDim.x + blockIdx.x] = sv[0];
    best_id[int64_t{b} * gridDim.x + blockIdx.x] = static_cast<int32_t>(si[0] == INT64_MAX ? 0 : si[0]);
  }
}

__global__ void markov_pick_kernel(const float* best_val, const int32_t* best_id, int parts, const int64_t* d2t,
                                   int32_t* tokens, int n, int k) {
  const int b = blockIdx.x;
  if (threadIdx.x != 0) return;
  float v = best_val[int64_t{b} * parts];
  int32_t id = best_id[int64_t{b} * parts];
  for (int p = 1; p < parts; ++p) {  // parts cover increasing ids: strictly larger wins
    const float o = best_val[int64_t{b} * parts + p];
    if (o > v) {
      v = o;
      id = best_id[int64_t{b} * parts + p];
    }
  }
  tokens[int64_t{b} * n + k] = d2t ? static_cast<int32_t>(id + d2t[id]) : id;
}

core::Status dense_on_cuda(const LinearWeight* w, const char* name) {
  if (w == nullptr) return core::Status::fail(std::string(name) + " is missing");
  return weight_on_cuda(*w, name);
}

}  // namespace

void register_dspark_cuda(DsparkOps& r, const CudaOps& ops) {
  r.rope_pairs.add({"cuda_pairs", core::Device::cuda,
                    [ops](const RopePairsArgs& a) {
                      return all_of({ops.usable(), on_cuda({{"x", &a.x}, {"inv_freq", &a.inv_freq}})});
                    },
                    [ops](const RopePairsArgs& a) {
                      if (a.x.dim(0) == 0) return;
                      rope_pairs_kernel<<<dim3(static_cast<unsigned>(a.x.dim(0)), static_cast<unsigned>(a.heads)), 64,
                                          0, ops.ctx->stream()>>>(a.x.as<float>(), a.x.strides[0],
                                                                  a.inv_freq.as<const float>(), a.offset, a.head_stride,
                                                                  a.dim, a.position, a.precision == Precision::bf16);
                      K3_CUDA_CHECK_LAUNCH("rope_pairs_kernel");
                    }});
  r.mla_block_attention.add(
      {"cuda_warp_split", core::Device::cuda,
       [ops](const MlaBlockAttentionArgs& a) {
         return all_of({ops.usable(),
                        on_cuda({{"q", &a.q}, {"context", &a.context}, {"block", &a.block}, {"out", &a.out}}),
                        dense_on_cuda(a.kv_b, "kv_b"),
                        a.kv_b != nullptr && a.kv_b->in_features() <= kMaxLatent && a.rope_dim <= kMaxRope
                            ? core::Status::ok()
                            : core::Status::fail("kv_lora above " + std::to_string(kMaxLatent) +
                                                 " or rope dims above " + std::to_string(kMaxRope))});
       },
       [ops](const MlaBlockAttentionArgs& a) {
         const int64_t T = a.q.dim(0);
         if (T == 0) return;
         const int NH = a.num_heads, dn = a.nope_dim, dr = a.rope_dim, dv = a.v_dim;
         const int L = static_cast<int>(a.kv_b->in_features());
         const bool round = a.precision == Precision::bf16;
         const size_t lat_bytes = static_cast<size_t>(T * NH * L) * sizeof(float);
         const std::shared_ptr<void> scratch = ops.ctx->scratch(2 * lat_bytes);
         float* q_lat = static_cast<float*>(scratch.get());
         float* o_lat = q_lat + T * NH * L;
         const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(NH));
         const WeightRef w = weight_ref(*a.kv_b);
         with_wfmt(weight_format(*a.kv_b), [&](auto fmt) {
           q_lat_kernel<decltype(fmt)::value>
               <<<grid, 128, static_cast<size_t>(dn) * sizeof(float), ops.ctx->stream()>>>(
                   a.q.as<const float>(), a.q.strides[0], w, q_lat, NH, dn, dr, dv, L, round);
         });
         K3_CUDA_CHECK_LAUNCH("q_lat_kernel");
         attend_kernel<<<grid, 32 * kWarps, 0, ops.ctx->stream()>>>(
             a.q.as<const float>(), a.q.strides[0], q_lat, a.context.as<const float>(),
             a.context.dim(0) > 1 ? a.context.strides[0] : L + dr, a.context.dim(0), a.block.as<const float>(),
             a.block.strides[0], T, o_lat, NH, dn, dr, L, a.scale, round);
         K3_CUDA_CHECK_LAUNCH("attend_kernel");
         const int64_t warps = T * NH * dv;
         with_wfmt(weight_format(*a.kv_b), [&](auto fmt) {
           uv_kernel<decltype(fmt)::value><<<grid_for(warps * 32, 256), 256, 0, ops.ctx->stream()>>>(
               o_lat, w, a.out.as<float>(), a.out.strides[0], T, NH, dn, dv, L, round);
         });
         K3_CUDA_CHECK_LAUNCH("uv_kernel");
       }});
  r.markov_draft.add({"cuda_device_chain", core::Device::cuda,
                      [ops](const MarkovDraftArgs& a) {
                        const bool mapped = a.d2t.defined() && a.d2t.rank() == 1;
                        return all_of(
                            {ops.usable(),
                             on_cuda({{"base_logits", &a.base_logits},
                                      {"x0", &a.x0},
                                      {"w1", &a.w1},
                                      {"tokens", &a.tokens},
                                      {"logits", &a.logits}}),
                             mapped ? on_cuda({{"d2t", &a.d2t}}) : core::Status::ok(), dense_on_cuda(a.w2, "w2"),
                             a.w1.dim(1) <= 1024 ? core::Status::ok() : core::Status::fail("Markov rank above 1024")});
                      },
                      [ops](const MarkovDraftArgs& a) {
                        const int64_t B = a.x0.dim(0), Vd = a.base_logits.dim(1);
                        if (B == 0) return;
                        const int n = static_cast<int>(a.tokens.dim(1)), R = static_cast<int>(a.w1.dim(1));
                        const unsigned parts = grid_for(Vd, kMarkovThreads);
                        const std::shared_ptr<void> scratch = ops.ctx->scratch(static_cast<size_t>(B) * parts *
                                                                               (sizeof(float) + sizeof(int32_t)));
                        float* best_val = static_cast<float*>(scratch.get());
                        auto* best_id = reinterpret_cast<int32_t*>(best_val + B * parts);
                        const bool mapped = a.d2t.defined() && a.d2t.rank() == 1;
                        const WeightRef w2 = weight_ref(*a.w2);
                        for (int k = 0; k < n; ++k) {
                          with_wfmt(weight_format(*a.w2), [&](auto fmt) {
                            auto launch = [&](auto w1) {
                              markov_logits_kernel<decltype(fmt)::value>
                                  <<<dim3(parts, static_cast<unsigned>(B)), kMarkovThreads, 0, ops.ctx->stream()>>>(
                                      a.base_logits.as<const float>(), a.base_logits.strides[0],
                                      a.x0.as<const int32_t>(), w1, a.w1.strides[0], w2, a.tokens.as<const int32_t>(),
                                      a.logits.as<float>(), best_val, best_id, Vd, R, a.block_size, n, k);
                            };
                            if (a.w1.dtype == core::DType::bf16) launch(a.w1.as<const bf16>());
                            else launch(a.w1.as<const float>());
                          });
                          K3_CUDA_CHECK_LAUNCH("markov_logits_kernel");
                          markov_pick_kernel<<<static_cast<unsigned>(B), 32, 0, ops.ctx->stream()>>>(
                              best_val, best_id, static_cast<int>(parts), mapped ? a.d2t.as<const int64_t>() : nullptr,
                              a.tokens.as<int32_t>(), n, k);
                          K3_CUDA_CHECK_LAUNCH("markov_pick_kernel");
                        }
                      }});
}

}  // namespace k3::kernels
