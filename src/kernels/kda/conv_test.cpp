// kernels/kda/conv_test.cpp: the KDA short conv (spec §5.2) against a naive form, a hand example,
// state continuation over split calls, the real TP8 shard width, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

struct ConvCase {
  Tensor x, w, state;
  int T, C, K;
};

ConvCase random_conv(uint64_t seed, int T, int C, int K, Precision p) {
  core::Rng rng(seed);
  ConvCase cc{random(rng, {T, C}, 0.0, 1.0, p), random(rng, {C, K}, 0.0, 0.6), random(rng, {C, K - 1}, 0.0, 1.0, p), T,
              C, K};
  return cc;
}

KdaConvArgs conv_args(const TensorView& x, const Tensor& w, const Tensor& state, const TensorView& out, Precision p) {
  KdaConvArgs a;
  a.x = x;
  a.weight = w.view();
  a.state = state.view();
  a.out = out;
  a.precision = p;
  return a;
}

TEST(KdaConv, MatchesNaiveOnOddShapes) {
  struct Shape3 { int T, C, K; };
  const Shape3 shapes[] = {{1, 1, 4}, {17, 17, 4}, {54, 97, 4}, {97, 33, 4}, {150, 5, 4},
                           {17, 9, 2}, {54, 7, 3},  {20, 13, 5}, {5, 3, 1}};
  uint64_t seed = 1;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (const auto& s : shapes) {
      SCOPED_TRACE("T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) + " K=" + std::to_string(s.K) +
                   (p == Precision::bf16 ? " bf16" : " fp32"));
      ConvCase cc = random_conv(seed++, s.T, s.C, s.K, p);
      std::vector<float> naive_state = to_vec(cc.state);
      const std::vector<double> ref = naive_conv(to_vec(cc.x), to_vec(cc.w), naive_state, s.T, s.C, s.K);
      Tensor out = poisoned({s.T, s.C});
      kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), p));
      if (p == Precision::fp32) {
        EXPECT_LT(rel_err(out.span<float>(), ref), 1e-6);
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out.span<float>()[i], ref[i], 1e-5 * (1 + std::abs(ref[i])));
      } else {
        EXPECT_TRUE(bf16_close(out.span<float>(), ref));
      }
      // The state is the last K-1 inputs, exactly (inputs are copied, never recomputed).
      EXPECT_TRUE(bits_equal(cc.state.span<float>(), naive_state));
    }
  }
}

TEST(KdaConv, HandExampleAndShortSequencesShiftTheState) {
  // C = 1, K = 4, weights (w0..w3), state (a, b, c) oldest first.
  Tensor w = f32({1, 4}), state = f32({1, 3});
  const float wv[4] = {0.5f, -1.0f, 0.25f, 2.0f}, sv[3] = {1.0f, 2.0f, 3.0f};
  std::copy(wv, wv + 4, w.data<float>());
  std::copy(sv, sv + 3, state.data<float>());
  Tensor x = f32({1, 1}), out = poisoned({1, 1});
  x.data<float>()[0] = -0.75f;
  kda_conv_reference(conv_args(x.view(), w, state, out.view(), Precision::fp32));
  const float c = ((0.5f * 1.0f + -1.0f * 2.0f) + 0.25f * 3.0f) + 2.0f * -0.75f;  // = -2.25
  EXPECT_FLOAT_EQ(out.data<float>()[0], c / (1.0f + std::exp(-c)));
  // T = 1 < K-1: the state shifts left by one and appends the new input.
  EXPECT_EQ(to_vec(state), (std::vector<float>{2.0f, 3.0f, -0.75f}));
  // T = 2: shifts by two.
  Tensor x2 = f32({2, 1}), out2 = poisoned({2, 1});
  x2.data<float>()[0] = 4.0f, x2.data<float>()[1] = 5.0f;
  kda_conv_reference(conv_args(x2.view(), w, state, out2.view(), Precision::fp32));
  EXPECT_EQ(to_vec(state), (std::vector<float>{-0.75f, 4.0f, 5.0f}));
  // T = 0 changes nothing.
  Tensor x0 = f32({0, 1}), out0 = f32({0, 1});
  kda_conv_reference(conv_args(x0.view(), w, state, out0.view(), Precision::fp32));
  EXPECT_EQ(to_vec(state), (std::vector<float>{-0.75f, 4.0f, 5.0f}));
}

TEST(KdaConv, ZeroStateMeansNothingBeforeTheSequence) {
  ConvCase cc = random_conv(7, 3, 5, 4, Precision::fp32);
  for (float& s : cc.state.span<float>()) s = 0.0f;
  Tensor out = poisoned({3, 5});
  const std::vector<float> x = to_vec(cc.x), w = to_vec(cc.w);
  kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::fp32));
  for (int c = 0; c < 5; ++c) {
    const float c0 = w[c * 4 + 3] * x[c];  // first token: only the current input contributes
    EXPECT_FLOAT_EQ(out.data<float>()[c], c0 / (1.0f + std::exp(-c0)));
  }
}

