// kernels/moe/router_test.cpp: router top-k against a full sort on the shapes of cases.h (odd shapes,
// K3's top-16 of 896); bias steers selection only.
#include "kernels/moe/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "kernels/moe/cases.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

struct Routed {
  Tensor ids, weights;
};

Tensor matrix(int64_t T, int64_t E, double std, uint64_t seed) {
  core::Rng rng(seed);
  Tensor x = Tensor::zeros(DType::f32, {T, E});
  for (float& v : x.span<float>()) v = static_cast<float>(rng.normal() * std);
  return x;
}

Tensor vec(const std::vector<float>& v) {
  Tensor x = Tensor::zeros(DType::f32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), x.data<float>());
  return x;
}

Routed run(const Tensor& logits, const Tensor& bias, int64_t k, bool renormalize = true, float scaling = 1.0f) {
  const int64_t T = logits.dim(0);
  Routed r{Tensor::zeros(DType::i32, {T, k}), Tensor::zeros(DType::f32, {T, k})};
  for (int32_t& v : r.ids.span<int32_t>()) v = -7;
  for (float& v : r.weights.span<float>()) v = std::numeric_limits<float>::quiet_NaN();
  RouterTopkArgs a{logits.view(), bias.view(), r.ids.view(), r.weights.view(), renormalize, scaling};
  EXPECT_TRUE(router_topk_check(a)) << router_topk_check(a).reason();
  router_topk_reference(a);
  return r;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Naive form: sort ALL experts by (biased score desc, id asc), take the first k.
void check_against_full_sort(const Tensor& logits, const Tensor& bias, int64_t k, bool renormalize, float scaling) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  Routed r = run(logits, bias, k, renormalize, scaling);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::tuple<float, int32_t>> ranked;
    for (int32_t e = 0; e < E; ++e) {
      const float s = sigmoid(logits.data<float>()[t * E + e]);
      ranked.emplace_back(-(s + bias.data<float>()[e]), e);
    }
    std::sort(ranked.begin(), ranked.end());
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += sigmoid(logits.data<float>()[t * E + std::get<1>(ranked[j])]);
    double weight_total = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = std::get<1>(ranked[j]);
      const float s = sigmoid(logits.data<float>()[t * E + e]);
      ASSERT_EQ(r.ids.data<int32_t>()[t * k + j], e) << "t=" << t << " j=" << j;
      const float want = renormalize ? s / (sum + 1e-20f) * scaling : s * scaling;
      ASSERT_EQ(r.weights.data<float>()[t * k + j], want) << "t=" << t << " j=" << j;
      weight_total += r.weights.data<float>()[t * k + j];
    }
    if (renormalize) {
      ASSERT_NEAR(weight_total, scaling, 1e-6 * scaling);
    }
  }
}

TEST(RouterTopk, MatchesFullSortOnOddShapes) {
  for (const MoeRouterShape& s : kMoeRouterOddShapes)
    for (int64_t T : kMoeRouterOddTokens) {
      SCOPED_TRACE(std::string(s.name) + " T " + std::to_string(T));
      const uint64_t seed = T * 100000 + s.E * 100 + s.k;
      Tensor logits = matrix(T, s.E, 2.0, seed);
      Tensor bias = Tensor::copy_of(matrix(1, s.E, 0.3, seed + 1).view().row(0));
      check_against_full_sort(logits, bias, s.k, true, 1.0f);
      check_against_full_sort(logits, bias, s.k, false, 2.5f);
      check_against_full_sort(logits, bias, s.k, true, 2.5f);
    }
}

TEST(RouterTopk, K3ShapeE896Top16) {
  const MoeRouterShape& s = kMoeRouterK3;
  for (int64_t T : kMoeK3Tokens) {
    SCOPED_TRACE("T " + std::to_string(T));
    Tensor logits = matrix(T, s.E, 1.5, T);
    Tensor bias = Tensor::copy_of(matrix(1, s.E, 0.01, 2).view().row(0));
    check_against_full_sort(logits, bias, s.k, true, 1.0f);
  }
}

