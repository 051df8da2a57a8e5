// kernels/kda/cuda_kda_decode.cu: the fused KDA decode kernels (kda_decode.h). Strategy
// "cuda_head_cta": grid (num_heads, num_seqs), one CTA of 512 threads per (head, sequence); for small
// batches "cuda_vsplit_cluster" (cuda_kda_decode_vsplit.cu) splits each head's state along V over a
// cluster of 4-8 CTAs.
//
// Thread roles inside a CTA (D = head_dim <= 128, channels of head h are c0 + i, c0 = h * D):
//   conv:  thread tid < 384 owns channel i = tid % 128 of part tid / 128 (0 q, 1 k, 2 v): its K
//          weights and its K-1 window entries live in registers for the whole call;
//   f_b:   4 threads per decay logit i = tid / 4, each summing a quarter of the R inputs (chunks of
//          8: 16-byte weight loads), joined by two shuffles;
//   state: 4 threads per V row v = tid / 4, 32 fp32 entries S[v][k] at k = 16 j + 4 (tid % 4) + e
//          (as kernels/kda/cuda_recurrent.cu), loaded once before the first row, stored once after
//          the last (not at all with no_commit).
// Per row t of the sequence, with barriers between the phases:
//   1. f_a row -> shared; conv of the 3 x D channels -> qkv_s (rounded as the standard conv)
//   2. f = round(W_fb f_a) per logit, alpha = exp(gate(f)); |q~|, |k~| (warps 0, 1); beta (warp 2)
//   3. q = q~ / |q~| * D^-1/2, k = k~ / |k~| into shared memory
//   4. delta rule on the registers: decay, read, delta, write, o[v] = S[v] . q -> o_s (rounded)
//   5. rstd of o over the head (warp 0);  6. out = round(o * rstd * o_norm * sigmoid(g))
// Sums run in a different order than the reference (partial sums + shuffles) and nvcc may contract
// multiply-adds: equal to the CPU reference within fp32 rounding (kernels/kda/kda_decode_ops_test.cpp).
// Programmatic dependent launch (rules: kernels/cuda_common.cuh), both strategies: launched while the
// multi_linear that produced q/k/v/g/f_a/b still runs; a CTA triggers, takes the weights it needs into
// registers (conv taps, 3 x 128 x 4 x 4 B = 6 KB per head; the V-split form also its f_b rows, 16 x 256 B
// per CTA) or asks L2 for them (head-CTA form: the head's f_b rows, 128 x 256 B = 32 KB, sequence-0 CTAs
// only; 393 KB for all 12 heads at K3 TP8), then waits before it reads a step table, the conv window,
// the state or an activation, and before any store.
#include "kernels/kda/cuda_kda_decode.cuh"

#include "kernels/kda/ops.h"

namespace k3::kernels {

namespace kda_decode_detail {

namespace {

template <class T, class S>
__global__ void __launch_bounds__(kThreads) kda_decode_kernel(DecodeParams<T, S> p) {
  __shared__ float fa_s[kMaxFaWidth];
  __shared__ float qkv_s[3][kMaxD];  // this row's q~, k~, v~ of the head (conv outputs, rounded)
  __shared__ float q_s[kMaxD], k_s[kMaxD], alpha_s[kMaxD], o_s[kMaxD];
  __shared__ float norm_s[2], beta_s, rstd_s;

  const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int D = p.D, K = p.K;
  const int64_t c0 = static_cast<int64_t>(h) * D;
  // State role: row v, quarter sub (also the f_b role: logit fo = v).
  const int v = tid >> 2, sub = tid & 3;
  const bool row_ok = v < D;

  // PDL: trigger; before the wait only weights: this thread's conv taps into registers, the head's f_b
  // rows into L2 (one thread per row, sequence-0 CTAs: every sequence reads the same rows).
  pdl_launch_dependents();
  const int cpart = tid / kMaxD, ci = tid % kMaxD;  // conv role: channel ci of part cpart
  const bool conv_on = cpart < 3 && ci < D;
  const float* c_w = (cpart == 0 ? p.q_conv : (cpart == 1 ? p.k_conv : p.v_conv)) + (c0 + ci) * K;
  float cw[kMaxWidth], window[kMaxWidth];
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i) cw[i] = conv_on && i < K ? c_w[i] : 0.0f;
  if (seq == 0 && row_ok && sub == 0) {
    const int64_t esize = p.f_b_bf16 ? 2 : 4;
    prefetch_l2_within(static_cast<const char*>(p.f_b) + (c0 + v) * p.f_b_ld * esize,
                       static_cast<uint64_t>(p.R) * esize);
  }
  pdl_wait();

