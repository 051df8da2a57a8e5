// draft/eagle3_model_test.cpp: the EAGLE-3 forward in fp32 mode against an independent
// double-precision transcription of eagle3_model.h's math (vLLM's Eagle3 Llama layer), on odd
// shapes with grouped-query heads, a reduced draft vocabulary and both residual orders; plus the
// cache's contracts: rows run one at a time equal rows run together, requests stacked in one pass
// equal each alone, truncate forgets rows.
#include "draft/eagle3_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "draft/test_util.h"

namespace k3::draft {
namespace {

using Vec = std::vector<double>;
using testing::random_act;
using testing::random_bf16;
using testing::reference_ops;

Eagle3Config odd_config(bool norm_before_residual = false) {
  Eagle3Config c;
  c.hidden_size = 36;
  c.target_hidden_size = 20;  // a draft wider than its target: it needs its own embedding
  c.vocab_size = 97;
  c.draft_vocab_size = 61;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 10;
  c.intermediate_size = 23;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500.0f;
  c.norm_before_residual = norm_before_residual;
  c.aux_layer_ids = {1, 3, 4};
  validate(c, "odd_config");
  return c;
}

struct Draft {
  Eagle3Config config;
  core::Tensor embed;
  Eagle3Weights weights;
  std::unique_ptr<Eagle3Model> model;
  explicit Draft(Eagle3Config c, uint64_t seed = 7) : config(std::move(c)) {
    embed = random_bf16(config.vocab_size, config.hidden_size, seed ^ 0x51);
    weights = random_eagle3_weights(config, seed, embed);
    // d2t: spread the draft ids over the target vocabulary (every third id, then the rest).
    if (config.has_d2t())
      for (int64_t d = 0; d < config.draft_vocab_size; ++d)
        weights.d2t.data<int64_t>()[d] = (d * 3) % config.vocab_size - d;
    Eagle3Options o;
    o.precision = kernels::Precision::fp32;
    o.poison_buffers = true;
    model = std::make_unique<Eagle3Model>(config, weights, reference_ops(), o);
  }
};

// The math of eagle3_model.h in double, one request, rows given with their absolute positions.
struct Ref {
  const Eagle3Config& c;
  const Eagle3Weights& w;
  std::vector<Vec> keys, values;  // per cached row: [NKV * hd]