TEST(KdaConv, SplitCallsEqualOneCall) {
  const int T = 23, C = 19, K = 4;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    ConvCase cc = random_conv(11, T, C, K, p);
    Tensor full_state = copy(cc.state), full_out = poisoned({T, C});
    kda_conv_reference(conv_args(cc.x.view(), cc.w, full_state, full_out.view(), p));
    for (int split : {1, 2, K - 1, 13}) {
      SCOPED_TRACE("split=" + std::to_string(split));
      Tensor state = copy(cc.state), out = poisoned({T, C});
      kda_conv_reference(conv_args(rows(cc.x.view(), 0, split), cc.w, state, rows(out.view(), 0, split), p));
      // The rest one token at a time for the first few (decode), then the remainder at once.
      int t = split;
      for (; t < split + 3; ++t) kda_conv_reference(conv_args(rows(cc.x.view(), t, 1), cc.w, state, rows(out.view(), t, 1), p));
      kda_conv_reference(conv_args(rows(cc.x.view(), t, T - t), cc.w, state, rows(out.view(), t, T - t), p));
      EXPECT_TRUE(bits_equal(out.span<float>(), full_out.span<float>()));
      EXPECT_TRUE(bits_equal(state.span<float>(), full_state.span<float>()));
    }
  }
}

TEST(KdaConv, Bf16ModeStateHoldsBf16) {
  ConvCase cc = random_conv(5, 9, 6, 4, Precision::fp32);  // deliberately unrounded inputs
  Tensor out = poisoned({9, 6});
  kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::bf16));
  for (float s : cc.state.span<float>()) EXPECT_EQ(core::bf16_round(s), s);
  for (float o : out.span<float>()) EXPECT_EQ(core::bf16_round(o), o);
}

TEST(KdaConv, CheckpointWeightShapeAndStridedInput) {
  // Weight as the checkpoint stores it, [C, 1, K]; x a column slice of a fused [T, 3C] projection.
  const int T = 17, C = 13, K = 4;
  core::Rng rng(3);
  Tensor fused = random(rng, {T, 3 * C}, 0.0, 1.0), w = random(rng, {C, K}, 0.0, 0.5);
  Tensor state_a = random(rng, {C, K - 1}, 0.0, 1.0), state_b = copy(state_a);
  Tensor x = f32({T, C});
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) x.data<float>()[t * C + c] = fused.data<float>()[t * 3 * C + C + c];
  Tensor out_a = poisoned({T, C}), out_b = poisoned({T, C});
  kda_conv_reference(conv_args(x.view(), w, state_a, out_a.view(), Precision::fp32));
  KdaConvArgs a = conv_args(cols(fused.view(), C, C), w, state_b, out_b.view(), Precision::fp32);
  a.weight = TensorView::contiguous(w.data<float>(), core::DType::f32, {C, 1, K});
  kda_conv_reference(a);
  EXPECT_TRUE(bits_equal(out_a.span<float>(), out_b.span<float>()));
  EXPECT_TRUE(bits_equal(state_a.span<float>(), state_b.span<float>()));
}

TEST(KdaConv, RealTp8ShardPrefillThenDecode) {
  // q, k and v channels of one TP8 shard side by side: 3 * 12 heads * 128 = 4608 (spec §11).
  const int T = 20, C = 3 * 12 * 128, K = 4;
  ConvCase cc = random_conv(21, T + 1, C, K, Precision::bf16);
  std::vector<float> naive_state = to_vec(cc.state);
  const std::vector<double> ref = naive_conv(to_vec(cc.x), to_vec(cc.w), naive_state, T + 1, C, K);
  Tensor out = poisoned({T + 1, C});
  kda_conv_reference(conv_args(rows(cc.x.view(), 0, T), cc.w, cc.state, rows(out.view(), 0, T), Precision::bf16));
  kda_conv_reference(conv_args(rows(cc.x.view(), T, 1), cc.w, cc.state, rows(out.view(), T, 1), Precision::bf16));
  EXPECT_TRUE(bf16_close(out.span<float>(), ref));
  EXPECT_TRUE(bits_equal(cc.state.span<float>(), naive_state));
}

TEST(KdaConv, CheckNamesTheBadArgument) {
  ConvCase cc = random_conv(1, 5, 8, 4, Precision::fp32);
  Tensor out = f32({5, 8});
  auto reason = [&](auto mutate) {
    KdaConvArgs a = conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::fp32);
    mutate(a);
    core::Status s = kda_conv_check(a);
    return s ? std::string("ok") : s.reason();
  };
  EXPECT_EQ(reason([](KdaConvArgs&) {}), "ok");
  Tensor bad_state = f32({8, 4}), bad_out = f32({5, 7}), bad_w = f32({7, 4});
  Tensor bf16_x = Tensor::zeros(core::DType::bf16, {5, 8});
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.state = bad_state.view(); }).find("state"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.out = bad_out.view(); }).find("out"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.weight = bad_w.view(); }).find("x"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.x = bf16_x.view(); }).find("x must be F32"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.weight = TensorView{}; }).find("weight"), std::string::npos);
  EXPECT_THROW(kda_conv_reference(conv_args(cc.x.view(), cc.w, bad_state, out.view(), Precision::fp32)), core::Error);
}

}  // namespace
}  // namespace k3::kernels
