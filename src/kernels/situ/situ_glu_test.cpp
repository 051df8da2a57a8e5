// kernels/situ/situ_glu_test.cpp: SiTU-GLU and SiLU-GLU against their closed forms, including the tanh
// clipping.
#include "kernels/situ/situ_glu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The spec §8 closed form in double precision.
double closed_form(double a, double c, double beta = 4.0, double linear_beta = 25.0) {
  return beta * std::tanh(a / beta) / (1.0 + std::exp(-a)) * linear_beta * std::tanh(c / linear_beta);
}

Tensor random_act(int64_t T, int64_t I, double std, uint64_t seed) {
  core::Rng rng(seed);
  Tensor x = Tensor::zeros(DType::f32, {T, I});
  for (float& v : x.span<float>()) v = core::bf16_round(static_cast<float>(rng.normal() * std));
  return x;
}

Tensor from_values(const std::vector<float>& v) {
  Tensor x = Tensor::zeros(DType::f32, {1, static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), x.data<float>());
  return x;
}

Tensor run(const Tensor& gate, const Tensor& up, Precision p, float beta = 4.0f, float lb = 25.0f) {
  Tensor out = Tensor::zeros(DType::f32, gate.shape());
  for (float& v : out.span<float>()) v = kNaN;
  SituGluArgs a{gate.view(), up.view(), out.view(), beta, lb, p};
  EXPECT_TRUE(situ_glu_check(a)) << situ_glu_check(a).reason();
  situ_glu_reference(a);
  return out;
}

void check_closed_form(const Tensor& gate, const Tensor& up, const Tensor& out, Precision p, double beta = 4.0,
                       double lb = 25.0) {
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double want = closed_form(gate.data<float>()[i], up.data<float>()[i], beta, lb);
    const float got = out.data<float>()[i];
    // fp32: a few ulps from tanhf/expf and three products; bf16: plus one rounding (2^-9).
    const double rel = p == Precision::fp32 ? 4e-6 : 1.0 / 256;
    ASSERT_NEAR(got, want, rel * std::fabs(want) + 1e-30)
        << "a=" << gate.data<float>()[i] << " c=" << up.data<float>()[i];
    if (p == Precision::bf16) {
      ASSERT_EQ(got, core::bf16_round(got));
    }
  }
}

TEST(SituGlu, MatchesClosedFormOnOddShapes) {
  for (int64_t T : {1, 17, 54, 97})
    for (int64_t I : {96, 257}) {
      // std 20 on both: many gates deep in saturation and many ups past the 25 clip.
      Tensor gate = random_act(T, I, 20.0, T * 1000 + I), up = random_act(T, I, 20.0, T * 1000 + I + 1);
      for (Precision p : {Precision::bf16, Precision::fp32}) check_closed_form(gate, up, run(gate, up, p), p);
    }
}

TEST(SituGlu, MatchesClosedFormOnK3ShardWidths) {
  // Routed expert shard (TP8) 384, shared expert shard 768, dense layer-0 shard 4224.
  for (int64_t I : {384, 768, 4224}) {
    Tensor gate = random_act(17, I, 3.0, I), up = random_act(17, I, 30.0, I + 1);
    for (Precision p : {Precision::bf16, Precision::fp32}) check_closed_form(gate, up, run(gate, up, p), p);
  }
}

TEST(SituGlu, ClippingAtLargeMagnitudes) {
  // |up| >> 25: the up factor saturates at +-25. gate >> 0: the gate factor saturates at 4;
  // gate << 0: it goes to 0 (sigmoid), not to -4.
  const std::vector<float> gates = {50.0f, 1000.0f, 50.0f, -50.0f, -1000.0f, 2.0f, 2.0f, 1e30f};
  const std::vector<float> ups = {1000.0f, 1e4f, -1e5f, 1000.0f, -1000.0f, 1000.0f, 0.5f, 1e30f};
  Tensor gate = from_values(gates), up = from_values(ups);
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    Tensor out = run(gate, up, p);
    check_closed_form(gate, up, out, p);
    const float* y = out.data<float>();
    EXPECT_NEAR(y[0], 100.0f, 1e-4f);  // 4 * 25
    EXPECT_NEAR(y[1], 100.0f, 1e-4f);
    EXPECT_NEAR(y[2], -100.0f, 1e-4f);
    EXPECT_NEAR(y[3], 0.0f, 1e-18f);  // sigmoid(-50) ~ 2e-22
    EXPECT_NEAR(y[4], 0.0f, 1e-30f);
    EXPECT_NEAR(y[7], 100.0f, 1e-4f);
    for (float v : out.span<float>()) EXPECT_LE(std::fabs(v), 100.0f);
    // Against SwiGLU the clip bites: silu(2) * 1000 would be ~1762, SiTU gives ~40.7.
    EXPECT_NEAR(y[5], closed_form(2.0, 1000.0), 0.2);
    EXPECT_LT(y[5], 41.0f);
    // In the linear range it is close to, but not equal to, SwiGLU (4 tanh(a/4) != a).
    const double swiglu = 2.0 / (1.0 + std::exp(-2.0)) * 0.5;
    EXPECT_GT(std::fabs(y[6] - swiglu), 0.05);
  }
}

