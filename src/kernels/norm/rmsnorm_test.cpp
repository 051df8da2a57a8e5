// kernels/norm/rmsnorm_test.cpp: RMSNorm (both styles) against double and naive float forms.
#include "kernels/norm/rmsnorm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// x rows get very different scales (1e-3 .. 30) so that eps placement matters for the small rows.
Tensor random_x(int64_t T, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  Tensor x = Tensor::zeros(DType::f32, {T, D});
  const double scales[] = {1e-3, 1.0, 30.0, 0.2};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) x.data<float>()[t * D + d] = static_cast<float>(rng.normal() * scales[t % 4]);
  return x;
}

// Norm weights 1 + N(0, 0.1^2) as in spec §14.3, stored in the given dtype.
Tensor random_w(DType dt, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  Tensor w = Tensor::zeros(dt, {D});
  for (int64_t d = 0; d < D; ++d) {
    const float v = static_cast<float>(1.0 + 0.1 * rng.normal());
    if (dt == DType::bf16) w.data<uint16_t>()[d] = core::f32_to_bf16_bits(v);
    else w.data<float>()[d] = v;
  }
  return w;
}

float w_at(const Tensor& w, int64_t d) {
  return w.dtype() == DType::bf16 ? core::bf16_bits_to_f32(w.data<uint16_t>()[d]) : w.data<float>()[d];
}

Tensor run(const Tensor& x, const Tensor& w, RmsNormStyle style, Precision p, float eps = 1e-5f) {
  Tensor out = Tensor::zeros(DType::f32, x.shape());
  for (float& v : out.span<float>()) v = kNaN;
  RmsNormArgs a{x.view(), w.view(), out.view(), eps, style, p};
  EXPECT_TRUE(rmsnorm_check(a)) << rmsnorm_check(a).reason();
  rmsnorm_reference(a);
  return out;
}

// Straightforward float transcription of spec §2 for row t, one formula per style.
std::vector<float> naive_float(const Tensor& x, const Tensor& w, int64_t t, RmsNormStyle style, Precision p) {
  const int64_t D = x.dim(1);
  const float* row = x.data<float>() + t * D;
  float ss = 0.0f;
  for (int64_t i = 0; i < D; ++i) ss = ss + row[i] * row[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + 1e-5f);
  std::vector<float> y(D);
  for (int64_t d = 0; d < D; ++d)
    y[d] = style == RmsNormStyle::moonshot ? round_act(w_at(w, d) * round_act(row[d] * r, p), p)
                                           : round_act(w_at(w, d) * (row[d] * r), p);
  return y;
}

// Row t in double precision, no rounding anywhere.
std::vector<double> naive_double(const Tensor& x, const Tensor& w, int64_t t) {
  const int64_t D = x.dim(1);
  const float* row = x.data<float>() + t * D;
  double ss = 0.0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(row[i]) * row[i];
  std::vector<double> y(D);
  for (int64_t d = 0; d < D; ++d) y[d] = w_at(w, d) * static_cast<double>(row[d]) / std::sqrt(ss / D + 1e-5);
  return y;
}

void check_against_naive(int64_t T, int64_t D, DType wdt, uint64_t seed) {
  Tensor x = random_x(T, D, seed);
  Tensor w = random_w(wdt, D, seed + 1);
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    for (RmsNormStyle style : {RmsNormStyle::moonshot, RmsNormStyle::fused}) {
      Tensor y = run(x, w, style, p);
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> want = naive_float(x, w, t, style, p);
        const std::vector<double> exact = naive_double(x, w, t);
        for (int64_t d = 0; d < D; ++d) {
          const float got = y.data<float>()[t * D + d];
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want[d]))
              << "T=" << T << " D=" << D << " t=" << t << " d=" << d;
          // fp32: a few float ulps; bf16: at most two roundings of 2^-9 each.
          const double tol = p == Precision::fp32 ? 2e-6 : 1.0 / 128;
          ASSERT_NEAR(got, exact[d], tol * std::fabs(exact[d]) + 1e-30) << "t=" << t << " d=" << d;
          if (p == Precision::bf16) {
            ASSERT_EQ(got, core::bf16_round(got));
          }
        }
      }
    }
  }
}

