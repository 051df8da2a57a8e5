// kernels/kda/cuda_kda_decode.cuh: what the two CUDA strategies of the fused KDA decode
// share (kda_decode.h): the limits, the kernel parameters, the support check and the host-side
// parameter fill. cuda_kda_decode.cu holds "cuda_head_cta" and the registration;
// cuda_kda_decode_vsplit.cu holds "cuda_vsplit_cluster".
#pragma once
#include "kernels/cuda_common.cuh"
#include "kernels/kda/cuda_kda_common.cuh"
#include "kernels/kda/kda_decode.h"
#include "kernels/kda/ops.h"

namespace k3::kernels::kda_decode_detail {

using namespace cuda_detail;

constexpr int kThreads = 512;      // 4 threads per state row of a 128-dim head
constexpr int kMaxD = 128;         // head_dim limit (kKdaMaxHeadDim)
constexpr int kMaxWidth = 4;       // conv width K limit (K3: 4; a wider window would spill registers)
constexpr int kMaxFaWidth = 1024;  // f_a width R limit (its row sits in shared memory)
static_assert(kMaxD == kKdaMaxHeadDim && kThreads == 4 * kMaxD && 3 * kMaxD <= kThreads);

// Kernel parameters: activations T (bf16 or f32) with row strides (`*_ld`, elements), the conv
// storage S (bf16 or f32) [num_slots, 3, P, K-1], the f32 state pool [num_slots, H, D, D].
template <class T, class S>
struct DecodeParams {
  const T *q_in, *k_in, *v_in, *g, *f_a, *b;
  int64_t q_ld, k_ld, v_ld, g_ld, f_a_ld, b_ld;
  const void* f_b;  // [P, R] bf16 or f32, row r at f_b + r * f_b_ld
  int64_t f_b_ld;
  bool f_b_bf16;
  bool f_b_vec;  // R % 8 == 0 and every row 16-byte aligned: 8-element vector loads
  int R;
  const float *q_conv, *k_conv, *v_conv;  // [P, K] each
  int K;
  S* conv_state;
  int64_t conv_slot_stride, conv_part_stride;  // elements: slot to slot, q part to k part
  const float* a_log;                          // [>= H]
  const float* dt_bias;                        // [P]
  float* state;
  int64_t slot_stride;
  bool state_vec4;     // state rows may be read as float4
  const void* o_norm;  // [D] bf16 or f32
  bool o_norm_bf16;
  T* out;
  int64_t out_ld;
  T* o_trace;  // nullptr: not written
  int64_t o_trace_ld;
  const int32_t *row_begin, *num_rows, *slot;  // SeqBatch tables (device)
  int max_rows;
  int H, D;
  float lower_bound, q_scale, eps;
  bool round;   // Precision::bf16: round f, q~/k~/v~, o, out
  bool commit;  // !no_commit: store both states
};

// Everything both strategies need of the arguments (devices, dtypes, the limits above).
core::Status kda_decode_supports(const CudaOps& ops, const KdaDecodeArgs& a);

template <class T, class S>
DecodeParams<T, S> decode_params(const KdaDecodeArgs& a) {
  DecodeParams<T, S> p;
  p.q_in = a.q_in.as<const T>(), p.k_in = a.k_in.as<const T>(), p.v_in = a.v_in.as<const T>();
  p.g = a.g.as<const T>(), p.f_a = a.f_a.as<const T>(), p.b = a.b.as<const T>();
  p.q_ld = a.q_in.strides[0], p.k_ld = a.k_in.strides[0], p.v_ld = a.v_in.strides[0];
  p.g_ld = a.g.strides[0], p.f_a_ld = a.f_a.strides[0], p.b_ld = a.b.strides[0];
  const core::TensorView& fb = a.f_b->weight.view();
  p.f_b = fb.data;
  p.f_b_ld = fb.strides[0];
  p.f_b_bf16 = fb.dtype == core::DType::bf16;
  p.R = static_cast<int>(fb.dim(1));
  p.f_b_vec = p.R % 8 == 0 && p.f_b_ld % 8 == 0 && aligned16(fb.data);
  p.q_conv = a.q_conv.as<const float>(), p.k_conv = a.k_conv.as<const float>(), p.v_conv = a.v_conv.as<const float>();
  p.K = static_cast<int>(a.q_conv.dim(a.q_conv.rank() - 1));
  p.conv_state = a.conv_state.as<S>();
  p.conv_slot_stride = a.conv_state.dim(0) > 1 ? a.conv_state.strides[0] : 0;
  p.conv_part_stride = a.conv_state.strides[1];
  p.a_log = a.a_log.as<const float>();
  p.dt_bias = a.dt_bias.as<const float>();
  p.state = a.state.as<float>();
  p.slot_stride = a.state.dim(0) > 1 ? a.state.strides[0] : 0;
  p.state_vec4 = (a.head_dim & 3) == 0 && (p.slot_stride & 3) == 0 && aligned16(a.state.data);
  p.o_norm = a.o_norm.data;
  p.o_norm_bf16 = a.o_norm.dtype == core::DType::bf16;
  p.out = a.out.as<T>();
  p.out_ld = a.out.strides[0];
  p.o_trace = a.o_trace.data != nullptr ? a.o_trace.as<T>() : nullptr;
  p.o_trace_ld = a.o_trace.data != nullptr ? a.o_trace.strides[0] : 0;
  p.row_begin = a.seqs.row_begin.as<const int32_t>(), p.num_rows = a.seqs.num_rows.as<const int32_t>();
  p.slot = a.seqs.slot.as<const int32_t>();
  p.max_rows = a.seqs.max_rows;
  p.H = a.num_heads, p.D = a.head_dim;
  p.lower_bound = a.lower_bound;
  p.q_scale = 1.0f / sqrtf(static_cast<float>(a.head_dim));
  p.eps = a.rms_eps;
  p.round = a.precision == Precision::bf16;
  p.commit = !a.no_commit;
  return p;
}

// Adds "cuda_vsplit_cluster" to the registry (cuda_kda_decode_vsplit.cu).
void register_kda_decode_vsplit(KdaOps& r, const CudaOps& ops);

}  // namespace k3::kernels::kda_decode_detail
