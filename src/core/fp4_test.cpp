// core/fp4_test.cpp: FP4 E2M1 codes, E8M0 scales and MXFP4 row (de)quantization (spec §9):
// all 16 codes, ties to even at every midpoint, saturation at 6, scale edge codes, nibble order,
// exact round trip of representable rows, error bounds, zero groups, groups in far-apart binades.
#include "core/fp4.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace k3::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Fp4E2m1, AllSixteenCodes) {
  const float expected[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t c = 0; c < 16; ++c) {
    const float f = fp4_e2m1_to_f32(c);
    EXPECT_EQ(f, expected[c]) << int(c);
    EXPECT_EQ(std::signbit(f), c >= 8) << int(c);
    EXPECT_EQ(f32_to_fp4_e2m1(f), c) << "round trip of code " << int(c);
    // E2M1 from its definition: bias 1, exponent 0 is subnormal (step 0.5).
    const int e = (c >> 1) & 3, m = c & 1;
    const float def = e == 0 ? 0.5f * m : std::ldexp(1.0f + 0.5f * m, e - 1);
    EXPECT_EQ(std::fabs(f), def) << int(c);
  }
}

TEST(Fp4E2m1, EveryMidpointTiesToEvenCode) {
  for (uint8_t c = 0; c < 7; ++c) {
    const float lo = kFp4Magnitudes[c], hi = kFp4Magnitudes[c + 1];
    const float mid = 0.5f * (lo + hi);
    const uint8_t even = (c % 2 == 0) ? c : static_cast<uint8_t>(c + 1);
    EXPECT_EQ(f32_to_fp4_e2m1(mid), even) << "midpoint " << mid;
    EXPECT_EQ(f32_to_fp4_e2m1(-mid), even | 8) << "midpoint " << -mid;
    EXPECT_EQ(f32_to_fp4_e2m1(std::nextafter(mid, 0.0f)), c) << mid;
    EXPECT_EQ(f32_to_fp4_e2m1(std::nextafter(mid, kInf)), c + 1) << mid;
    EXPECT_EQ(f32_to_fp4_e2m1(-std::nextafter(mid, kInf)), (c + 1) | 8) << mid;
  }
  // Spelled out: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5.0->4.0.
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(f32_to_fp4_e2m1(5.0f)), 4.0f);
}

TEST(Fp4E2m1, SaturationZeroAndNaN) {
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, FLT_MAX, kInf}) {
    EXPECT_EQ(f32_to_fp4_e2m1(x), 7) << x;
    EXPECT_EQ(f32_to_fp4_e2m1(-x), 15) << -x;
  }
  EXPECT_EQ(f32_to_fp4_e2m1(0.0f), 0);
  EXPECT_EQ(f32_to_fp4_e2m1(-0.0f), 8);
  EXPECT_EQ(f32_to_fp4_e2m1(-0.1f), 8);                                    // underflow keeps the sign
  EXPECT_EQ(f32_to_fp4_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);  // documented
}

TEST(Fp4E2m1, RandomValuesMatchBruteForce) {
  Rng rng(0xf4);
  for (int i = 0; i < 100'000; ++i) {
    const float x = static_cast<float>(rng.uniform(-8.0, 8.0));
    const float a = std::fabs(x);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      const float d = std::fabs(kFp4Magnitudes[c] - a), db = std::fabs(kFp4Magnitudes[best] - a);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    ASSERT_EQ(f32_to_fp4_e2m1(x), (x < 0 ? 8 : 0) | best) << x;
  }
}

TEST(E8m0, Scales) {
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_GT(e8m0_to_f32(0), 0.0f);  // a float subnormal, not flushed
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
  for (int e = 0; e < 255; ++e)
    EXPECT_EQ(static_cast<double>(e8m0_to_f32(static_cast<uint8_t>(e))), std::ldexp(1.0, e - 127)) << e;
}

struct Mxfp4Row {
  std::vector<uint8_t> packed, scales;
  std::vector<float> out;
};

// Quantizes then dequantizes x; the output is NaN-poisoned first so unwritten entries fail.
Mxfp4Row round_trip(const std::vector<float>& x) {
  Mxfp4Row r;
  r.packed.assign(x.size() / 2, 0xAA);
  r.scales.assign(x.size() / 32, 0xAA);
  r.out.assign(x.size(), std::numeric_limits<float>::quiet_NaN());
  mxfp4_quantize_row(x, r.packed, r.scales);
  mxfp4_dequantize_row(r.packed, r.scales, r.out);
  return r;
}