TEST(RmsNorm, MatchesNaiveOnOddShapes) {
  for (int64_t T : {1, 17, 54, 97})
    for (int64_t D : {96, 257}) check_against_naive(T, D, DType::bf16, 100 * T + D);
  check_against_naive(17, 257, DType::f32, 5);
}

TEST(RmsNorm, MatchesNaiveOnK3Hidden) { check_against_naive(17, 7168, DType::bf16, 7168); }

TEST(RmsNorm, MoonshotAndFusedDifferByAtMostOneBf16Ulp) {
  const int64_t T = 54, D = 7168;
  Tensor x = random_x(T, D, 9);
  Tensor w = random_w(DType::bf16, D, 10);
  Tensor a = run(x, w, RmsNormStyle::moonshot, Precision::bf16);
  Tensor b = run(x, w, RmsNormStyle::fused, Precision::bf16);
  int64_t differing = 0;
  for (int64_t i = 0; i < T * D; ++i) {
    const int32_t ba = core::f32_to_bf16_bits(a.data<float>()[i]);
    const int32_t bb = core::f32_to_bf16_bits(b.data<float>()[i]);
    ASSERT_LE(std::abs(ba - bb), 1) << "i=" << i;
    differing += ba != bb;
  }
  EXPECT_GT(differing, 0) << "the double rounding of the Moonshot style never showed";
  // In fp32 mode the two styles are the same function, bit for bit, and nothing is rounded.
  Tensor c = run(x, w, RmsNormStyle::moonshot, Precision::fp32);
  Tensor d = run(x, w, RmsNormStyle::fused, Precision::fp32);
  int64_t off_grid = 0;
  for (int64_t i = 0; i < T * D; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(c.data<float>()[i]), std::bit_cast<uint32_t>(d.data<float>()[i]));
    off_grid += c.data<float>()[i] != core::bf16_round(c.data<float>()[i]);
  }
  EXPECT_GT(off_grid, T * D / 2);
}

TEST(RmsNorm, OutputMayAliasInput) {
  const int64_t T = 17, D = 257;
  Tensor x = random_x(T, D, 4);
  Tensor w = random_w(DType::bf16, D, 5);
  Tensor want = run(x, w, RmsNormStyle::moonshot, Precision::bf16);
  RmsNormArgs a{x.view(), w.view(), x.view()};
  ASSERT_TRUE(rmsnorm_check(a));
  rmsnorm_reference(a);
  for (int64_t i = 0; i < T * D; ++i) ASSERT_EQ(x.data<float>()[i], want.data<float>()[i]);
}

TEST(RmsNorm, EpsIsAddedToTheMean) {
  // A row of constant 1e-3: mean(x^2) = 1e-6, so y = w * 1e-3 / sqrt(1e-6 + eps).
  const int64_t D = 96;
  Tensor x = Tensor::zeros(DType::f32, {1, D});
  for (float& v : x.span<float>()) v = 1e-3f;
  Tensor w = Tensor::zeros(DType::f32, {D});
  for (float& v : w.span<float>()) v = 1.0f;
  Tensor y = run(x, w, RmsNormStyle::fused, Precision::fp32, 1e-5f);
  EXPECT_NEAR(y.data<float>()[0], 1e-3 / std::sqrt(1e-6 + 1e-5), 1e-6);
}

TEST(RmsNorm, BadShapesFail) {
  Tensor x = random_x(4, 8, 1);
  Tensor w_short = random_w(DType::bf16, 7, 1);
  Tensor w_ok = random_w(DType::bf16, 8, 1);
  Tensor w_i32 = Tensor::zeros(DType::i32, {8});
  Tensor out_bad = Tensor::zeros(DType::f32, {4, 9});
  Tensor out_ok = Tensor::zeros(DType::f32, {4, 8});
  core::Status s = rmsnorm_check({x.view(), w_short.view(), out_ok.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("w must be"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("[7]"), std::string::npos) << s.reason();
  EXPECT_FALSE(rmsnorm_check({x.view(), w_i32.view(), out_ok.view()}));
  s = rmsnorm_check({x.view(), w_ok.view(), out_bad.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("out"), std::string::npos);
  EXPECT_TRUE(rmsnorm_check({x.view(), w_ok.view(), out_ok.view()}));
}

}  // namespace
}  // namespace k3::kernels
