// kernels/dspark/dspark_test.cpp: the dspark ops' argument checks name what is wrong, and their
// references on hand-computable cases (the whole draft forward against a double-precision
// transcription is draft/draft_reference_test.cpp's; the device against these references,
// dspark_ops_test.cpp's).
#include "kernels/dspark/dspark.h"

#include <gtest/gtest.h>

#include <cmath>

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

std::string reason(const core::Status& s) { return s.reason(); }

TEST(RopePairs, CheckNamesTheBadArgument) {
  Tensor x = Tensor::zeros(DType::f32, {2, 10}), freq = Tensor::zeros(DType::f32, {2});
  RopePairsArgs a{x.view(), freq.view(), 2, 4, 2, 4, 0, Precision::fp32};
  EXPECT_TRUE(rope_pairs_check(a));
  RopePairsArgs b = a;
  b.offset = 3;  // head 1 would end at column 11
  EXPECT_NE(reason(rope_pairs_check(b)).find("do not fit in 10 columns"), std::string::npos)
      << reason(rope_pairs_check(b));
  b = a;
  b.dim = 3;
  EXPECT_NE(reason(rope_pairs_check(b)).find("even dim"), std::string::npos);
  b = a;
  b.position = -1;
  EXPECT_NE(reason(rope_pairs_check(b)).find("negative position"), std::string::npos);
  Tensor bad = Tensor::zeros(DType::f32, {3});
  b = a;
  b.inv_freq = bad.view();
  EXPECT_NE(reason(rope_pairs_check(b)).find("inv_freq must be f32 [2]"), std::string::npos);
}

TEST(RopePairs, RotatesEachPairByPositionTimesFrequency) {
  Tensor x = Tensor::zeros(DType::f32, {2, 6}), freq = Tensor::zeros(DType::f32, {1});
  freq.data<float>()[0] = 0.5f;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 6; ++c) x.data<float>()[r * 6 + c] = static_cast<float>(c + 1);
  // Heads at columns 1..2 and 4..5 (offset 1, stride 3), rows at positions 3 and 4.
  rope_pairs_reference({x.view(), freq.view(), 1, 3, 2, 2, 3, Precision::fp32});
  for (int r = 0; r < 2; ++r) {
    const float angle = static_cast<float>(3 + r) * 0.5f;
    const float* row = x.data<const float>() + r * 6;
    EXPECT_EQ(row[0], 1.0f);
    EXPECT_EQ(row[3], 4.0f);  // columns outside the slices stay
    EXPECT_FLOAT_EQ(row[1], 2.0f * std::cos(angle) - 3.0f * std::sin(angle));
    EXPECT_FLOAT_EQ(row[2], 2.0f * std::sin(angle) + 3.0f * std::cos(angle));
    EXPECT_FLOAT_EQ(row[4], 5.0f * std::cos(angle) - 6.0f * std::sin(angle));
  }
}

struct BlockArgs {
  Tensor q = Tensor::zeros(DType::f32, {2, 2 * (3 + 2)}), ctx = Tensor::zeros(DType::f32, {4, 4 + 2}),
         blk = Tensor::zeros(DType::f32, {2, 4 + 2}), out = Tensor::zeros(DType::f32, {2, 2 * 3});
  LinearWeight kv_b{Tensor::zeros(DType::f32, {2 * (3 + 3), 4}), {}};
  MlaBlockAttentionArgs get() const {
    return {q.view(), ctx.view(), blk.view(), &kv_b, out.view(), 2, 3, 2, 3, 0.5f, Precision::fp32};
  }
};

TEST(MlaBlockAttention, CheckNamesTheBadArgument) {
  BlockArgs a;
  EXPECT_TRUE(mla_block_attention_check(a.get()));
  MlaBlockAttentionArgs x = a.get();
  Tensor narrow = Tensor::zeros(DType::f32, {4, 5});
  x.context = narrow.view();
  EXPECT_NE(reason(mla_block_attention_check(x)).find("context must be f32 [P, 6]"), std::string::npos)
      << reason(mla_block_attention_check(x));
  x = a.get();
  x.kv_b = nullptr;
  EXPECT_NE(reason(mla_block_attention_check(x)).find("kv_b must be a dense"), std::string::npos);
  x = a.get();
  x.out = a.q.view();
  EXPECT_FALSE(mla_block_attention_check(x));
}