TEST(RouterTopk, BiasAffectsSelectionOnly) {
  // s = sigmoid(logits) = [0.90, 0.80, 0.70, 0.60, 0.50, 0.10, 0.05, 0.02] (approximately).
  const std::vector<float> s_target = {0.90f, 0.80f, 0.70f, 0.60f, 0.50f, 0.10f, 0.05f, 0.02f};
  Tensor logits = Tensor::zeros(DType::f32, {1, 8});
  for (int e = 0; e < 8; ++e) logits.data<float>()[e] = std::log(s_target[e] / (1.0f - s_target[e]));
  Routed plain = run(logits, vec(std::vector<float>(8, 0.0f)), 2);
  EXPECT_EQ(plain.ids.data<int32_t>()[0], 0);
  EXPECT_EQ(plain.ids.data<int32_t>()[1], 1);
  // A bias of +1 lifts expert 5 (s = 0.1) above everything; -1 drops expert 0.
  Routed biased = run(logits, vec({-1.0f, 0, 0, 0, 0, 1.0f, 0, 0}), 2);
  ASSERT_EQ(biased.ids.data<int32_t>()[0], 5);
  ASSERT_EQ(biased.ids.data<int32_t>()[1], 1);
  const float s5 = sigmoid(logits.data<float>()[5]), s1 = sigmoid(logits.data<float>()[1]);
  // Weights never include the bias: s_j / (s_5 + s_1), and they sum to 1.
  EXPECT_EQ(biased.weights.data<float>()[0], s5 / (s5 + s1 + 1e-20f));
  EXPECT_EQ(biased.weights.data<float>()[1], s1 / (s5 + s1 + 1e-20f));
  EXPECT_NEAR(biased.weights.data<float>()[0], 0.1 / 0.9, 1e-6);
  EXPECT_NEAR(biased.weights.data<float>()[0] + biased.weights.data<float>()[1], 1.0, 1e-7);
  // Written in descending BIASED order even though expert 5 has the lower weight.
  EXPECT_LT(biased.weights.data<float>()[0], biased.weights.data<float>()[1]);

  // Randomised: a bias of the size of the score spread changes many selections, and every
  // selected weight equals s / sum(selected s), bias-free.
  Tensor many = matrix(97, 64, 1.0, 5);
  Tensor bias = Tensor::copy_of(matrix(1, 64, 0.2, 6).view().row(0));
  Routed with = run(many, bias, 8), without = run(many, vec(std::vector<float>(64, 0.0f)), 8);
  int64_t changed = 0;
  for (int64_t t = 0; t < 97; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < 8; ++j) sum += sigmoid(many.data<float>()[t * 64 + with.ids.data<int32_t>()[t * 8 + j]]);
    double total = 0.0;
    for (int64_t j = 0; j < 8; ++j) {
      const float s = sigmoid(many.data<float>()[t * 64 + with.ids.data<int32_t>()[t * 8 + j]]);
      ASSERT_EQ(with.weights.data<float>()[t * 8 + j], s / (sum + 1e-20f));
      total += with.weights.data<float>()[t * 8 + j];
    }
    ASSERT_NEAR(total, 1.0, 1e-6);
    changed += !std::equal(with.ids.data<int32_t>() + t * 8, with.ids.data<int32_t>() + t * 8 + 8,
                           without.ids.data<int32_t>() + t * 8);
  }
  EXPECT_GT(changed, 20);
}

TEST(RouterTopk, ExactTiesPickTheLowerIdAndOrderIsDescending) {
  // All logits equal: selection is 0..k-1 in id order.
  Routed r = run(Tensor::zeros(DType::f32, {1, 12}), vec(std::vector<float>(12, 0.0f)), 5);
  for (int j = 0; j < 5; ++j) EXPECT_EQ(r.ids.data<int32_t>()[j], j);
  for (int j = 0; j < 5; ++j) EXPECT_FLOAT_EQ(r.weights.data<float>()[j], 0.2f);
  // Experts 7 and 3 tie on the biased score above the rest: 3 comes first, then 7.
  Tensor logits = Tensor::zeros(DType::f32, {1, 12});
  logits.data<float>()[7] = 3.0f;
  logits.data<float>()[3] = 3.0f;
  r = run(logits, vec(std::vector<float>(12, 0.0f)), 3);
  EXPECT_EQ(r.ids.data<int32_t>()[0], 3);
  EXPECT_EQ(r.ids.data<int32_t>()[1], 7);
  EXPECT_EQ(r.ids.data<int32_t>()[2], 0);
}

TEST(RouterTopk, NaNLogitThrows) {
  Tensor logits = matrix(2, 8, 1.0, 3);
  logits.data<float>()[8 + 4] = std::numeric_limits<float>::quiet_NaN();
  Tensor ids = Tensor::zeros(DType::i32, {2, 2}), w = Tensor::zeros(DType::f32, {2, 2});
  Tensor bias = vec(std::vector<float>(8, 0.0f));
  try {
    router_topk_reference({logits.view(), bias.view(), ids.view(), w.view()});
    FAIL() << "expected a core::Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token 1"), std::string::npos) << e.what();
  }
}

TEST(RouterTopk, BadArgumentsFail) {
  Tensor logits = matrix(3, 8, 1.0, 1);
  Tensor bias = vec(std::vector<float>(8, 0.0f)), bias_bad = vec(std::vector<float>(7, 0.0f));
  Tensor ids = Tensor::zeros(DType::i32, {3, 2}), ids_big = Tensor::zeros(DType::i32, {3, 9});
  Tensor w = Tensor::zeros(DType::f32, {3, 2}), w_big = Tensor::zeros(DType::f32, {3, 9});
  Tensor w_bad = Tensor::zeros(DType::f32, {3, 3});
  core::Status s = router_topk_check({logits.view(), bias_bad.view(), ids.view(), w.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("bias must be f32 [8]"), std::string::npos) << s.reason();
  s = router_topk_check({logits.view(), bias.view(), ids_big.view(), w_big.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("top-k 9"), std::string::npos) << s.reason();
  s = router_topk_check({logits.view(), bias.view(), ids.view(), w_bad.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("weights"), std::string::npos) << s.reason();
  EXPECT_TRUE(router_topk_check({logits.view(), bias.view(), ids.view(), w.view()}));
}

}  // namespace
}  // namespace k3::kernels