  // The sequence, read from the device tables (the same for every thread: uniform control flow).
  const int n_raw = p.num_rows[seq];
  const int n = n_raw < 0 ? 0 : (n_raw > p.max_rows ? p.max_rows : n_raw);
  const int64_t row0 = p.row_begin[seq];
  const int64_t slot = p.slot[seq];

  const T* c_in = cpart == 0 ? p.q_in : (cpart == 1 ? p.k_in : p.v_in);
  const int64_t c_ld = cpart == 0 ? p.q_ld : (cpart == 1 ? p.k_ld : p.v_ld);
  S* c_st = p.conv_state + slot * p.conv_slot_stride + (conv_on ? cpart : 0) * p.conv_part_stride +
            (c0 + (conv_on ? ci : 0)) * (K - 1);
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i) window[i] = conv_on && i < K - 1 ? to_f32(c_st[i]) : 0.0f;

  float* S_row = p.state + slot * p.slot_stride + (c0 + (row_ok ? v : 0)) * D;
  float s[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k0 = 16 * i + 4 * sub;
    if (row_ok && p.state_vec4 && k0 < D) {
      const float4 q4 = *reinterpret_cast<const float4*>(S_row + k0);
      s[i][0] = q4.x, s[i][1] = q4.y, s[i][2] = q4.z, s[i][3] = q4.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = (row_ok && k0 + e < D) ? S_row[k0 + e] : 0.0f;
    }
  }

  // f_b role: logit fo (= v), quarter sub.
  const int fo = v;
  const float a_log = p.a_log[h];

  for (int r = 0; r < n; ++r) {
    const int64_t t = row0 + r;
    // 1. f_a row to shared memory; the conv of this thread's channel.
    for (int j = tid; j < p.R; j += kThreads) fa_s[j] = to_f32(p.f_a[t * p.f_a_ld + j]);
    if (conv_on) {
      // Inputs are bf16 values in bf16 mode already; rounding again keeps "the state holds bf16".
      const float xt = round_if(to_f32(c_in[t * c_ld + c0 + ci]), p.round);
#pragma unroll
      for (int i = 0; i < kMaxWidth; ++i)
        if (i == K - 1) window[i] = xt;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxWidth; ++i)
        if (i < K) sum += cw[i] * window[i];
      qkv_s[cpart][ci] = round_if(sum / (1.0f + expf(-sum)), p.round);  // SiLU = x / (1 + e^-x)
#pragma unroll
      for (int i = 0; i + 1 < kMaxWidth; ++i)
        if (i + 1 < K) window[i] = window[i + 1];
    }
    __syncthreads();

    // 2. Decay logit f[fo] = round(sum_j W_fb[c0 + fo][j] f_a[j]) and alpha; norms of q~, k~; beta.
    float fsum = 0.0f;
    if (fo < D) {
      const int64_t w_row = (c0 + fo) * p.f_b_ld;
      for (int j0 = 8 * sub; j0 < p.R; j0 += 32) {
        float w8[8];
        if (p.f_b_vec) {
          load_vec_n<8>(p.f_b, p.f_b_bf16, w_row + j0, w8);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) w8[e] = j0 + e < p.R ? load_vec(p.f_b, p.f_b_bf16, w_row + j0 + e) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (j0 + e < p.R) fsum += w8[e] * fa_s[j0 + e];
      }
    }
    fsum += __shfl_xor_sync(kFullMask, fsum, 1);
    fsum += __shfl_xor_sync(kFullMask, fsum, 2);
    if (fo < D && sub == 0) {
      const float f = round_if(fsum, p.round);  // f is an activation of the standard path
      alpha_s[fo] = expf(kda_gate(f, p.dt_bias[c0 + fo], a_log, p.lower_bound));
    }
    if (warp < 2) {  // warp 0: |q~|, warp 1: |k~| (eps inside the sqrt of the sum, spec §5.3)
      float sq = 0.0f;
      for (int i = lane; i < D; i += 32) sq += qkv_s[warp][i] * qkv_s[warp][i];
      sq = warp_sum(sq);
      if (lane == 0) norm_s[warp] = sqrtf(sq + kKdaL2Eps);
    }
    if (tid == 64) beta_s = sigmoid_f32(to_f32(p.b[t * p.b_ld + h]));
    __syncthreads();

