// kernels/attn_res/mix_test.cpp: AttnRes Mix against a double form; the norm weight's role.
#include "kernels/attn_res/mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// n sources [T, D]; source j has scale 0.5 * (j + 1) so that un-normalised and normalised
// sources differ a lot (a mix over normalised sources would be off by up to 9x).
std::vector<Tensor> random_sources(int n, int64_t T, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<Tensor> src;
  for (int j = 0; j < n; ++j) {
    Tensor s = Tensor::zeros(DType::f32, {T, D});
    for (float& v : s.span<float>()) v = core::bf16_round(static_cast<float>(rng.normal() * 0.5 * (j + 1)));
    src.push_back(s);
  }
  return src;
}

// A vector of D values mean + std * N(0,1) stored in dt with shape [D] (or [1, D] if as_row).
Tensor random_vec(DType dt, int64_t D, double mean, double std, uint64_t seed, bool as_row = false) {
  core::Rng rng(seed);
  Tensor v = as_row ? Tensor::zeros(dt, {1, D}) : Tensor::zeros(dt, {D});
  for (int64_t h = 0; h < D; ++h) {
    const float x = static_cast<float>(mean + std * rng.normal());
    if (dt == DType::bf16) v.data<uint16_t>()[h] = core::f32_to_bf16_bits(x);
    else v.data<float>()[h] = x;
  }
  return v;
}

float at(const Tensor& v, int64_t h) {
  return v.dtype() == DType::bf16 ? core::bf16_bits_to_f32(v.data<uint16_t>()[h]) : v.data<float>()[h];
}

// Query scaled so the scores are O(1..3): softmax far from uniform but not one-hot (spec §14.3).
Tensor strong_query(DType dt, int64_t D, uint64_t seed) {
  return random_vec(dt, D, 0.0, 3.0 / std::sqrt(static_cast<double>(D)), seed, /*as_row=*/true);
}

Tensor run(const std::vector<Tensor>& src, const Tensor& q, const Tensor& nw, Precision p) {
  std::vector<core::TensorView> views;
  for (const Tensor& s : src) views.push_back(s.view());
  Tensor out = Tensor::zeros(DType::f32, src[0].shape());
  for (float& v : out.span<float>()) v = kNaN;
  AttnResMixArgs a{views, q.view(), nw.view(), out.view(), 1e-5f, p};
  EXPECT_TRUE(attn_res_mix_check(a)) << attn_res_mix_check(a).reason();
  attn_res_mix_reference(a);
  return out;
}

// Spec §3.1 in double precision for token t: the alphas.
std::vector<double> naive_alpha(const std::vector<Tensor>& src, const Tensor& q, const Tensor& nw, int64_t t) {
  const int64_t D = src[0].dim(1);
  std::vector<double> s;
  for (const Tensor& r : src) {
    const float* row = r.data<float>() + t * D;
    double ss = 0.0, dot = 0.0;
    for (int64_t h = 0; h < D; ++h) {
      ss += static_cast<double>(row[h]) * row[h];
      dot += static_cast<double>(row[h]) * at(nw, h) * at(q, h);
    }
    s.push_back(dot / std::sqrt(ss / D + 1e-5));
  }
  const double m = *std::max_element(s.begin(), s.end());
  double z = 0.0;
  for (double& v : s) z += (v = std::exp(v - m));
  for (double& v : s) v /= z;
  return s;
}

// Checks out against sum_j alpha_j R_j (double alphas); returns the largest alpha seen.
double check_against_naive(const std::vector<Tensor>& src, const Tensor& q, const Tensor& nw, const Tensor& out,
                           Precision p) {
  const int64_t T = src[0].dim(0), D = src[0].dim(1);
  double max_alpha = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> alpha = naive_alpha(src, q, nw, t);
    max_alpha = std::max(max_alpha, *std::max_element(alpha.begin(), alpha.end()));
    for (int64_t h = 0; h < D; ++h) {
      double exact = 0.0, max_abs = 0.0;
      for (size_t j = 0; j < src.size(); ++j) {
        const double r = src[j].data<float>()[t * D + h];
        exact += alpha[j] * r;
        max_abs = std::max(max_abs, std::fabs(r));
      }
      const float got = out.data<float>()[t * D + h];
      const double tol = 2e-5 * max_abs + (p == Precision::bf16 ? std::fabs(exact) / 256 : 0.0);
      EXPECT_NEAR(got, exact, tol) << "n=" << src.size() << " t=" << t << " h=" << h;
      if (p == Precision::bf16) {
        EXPECT_EQ(got, core::bf16_round(got));
      }
      if (::testing::Test::HasFailure()) return max_alpha;
    }
  }
  return max_alpha;
}

TEST(AttnResMix, MatchesDoubleOnOddShapesOneToNineSources) {
  for (int64_t T : {1, 17, 54, 97})
    for (int64_t D : {96, 257})
      for (int n = 1; n <= 9; ++n) {
        const uint64_t seed = 1000 * T + 10 * D + n;
        std::vector<Tensor> src = random_sources(n, T, D, seed);
        Tensor q = strong_query(DType::bf16, D, seed + 1);
        Tensor nw = random_vec(DType::bf16, D, 1.0, 0.3, seed + 2);
        for (Precision p : {Precision::bf16, Precision::fp32}) {
          check_against_naive(src, q, nw, run(src, q, nw, p), p);
          ASSERT_FALSE(HasFailure()) << "T=" << T << " D=" << D << " n=" << n;
        }
      }
}