// With equal scores everywhere (q = 0) every row's output is W_UV times the mean of all P + T
// latents' c_n: the context rows and the block's own rows alike, whatever the row.
TEST(MlaBlockAttention, ZeroQueriesAverageContextAndBlockLatents) {
  BlockArgs a;
  for (int64_t i = 0; i < a.ctx.numel(); ++i) a.ctx.data<float>()[i] = static_cast<float>(i % 7);
  for (int64_t i = 0; i < a.blk.numel(); ++i) a.blk.data<float>()[i] = static_cast<float>(i % 5) - 2.0f;
  for (int64_t i = 0; i < a.kv_b.weight.numel(); ++i) a.kv_b.weight.data<float>()[i] = static_cast<float>(i % 3);
  mla_block_attention_reference(a.get());
  float mean[4] = {0, 0, 0, 0};
  for (int j = 0; j < 6; ++j)
    for (int i = 0; i < 4; ++i)
      mean[i] += (j < 4 ? a.ctx.data<float>()[j * 6 + i] : a.blk.data<float>()[(j - 4) * 6 + i]) / 6.0f;
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 3; ++e) {
        float want = 0.0f;
        for (int i = 0; i < 4; ++i) want += a.kv_b.weight.data<float>()[(h * 6 + 3 + e) * 4 + i] * mean[i];
        EXPECT_NEAR(a.out.data<float>()[t * 6 + h * 3 + e], want, 1e-5) << t << " " << h << " " << e;
      }
}

struct MarkovArgs {
  Tensor base = Tensor::zeros(DType::f32, {2 * 3, 4}), x0 = Tensor::zeros(DType::i32, {2}),
         w1 = Tensor::zeros(DType::f32, {6, 2}), d2t = Tensor::zeros(DType::i64, {4}),
         tokens = Tensor::zeros(DType::i32, {2, 3}), logits = Tensor::zeros(DType::f32, {2 * 3, 4});
  LinearWeight w2{Tensor::zeros(DType::f32, {4, 2}), {}};
  MarkovDraftArgs get() const {
    return {base.view(), x0.view(), w1.view(), &w2, d2t.view(), tokens.view(), logits.view(), 3};
  }
};

TEST(MarkovDraft, CheckNamesTheBadArgument) {
  MarkovArgs a;
  EXPECT_TRUE(markov_draft_check(a.get()));
  MarkovDraftArgs x = a.get();
  x.d2t = {};
  EXPECT_NE(reason(markov_draft_check(x)).find("without d2t"), std::string::npos) << reason(markov_draft_check(x));
  x = a.get();
  Tensor long_tokens = Tensor::zeros(DType::i32, {2, 4});
  x.tokens = long_tokens.view();
  EXPECT_NE(reason(markov_draft_check(x)).find("1 <= n <= 3"), std::string::npos);
  x = a.get();
  x.block_size = 0;
  EXPECT_FALSE(markov_draft_check(x));
}

// The chain: each step's previous token (a target id through d2t) picks the W1 row that biases the
// next step, and equal maxima go to the lowest draft id.
TEST(MarkovDraft, ChainsThroughTheMappedPreviousToken) {
  MarkovArgs a;
  const int64_t map[4] = {1, 1, 1, 1};  // draft id d is target id d + 1
  std::copy(map, map + 4, a.d2t.data<int64_t>());
  // W1 row t = (t, 0) and W2 row v = (v, 0): the Markov term is prev * v, so larger previous ids
  // favour larger draft ids.
  for (int t = 0; t < 6; ++t) a.w1.data<float>()[t * 2] = static_cast<float>(t);
  for (int v = 0; v < 4; ++v) a.w2.weight.data<float>()[v * 2] = static_cast<float>(v);
  // Request 0: base rows favour id 0 by 1.5 at every step. Request 1: all zero (ties).
  for (int k = 0; k < 3; ++k) a.base.data<float>()[k * 4 + 0] = 1.5f;
  a.x0.data<int32_t>()[0] = 0;  // prev 0: no bias, id 0 wins (1.5), target id 1
  a.x0.data<int32_t>()[1] = 0;  // all ties: id 0 wins, then prev = 1 favours id 3
  markov_draft_reference(a.get());
  // Request 0: step 1 -> draft 0 (target 1); step 2: z = 1.5 + 0, 0 + 1, 0 + 2, 0 + 3 -> draft 3
  // (target 4); step 3: z = 1.5, 4, 8, 12 -> draft 3 (target 4).
  EXPECT_EQ(a.tokens.data<int32_t>()[0], 1);
  EXPECT_EQ(a.tokens.data<int32_t>()[1], 4);
  EXPECT_EQ(a.tokens.data<int32_t>()[2], 4);
  EXPECT_EQ(a.logits.data<float>()[1 * 4 + 3], 3.0f);
  EXPECT_EQ(a.logits.data<float>()[2 * 4 + 0], 1.5f);
  // Request 1: ties at step 1 -> draft 0 (target 1); then prev 1 favours draft 3 (target 4).
  EXPECT_EQ(a.tokens.data<int32_t>()[3], 1);
  EXPECT_EQ(a.tokens.data<int32_t>()[4], 4);
}

}  // namespace
}  // namespace k3::kernels
