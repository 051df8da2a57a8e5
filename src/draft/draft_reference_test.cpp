// draft/draft_reference_test.cpp: the whole draft forward (context ingestion, block pass, Markov
// logits) in fp32 mode against an independent double-precision transcription of draft_model.h's
// math, on odd shapes: catches wiring mistakes (head row layouts of q_b / kv_b, RoPE positions,
// which norm feeds what) that per-op tests cannot.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "draft/test_util.h"

namespace k3::draft {
namespace {

using Vec = std::vector<double>;

struct Ref {
  const DraftConfig& c;
  const DraftWeights& w;

  static Vec matvec(const kernels::LinearWeight& lw, const Vec& x) { return testing::ref_matvec(lw, x); }
  Vec norm(const Vec& x, const core::Tensor& wt) const { return testing::ref_rmsnorm(x, wt, double(c.rms_norm_eps)); }
  void rope(double* x, int64_t pos) const {
    const int d = c.qk_rope_head_dim;
    for (int i = 0; i < d / 2; ++i) {
      const double a = double(pos) * std::pow(double(c.rope_theta), -2.0 * i / d);
      const double x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
      x[2 * i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  }
  // [c_n | RoPE'd k_pe] of one normed input at `pos`.
  Vec latent(const DraftLayerWeights& lw, const Vec& x, int64_t pos) const {
    Vec kv = matvec(lw.kv_a_proj, x);
    Vec cn = norm(Vec(kv.begin(), kv.begin() + c.kv_lora_rank), lw.kv_a_norm);
    Vec out = cn;
    out.insert(out.end(), kv.begin() + c.kv_lora_rank, kv.end());
    rope(out.data() + c.kv_lora_rank, pos);
    return out;
  }
  Vec embed(int32_t id) const {
    Vec e(size_t(c.hidden_size));
    for (int i = 0; i < c.hidden_size; ++i) e[size_t(i)] = kernels::load_f32(w.embed.view().row(id), i);
    return e;
  }
  // Base logits U [K][Vd] for x0 over context taps [P][n*H].
  std::vector<Vec> block_logits(const std::vector<Vec>& taps, int32_t x0) const {
    const int64_t P = int64_t(taps.size()), K = c.block_size;
    const int nh = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    std::vector<Vec> ctx;
    for (const Vec& t : taps) ctx.push_back(norm(matvec(w.context_proj, t), w.context_norm));
    std::vector<Vec> h;
    for (int64_t j = 0; j < K; ++j) h.push_back(embed(j == 0 ? x0 : c.mask_token_id));
    for (const DraftLayerWeights& lw : w.layers) {
      std::vector<Vec> x, lat;
      for (int64_t p = 0; p < P; ++p) lat.push_back(latent(lw, ctx[size_t(p)], p));
      for (int64_t j = 0; j < K; ++j) {
        x.push_back(norm(h[size_t(j)], lw.input_norm));
        lat.push_back(latent(lw, x.back(), P + j));
      }
      std::vector<Vec> kv;  // expanded keys/values per latent row
      for (const Vec& l : lat) kv.push_back(matvec(lw.kv_b_proj, Vec(l.begin(), l.begin() + c.kv_lora_rank)));
      for (int64_t j = 0; j < K; ++j) {
        Vec q = matvec(lw.q_b_proj, norm(matvec(lw.q_a_proj, x[size_t(j)]), lw.q_a_norm));
        Vec o(size_t(nh * dv), 0.0);
        for (int hd = 0; hd < nh; ++hd) {
          double* qh = q.data() + hd * (dn + dr);
          rope(qh + dn, P + j);
          Vec s;
          double mx = -1e300;
          for (size_t r = 0; r < lat.size(); ++r) {
            double acc = 0;
            for (int d = 0; d < dn; ++d) acc += qh[d] * kv[r][size_t(hd * (dn + dv) + d)];
            for (int e = 0; e < dr; ++e) acc += qh[dn + e] * lat[r][size_t(c.kv_lora_rank + e)];
            s.push_back(acc / std::sqrt(double(dn + dr)));
            mx = std::max(mx, s.back());
          }
          double sum = 0;
          for (double& v : s) sum += (v = std::exp(v - mx));
          for (size_t r = 0; r < lat.size(); ++r)
            for (int e = 0; e < dv; ++e) o[size_t(hd * dv + e)] += s[r] / sum * kv[r][size_t(hd * (dn + dv) + dn + e)];
        }
        const Vec a = matvec(lw.o_proj, o);
        for (size_t i = 0; i < a.size(); ++i) h[size_t(j)][i] += a[i];
      }
      for (int64_t j = 0; j < K; ++j) {
        const Vec x2 = norm(h[size_t(j)], lw.post_attn_norm);
        const Vec g = matvec(lw.gate_proj, x2), u = matvec(lw.up_proj, x2);
        Vec act(g.size());
        for (size_t i = 0; i < g.size(); ++i)
          act[i] = c.situ_beta * std::tanh(g[i] / c.situ_beta) / (1 + std::exp(-g[i])) * c.situ_linear_beta *
                   std::tanh(u[i] / c.situ_linear_beta);
        const Vec f = matvec(lw.down_proj, act);
        for (size_t i = 0; i < f.size(); ++i) h[size_t(j)][i] += f[i];
      }
    }
    std::vector<Vec> logits;
    for (int64_t j = 0; j < K; ++j) logits.push_back(matvec(w.lm_head, norm(h[size_t(j)], w.final_norm)));
    return logits;
  }
};

class DraftReference : public ::testing::TestWithParam<bool> {};

// Both attention forms (naive, absorbed) against the same transcription.
TEST_P(DraftReference, Fp32ForwardMatchesDoubleTranscription) {
  DraftOptions opt;
  opt.precision = kernels::Precision::fp32;
  opt.absorbed_attention = GetParam();
  testing::RandomDraft d(testing::odd_config(), 91, opt);
  const DraftConfig& c = d.config;
  const int64_t P = 7, width = int64_t{c.num_taps()} * c.hidden_size;
  const core::Tensor taps = testing::random_act(P, width, 92, 2.0);
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, taps.view());
  const int32_t x0 = 33;
  const BlockOutput got = d.model->forward_block(cache, x0);

  std::vector<Vec> ref_taps;
  for (int64_t p = 0; p < P; ++p)
    ref_taps.emplace_back(taps.data<const float>() + p * width, taps.data<const float>() + (p + 1) * width);
  const Ref ref{c, d.weights};
  const std::vector<Vec> want = ref.block_logits(ref_taps, x0);
  double scale = 0, err = 0;
  for (int64_t k = 0; k < c.block_size; ++k)
    for (int64_t v = 0; v < c.draft_vocab_size; ++v) {
      const double w = want[size_t(k)][size_t(v)];
      scale = std::max(scale, std::fabs(w));
      err = std::max(err, std::fabs(w - got.base_logits.data<const float>()[k * c.draft_vocab_size + v]));
    }
  EXPECT_GT(scale, 0.5);
  EXPECT_LT(err, 2e-5 * scale) << "max |err| " << err << " at logit scale " << scale;

  // The drafted logits add the Markov term W2 . W1[x_{k-1}] to those.
  const DraftResult r = d.model->draft(cache, x0, c.block_size, true);
  int32_t prev = x0;
  for (size_t k = 0; k < r.tokens.size(); ++k) {
    Vec e1(size_t(c.markov_rank));
    for (int i = 0; i < c.markov_rank; ++i) e1[size_t(i)] = kernels::load_f32(d.weights.markov_w1.view().row(prev), i);
    const Vec m = Ref::matvec(d.weights.markov_w2, e1);
    for (int64_t v = 0; v < c.draft_vocab_size; ++v)
      ASSERT_NEAR(r.logits.data<const float>()[int64_t(k) * c.draft_vocab_size + v], want[k][size_t(v)] + m[size_t(v)],
                  4e-5 * (scale + 1));
    prev = r.tokens[k];
  }
}

INSTANTIATE_TEST_SUITE_P(AttentionForms, DraftReference, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "absorbed" : "naive"; });

}  // namespace
}  // namespace k3::draft
