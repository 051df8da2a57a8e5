// kernels/kda/output_gate.cpp: KDA output norm and gate (spec §5.6), before o_proj.
//
// Per token t and head h (channels h*D .. h*D+D-1), all fp32, rounded once at the end (FLA's
// fused_norm_gate):
//   rstd   = 1 / sqrt( (sum_i o[i]^2) / D + eps )       sum sequential over i
//   out[i] = round( ((o[i] * rstd) * w[i]) * sigmoid(gate[i]) )
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/kda/gate.h"
#include "kernels/kda/kda_check.h"

namespace k3::kernels {

core::Status kda_output_gate_check(const KdaOutputGateArgs& a) {
  using kda_detail::describe;
  using kda_detail::expect_activation;
  if (a.num_heads <= 0) return core::Status::fail("num_heads must be positive, got " + std::to_string(a.num_heads));
  if (a.head_dim <= 0) return core::Status::fail("head_dim must be positive, got " + std::to_string(a.head_dim));
  if (!(a.eps > 0.0f) || !std::isfinite(a.eps))
    return core::Status::fail("eps must be finite and positive, got " + std::to_string(a.eps));
  const int64_t H = a.num_heads, D = a.head_dim, P = H * D;
  if (a.o.rank() != 2) return core::Status::fail("o must be rank 2 [T, H*D], got " + describe(a.o));
  const int64_t T = a.o.dim(0);
  const std::string hd = " (T, num_heads*head_dim)";
  if (auto s = expect_activation(a.o, "o", T, P, hd); !s) return s;
  if (auto s = expect_activation(a.gate, "gate", T, P, hd); !s) return s;
  if (auto s = expect_activation(a.out, "out", T, P, hd); !s) return s;
  if (a.norm_w.data == nullptr) return core::Status::fail("norm_w is not set");
  if (a.norm_w.dtype != core::DType::f32 && a.norm_w.dtype != core::DType::bf16)
    return core::Status::fail("norm_w must be F32 or BF16, got " + describe(a.norm_w));
  if (a.norm_w.rank() != 1 || a.norm_w.dim(0) != D || !a.norm_w.is_contiguous())
    return core::Status::fail("norm_w must be contiguous [" + std::to_string(D) +
                              "] (head_dim, shared by all heads), got " + describe(a.norm_w));
  return core::Status::ok();
}

void kda_output_gate_reference(const KdaOutputGateArgs& a, backends::cpu::ThreadPool* pool) {
  if (core::Status s = kda_output_gate_check(a); !s) throw core::Error("kda_output_gate: " + s.reason());
  const int H = a.num_heads, D = a.head_dim;
  const int64_t T = a.o.dim(0);
  std::vector<float> w(D);
  for (int i = 0; i < D; ++i) w[i] = load_f32(a.norm_w, i);
  // Tokens are independent: one task per token range.
  backends::cpu::parallel_for(pool, T, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      for (int h = 0; h < H; ++h) {
        const int64_t c0 = static_cast<int64_t>(h) * D;
        const float* o = kda_detail::row_f32(a.o, t) + c0;
        const float* gate = kda_detail::row_f32(a.gate, t) + c0;
        float* out = kda_detail::row_f32_mut(a.out, t) + c0;
        float sum_sq = 0.0f;
        for (int i = 0; i < D; ++i) sum_sq += o[i] * o[i];
        const float rstd = 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + a.eps);
        // out[i] is written after o[i] and gate[i] were read: out may alias o or gate.
        for (int i = 0; i < D; ++i)
          out[i] = round_act(o[i] * rstd * w[i] * kda_detail::sigmoid_f32(gate[i]), a.precision);
      }
    }
  });
}

}  // namespace k3::kernels