TEST(AttnResMix, K3FinalMixNineSources) {
  const int64_t T = 5, D = 7168;
  std::vector<Tensor> src = random_sources(9, T, D, 42);
  for (DType dt : {DType::bf16, DType::f32}) {
    Tensor q = strong_query(dt, D, 43);
    Tensor nw = random_vec(dt, D, 1.0, 0.1, 44);
    for (Precision p : {Precision::bf16, Precision::fp32}) {
      const double max_alpha = check_against_naive(src, q, nw, run(src, q, nw, p), p);
      EXPECT_GT(max_alpha, 0.3) << "the softmax should be far from uniform (1/9)";
    }
  }
}

TEST(AttnResMix, OneSourceIsTheSourceExactly) {
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    std::vector<Tensor> src = random_sources(1, 17, 257, 5);
    // In fp32 mode the source is moved off the bf16 grid, so any rounding would show.
    if (p == Precision::fp32)
      for (float& v : src[0].span<float>()) v *= 1.0f + 1e-3f;
    Tensor q = random_vec(DType::f32, 257, 0.0, 10.0, 6);
    Tensor nw = random_vec(DType::f32, 257, 1.0, 0.5, 7);
    Tensor out = run(src, q, nw, p);
    for (int64_t i = 0; i < src[0].numel(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(out.data<float>()[i]), std::bit_cast<uint32_t>(src[0].data<float>()[i]));
  }
}

TEST(AttnResMix, NormWeightEntersTheScoreOnly) {
  const int64_t T = 17, D = 257;
  std::vector<Tensor> src = random_sources(5, T, D, 8);
  Tensor q = strong_query(DType::f32, D, 9);
  Tensor norm_a = random_vec(DType::f32, D, 1.0, 0.1, 10);
  Tensor norm_b = random_vec(DType::f32, D, 1.0, 0.8, 11);
  Tensor out_a = run(src, q, norm_a, Precision::fp32);
  Tensor out_b = run(src, q, norm_b, Precision::fp32);
  // Changing the norm weight changes the alphas, so the output moves...
  double max_diff = 0.0;
  for (int64_t i = 0; i < T * D; ++i)
    max_diff = std::max(max_diff, std::fabs(double(out_a.data<float>()[i]) - out_b.data<float>()[i]));
  EXPECT_GT(max_diff, 0.1);
  // ...but both stay convex combinations of the RAW sources (never normalised outputs).
  check_against_naive(src, q, norm_a, out_a, Precision::fp32);
  check_against_naive(src, q, norm_b, out_b, Precision::fp32);
  for (const Tensor* out : {&out_a, &out_b})
    for (int64_t i = 0; i < T * D; ++i) {
      float lo = src[0].data<float>()[i], hi = lo;
      for (const Tensor& s : src) {
        lo = std::min(lo, s.data<float>()[i]);
        hi = std::max(hi, s.data<float>()[i]);
      }
      ASSERT_GE(out->data<float>()[i], lo - 1e-5f * std::fabs(lo));
      ASSERT_LE(out->data<float>()[i], hi + 1e-5f * std::fabs(hi));
    }
  // Only the product norm * query matters: moving a factor 2 from one to the other (exact in
  // fp32) leaves the output unchanged bit for bit.
  Tensor q2 = Tensor::copy_of(q.view()), norm2 = Tensor::copy_of(norm_b.view());
  for (float& v : q2.span<float>()) v *= 2.0f;
  for (float& v : norm2.span<float>()) v *= 0.5f;
  Tensor out_c = run(src, q2, norm2, Precision::fp32);
  for (int64_t i = 0; i < T * D; ++i) ASSERT_EQ(out_c.data<float>()[i], out_b.data<float>()[i]);
}

TEST(AttnResMix, OutputMayAliasThePrefix) {
  std::vector<Tensor> src = random_sources(3, 17, 96, 12);
  Tensor q = strong_query(DType::bf16, 96, 13);
  Tensor nw = random_vec(DType::bf16, 96, 1.0, 0.1, 14);
  Tensor want = run(src, q, nw, Precision::bf16);
  std::vector<core::TensorView> views{src[0].view(), src[1].view(), src[2].view()};
  AttnResMixArgs a{views, q.view(), nw.view(), src[2].view()};
  ASSERT_TRUE(attn_res_mix_check(a));
  attn_res_mix_reference(a);
  for (int64_t i = 0; i < src[2].numel(); ++i) ASSERT_EQ(src[2].data<float>()[i], want.data<float>()[i]);
}

TEST(AttnResMix, BadArgumentsFail) {
  std::vector<Tensor> src = random_sources(2, 4, 8, 1);
  Tensor odd = Tensor::zeros(DType::f32, {4, 9});
  Tensor q = random_vec(DType::bf16, 8, 0, 1, 2), q_bad = random_vec(DType::bf16, 7, 0, 1, 2);
  Tensor nw = random_vec(DType::bf16, 8, 1, 0.1, 3);
  Tensor out = Tensor::zeros(DType::f32, {4, 8}), out_bad = Tensor::zeros(DType::f32, {5, 8});
  EXPECT_FALSE(attn_res_mix_check({{}, q.view(), nw.view(), out.view()}));
  std::vector<core::TensorView> mismatched{src[0].view(), odd.view()};
  core::Status s = attn_res_mix_check({mismatched, q.view(), nw.view(), out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("sources[1]"), std::string::npos) << s.reason();
  std::vector<core::TensorView> ok{src[0].view(), src[1].view()};
  s = attn_res_mix_check({ok, q_bad.view(), nw.view(), out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("query"), std::string::npos) << s.reason();
  s = attn_res_mix_check({ok, q.view(), q_bad.view(), out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("norm"), std::string::npos) << s.reason();
  EXPECT_FALSE(attn_res_mix_check({ok, q.view(), nw.view(), out_bad.view()}));
  EXPECT_TRUE(attn_res_mix_check({ok, q.view(), nw.view(), out.view()}));
}

}  // namespace
}  // namespace k3::kernels