TEST(SituGlu, BetasComeFromTheArguments) {
  Tensor gate = random_act(17, 96, 10.0, 1), up = random_act(17, 96, 30.0, 2);
  Tensor a = run(gate, up, Precision::fp32, 2.0f, 10.0f);
  check_closed_form(gate, up, a, Precision::fp32, 2.0, 10.0);
  Tensor b = run(gate, up, Precision::fp32);
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_LE(std::fabs(a.data<float>()[i]), 20.0f);
    differ += a.data<float>()[i] != b.data<float>()[i];
  }
  EXPECT_GT(differ, a.numel() / 2);
}

TEST(SituGlu, OutputMayAliasGate) {
  Tensor gate = random_act(17, 257, 5.0, 3), up = random_act(17, 257, 5.0, 4);
  Tensor want = run(gate, up, Precision::bf16);
  SituGluArgs a{gate.view(), up.view(), gate.view()};
  ASSERT_TRUE(situ_glu_check(a));
  situ_glu_reference(a);
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(gate.data<float>()[i], want.data<float>()[i]);
}

TEST(SituGlu, BadArgumentsFail) {
  Tensor gate = random_act(4, 8, 1, 1), up_bad = random_act(4, 9, 1, 2), out = random_act(4, 8, 1, 3);
  core::Status s = situ_glu_check({gate.view(), up_bad.view(), out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("up must be f32 [4, 8]"), std::string::npos) << s.reason();
  Tensor out_bad = random_act(3, 8, 1, 4);
  EXPECT_FALSE(situ_glu_check({gate.view(), gate.view(), out_bad.view()}));
  EXPECT_FALSE(situ_glu_check({gate.view(), gate.view(), out.view(), 0.0f, 25.0f}));
  EXPECT_TRUE(situ_glu_check({gate.view(), gate.view(), out.view()}));
}

// SiLU-GLU against a * sigmoid(a) * c in double: one rounding in bf16, a few ulps in fp32, and
// a large negative gate gives 0 (not NaN from the overflowing exp).
TEST(SiluGlu, MatchesClosedFormOnOddShapes) {
  for (int64_t T : {1, 17, 54})
    for (int64_t I : {97, 512}) {
      Tensor gate = random_act(T, I, 8.0, T * 31 + I), up = random_act(T, I, 3.0, T * 31 + I + 1);
      gate.data<float>()[0] = -200.0f;
      for (Precision p : {Precision::bf16, Precision::fp32}) {
        Tensor out = Tensor::zeros(DType::f32, gate.shape());
        for (float& v : out.span<float>()) v = kNaN;
        SiluGluArgs a{gate.view(), up.view(), out.view(), p};
        ASSERT_TRUE(silu_glu_check(a)) << silu_glu_check(a).reason();
        silu_glu_reference(a);
        for (int64_t i = 0; i < gate.numel(); ++i) {
          const double g = gate.data<float>()[i], c = up.data<float>()[i];
          const double want = g / (1.0 + std::exp(-g)) * c;
          const float got = out.data<float>()[i];
          const double rel = p == Precision::fp32 ? 4e-6 : 1.0 / 256;
          ASSERT_NEAR(got, want, rel * std::fabs(want) + 1e-30) << "a=" << g << " c=" << c;
          if (p == Precision::bf16) ASSERT_EQ(got, core::bf16_round(got));
        }
        EXPECT_EQ(out.data<float>()[0], 0.0f);
      }
    }
  Tensor gate = random_act(2, 8, 1, 1), up_bad = random_act(2, 9, 1, 2);
  EXPECT_FALSE(silu_glu_check({gate.view(), up_bad.view(), gate.view()}));
}

}  // namespace
}  // namespace k3::kernels