TEST(Mxfp4, NibbleOrderEvenIndexInLowNibble) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;   // code 2
  x[1] = -2.0f;  // code 0xC
  x[2] = 0.5f;   // code 1
  x[3] = 6.0f;   // code 7 (amax 6 -> scale 1.0)
  const Mxfp4Row r = round_trip(x);
  EXPECT_EQ(r.scales[0], 127);
  EXPECT_EQ(r.packed[0], 0xC2);
  EXPECT_EQ(r.packed[1], 0x71);
  for (size_t i = 2; i < r.packed.size(); ++i) EXPECT_EQ(r.packed[i], 0x00) << i;
  // A hand-built byte decodes the same way: 0x2C -> [-2 (0xC, low), 1 (0x2, high)].
  std::vector<uint8_t> packed(16, 0x00), scales{128};  // scale 2
  packed[0] = 0x2C;
  packed[15] = 0xF7;  // elements 30, 31: 6*2, -6*2
  std::vector<float> out(32, std::numeric_limits<float>::quiet_NaN());
  mxfp4_dequantize_row(packed, scales, out);
  EXPECT_EQ(out[0], -4.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[30], 12.0f);
  EXPECT_EQ(out[31], -12.0f);
  for (int i = 2; i < 30; ++i) EXPECT_EQ(out[i], 0.0f) << i;
}

TEST(Mxfp4, RepresentableRowsRoundTripExactly) {
  Rng rng(0x4f4);
  for (int n : {32, 64, 96, 3584}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int g = 0; g < n / 32; ++g) {
      const int k = static_cast<int>(rng.uniform(-30.0, 30.0));  // group scale 2^k
      for (int i = 0; i < 32; ++i)
        x[static_cast<size_t>(g * 32 + i)] = std::ldexp(fp4_e2m1_to_f32(static_cast<uint8_t>(rng.next_u64() & 15)), k);
    }
    const Mxfp4Row r = round_trip(x);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(r.out[static_cast<size_t>(i)], x[static_cast<size_t>(i)]) << "n " << n << " i " << i;
  }
}

TEST(Mxfp4, ErrorIsHalfAStepAndScaleIsTheSmallestThatFits) {
  Rng rng(0x5ca1e);
  const int n = 32 * 40;
  std::vector<float> x(n);
  for (int g = 0; g < n / 32; ++g) {
    const double binade = std::exp2(rng.uniform(-40.0, 40.0));
    for (int i = 0; i < 32; ++i) x[static_cast<size_t>(g * 32 + i)] = static_cast<float>(rng.normal() * binade);
  }
  const Mxfp4Row r = round_trip(x);
  for (int g = 0; g < n / 32; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(g * 32 + i)]));
    const float s = e8m0_to_f32(r.scales[static_cast<size_t>(g)]);
    // Smallest power of two with amax / s <= 6, so amax / s is in (3, 6]: nothing saturates.
    EXPECT_LE(amax / s, 6.0f) << "group " << g;
    EXPECT_GT(amax / s, 3.0f) << "group " << g;
    for (int i = 0; i < 32; ++i) {
      const size_t k = static_cast<size_t>(g * 32 + i);
      const float y = std::fabs(x[k]) / s;  // in units of the scale
      const float step = y < 2.0f ? 0.5f : (y < 4.0f ? 1.0f : 2.0f);
      EXPECT_LE(std::fabs(r.out[k] - x[k]), 0.5f * step * s) << "group " << g << " i " << i;
      // And it is exactly the nearest representable value (the element codec on x / s).
      EXPECT_EQ(r.out[k], fp4_e2m1_to_f32(f32_to_fp4_e2m1(x[k] / s)) * s);
    }
  }
}

TEST(Mxfp4, ScaleBoundaries) {
  std::vector<float> x(32, 0.0f);
  x[5] = 6.0f * 0x1p-3f;  // exactly 6 * 2^-3: scale 2^-3
  EXPECT_EQ(round_trip(x).scales[0], 127 - 3);
  x[5] = std::nextafter(6.0f * 0x1p-3f, kInf);  // just above: next scale up
  EXPECT_EQ(round_trip(x).scales[0], 127 - 2);
  x[5] = 3.0f;  // 3 <= 6 * 2^-1: scale 0.5
  EXPECT_EQ(round_trip(x).scales[0], 126);
  x[5] = std::nextafter(3.0f, kInf);  // just above 3: scale 1
  EXPECT_EQ(round_trip(x).scales[0], 127);
}

