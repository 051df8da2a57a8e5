// draft/draft_model_test.cpp: RoPE by hand, the block attention against a double-precision
// reference, forward shapes / determinism / NaN poisoning, context ingestion, the non-causal block,
// the Markov head's sequential dependency, the confidence head and d2t.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "draft/rope.h"
#include "draft/test_util.h"

namespace k3::draft {
namespace {

using kernels::Precision;
using testing::RandomDraft;

TEST(Rope, HandComputedSmallCase) {
  // dim 2, position 1: angle 1 rad.
  float a[2] = {1.0f, 0.0f}, b[2] = {0.0f, 1.0f};
  apply_rope(a, 2, 1, 10000.0f, Precision::fp32);
  apply_rope(b, 2, 1, 10000.0f, Precision::fp32);
  EXPECT_NEAR(a[0], 0.5403023f, 1e-6);
  EXPECT_NEAR(a[1], 0.8414710f, 1e-6);
  EXPECT_NEAR(b[0], -0.8414710f, 1e-6);
  EXPECT_NEAR(b[1], 0.5403023f, 1e-6);
  // dim 4, theta 100, position 3: pair 0 turns by 3 rad, pair 1 by 3 / 100^(2/4) = 0.3 rad.
  float x[4] = {2.0f, 3.0f, 1.0f, -1.0f};
  apply_rope(x, 4, 3, 100.0f, Precision::fp32);
  EXPECT_NEAR(x[0], -2.4033450f, 2e-6);  // 2 cos 3 - 3 sin 3
  EXPECT_NEAR(x[1], -2.6877376f, 2e-6);  // 2 sin 3 + 3 cos 3
  EXPECT_NEAR(x[2], 1.2508567f, 2e-6);   // cos .3 + sin .3
  EXPECT_NEAR(x[3], -0.6598163f, 2e-6);  // sin .3 - cos .3
  // position 0 is the identity; bf16 mode stores rounded values.
  float y[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  apply_rope(y, 4, 0, 100.0f, Precision::fp32);
  EXPECT_EQ(y[0], 0.1f);
  EXPECT_EQ(y[3], 0.4f);
  float z[2] = {1.0f, 0.0f};
  apply_rope(z, 2, 1, 10000.0f, Precision::bf16);
  EXPECT_EQ(z[0], core::bf16_round(0.5403023f));
  EXPECT_THROW(apply_rope(z, 3, 0, 100.0f, Precision::fp32), core::Error);
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int d = 16;
  core::Rng rng(5);
  std::vector<float> q(d), k(d);
  for (int i = 0; i < d; ++i) q[i] = float(rng.normal()), k[i] = float(rng.normal());
  auto dot_at = [&](int64_t m, int64_t n) {
    std::vector<float> a = q, b = k;
    apply_rope(a.data(), d, m, 10000.0f, Precision::fp32);
    apply_rope(b.data(), d, n, 10000.0f, Precision::fp32);
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(a[i]) * b[i];
    return s;
  };
  EXPECT_NEAR(dot_at(7, 3), dot_at(104, 100), 1e-4);
  EXPECT_NEAR(dot_at(0, 0), dot_at(53, 53), 1e-4);
  EXPECT_GT(std::fabs(dot_at(7, 3) - dot_at(7, 4)), 1e-3);
}

// block_attention in double: every query row over every latent row, no mask.
std::vector<double> attention_double(const DraftConfig& c, const core::Tensor& q, const core::Tensor& lat,
                                     const core::Tensor& kv) {
  const int64_t T = q.dim(0), S = lat.dim(0), dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  std::vector<double> out(size_t(T * c.num_heads * dv));
  for (int h = 0; h < c.num_heads; ++h)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> s(static_cast<size_t>(S));
      double mx = -1e300;
      for (int64_t j = 0; j < S; ++j) {
        double acc = 0;
        const float* qr = q.data<const float>() + t * q.dim(1) + h * (dn + dr);
        const float* kr = kv.data<const float>() + j * kv.dim(1) + h * (dn + dv);
        const float* pe = lat.data<const float>() + j * c.cache_dim() + c.kv_lora_rank;
        for (int64_t d = 0; d < dn; ++d) acc += double(qr[d]) * kr[d];
        for (int64_t r = 0; r < dr; ++r) acc += double(qr[dn + r]) * pe[r];
        s[size_t(j)] = acc / std::sqrt(double(dn + dr));
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (int64_t e = 0; e < dv; ++e) {
        double o = 0;
        for (int64_t j = 0; j < S; ++j)
          o += s[size_t(j)] / sum * kv.data<const float>()[j * kv.dim(1) + h * (dn + dv) + dn + e];
        out[size_t(t * c.num_heads * dv + h * dv + e)] = o;
      }
    }
  return out;
}

TEST(BlockAttention, MatchesDoubleReferenceAndIsNonCausal) {
  const DraftConfig c = testing::odd_config();
  const int64_t T = 4, S = 11;
  const core::Tensor q = testing::random_act(T, c.num_heads * c.q_head_dim(), 1, 2.0);
  core::Tensor lat = testing::random_act(S, c.cache_dim(), 2, 2.0);
  core::Tensor kv = testing::random_act(S, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), 3, 2.0);
  core::Tensor out = testing::random_act(T, c.num_heads * c.v_head_dim, 4);
  for (float& v : out.span<float>()) v = NAN;
  block_attention(c, q.view(), lat.view(), kv.view(), out.view(), Precision::fp32);
  const std::vector<double> want = attention_double(c, q, lat, kv);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out.data<float>()[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
  // Non-causal: query row 0 sees the LAST row (a later block position) too.
  core::Tensor out2 = testing::random_act(T, c.num_heads * c.v_head_dim, 4);
  kv.data<float>()[(S - 1) * kv.dim(1) + c.qk_nope_head_dim] += 3.0f;  // head 0's value of the last row
  block_attention(c, q.view(), lat.view(), kv.view(), out2.view(), Precision::fp32);
  EXPECT_NE(out.data<float>()[0], out2.data<float>()[0]);
  // bf16 mode rounds every output.
  block_attention(c, q.view(), lat.view(), kv.view(), out2.view(), Precision::bf16);
  for (float v : out2.span<float>()) EXPECT_EQ(v, core::bf16_round(v));
}

class DraftForward : public ::testing::TestWithParam<Precision> {};

TEST_P(DraftForward, ShapesFiniteAndDeterministic) {
  DraftOptions opt;
  opt.precision = GetParam();
  opt.poison_buffers = true;  // any unwritten output stays NaN
  RandomDraft d(testing::odd_config(), 11, opt);
  const DraftConfig& c = d.config;
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, testing::random_act(9, c.num_taps() * c.hidden_size, 12, 3.0).view());
  EXPECT_EQ(cache.num_context, 9);
  for (const RowBuffer& l : cache.layers) {
    EXPECT_EQ(l.rows, 9);
    EXPECT_EQ(l.data.dim(1), c.cache_dim());
  }
  const BlockOutput a = d.model->forward_block(cache, 42);
  EXPECT_EQ(a.hidden.shape(), (core::Shape{c.block_size, c.hidden_size}));
  EXPECT_EQ(a.base_logits.shape(), (core::Shape{c.block_size, c.draft_vocab_size}));
  EXPECT_TRUE(testing::all_finite(a.hidden));
  EXPECT_TRUE(testing::all_finite(a.base_logits));
  const BlockOutput b = d.model->forward_block(cache, 42);
  EXPECT_EQ(0, std::memcmp(a.base_logits.data<void>(), b.base_logits.data<void>(), size_t(a.base_logits.nbytes())));
  // Logits are spread, not degenerate: the rows' maxima differ from their means by O(1).
  for (int64_t k = 0; k < c.block_size; ++k) {
    const float* u = a.base_logits.data<const float>() + k * c.draft_vocab_size;
    double mean = 0, mx = -1e30;
    for (int64_t v = 0; v < c.draft_vocab_size; ++v) mean += u[v], mx = std::max(mx, double(u[v]));
    EXPECT_GT(mx - mean / c.draft_vocab_size, 0.1);
  }
  // A different x_0 changes every row (row 0 is embed(x_0); the others see it through attention).
  const BlockOutput e = d.model->forward_block(cache, 43);
  for (int64_t k = 0; k < c.block_size; ++k)
    EXPECT_NE(0, std::memcmp(a.hidden.data<float>() + k * c.hidden_size, e.hidden.data<float>() + k * c.hidden_size,
                             sizeof(float) * size_t(c.hidden_size)));
  if (GetParam() == Precision::bf16) {
    for (float v : a.hidden.span<const float>()) EXPECT_EQ(v, core::bf16_round(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, DraftForward, ::testing::Values(Precision::bf16, Precision::fp32));

TEST(DraftContext, AppendingInPiecesEqualsAtOnceAndTruncates) {
  RandomDraft d(testing::odd_config(), 21);
  const DraftConfig& c = d.config;
  const core::Tensor taps = testing::random_act(12, c.num_taps() * c.hidden_size, 22, 2.0);
  DraftCache whole = d.model->new_cache(), parts = d.model->new_cache();
  d.model->append_context(whole, taps.view());
  for (int64_t b : {0, 1, 5, 12}) {  // pieces [0,1) [1,5) [5,12)
    if (b == 0) continue;
    const int64_t a = parts.num_context;
    core::TensorView v = taps.view();
    v.data = taps.data<float>() + a * taps.dim(1);
    v.shape = {b - a, taps.dim(1)};
    d.model->append_context(parts, v);
  }
  ASSERT_EQ(parts.num_context, 12);
  for (int l = 0; l < c.num_layers; ++l) {  // rows sit contiguously in a RowBuffer
    const RowBuffer &w = whole.layers[size_t(l)], &p = parts.layers[size_t(l)];
    ASSERT_EQ(w.rows, p.rows);
    EXPECT_EQ(0,
              std::memcmp(w.data.data<float>(), p.data.data<float>(), size_t(w.rows * c.cache_dim()) * sizeof(float)))
        << "layer " << l;
  }
  // Context rows change the block's output; truncating back to fewer rows gives that shorter context.
  DraftCache short_cache = d.model->new_cache();
  core::TensorView first5 = taps.view();
  first5.shape = {5, taps.dim(1)};
  d.model->append_context(short_cache, first5);
  d.model->truncate(whole, 5);
  EXPECT_EQ(whole.num_context, 5);
  const BlockOutput x = d.model->forward_block(whole, 7), y = d.model->forward_block(short_cache, 7);
  EXPECT_EQ(0, std::memcmp(x.base_logits.data<void>(), y.base_logits.data<void>(), size_t(x.base_logits.nbytes())));
  EXPECT_THROW(d.model->truncate(whole, 6), core::Error);
  // Wrong widths and dtypes are named.
  EXPECT_THROW(d.model->append_context(whole, testing::random_act(2, c.hidden_size, 1).view()), core::Error);
  EXPECT_THROW(d.model->forward_block(whole, c.vocab_size), core::Error);
}

TEST(DraftBlock, AllPositionsInOnePassAndNonCausal) {
  RandomDraft d(testing::odd_config(), 31);
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, testing::random_act(6, d.config.num_taps() * d.config.hidden_size, 32, 2.0).view());
  // The same weights with a block of 1: row 0 then sees only the context and itself. With K = 5
  // it also sees the 4 later (mask) rows, so its output differs: the block is not causal.
  DraftConfig one = d.config;
  one.block_size = 1;
  const DraftModel single(one, d.weights, testing::reference_ops());
  const BlockOutput full = d.model->forward_block(cache, 9), alone = single.forward_block(cache, 9);
  EXPECT_NE(0, std::memcmp(full.hidden.data<void>(), alone.hidden.data<void>(),
                           sizeof(float) * size_t(d.config.hidden_size)));
  // draft(): K tokens from that one pass; each logits row is U_k + W2 W1[x_{k-1}] with U_k from the
  // single block pass (the drafted tokens do not re-enter the trunk), and x_k its argmax.
  const DraftResult r = d.model->draft(cache, 9, 100, /*with_logits=*/true);
  ASSERT_EQ(r.tokens.size(), size_t(d.config.block_size));
  ASSERT_EQ(r.confidence.size(), r.tokens.size());
  const int64_t Vd = d.config.draft_vocab_size;
  int32_t prev = 9;
  for (size_t k = 0; k < r.tokens.size(); ++k) {
    const std::vector<float> m = d.model->markov_bias(prev);
    int64_t best = 0;
    for (int64_t v = 0; v < Vd; ++v) {
      const float want = full.base_logits.data<const float>()[int64_t(k) * Vd + v] + m[size_t(v)];
      ASSERT_EQ(r.logits.data<const float>()[int64_t(k) * Vd + v], want);
      if (want > r.logits.data<const float>()[int64_t(k) * Vd + best]) best = v;
    }
    EXPECT_EQ(r.tokens[k], best);
    EXPECT_GE(r.tokens[k], 0);
    EXPECT_LT(r.tokens[k], d.config.vocab_size);
    prev = r.tokens[k];
  }
  EXPECT_EQ(d.model->draft(cache, 9, 2).tokens.size(), 2u);
  EXPECT_TRUE(d.model->draft(cache, 9, 0).tokens.empty());
}

TEST(DraftBlock, BatchedRequestsEqualSingleOnesBitForBit) {
  RandomDraft d(testing::odd_config(), 35, {Precision::bf16, kernels::RmsNormStyle::moonshot, true});
  const DraftConfig& c = d.config;
  const int64_t width = int64_t{c.num_taps()} * c.hidden_size;
  // Three requests with different context lengths (1, 8, 3 rows) and tokens.
  std::vector<DraftCache> caches;
  for (int64_t n : {1, 8, 3}) {
    caches.push_back(d.model->new_cache());
    d.model->append_context(caches.back(), testing::random_act(n, width, 36 + uint64_t(n), 2.0).view());
  }
  const std::vector<const DraftCache*> ptrs = {&caches[0], &caches[1], &caches[2]};
  const std::vector<int32_t> x0 = {4, 60, 4};
  const std::vector<int> max_tokens = {5, 2, 0};
  const BlockOutput all = d.model->forward_blocks(ptrs, x0);
  ASSERT_EQ(all.base_logits.dim(0), 3 * c.block_size);
  const int64_t Vd = c.draft_vocab_size;
  for (size_t b = 0; b < 3; ++b) {
    const BlockOutput one = d.model->forward_block(caches[b], x0[b]);
    EXPECT_EQ(0, std::memcmp(all.base_logits.data<float>() + int64_t(b) * c.block_size * Vd,
                             one.base_logits.data<void>(), size_t(one.base_logits.nbytes())))
        << "request " << b;
  }
  const std::vector<DraftResult> r = d.model->draft_batch(ptrs, x0, max_tokens);
  ASSERT_EQ(r.size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    const DraftResult one = d.model->draft(caches[b], x0[b], max_tokens[b]);
    EXPECT_EQ(r[b].tokens, one.tokens);
    EXPECT_EQ(r[b].confidence, one.confidence);
  }
  EXPECT_EQ(r[0].tokens.size(), 5u);
  EXPECT_EQ(r[1].tokens.size(), 2u);
  EXPECT_TRUE(r[2].tokens.empty());
}

TEST(MarkovHead, PreviousTokenShiftsLogitsByW2TimesW1Difference) {
  RandomDraft d(testing::odd_config(), 41, {Precision::fp32});
  const DraftConfig& c = d.config;
  const int32_t a = 5, b = 77;
  const std::vector<float> ma = d.model->markov_bias(a), mb = d.model->markov_bias(b);
  auto w = [&](const kernels::LinearWeight& lw, int64_t r) {
    std::vector<float> row(size_t(lw.in_features()));
    lw.load_row(r, row.data());
    return row;
  };
  const core::TensorView w1a = d.weights.markov_w1.view().row(a), w1b = d.weights.markov_w1.view().row(b);
  double max_diff = 0;
  for (int64_t v = 0; v < c.draft_vocab_size; ++v) {
    const std::vector<float> w2 = w(d.weights.markov_w2, v);
    double want = 0;
    for (int i = 0; i < c.markov_rank; ++i)
      want += double(w2[size_t(i)]) * (double(kernels::load_f32(w1a, i)) - kernels::load_f32(w1b, i));
    EXPECT_NEAR(double(ma[size_t(v)]) - mb[size_t(v)], want, 1e-5 * (1 + std::fabs(want)));
    max_diff = std::max(max_diff, std::fabs(want));
  }
  EXPECT_GT(max_diff, 0.1);  // the head really moves the logits
  // In the drafted logits of position k, only x_{k-1} enters through this term: the drafted row
  // minus the Markov bias of the token before it is the same U_k whatever x_{k-1} was.
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, testing::random_act(3, c.num_taps() * c.hidden_size, 42).view());
  const DraftResult r = d.model->draft(cache, a, c.block_size, true);
  const BlockOutput blk = d.model->forward_block(cache, a);
  for (int64_t v = 0; v < c.draft_vocab_size; ++v)
    EXPECT_EQ(r.logits.data<const float>()[v], blk.base_logits.data<const float>()[v] + ma[size_t(v)]);
}

TEST(ConfidenceHead, SigmoidOfHiddenAndMarkovEmbedding) {
  RandomDraft d(testing::odd_config(), 51, {Precision::fp32});
  const DraftConfig& c = d.config;
  std::vector<float> h(size_t(c.hidden_size));
  core::Rng rng(3);
  for (float& v : h) v = float(rng.normal());
  std::vector<float> w(size_t(c.hidden_size + c.markov_rank));
  d.weights.confidence_head.load_row(0, w.data());
  double z = 0;
  for (int i = 0; i < c.hidden_size; ++i) z += double(w[size_t(i)]) * h[size_t(i)];
  for (int i = 0; i < c.markov_rank; ++i)
    z += double(w[size_t(c.hidden_size + i)]) * kernels::load_f32(d.weights.markov_w1.view().row(8), i);
  const float got = d.model->confidence(h.data(), 8);
  EXPECT_NEAR(got, 1.0 / (1.0 + std::exp(-z)), 1e-6);
  EXPECT_GT(got, 0.0f);
  EXPECT_LT(got, 1.0f);
}

TEST(DraftVocab, D2tMapsDraftIdsToTargetIds) {
  DraftConfig c = testing::odd_config();
  c.draft_vocab_size = 50;
  RandomDraft d(c, 61);
  for (int64_t i = 0; i < 50; ++i) d.weights.d2t.data<int64_t>()[i] = 47;  // draft id i is target id i + 47
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, testing::random_act(4, c.num_taps() * c.hidden_size, 62).view());
  const DraftResult r = d.model->draft(cache, 3, c.block_size, true);
  ASSERT_EQ(r.logits.dim(1), 50);
  for (size_t k = 0; k < r.tokens.size(); ++k) {
    const float* z = r.logits.data<const float>() + int64_t(k) * 50;
    int64_t best = 0;
    for (int64_t v = 1; v < 50; ++v)
      if (z[v] > z[best]) best = v;
    EXPECT_EQ(r.tokens[k], best + 47);
  }
  EXPECT_THROW(d.model->to_target_id(50), core::Error);
}

TEST(DraftModel, RejectsMismatchedWeights) {
  RandomDraft d(testing::odd_config(), 71);
  DraftWeights w = d.weights;
  w.layers[1].kv_b_proj.weight = testing::random_bf16(10, 13, 1);
  try {
    DraftModel m(d.config, w, testing::reference_ops());
    FAIL();
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.self_attn.kv_b_proj.weight"), std::string::npos) << e.what();
  }
  w = d.weights;
  w.layers.pop_back();
  EXPECT_THROW(DraftModel(d.config, w, testing::reference_ops()), core::Error);
}

// One layer at K3's per-rank TP8 MLA shapes (12 heads, q-LoRA 1536, kv_lora 512, 128/64/128,
// hidden 7168; spec §11) with one tap and a small vocabulary, to keep the test fast.
TEST(DraftForward, K3PerRankShapes) {
  DraftConfig c = builtin_draft_config("k3-proxy-tp8-dspark");
  c.num_layers = 1;
  c.vocab_size = c.draft_vocab_size = 300;
  c.mask_token_id = 299;
  c.target_layer_ids = {22};
  c.intermediate_size = 256;
  RandomDraft d(c, 81, {Precision::bf16, kernels::RmsNormStyle::moonshot, true});
  DraftCache cache = d.model->new_cache();
  d.model->append_context(cache, testing::random_act(3, c.hidden_size, 82).view());
  EXPECT_EQ(cache.layers[0].rows, 3);
  EXPECT_EQ(cache.layers[0].data.dim(1), 576);
  const DraftResult r = d.model->draft(cache, 17, c.block_size, true);
  ASSERT_EQ(r.tokens.size(), 7u);
  EXPECT_TRUE(testing::all_finite(r.logits));
  for (int32_t t : r.tokens) EXPECT_LT(t, 300);
}

}  // namespace
}  // namespace k3::draft
