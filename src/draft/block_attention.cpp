// draft/block_attention.cpp: the draft's MLA attention over context + block rows, with no
// causal mask (every block row sees every row), in the expanded form (the absorbed one is the
// mla_block_attention op, kernels/dspark): see draft_model.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "draft/draft_model.h"

namespace k3::draft {

void block_attention(const DraftConfig& c, const core::TensorView& q, const core::TensorView& latents,
                     const core::TensorView& kv, const core::TensorView& out, kernels::Precision precision) {
  const int64_t T = q.dim(0), S = latents.dim(0);
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim, NH = c.num_heads;
  K3_CHECK(q.is_contiguous() && q.dim(1) == NH * (nope + rope), "block_attention: q must be [T, heads * q_head_dim]");
  K3_CHECK(latents.is_contiguous() && latents.dim(1) == c.cache_dim(),
           "block_attention: latents must be [S, cache_dim]");
  K3_CHECK(kv.is_contiguous() && kv.dim(0) == S && kv.dim(1) == NH * (nope + vd),
           "block_attention: kv must be [S, heads * (nope + v)]");
  K3_CHECK(out.is_contiguous() && out.dim(0) == T && out.dim(1) == NH * vd,
           "block_attention: out must be [T, heads * v]");
  const float scale = c.softmax_scale();
  const float* qd = q.as<const float>();
  const float* lat = latents.as<const float>();
  const float* kvd = kv.as<const float>();
  float* od = out.as<float>();
  std::vector<float> p(static_cast<size_t>(S)), o(static_cast<size_t>(vd));
  for (int64_t h = 0; h < NH; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      const float* q_nope = qd + t * q.dim(1) + h * (nope + rope);
      const float* q_pe = q_nope + nope;
      float mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        const float* k = kvd + j * kv.dim(1) + h * (nope + vd);
        const float* pe = lat + j * c.cache_dim() + c.kv_lora_rank;
        float acc = 0.0f;
        for (int64_t d = 0; d < nope; ++d) acc += q_nope[d] * k[d];
        for (int64_t r = 0; r < rope; ++r) acc += q_pe[r] * pe[r];
        p[static_cast<size_t>(j)] = scale * acc;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < S; ++j) {
        p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
        sum += p[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < S; ++j) p[static_cast<size_t>(j)] /= sum;
      for (int64_t e = 0; e < vd; ++e) o[static_cast<size_t>(e)] = 0.0f;
      for (int64_t j = 0; j < S; ++j) {
        const float* v = kvd + j * kv.dim(1) + h * (nope + vd) + nope;
        for (int64_t e = 0; e < vd; ++e) o[static_cast<size_t>(e)] += p[static_cast<size_t>(j)] * v[e];
      }
      for (int64_t e = 0; e < vd; ++e)
        od[t * out.dim(1) + h * vd + e] = kernels::round_act(o[static_cast<size_t>(e)], precision);
    }
  }
}

}  // namespace k3::draft