TEST(Mxfp4, ZeroGroupsAndFarApartBinades) {
  // Group 0 all zero, group 1 tiny, group 2 ordinary, group 3 huge: groups are independent.
  std::vector<float> x(128, 0.0f);
  for (int i = 0; i < 32; ++i) {
    x[static_cast<size_t>(32 + i)] = (i % 2 ? -1.0f : 1.0f) * 1e-30f * static_cast<float>(i % 7);
    x[static_cast<size_t>(64 + i)] = 0.1f * static_cast<float>(i - 16);
    x[static_cast<size_t>(96 + i)] = 1e30f * static_cast<float>(i % 5);
  }
  const Mxfp4Row r = round_trip(x);
  EXPECT_EQ(r.scales[0], 127);  // all-zero group: scale 1, codes 0
  for (int i = 0; i < 16; ++i) EXPECT_EQ(r.packed[static_cast<size_t>(i)], 0) << i;
  for (int g = 0; g < 4; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(g * 32 + i)]));
    for (int i = 0; i < 32; ++i) {
      const size_t k = static_cast<size_t>(g * 32 + i);
      ASSERT_FALSE(std::isnan(r.out[k])) << k;
      // Relative to the group's own amax: at most half the top step (1 * scale), and the
      // scale is at most amax / 3.
      EXPECT_LE(std::fabs(r.out[k] - x[k]), amax / 3.0f) << "group " << g << " i " << i;
    }
  }
  // The tiny group is not flushed by its huge neighbour.
  EXPECT_NE(r.out[33], 0.0f);
  EXPECT_NE(r.out[97], 0.0f);
  // Negative zeros dequantize to zero.
  std::vector<float> z(32, -0.0f);
  for (float v : round_trip(z).out) EXPECT_EQ(v, 0.0f);
}

TEST(Mxfp4, TinyAndSubnormalGroupsClampTheScale) {
  // Scales below 2^-127 do not exist: the group takes the smallest scale and rounds to it.
  std::vector<float> x(32, 0.0f);
  x[0] = 0x1p-149f;  // smallest float subnormal (amax / 6 underflows to 0)
  Mxfp4Row r = round_trip(x);
  EXPECT_EQ(r.scales[0], 0);
  EXPECT_EQ(r.out[0], 0.0f);
  x[0] = 0x1p-126f;  // 2^-126 = 2 * 2^-127: representable exactly
  x[1] = -0x1p-127f;
  r = round_trip(x);
  EXPECT_EQ(r.scales[0], 0);
  EXPECT_EQ(r.out[0], 0x1p-126f);
  EXPECT_EQ(r.out[1], -0x1p-127f);
  // Near the top of float: the scale stays a finite E8M0 code.
  x.assign(32, 0.0f);
  x[3] = 0x1p127f;
  r = round_trip(x);
  EXPECT_LT(r.scales[0], 0xff);
  EXPECT_EQ(r.out[3], 0x1p127f);
}

TEST(Mxfp4, BadInputThrows) {
  std::vector<float> x(33, 1.0f);
  std::vector<uint8_t> packed(16), scales(1);
  EXPECT_THROW(mxfp4_quantize_row(std::span<const float>(x.data(), 33), packed, scales), Error);
  x.resize(32);
  std::vector<uint8_t> short_packed(15);
  EXPECT_THROW(mxfp4_quantize_row(x, short_packed, scales), Error);
  std::vector<uint8_t> two_scales(2);
  EXPECT_THROW(mxfp4_quantize_row(x, packed, two_scales), Error);
  std::vector<float> out(31);
  EXPECT_THROW(mxfp4_dequantize_row(packed, scales, out), Error);
  // Non-finite inputs have no MXFP4 encoding: a clear error, not a hang or a silent zero.
  for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    x.assign(32, 1.0f);
    x[17] = bad;
    try {
      mxfp4_quantize_row(x, packed, scales);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("index 17"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace k3::core
