// core/fp8_test.cpp: FP8 E4M3 ("fn": no inf, S.1111.111 NaN, max 448) codec: all 256 codes,
// saturation, NaN, subnormals, round-to-nearest-even at every midpoint, signed zero, and a
// brute-force nearest-code reference on random inputs.
#include "core/fp8.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace k3::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Value of a code from the format definition, computed independently in double.
double reference_decode(uint8_t code) {
  const int e = (code >> 3) & 0xf, m = code & 7;
  const double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -v : v;
}

// Brute force over the 127 non-negative finite codes: nearest, ties to the even code, and
// anything beyond 448 saturates (the encoder's documented contract).
uint8_t reference_encode(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7e;
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7e; ++c) v.push_back(reference_decode(static_cast<uint8_t>(c)));
    return v;
  }();
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(values[static_cast<size_t>(c)] - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_d = d;
    }
  }
  return sign | best;
}

TEST(Fp8E4m3, DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = fp8_e4m3_to_f32(code);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), reference_decode(code)) << "code " << c;
    EXPECT_EQ(std::signbit(f), (code & 0x80) != 0) << "code " << c;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);      // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);      // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(kFp8E4m3Max, 448.0f);
}

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(code)), code) << "code " << c;
  }
}

TEST(Fp8E4m3, NaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_fp8_e4m3(qnan), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-qnan), 0xff);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_round(qnan)));
}

TEST(Fp8E4m3, Saturates) {
  for (float x : {448.0f, 448.5f, 449.0f, 464.0f, 479.0f, 480.0f, 500.0f, 1e6f, 1e30f, FLT_MAX, kInf}) {
    EXPECT_EQ(f32_to_fp8_e4m3(x), 0x7e) << x;
    EXPECT_EQ(f32_to_fp8_e4m3(-x), 0xfe) << -x;
  }
  EXPECT_EQ(fp8_e4m3_round(kInf), 448.0f);
  EXPECT_EQ(fp8_e4m3_round(-kInf), -448.0f);
  // Just below 448 stays in range and rounds normally (432 = midpoint of 416 and 448: even is 448).
  EXPECT_EQ(f32_to_fp8_e4m3(447.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(432.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(431.0f), 0x7d);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7d), 416.0f);
}

TEST(Fp8E4m3, SubnormalsAndSignedZero) {
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-10f), 0x00);         // tie with 0: even
  EXPECT_EQ(f32_to_fp8_e4m3(0x1.000002p-10f), 0x01);  // just above the tie
  EXPECT_EQ(f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02);     // tie between 1 and 2: even
  EXPECT_EQ(f32_to_fp8_e4m3(7.5f * 0x1p-9f), 0x08);   // tie between 7 (odd) and the first normal
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-20f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-149f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(-0x1p-11f), 0x80);  // underflow keeps the sign
  EXPECT_EQ(f32_to_fp8_e4m3(-0x1p-9f), 0x81);
  EXPECT_TRUE(std::signbit(fp8_e4m3_round(-0.0f)));
  EXPECT_FALSE(std::signbit(fp8_e4m3_round(0.0f)));
  EXPECT_TRUE(std::signbit(fp8_e4m3_round(-1e-30f)));
}

TEST(Fp8E4m3, EveryMidpointTiesToEven) {
  // Codes 0x00..0x7e are increasing in value, so neighbours in code order are neighbours in
  // value; their midpoint is exact in float.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    const float hi = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    ASSERT_LT(lo, hi);
    const float mid = 0.5f * (lo + hi);
    ASSERT_EQ(static_cast<double>(mid), 0.5 * (static_cast<double>(lo) + hi)) << "inexact midpoint";
    const uint8_t even = (c % 2 == 0) ? static_cast<uint8_t>(c) : static_cast<uint8_t>(c + 1);
    EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "midpoint after code " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), even | 0x80) << "negative midpoint after code " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c) << "below midpoint after " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, kInf)), c + 1) << "above midpoint after " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(-std::nextafter(mid, kInf)), (c + 1) | 0x80);
  }
}

TEST(Fp8E4m3, RandomValuesMatchBruteForce) {
  Rng rng(0xf8);
  for (int i = 0; i < 100'000; ++i) {
    // Log-uniform magnitudes from far below the subnormals to far above saturation.
    const float mag = static_cast<float>(std::exp2(rng.uniform(-14.0, 11.0)));
    const float x = rng.uniform() < 0.5 ? -mag : mag;
    ASSERT_EQ(f32_to_fp8_e4m3(x), reference_encode(x)) << x;
  }
}

}  // namespace
}  // namespace k3::core
