// kernels/kda/cuda_kda_common.cuh: internal to kernels/kda: what the CUDA recurrent and chunked KDA
// kernels share: their parameter block (batched over sequences: SeqBatch tables in device memory),
// the per-sequence lookup, the gate (spec §5.4) and the supports() check.
#pragma once
#include "kernels/cuda_common.cuh"
#include "kernels/kda/kda.h"

namespace k3::kernels::cuda_detail {

constexpr int kKdaMaxHeadDim = 128;
constexpr float kKdaL2Eps = 1e-6f;  // inside the sqrt of the SUM of squares (spec §5.3)

// Kernel parameters of one batched KDA attention call. Activations [T, H*D] head-major with row
// strides; state f32 pool [num_slots, H, V=D, K=D] V-major, slots slot_stride elements apart; the
// SeqBatch tables (i32 [num_seqs]) in device memory: kernels read them, grids never depend on them.
template <class T>
struct KdaParams {
  const T *q, *k, *v, *f, *b;
  int64_t q_ld, k_ld, v_ld, f_ld, b_ld;
  const float* a_log;    // [>= H], per head
  const float* dt_bias;  // [H*D]
  float* state;          // pool base
  int64_t slot_stride;   // elements from one slot to the next
  bool state_vec4;       // every slot's rows may be read as float4 (16-byte aligned)
  T* out;
  int64_t out_ld;
  const int32_t *row_begin, *num_rows, *slot, *position;  // SeqBatch tables (device)
  int max_rows;                                           // SeqBatch::max_rows: num_rows are clamped to it
  int H, D;
  float lower_bound, q_scale;
  bool round;   // bf16 rounding of o (Precision::bf16)
  bool commit;  // store the final state (false: KdaAttentionArgs::no_commit, recurrent only)
};

template <class T>
KdaParams<T> kda_params(const KdaAttentionArgs& a) {
  KdaParams<T> p;
  p.q = a.q.as<const T>(), p.k = a.k.as<const T>(), p.v = a.v.as<const T>(), p.f = a.f.as<const T>();
  p.b = a.b.as<const T>();
  p.q_ld = a.q.strides[0], p.k_ld = a.k.strides[0], p.v_ld = a.v.strides[0], p.f_ld = a.f.strides[0];
  p.b_ld = a.b.strides[0];
  p.a_log = a.a_log.as<const float>();
  p.dt_bias = a.dt_bias.as<const float>();
  p.state = a.state.as<float>();
  p.slot_stride = a.state.dim(0) > 1 ? a.state.strides[0] : 0;
  p.state_vec4 = (a.head_dim & 3) == 0 && (p.slot_stride & 3) == 0 && aligned16(a.state.data);
  p.out = a.out.as<T>();
  p.out_ld = a.out.strides[0];
  p.row_begin = a.seqs.row_begin.as<const int32_t>(), p.num_rows = a.seqs.num_rows.as<const int32_t>();
  p.slot = a.seqs.slot.as<const int32_t>(), p.position = a.seqs.position.as<const int32_t>();
  p.max_rows = a.seqs.max_rows;
  p.H = a.num_heads, p.D = a.head_dim;
  p.lower_bound = a.lower_bound;
  p.q_scale = 1.0f / sqrtf(static_cast<float>(a.head_dim));
  p.round = a.precision == Precision::bf16;
  p.commit = !a.no_commit;
  return p;
}

// Sequence s of a batched call, read from the device tables: its first activation row, its row
// count (clamped to [0, max_rows], so a bad table cannot run past what the caller sized for) and
// its state slot's base.
struct KdaSeq {
  int64_t row0;
  int rows;
  float* state;
};
template <class T>
__device__ __forceinline__ KdaSeq kda_seq(const KdaParams<T>& p, int s) {
  const int n = p.num_rows[s];
  KdaSeq q;
  q.row0 = p.row_begin[s];
  q.rows = n < 0 ? 0 : (n > p.max_rows ? p.max_rows : n);
  q.state = p.state + static_cast<int64_t>(p.slot[s]) * p.slot_stride;
  return q;
}

// The launch grid's sequence dimension (gridDim.z or .y) is limited to 65535.
constexpr int kMaxSeqsPerLaunch = 65535;

// g = lower_bound * sigmoid(exp(a_log) * (f + dt_bias)) (spec §5.4).
__device__ __forceinline__ float kda_gate(float f, float dt_bias, float a_log, float lower_bound) {
  return lower_bound * sigmoid_f32(expf(a_log) * (f + dt_bias));
}

inline core::Status kda_supports(const CudaOps& ops, const KdaAttentionArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"q", &a.q},
                        {"k", &a.k},
                        {"v", &a.v},
                        {"f", &a.f},
                        {"b", &a.b},
                        {"a_log", &a.a_log},
                        {"dt_bias", &a.dt_bias},
                        {"state", &a.state},
                        {"out", &a.out}});
      !s)
    return s;
  if (a.seqs.num_seqs > 0)  // (an empty batch may leave its tables unset)
    if (auto s = on_cuda({{"seqs.row_begin", &a.seqs.row_begin},
                          {"seqs.num_rows", &a.seqs.num_rows},
                          {"seqs.slot", &a.seqs.slot},
                          {"seqs.position", &a.seqs.position}});
        !s)
      return s;
  if (auto s = same_act({{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"f", &a.f}, {"b", &a.b}, {"out", &a.out}},
                        a.precision);
      !s)
    return s;
  if (a.seqs.num_seqs > kMaxSeqsPerLaunch)
    return core::Status::fail("seqs.num_seqs " + std::to_string(a.seqs.num_seqs) + " is above the CUDA limit " +
                              std::to_string(kMaxSeqsPerLaunch) + " per call");
  // Blocks split a head's state rows, so one block may write o while another still reads the same
  // token's q, k or f: those aliases (allowed on the CPU) are refused here.
  for (const auto& [name, v] : {Named{"q", &a.q}, Named{"k", &a.k}, Named{"f", &a.f}})
    if (overlaps(a.out, *v)) return core::Status::fail(std::string("out must not alias ") + name + " on CUDA");
  if (a.head_dim > kKdaMaxHeadDim)
    return core::Status::fail("head_dim " + std::to_string(a.head_dim) + " is above the CUDA limit " +
                              std::to_string(kKdaMaxHeadDim));
  return core::Status::ok();
}

}  // namespace k3::kernels::cuda_detail
