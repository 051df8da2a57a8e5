// kernels/attn_res/merge_common.cuh: what the two CUDA forms of attn_res_merge share
// (included by kernels/attn_res/cuda*.cu only): the kernel parameter block, its filling from
// the op's arguments, the vector-path rule and the host checks common to both supports().
//   cuda.cu                 merge_kernel, one CTA per row ("cuda_merge_rowwise")
//   cuda_merge_cluster.cu   merge_cluster_kernel, one thread block cluster per row, small T
//                           ("cuda_merge_cluster")
#pragma once
#include <string>
#include <vector>

#include "kernels/attn_res/attn_res_fused.h"
#include "kernels/attn_res/ops.h"
#include "kernels/cuda_common.cuh"

namespace k3::kernels::attn_res_fused_detail {

using namespace cuda_detail;

// The f32 row of the one-CTA form lives in shared memory: D <= 51200.
inline constexpr size_t kMaxMergeSmem = 200 * 1024;

inline bool absent(const core::TensorView& v) { return v.data == nullptr && v.rank() == 0; }

template <class T>
struct MergeParams {
  const T* prefix;  // act [T, D]: P_old
  int64_t prefix_ld;
  const T* sub;  // act [T, D]: a, or null
  int64_t sub_ld;
  bool restart;      // P_new = a
  const float* acc;  // f32 [T, D]: bank partials, or null (empty bank)
  int64_t acc_ld;
  const float* stats;  // f32 [T, 2]: (max_b, sum_b)
  int64_t stats_ld;
  const void* query;   // bf16/f32 [D]
  const void* norm;    // bf16/f32 [D]
  const void* weight;  // bf16/f32 [D]: the RMSNorm weight
  bool query_bf16, norm_bf16, weight_bf16;
  T* prefix_out;  // act [T, D]: P_new, or null (may equal prefix or sub)
  int64_t prefix_out_ld;
  T* mixed_out;  // act [T, D]: h, or null
  int64_t mixed_ld;
  T* normed_out;  // act [T, D]: x
  int64_t normed_ld;
  int64_t D;
  float mix_eps, rms_eps;
  bool moonshot;  // round x_hat before the weight (with `round`)
  bool round;     // Precision::bf16
};

// Whether every row and vector of the call can be read 8 elements (16 bytes) at a time: N = 8,
// which also means D % 8 == 0. Both forms use the same rule, so they take the same path.
inline bool merge_rows_vec8(const AttnResMergeArgs& a) {
  bool vec = rows_vec8(a.prefix) && rows_vec8(a.normed_out) && aligned16(a.query.data) && aligned16(a.norm.data) &&
             aligned16(a.rmsnorm_weight.data);
  if (!absent(a.sublayer_out)) vec = vec && rows_vec8(a.sublayer_out);
  if (!absent(a.bank_acc)) vec = vec && rows_vec8(a.bank_acc);
  if (!absent(a.prefix_out)) vec = vec && rows_vec8(a.prefix_out);
  if (!absent(a.mixed_out)) vec = vec && rows_vec8(a.mixed_out);
  return vec;
}

template <class E>
MergeParams<E> merge_params(const AttnResMergeArgs& a) {
  MergeParams<E> p{};
  const auto ld = [](const core::TensorView& v) { return v.strides[0]; };
  p.prefix = a.prefix.as<const E>();
  p.prefix_ld = ld(a.prefix);
  if (!absent(a.sublayer_out)) {
    p.sub = a.sublayer_out.as<const E>();
    p.sub_ld = ld(a.sublayer_out);
  }
  p.restart = a.restart;
  if (!absent(a.bank_acc)) {
    p.acc = a.bank_acc.as<const float>();
    p.acc_ld = ld(a.bank_acc);
    p.stats = a.bank_stats.as<const float>();
    p.stats_ld = ld(a.bank_stats);
  }
  p.query = a.query.data;
  p.norm = a.norm.data;
  p.weight = a.rmsnorm_weight.data;
  p.query_bf16 = a.query.dtype == core::DType::bf16;
  p.norm_bf16 = a.norm.dtype == core::DType::bf16;
  p.weight_bf16 = a.rmsnorm_weight.dtype == core::DType::bf16;
  if (!absent(a.prefix_out)) {
    p.prefix_out = a.prefix_out.as<E>();
    p.prefix_out_ld = ld(a.prefix_out);
  }
  if (!absent(a.mixed_out)) {
    p.mixed_out = a.mixed_out.as<E>();
    p.mixed_ld = ld(a.mixed_out);
  }
  p.normed_out = a.normed_out.as<E>();
  p.normed_ld = ld(a.normed_out);
  p.D = a.prefix.dim(1);
  p.mix_eps = a.mix_eps;
  p.rms_eps = a.rmsnorm_eps;
  p.moonshot = a.rmsnorm_style == RmsNormStyle::moonshot;
  p.round = a.precision == Precision::bf16;
  return p;
}

// What both forms need: a usable device, every tensor on it, one activation dtype, D within the
// one-CTA form's shared memory (the cluster form accepts a subset of these widths).
inline core::Status merge_supports(const CudaOps& ops, const AttnResMergeArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  // The activations of the call (the absent ones left out) share one dtype, on the device.
  std::vector<Named> acts = {{"prefix", &a.prefix}, {"normed_out", &a.normed_out}};
  if (!absent(a.sublayer_out)) acts.push_back({"sublayer_out", &a.sublayer_out});
  if (!absent(a.prefix_out)) acts.push_back({"prefix_out", &a.prefix_out});
  if (!absent(a.mixed_out)) acts.push_back({"mixed_out", &a.mixed_out});
  std::vector<Named> all = acts;
  all.push_back({"query", &a.query});
  all.push_back({"norm", &a.norm});
  all.push_back({"rmsnorm_weight", &a.rmsnorm_weight});
  if (!absent(a.bank_acc)) all.push_back({"bank_acc", &a.bank_acc});
  if (!absent(a.bank_stats)) all.push_back({"bank_stats", &a.bank_stats});
  for (const Named& v : all)
    if (auto s = on_cuda({v}); !s) return s;
  for (const Named& v : acts)
    if (auto s = same_act({acts[0], v}, a.precision); !s) return s;
  const size_t smem = static_cast<size_t>(a.prefix.dim(1)) * sizeof(float);
  if (smem > kMaxMergeSmem)
    return core::Status::fail("hidden " + std::to_string(a.prefix.dim(1)) + " needs " + std::to_string(smem) +
                              " bytes of shared memory for the row; at most " + std::to_string(kMaxMergeSmem));
  if (a.prefix.dim(0) > 0x7fffffff) return core::Status::fail("more than 2^31 - 1 rows");
  return core::Status::ok();
}

// Adds "cuda_merge_cluster" (cuda_merge_cluster.cu) to the table; called by
// register_attn_res_fused_cuda, which owns the registration of the module.
void register_attn_res_merge_cluster_cuda(AttnResOps& r, const CudaOps& ops);

}  // namespace k3::kernels::attn_res_fused_detail