  static Vec matvec(const kernels::LinearWeight& lw, const Vec& x) { return testing::ref_matvec(lw, x); }
  Vec norm(const Vec& x, const core::Tensor& wt) const { return testing::ref_rmsnorm(x, wt, double(c.rms_norm_eps)); }
  void rope(double* x, int64_t pos) const {  // rotate-half over the head
    const int d = c.head_dim, half = d / 2;
    for (int i = 0; i < half; ++i) {
      const double a = double(pos) * std::pow(double(c.rope_theta), -2.0 * i / d);
      const double x0 = x[i], x1 = x[i + half];
      x[i] = x0 * std::cos(a) - x1 * std::sin(a);
      x[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }
  // One row: returns {normed, prenorm}.
  std::pair<Vec, Vec> row(int32_t token, const Vec& hidden, int64_t pos) {
    const int64_t H = c.hidden_size, hd = c.head_dim;
    Vec e(static_cast<size_t>(H));
    for (int64_t i = 0; i < H; ++i) e[size_t(i)] = kernels::load_f32(w.embed.view().row(token), i);
    e = norm(e, w.input_norm);
    const Vec n = norm(hidden, w.hidden_norm);
    const Vec residual = c.norm_before_residual ? n : hidden;
    Vec x = e;
    x.insert(x.end(), n.begin(), n.end());
    Vec q = matvec(w.q_proj, x), k = matvec(w.k_proj, x), v = matvec(w.v_proj, x);
    for (int h = 0; h < c.num_heads; ++h) rope(q.data() + h * hd, pos);
    for (int h = 0; h < c.num_kv_heads; ++h) rope(k.data() + h * hd, pos);
    keys.push_back(k);
    values.push_back(v);
    Vec a(size_t(c.q_width()));
    const int group = c.num_heads / c.num_kv_heads;
    for (int h = 0; h < c.num_heads; ++h) {
      const int64_t off = int64_t(h / group) * hd;
      Vec s(keys.size());
      double mx = -1e300;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += q[size_t(h * hd + d)] * keys[j][size_t(off + d)];
        s[j] = dot / std::sqrt(double(hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& p : s) sum += (p = std::exp(p - mx));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t j = 0; j < keys.size(); ++j) acc += s[j] * values[j][size_t(off + d)];
        a[size_t(h * hd + d)] = acc / sum;
      }
    }
    Vec r = matvec(w.o_proj, a);
    for (int64_t i = 0; i < H; ++i) r[size_t(i)] += residual[size_t(i)];
    const Vec hn = norm(r, w.post_attn_norm);
    const Vec g = matvec(w.gate_proj, hn), u = matvec(w.up_proj, hn);
    Vec m(g.size());
    for (size_t i = 0; i < g.size(); ++i) m[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    Vec pre = matvec(w.down_proj, m);
    for (int64_t i = 0; i < H; ++i) pre[size_t(i)] += r[size_t(i)];
    return {norm(pre, w.final_norm), pre};
  }
};

void expect_row_near(const float* got, const Vec& want, const std::string& what) {
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-4 * (scale + 1)) << what << " [" << i << "]";
}

// A host row buffer's rows in use, as values.
std::vector<float> host(const RowBuffer& b) {
  const core::TensorView v = b.view();
  return std::vector<float>(v.as<const float>(), v.as<const float>() + v.numel());
}

// A deep copy of a host cache (copies of Eagle3Cache share their buffers).
Eagle3Cache clone(const Eagle3Cache& c) {
  Eagle3Cache out = c;
  if (c.k.data.defined()) {
    out.k.data = core::Tensor::copy_of(c.k.data.view());
    out.v.data = core::Tensor::copy_of(c.v.data.view());
  }
  return out;
}

core::Tensor rows_of(const core::Tensor& t, int64_t begin, int64_t n) {
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {n, t.dim(1)});
  std::copy(t.data<const float>() + begin * t.dim(1), t.data<const float>() + (begin + n) * t.dim(1),
            out.data<float>());
  return out;
}

TEST(Eagle3Model, MatchesTheDoublePrecisionTranscription) {
  for (bool nbr : {false, true}) {
    Draft d(odd_config(nbr));
    const Eagle3Config& c = d.config;
    // Context rows from fused taps (first seen at position 3, as after a prefix-cache hit), then
    // a chain row on the draft's own pre-norm output.
    const int64_t first = 3, n = 5;
    const core::Tensor taps = random_act(n, int64_t{c.num_taps()} * c.target_hidden_size, 11);
    const core::Tensor fused = d.model->fuse_taps(taps.view());
    ASSERT_EQ(fused.shape(), core::Shape({n, c.hidden_size}));
    const std::vector<int32_t> tokens = {5, 96, 0, 41, 17};
    Eagle3Cache cache;
    cache.first_position = first;
    Eagle3Cache* caches[] = {&cache};
    const int64_t rows[] = {n};
    const Eagle3Output o = d.model->forward(caches, rows, tokens, fused.view());
    EXPECT_EQ(cache.rows(), n);
    EXPECT_EQ(cache.end_position(), first + n);

    Ref ref{c, d.weights, {}, {}};
    Vec prenorm_last;
    for (int64_t r = 0; r < n; ++r) {
      Vec tap(size_t(taps.dim(1)));
      for (size_t i = 0; i < tap.size(); ++i) tap[i] = taps.data<const float>()[r * taps.dim(1) + int64_t(i)];
      const Vec h = Ref::matvec(d.weights.fc, tap);
      expect_row_near(fused.data<const float>() + r * c.hidden_size, h, "fc row " + std::to_string(r));
      const auto [normed, pre] = ref.row(tokens[size_t(r)], h, first + r);
      expect_row_near(o.normed.data<const float>() + r * c.hidden_size, normed, "normed row " + std::to_string(r));
      expect_row_near(o.prenorm.data<const float>() + r * c.hidden_size, pre, "prenorm row " + std::to_string(r));
      prenorm_last = pre;
    }
    // The chain row: the last row's pre-norm output and a drafted token at the next position.
    const core::Tensor logits = d.model->logits(rows_of(o.normed, n - 1, 1).view());
    ASSERT_EQ(logits.shape(), core::Shape({1, c.draft_vocab_size}));
    const int32_t t = d.model->greedy_tokens(logits.view()).at(0);
    int64_t best = 0;
    for (int64_t v = 1; v < c.draft_vocab_size; ++v)
      if (logits.data<const float>()[v] > logits.data<const float>()[best]) best = v;
    EXPECT_EQ(t, (best * 3) % c.vocab_size) << "d2t maps the argmax draft id";
    const int32_t chain_tokens[] = {t};
    const int64_t one[] = {1};
    const Eagle3Output o2 = d.model->forward(caches, one, chain_tokens, rows_of(o.prenorm, n - 1, 1).view());
    const auto [normed2, pre2] = ref.row(t, prenorm_last, first + n);
    expect_row_near(o2.normed.data<const float>(), normed2, "chain row");
    expect_row_near(o2.prenorm.data<const float>(), pre2, "chain row prenorm");
  }
}

TEST(Eagle3Model, RowsOneAtATimeEqualRowsTogetherAndRequestsStackIndependently) {
  Draft d(odd_config());
  const Eagle3Config& c = d.config;
  const core::Tensor h = random_act(7, c.hidden_size, 3);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  Eagle3Cache together;
  Eagle3Cache* t_caches[] = {&together};
  const int64_t seven[] = {7};
  const Eagle3Output all = d.model->forward(t_caches, seven, tokens, h.view());
  Eagle3Cache one_by_one;
  Eagle3Cache* o_caches[] = {&one_by_one};
  const int64_t one[] = {1};
  for (int64_t r = 0; r < 7; ++r) {
    const Eagle3Output o = d.model->forward(o_caches, one, std::span(tokens).subspan(size_t(r), 1),
                                            rows_of(h, r, 1).view());
    for (int64_t i = 0; i < c.hidden_size; ++i)
      ASSERT_EQ(o.normed.data<const float>()[i], all.normed.data<const float>()[r * c.hidden_size + i]) << r;
  }
  EXPECT_EQ(host(one_by_one.k), host(together.k));
  EXPECT_EQ(host(one_by_one.v), host(together.v));

  // Two requests in one pass (3 rows on top of `together`'s 7, 2 rows fresh at position 40).
  Eagle3Cache a = clone(together), b;
  b.first_position = 40;
  Eagle3Cache a_alone = clone(together), b_alone = b;
  Eagle3Cache* both[] = {&a, &b};
  const int64_t counts[] = {3, 2};
  const core::Tensor h2 = random_act(5, c.hidden_size, 4);
  const std::vector<int32_t> t2 = {9, 8, 7, 6, 5};
  const Eagle3Output stacked = d.model->forward(both, counts, t2, h2.view());
  Eagle3Cache* a_only[] = {&a_alone};
  Eagle3Cache* b_only[] = {&b_alone};
  const int64_t three[] = {3}, two[] = {2};
  const Eagle3Output oa = d.model->forward(a_only, three, std::span(t2).subspan(0, 3), rows_of(h2, 0, 3).view());
  const Eagle3Output ob = d.model->forward(b_only, two, std::span(t2).subspan(3, 2), rows_of(h2, 3, 2).view());
  for (int64_t i = 0; i < 3 * c.hidden_size; ++i)
    ASSERT_EQ(stacked.normed.data<const float>()[i], oa.normed.data<const float>()[i]);
  for (int64_t i = 0; i < 2 * c.hidden_size; ++i)
    ASSERT_EQ(stacked.normed.data<const float>()[3 * c.hidden_size + i], ob.normed.data<const float>()[i]);

  // truncate forgets rows: re-running the last 3 of `a` after truncating gives the same outputs.
  d.model->truncate(a, 7);
  EXPECT_EQ(a.rows(), 7);
  const Eagle3Output again = d.model->forward(both, counts, t2, h2.view());
  EXPECT_EQ(again.normed.data<const float>()[0], stacked.normed.data<const float>()[0]);
  EXPECT_THROW(d.model->truncate(b, 39), core::Error);  // before its first position
}

TEST(Eagle3Model, BadInputsAreErrors) {
  Draft d(odd_config());
  Eagle3Cache cache;
  Eagle3Cache* caches[] = {&cache};
  const int64_t one[] = {1};
  const int32_t bad_token[] = {97};
  EXPECT_THROW(d.model->forward(caches, one, bad_token, random_act(1, d.config.hidden_size, 1).view()), core::Error);
  const int32_t ok_token[] = {3};
  EXPECT_THROW(d.model->forward(caches, one, ok_token, random_act(1, d.config.hidden_size + 1, 1).view()), core::Error);
  EXPECT_THROW(d.model->fuse_taps(random_act(2, 7, 1).view()), core::Error);
  EXPECT_EQ(cache.rows(), 0) << "a rejected forward appends nothing";
  EXPECT_EQ(cache.k.view().numel(), 0) << "an empty buffer's view is empty";
}

// Llama-3 RoPE scaling follows HF's rule: high frequencies kept, low ones divided by the factor,
// the band between interpolated.
TEST(Eagle3Model, Llama3RopeScalingFollowsTheHfRule) {
  const RotateHalfRope plain(128, 500000.0f), scaled(128, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
  const double pi = 3.14159265358979323846;
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < plain.inv_freq().size(); ++i) {
    const double f = plain.inv_freq()[i], wavelen = 2 * pi / f, got = scaled.inv_freq()[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_FLOAT_EQ(got, f);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(got, f / 8);
      ++divided;
    } else {
      const double s = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(got, (1 - s) * f / 8 + s * f, 1e-6 * f);
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

}  // namespace
}  // namespace k3::draft