    // 3. Normalised q (scaled) and k; channels past D hold zeros (their state entries stay 0).
    if (tid < kMaxD) {
      const bool ch = tid < D;
      q_s[tid] = ch ? qkv_s[0][tid] / norm_s[0] * p.q_scale : 0.0f;
      k_s[tid] = ch ? qkv_s[1][tid] / norm_s[1] : 0.0f;
      if (!ch) alpha_s[tid] = 0.0f;
    }
    __syncthreads();

    // 4. The delta rule on this thread's quarter of row v (spec §5.5, post-update output).
    float read = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 16 * i + 4 * sub + e;
        s[i][e] *= alpha_s[k];     // decay
        read += s[i][e] * k_s[k];  // read
      }
    read += __shfl_xor_sync(kFullMask, read, 1);
    read += __shfl_xor_sync(kFullMask, read, 2);
    const float u = beta_s * ((row_ok ? qkv_s[2][v] : 0.0f) - read);  // delta
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 16 * i + 4 * sub + e;
        s[i][e] += u * k_s[k];  // write
        o += s[i][e] * q_s[k];  // output
      }
    o += __shfl_xor_sync(kFullMask, o, 1);
    o += __shfl_xor_sync(kFullMask, o, 2);
    if (row_ok && sub == 0) {
      const float o_r = round_if(o, p.round);  // o is an activation of the standard path
      o_s[v] = o_r;
      if (p.o_trace != nullptr) store_act(p.o_trace + t * p.o_trace_ld + c0 + v, o_r, p.round);
    }
    __syncthreads();

    // 5. rstd = 1 / sqrt(mean(o^2) + eps) over the head.
    if (warp == 0) {
      float sq = 0.0f;
      for (int i = lane; i < D; i += 32) sq += o_s[i] * o_s[i];
      sq = warp_sum(sq);
      if (lane == 0) rstd_s = 1.0f / sqrtf(sq / static_cast<float>(D) + p.eps);
    }
    __syncthreads();

    // 6. out = round(((o * rstd) * w) * sigmoid(g)).
    if (tid < D) {
      const float gate = to_f32(p.g[t * p.g_ld + c0 + tid]);
      const float y = o_s[tid] * rstd_s * load_vec(p.o_norm, p.o_norm_bf16, tid) * sigmoid_f32(gate);
      store_act(p.out + t * p.out_ld + c0 + tid, y, p.round);
    }
    __syncthreads();  // the next row's phases overwrite the shared vectors
  }
  if (!p.commit) return;  // speculative verify: both slots keep their committed states

  if (conv_on) {
#pragma unroll
    for (int i = 0; i < kMaxWidth; ++i)
      if (i < K - 1) store_act(c_st + i, window[i], false);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k0 = 16 * i + 4 * sub;
    if (row_ok && p.state_vec4 && k0 < D) {
      *reinterpret_cast<float4*>(S_row + k0) = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (row_ok && k0 + e < D) S_row[k0 + e] = s[i][e];
    }
  }
}

}  // namespace

