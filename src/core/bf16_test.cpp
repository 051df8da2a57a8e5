// core/bf16_test.cpp: bfloat16 codec: every code, round-to-nearest-even, overflow, subnormals,
// signed zero and NaN, against an independent reference written in double arithmetic.
#include "core/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/rng.h"

namespace k3::core {
namespace {

float bits_f32(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }

// Independent RNE: the two bf16 candidates around a finite x are its truncation and the next
// code up in magnitude; compare distances exactly in double. The code above the largest finite
// bf16 stands for 2^128 (IEEE rounds as if the exponent were unbounded, then overflows to inf).
uint16_t reference_bf16(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return lo;  // exactly representable
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double ax = std::fabs(static_cast<double>(x));
  const double vlo = std::fabs(static_cast<double>(bf16_bits_to_f32(lo)));
  const double vhi = ((hi & 0x7fffu) == 0x7f80u) ? std::ldexp(1.0, 128)
                                                 : std::fabs(static_cast<double>(bf16_bits_to_f32(hi)));
  const double dlo = ax - vlo, dhi = vhi - ax;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;  // tie: even mantissa
}

TEST(Bf16, EveryCodeRoundTrips) {
  int nans = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t code = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_f32(code);
    EXPECT_EQ(f32_bits(f), b << 16) << "decode is a shift: " << b;
    const uint16_t back = f32_to_bf16_bits(f);
    if (std::isnan(f)) {
      ++nans;
      ASSERT_TRUE(std::isnan(bf16_bits_to_f32(back))) << "NaN code " << b << " lost its NaN-ness";
      EXPECT_EQ(back & 0x8000u, code & 0x8000u) << "NaN sign " << b;
      EXPECT_NE(back & 0x0040u, 0u) << "NaN comes back quiet " << b;
    } else {
      ASSERT_EQ(back, code) << "code " << b << " value " << f;
    }
  }
  EXPECT_EQ(nans, 2 * 127);  // exponent all ones, mantissa != 0, both signs
}

TEST(Bf16, TiesToEven) {
  // Around 1.0 the bf16 step is 2^-7.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80u);             // tie between 1 (even) and 1+2^-7
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82u);         // tie between 1+2^-7 and 1+2^-6 (even)
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81u);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 0x1p-8f - 0x1p-23f), 0x3f80u);  // just below: down
  EXPECT_EQ(f32_to_bf16_bits(-(1.0f + 0x1p-8f)), 0xbf80u);
  EXPECT_EQ(f32_to_bf16_bits(-(1.0f + 3 * 0x1p-8f)), 0xbf82u);
  // Every tie between consecutive finite codes goes to the even one, across all binades.
  for (uint32_t b = 0; b < 0x7f7fu; ++b) {
    const uint32_t mid = (b << 16) | 0x8000u;  // exactly halfway between code b and b+1
    const uint16_t even = (b & 1u) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    ASSERT_EQ(f32_to_bf16_bits(bits_f32(mid)), even) << "tie above code " << b;
    ASSERT_EQ(f32_to_bf16_bits(bits_f32(mid - 1)), b) << "below tie above code " << b;
    ASSERT_EQ(f32_to_bf16_bits(bits_f32(mid + 1)), b + 1) << "above tie above code " << b;
    ASSERT_EQ(f32_to_bf16_bits(bits_f32(mid | 0x80000000u)), even | 0x8000u) << "negative tie " << b;
  }
}

TEST(Bf16, OverflowAndInfinity) {
  const uint16_t max_bf16 = 0x7f7fu;  // 0x1.fep127
  EXPECT_EQ(bf16_bits_to_f32(max_bf16), 0x1.fep127f);
  EXPECT_EQ(f32_to_bf16_bits(FLT_MAX), 0x7f80u);  // past max + half step: inf
  EXPECT_EQ(f32_to_bf16_bits(-FLT_MAX), 0xff80u);
  EXPECT_EQ(f32_to_bf16_bits(0x1.ffp127f), 0x7f80u);       // exact tie above max (odd) -> inf
  EXPECT_EQ(f32_to_bf16_bits(0x1.fefffep127f), max_bf16);  // just below the tie
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80u);
  EXPECT_TRUE(std::isinf(bf16_round(3.4e38f)));
}

TEST(Bf16, SubnormalsAndZero) {
  EXPECT_EQ(bf16_bits_to_f32(0x0001u), 0x1p-133f);  // smallest bf16 subnormal
  EXPECT_EQ(f32_to_bf16_bits(0x1p-133f), 0x0001u);
  EXPECT_EQ(f32_to_bf16_bits(0x1p-134f), 0x0000u);  // tie with 0 (even)
  EXPECT_EQ(f32_to_bf16_bits(0x1p-134f + 0x1p-149f), 0x0001u);
  EXPECT_EQ(f32_to_bf16_bits(0x1.8p-133f), 0x0002u);   // tie between 1 and 2: even
  EXPECT_EQ(f32_to_bf16_bits(0x1p-149f), 0x0000u);     // smallest f32 subnormal flushes
  EXPECT_EQ(f32_to_bf16_bits(-0x1p-149f), 0x8000u);    // ... keeping its sign
  EXPECT_EQ(f32_to_bf16_bits(0x1.fcp-127f), 0x007fu);  // largest subnormal
  EXPECT_EQ(f32_to_bf16_bits(0x1.fdp-127f), 0x007fu);  // 127.25 * 2^-133: down
  EXPECT_EQ(f32_to_bf16_bits(0x1.fep-127f), 0x0080u);  // 127.5 * 2^-133: tie, up into the smallest normal
  EXPECT_EQ(bf16_bits_to_f32(0x0080u), 0x1p-126f);
  EXPECT_EQ(f32_to_bf16_bits(0.0f), 0x0000u);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(bf16_round(-0.0f)));
  EXPECT_FALSE(std::signbit(bf16_round(0.0f)));
}

TEST(Bf16, NaNStaysNaN) {
  // Payloads only in the low 16 bits would truncate to an inf pattern without the quiet bit.
  for (uint32_t u : {0x7f800001u, 0x7f80ffffu, 0x7fc00000u, 0x7fffffffu, 0x7f808000u, 0xff800001u, 0xffc00000u}) {
    const uint16_t b = f32_to_bf16_bits(bits_f32(u));
    EXPECT_TRUE(std::isnan(bf16_bits_to_f32(b))) << std::hex << u;
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
  }
  EXPECT_TRUE(std::isnan(bf16_round(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Bf16, RandomBitPatternsMatchReference) {
  Rng rng(0xbf16);
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng.next_u64());
    const float x = bits_f32(u);
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_bf16_bits(x), reference_bf16(x)) << std::hex << "bits 0x" << u;
  }
  // Ordinary activations (around 1), where most real values sit.
  for (int i = 0; i < 200'000; ++i) {
    const float x = static_cast<float>(rng.normal(0.0, 3.0));
    ASSERT_EQ(f32_to_bf16_bits(x), reference_bf16(x)) << x;
    const float r = bf16_round(x);
    EXPECT_EQ(bf16_round(r), r);                                // idempotent
    EXPECT_LE(std::fabs(r - x), std::ldexp(std::fabs(x), -8));  // half a step, relative 2^-8
  }
}

}  // namespace
}  // namespace k3::core
