// kernels/kda/gate.cpp: KDA attention argument check and the per-token front (spec §5.3-5.4)
// shared by the recurrent and chunked forms.
#include "kernels/kda/gate.h"

#include <cmath>
#include <string>
#include <utility>

#include "kernels/kda/kda_check.h"

namespace k3::kernels {

core::Status kda_attention_check(const KdaAttentionArgs& a) {
  using kda_detail::expect_activation;
  using kda_detail::expect_f32;
  if (a.num_heads <= 0) return core::Status::fail("num_heads must be positive, got " + std::to_string(a.num_heads));
  if (a.head_dim <= 0) return core::Status::fail("head_dim must be positive, got " + std::to_string(a.head_dim));
  if (a.chunk_size <= 0) return core::Status::fail("chunk_size must be positive, got " + std::to_string(a.chunk_size));
  if (!(a.lower_bound < 0.0f) || !std::isfinite(a.lower_bound))
    return core::Status::fail("lower_bound must be finite and negative (the decay bound), got " +
                              std::to_string(a.lower_bound));
  const int64_t H = a.num_heads, D = a.head_dim, P = H * D;
  if (a.q.rank() != 2) return core::Status::fail("q must be rank 2 [T, H*D], got " + a.q.shape.str());
  const int64_t T = a.q.dim(0);
  const std::string hd = " (T, num_heads*head_dim)";
  const std::pair<const core::TensorView*, const char*> per_channel[] = {
      {&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.f, "f"}, {&a.out, "out"}};
  for (const auto& [view, name] : per_channel)
    if (auto s = expect_activation(*view, name, T, P, hd); !s) return s;
  if (auto s = expect_activation(a.b, "b", T, H, " (T, num_heads)"); !s) return s;
  if (auto s = expect_f32(a.a_log, "a_log"); !s) return s;
  if (a.a_log.rank() != 1 || a.a_log.dim(0) < H || !a.a_log.is_contiguous())
    return core::Status::fail("a_log must be a contiguous rank-1 vector of at least num_heads = " + std::to_string(H) +
                              " entries, got " + a.a_log.shape.str());
  if (auto s = expect_f32(a.dt_bias, "dt_bias"); !s) return s;
  if (a.dt_bias.rank() != 1 || a.dt_bias.dim(0) != P || !a.dt_bias.is_contiguous())
    return core::Status::fail("dt_bias must be contiguous [" + std::to_string(P) + "] (num_heads*head_dim), got " +
                              a.dt_bias.shape.str());
  if (auto s = expect_f32(a.state, "state"); !s) return s;
  if (auto s = kda_detail::expect_pool(a.state, "state", {H, D, D}, " (num_heads, V=head_dim, K=head_dim)"); !s)
    return s;
  if (a.state.device != a.q.device)
    return core::Status::fail("state must be on the device of q, got " + kda_detail::describe(a.state));
  return kda_detail::check_seq_batch(a.seqs, T, a.state.dim(0), a.q.device, /*need_position=*/true);
}

namespace kda_detail {

void kda_l2_normalize(const float* x, int n, float scale, float* out) {
  float sum_sq = 0.0f;
  for (int i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float norm = std::sqrt(sum_sq + kL2NormEps);
  for (int i = 0; i < n; ++i) out[i] = x[i] / norm * scale;
}

void kda_prepare_token(const KdaAttentionArgs& a, int64_t t, int h, float* q, float* k, float* v, float* g,
                       float* beta) {
  const int D = a.head_dim;
  const int64_t c0 = static_cast<int64_t>(h) * D;  // head-major channels: h*D + i
  // The q scale D^-1/2 is applied after the L2 norm (spec §5.3).
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));
  kda_l2_normalize(row_f32(a.q, t) + c0, D, q_scale, q);
  kda_l2_normalize(row_f32(a.k, t) + c0, D, 1.0f, k);
  const float* vt = row_f32(a.v, t) + c0;
  for (int i = 0; i < D; ++i) v[i] = vt[i];
  const float* ft = row_f32(a.f, t) + c0;
  const float* dt_bias = a.dt_bias.as<const float>() + c0;
  const float a_log = a.a_log.as<const float>()[h];  // per head: only the first H entries are read
  for (int i = 0; i < D; ++i) g[i] = kda_gate(ft[i], dt_bias[i], a_log, a.lower_bound);
  *beta = sigmoid_f32(row_f32(a.b, t)[h]);
}

}  // namespace kda_detail
}  // namespace k3::kernels
