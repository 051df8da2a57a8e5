// kernels/kda/cuda_recurrent.cu: CUDA KDA delta rule one token at a time (spec §5.5): the decode
// form, also right for speculative-verify rows (T > 1).
//
// The rows v of a head's state evolve independently (every step below acts on one row, given the
// token's q, k, alpha, beta), so a block owns kRows rows of one head of one sequence and keeps them
// in registers for the whole call: grid (heads, D / kRows, sequences), so a decode step of 64
// sequences is one launch; a block reads its sequence's rows and state slot from the SeqBatch tables
// in device memory (the grid never depends on them). 4 threads per row, each holding 32 fp32
// entries S[v][k] at k = 16 i + 4 sub + e. Per token, every block prepares q, k, alpha (L2 norms over the
// head: cheap next to the state) in shared memory, then per row:
//   1. S[v][:] *= alpha   2. r = S[v] . k   3. u = beta (v - r)   4. S[v] += u k   5. o[v] = S[v] . q
// Dot products are 4 partial sums joined by shuffles (order differs from the reference: tolerance).
#include "kernels/kda/cuda_kda_common.cuh"
#include "kernels/kda/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kRows = 32;
constexpr int kThreads = kRows * 4;  // 128 = kKdaMaxHeadDim: one q/k channel per thread in the front

template <class T>
__global__ void __launch_bounds__(kThreads) kda_recurrent_kernel(KdaParams<T> p) {
  __shared__ float q_s[kKdaMaxHeadDim], k_s[kKdaMaxHeadDim], alpha_s[kKdaMaxHeadDim], v_s[kRows];
  __shared__ float beta_s;
  __shared__ float red[32];
  const int h = blockIdx.x, D = p.D;
  const int tid = threadIdx.x, row = tid >> 2, sub = tid & 3;
  const int v = blockIdx.y * kRows + row;
  const bool row_ok = v < D;
  const KdaSeq seq = kda_seq(p, blockIdx.z);  // the same for every thread: uniform control flow
  float* S_row = seq.state + (static_cast<int64_t>(h) * D + (row_ok ? v : 0)) * D;
  const bool vec = p.state_vec4;

  float s[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k0 = 16 * i + 4 * sub;
    if (row_ok && vec && k0 < D) {
      const float4 q4 = *reinterpret_cast<const float4*>(S_row + k0);
      s[i][0] = q4.x, s[i][1] = q4.y, s[i][2] = q4.z, s[i][3] = q4.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = (row_ok && k0 + e < D) ? S_row[k0 + e] : 0.0f;
    }
  }

  const int64_t c0 = static_cast<int64_t>(h) * D;
  const float a_log = p.a_log[h];
  for (int i_row = 0; i_row < seq.rows; ++i_row) {
    const int64_t t = seq.row0 + i_row;
    // Front: q, k L2-normalised (q also scaled), alpha = exp(g), beta = sigmoid(b), this block's v.
    const bool ch = tid < D;
    const float qi = ch ? to_f32(p.q[t * p.q_ld + c0 + tid]) : 0.0f;
    const float ki = ch ? to_f32(p.k[t * p.k_ld + c0 + tid]) : 0.0f;
    const float q_norm = sqrtf(block_sum(qi * qi, red) + kKdaL2Eps);
    const float k_norm = sqrtf(block_sum(ki * ki, red) + kKdaL2Eps);
    if (tid < kKdaMaxHeadDim) {
      q_s[tid] = ch ? qi / q_norm * p.q_scale : 0.0f;
      k_s[tid] = ch ? ki / k_norm : 0.0f;
      alpha_s[tid] = ch ? expf(kda_gate(to_f32(p.f[t * p.f_ld + c0 + tid]), p.dt_bias[c0 + tid], a_log, p.lower_bound))
                        : 0.0f;
    }
    if (tid < kRows) {
      const int vv = blockIdx.y * kRows + tid;
      v_s[tid] = vv < D ? to_f32(p.v[t * p.v_ld + c0 + vv]) : 0.0f;
    }
    if (tid == 0) beta_s = sigmoid_f32(to_f32(p.b[t * p.b_ld + h]));
    __syncthreads();

    float read = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 16 * i + 4 * sub + e;
        s[i][e] *= alpha_s[k];     // 1. decay (k >= D: alpha 0, entry stays 0)
        read += s[i][e] * k_s[k];  // 2. read
      }
    read += __shfl_xor_sync(kFullMask, read, 1);
    read += __shfl_xor_sync(kFullMask, read, 2);
    const float u = beta_s * (v_s[row] - read);  // 3. delta
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 16 * i + 4 * sub + e;
        s[i][e] += u * k_s[k];  // 4. write
        o += s[i][e] * q_s[k];  // 5. output (post-update state)
      }
    o += __shfl_xor_sync(kFullMask, o, 1);
    o += __shfl_xor_sync(kFullMask, o, 2);
    if (row_ok && sub == 0) store_act(p.out + t * p.out_ld + c0 + v, o, p.round);
    __syncthreads();  // the next token's front overwrites the shared vectors
  }
  if (!p.commit) return;  // speculative verify: the slot keeps its committed state (uniform per launch)

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k0 = 16 * i + 4 * sub;
    if (row_ok && vec && k0 < D) {
      *reinterpret_cast<float4*>(S_row + k0) = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (row_ok && k0 + e < D) S_row[k0 + e] = s[i][e];
    }
  }
}

}  // namespace

void register_kda_recurrent_cuda(KdaOps& r, const CudaOps& ops) {
  r.kda_recurrent.add({"cuda_rowsplit", core::Device::cuda,
                       [ops](const KdaAttentionArgs& a) { return kda_supports(ops, a); },
                       [ops](const KdaAttentionArgs& a) {
                         if (a.q.dim(0) == 0 || a.seqs.num_seqs == 0) return;
                         with_act(a.q.dtype, [&](auto tag) {
                           using E = typename decltype(tag)::type;
                           const dim3 grid(static_cast<unsigned>(a.num_heads), grid_for(a.head_dim, kRows),
                                           static_cast<unsigned>(a.seqs.num_seqs));
                           kda_recurrent_kernel<E><<<grid, kThreads, 0, ops.ctx->stream()>>>(kda_params<E>(a));
                           K3_CUDA_CHECK_LAUNCH("kda_recurrent_kernel");
                         });
                       }});
}

}  // namespace k3::kernels
