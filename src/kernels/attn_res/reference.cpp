// kernels/attn_res/reference.cpp: CPU reference of the AttnRes depth-attention Mix (spec §3.1).
//
// Per token t, over n sources R_0..R_{n-1} (bank rows, then the current prefix):
//   c      = norm * query                      fp32, folded once per call (spec §3.1: fp32 c)
//   rho_j  = 1 / sqrt(mean_h R_j[h]^2 + eps)   fp32, sum sequential over h
//   s_j    = rho_j * sum_h R_j[h] * c[h]       fp32, sum sequential over h
//   alpha  = softmax(s)                        max-subtracted, expf, sum in source order
//   out[h] = round(sum_j alpha_j * R_j[h])     un-normalised sources, in source order
// The norm weight only enters the score (normalising the output instead is the classic bug).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/attn_res/mix.h"

namespace k3::kernels {

namespace {

std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }

bool is_f32_matrix(const core::TensorView& v, int64_t rows, int64_t cols) {  // or bf16 on CUDA
  return is_activation_dtype(v) && v.rank() == 2 && v.strides[1] == 1 && v.dim(0) == rows && v.dim(1) == cols;
}

// A weight vector of D entries, stored [D] or [1, D] (res_proj.weight is [1, D]).
bool is_weight_vector(const core::TensorView& v, int64_t D) {
  const bool dtype_ok = v.dtype == core::DType::bf16 || v.dtype == core::DType::f32;
  const bool shape_ok = (v.rank() == 1 && v.dim(0) == D) || (v.rank() == 2 && v.dim(0) == 1 && v.dim(1) == D);
  return dtype_ok && shape_ok && v.is_contiguous();
}

}  // namespace

core::Status attn_res_mix_check(const AttnResMixArgs& a) {
  if (a.sources.empty()) return core::Status::fail("sources is empty (need at least the prefix)");
  const core::TensorView& first = a.sources[0];
  if (!is_activation_dtype(first) || first.rank() != 2 || first.strides[1] != 1)
    return core::Status::fail("sources[0] must be f32 (or bf16 on CUDA) [T, D] with contiguous rows, got " +
                              describe(first));
  const int64_t T = first.dim(0), D = first.dim(1);
  const std::string td = core::Shape{T, D}.str();
  for (size_t j = 1; j < a.sources.size(); ++j)
    if (!is_f32_matrix(a.sources[j], T, D))
      return core::Status::fail(std::string("sources[") + std::to_string(j) + "] must be f32 " + td +
                                " like sources[0], got " + describe(a.sources[j]));
  if (!is_weight_vector(a.query, D))
    return core::Status::fail("query must be bf16/f32 [" + std::to_string(D) + "] or [1, " + std::to_string(D) +
                              "], got " + describe(a.query));
  if (!is_weight_vector(a.norm, D))
    return core::Status::fail("norm must be bf16/f32 [" + std::to_string(D) + "], got " + describe(a.norm));
  if (!is_f32_matrix(a.out, T, D)) return core::Status::fail("out must be f32 " + td + ", got " + describe(a.out));
  if (!(a.eps >= 0.0f)) return core::Status::fail("eps must be >= 0, got " + std::to_string(a.eps));
  return core::Status::ok();
}

void attn_res_mix_reference(const AttnResMixArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.sources[0].dim(0), D = a.sources[0].dim(1);
  const size_t n = a.sources.size();
  std::vector<float> c(static_cast<size_t>(D));
  for (int64_t h = 0; h < D; ++h) c[h] = load_f32(a.norm, h) * load_f32(a.query, h);

  const auto mix_tokens = [&](int64_t t0, int64_t t1) {
    std::vector<const float*> rows(n);
    std::vector<float> alpha(n);
    for (int64_t t = t0; t < t1; ++t) {
      for (size_t j = 0; j < n; ++j) rows[j] = a.sources[j].as<const float>() + t * a.sources[j].strides[0];
      // Scores of the RMS-normalised sources (no weight in the norm; the weight is in c).
      for (size_t j = 0; j < n; ++j) {
        const float* r = rows[j];
        float sum_sq = 0.0f, dot = 0.0f;
        for (int64_t h = 0; h < D; ++h) {
          sum_sq += r[h] * r[h];
          dot += r[h] * c[h];
        }
        const float rho = 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + a.eps);
        alpha[j] = rho * dot;
      }
      const float max_score = *std::max_element(alpha.begin(), alpha.end());
      float denom = 0.0f;
      for (size_t j = 0; j < n; ++j) {
        alpha[j] = std::exp(alpha[j] - max_score);
        denom += alpha[j];
      }
      for (size_t j = 0; j < n; ++j) alpha[j] = alpha[j] / denom;
      // out may alias a source: element h of every source is read before out[h] is written.
      float* out = a.out.as<float>() + t * a.out.strides[0];
      for (int64_t h = 0; h < D; ++h) {
        float acc = alpha[0] * rows[0][h];  // one source: alpha_0 = 1 exactly, out = R_0 exactly
        for (size_t j = 1; j < n; ++j) acc += alpha[j] * rows[j][h];
        out[h] = round_act(acc, a.precision);
      }
    }
  };
  const int64_t work_per_token = std::max<int64_t>(1, static_cast<int64_t>(n) * D);
  backends::cpu::parallel_for(pool, T, mix_tokens, std::max<int64_t>(1, (int64_t{1} << 15) / work_per_token));
}

}  // namespace k3::kernels
