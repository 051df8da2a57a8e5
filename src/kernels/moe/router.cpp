// kernels/moe/router.cpp: CPU reference sigmoid router with biased top-k selection (spec §7, §2).
//
// Per token: s = sigmoid(logits) in fp32; experts are ranked by s + bias (higher first, the
// lower id first on exact ties); the k best are written in that order. Their weights use s
// only (the bias steers selection, never the mixture):
//   renormalize:  w_j = s_j / (sum_{selected, in written order} s + 1e-20) * scaling
//   otherwise:    w_j = s_j * scaling
#include "kernels/moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace k3::kernels {

namespace {
std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }
bool is_matrix(const core::TensorView& v, core::DType dt, int64_t rows, int64_t cols) {
  return v.dtype == dt && v.rank() == 2 && v.strides[1] == 1 && v.dim(0) == rows && v.dim(1) == cols;
}
}  // namespace

core::Status router_topk_check(const RouterTopkArgs& a) {
  if (a.logits.dtype != core::DType::f32 || a.logits.rank() != 2 || a.logits.strides[1] != 1)
    return core::Status::fail("logits must be f32 [T, E] with contiguous rows, got " + describe(a.logits));
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1);
  if ((a.bias.dtype != core::DType::f32 && a.bias.dtype != core::DType::bf16) || a.bias.rank() != 1 ||
      a.bias.dim(0) != E || !a.bias.is_contiguous())
    return core::Status::fail("bias must be f32 [" + std::to_string(E) + "] (one per expert), got " + describe(a.bias));
  if (a.ids.dtype != core::DType::i32 || a.ids.rank() != 2 || a.ids.strides[1] != 1 || a.ids.dim(0) != T)
    return core::Status::fail("ids must be i32 [" + std::to_string(T) + ", k], got " + describe(a.ids));
  const int64_t k = a.ids.dim(1);
  if (k < 1 || k > E)
    return core::Status::fail("top-k " + std::to_string(k) + " (ids' second dim) must be in [1, " + std::to_string(E) +
                              "] (the expert count)");
  if (!is_matrix(a.weights, core::DType::f32, T, k))
    return core::Status::fail("weights must be f32 " + core::Shape{T, k}.str() + " like ids, got " +
                              describe(a.weights));
  if (!std::isfinite(a.scaling)) return core::Status::fail("scaling must be finite, got " + std::to_string(a.scaling));
  return core::Status::ok();
}

void router_topk_reference(const RouterTopkArgs& a) {
  const int64_t T = a.logits.dim(0), E = a.logits.dim(1), k = a.ids.dim(1);
  std::vector<float> bias(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) bias[e] = load_f32(a.bias, e);
  std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* logits = a.logits.as<const float>() + t * a.logits.strides[0];
    for (int64_t e = 0; e < E; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      biased[e] = score[e] + bias[e];
      // A NaN would break the ordering (and silently pick arbitrary experts).
      K3_CHECK(!std::isnan(biased[e]), "router_topk: token " + std::to_string(t) + ", expert " + std::to_string(e) +
                                           ": biased score is NaN (logit " + std::to_string(logits[e]) + ", bias " +
                                           std::to_string(bias[e]) + ")");
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t x, int32_t y) { return biased[x] != biased[y] ? biased[x] > biased[y] : x < y; });
    int32_t* ids = a.ids.as<int32_t>() + t * a.ids.strides[0];
    float* weights = a.weights.as<float>() + t * a.weights.strides[0];
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += score[order[j]];
    const float denom = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      weights[j] = a.renormalize ? score[order[j]] / denom * a.scaling : score[order[j]] * a.scaling;
    }
  }
}

}  // namespace k3::kernels