core::Status kda_decode_supports(const CudaOps& ops, const KdaDecodeArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"q_in", &a.q_in},
                        {"k_in", &a.k_in},
                        {"v_in", &a.v_in},
                        {"g", &a.g},
                        {"f_a", &a.f_a},
                        {"b", &a.b},
                        {"q_conv", &a.q_conv},
                        {"k_conv", &a.k_conv},
                        {"v_conv", &a.v_conv},
                        {"conv_state", &a.conv_state},
                        {"a_log", &a.a_log},
                        {"dt_bias", &a.dt_bias},
                        {"state", &a.state},
                        {"o_norm", &a.o_norm},
                        {"out", &a.out}});
      !s)
    return s;
  if (a.o_trace.data != nullptr)
    if (auto s = on_cuda({{"o_trace", &a.o_trace}}); !s) return s;
  if (auto s = weight_on_cuda(*a.f_b, "f_b"); !s) return s;
  if (a.seqs.num_seqs > 0)  // (an empty batch may leave its tables unset)
    if (auto s = on_cuda({{"seqs.row_begin", &a.seqs.row_begin},
                          {"seqs.num_rows", &a.seqs.num_rows},
                          {"seqs.slot", &a.seqs.slot},
                          {"seqs.position", &a.seqs.position}});
        !s)
      return s;
  if (auto s = same_act({{"q_in", &a.q_in},
                         {"k_in", &a.k_in},
                         {"v_in", &a.v_in},
                         {"g", &a.g},
                         {"f_a", &a.f_a},
                         {"b", &a.b},
                         {"out", &a.out}},
                        a.precision);
      !s)
    return s;
  if (a.o_trace.data != nullptr && a.o_trace.dtype != a.out.dtype)
    return core::Status::fail("o_trace must have out's dtype " + std::string(core::dtype_name(a.out.dtype)) + ", got " +
                              describe(a.o_trace));
  // A bf16 conv pool rounds the conv window; in fp32 mode the CPU oracle keeps it f32.
  if (a.precision == Precision::fp32 && a.conv_state.dtype != core::DType::f32)
    return core::Status::fail("fp32 mode needs an f32 conv_state (the oracle keeps the conv window unrounded), got " +
                              describe(a.conv_state));
  if (a.head_dim > kMaxD)
    return core::Status::fail("head_dim " + std::to_string(a.head_dim) + " is above the CUDA limit " +
                              std::to_string(kMaxD));
  const int64_t K = a.q_conv.dim(a.q_conv.rank() - 1), R = a.f_b->in_features();
  if (K > kMaxWidth)
    return core::Status::fail("conv width K = " + std::to_string(K) + " is above the CUDA limit " +
                              std::to_string(kMaxWidth));
  if (R > kMaxFaWidth)
    return core::Status::fail("f_a width R = " + std::to_string(R) + " is above the CUDA limit " +
                              std::to_string(kMaxFaWidth));
  if (a.seqs.num_seqs > kMaxSeqsPerLaunch)
    return core::Status::fail("seqs.num_seqs " + std::to_string(a.seqs.num_seqs) + " is above the CUDA limit " +
                              std::to_string(kMaxSeqsPerLaunch) + " per call");
  return core::Status::ok();
}

}  // namespace kda_decode_detail

using namespace kda_decode_detail;

void register_kda_decode_cuda(KdaOps& r, const CudaOps& ops) {
  r.kda_decode.add({"cuda_head_cta", core::Device::cuda,
                    [ops](const KdaDecodeArgs& a) { return kda_decode_supports(ops, a); },
                    [ops](const KdaDecodeArgs& a) {
                      if (a.q_in.dim(0) == 0 || a.seqs.num_seqs == 0) return;
                      with_act(a.q_in.dtype, [&](auto act) {
                        using E = typename decltype(act)::type;
                        with_act(a.conv_state.dtype, [&](auto st) {
                          using S = typename decltype(st)::type;
                          const dim3 grid(static_cast<unsigned>(a.num_heads), static_cast<unsigned>(a.seqs.num_seqs));
                          launch_dependent(kda_decode_kernel<E, S>, grid, dim3(kThreads), 0, ops.ctx->stream(),
                                           dim3(1, 1, 1), decode_params<E, S>(a));
                          K3_CUDA_CHECK_LAUNCH("kda_decode_kernel");
                        });
                      });
                    }});
  register_kda_decode_vsplit(r, ops);
}

}  // namespace k3::kernels
