// core/fp8.cpp: FP8 E4M3 (fn) codec. Bias 7, 3 mantissa bits, subnormal step 2^-9.
#include "core/fp8.h"

#include <cmath>

namespace k3::core {

uint8_t f32_to_fp8_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::fabs(x);
  if (a >= kFp8E4m3Max) return sign | 0x7e;  // saturate (inf included)
  if (a < 0x1p-6f) {
    // Subnormal range: code = round(a / 2^-9); 8 rolls over into the smallest normal (0x08).
    return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  }
  int e2 = 0;
  const float f = std::frexp(a, &e2);                                     // a = f * 2^e2, f in [0.5, 1)
  int exp = e2 - 1;                                                       // a = (2f) * 2^exp, 2f in [1, 2)
  int mant = static_cast<int>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));  // RNE
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  const int code = ((exp + 7) << 3) | mant;
  if (code > 0x7e) return sign | 0x7e;  // rounding past 448 saturates
  return sign | static_cast<uint8_t>(code);
}

float fp8_e4m3_to_f32(uint8_t code) {
  const bool neg = code & 0x80;
  const int exp = (code >> 3) & 0xf;
  const int mant = code & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = std::nanf("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return neg ? -v : v;
}

}  // namespace k3::core
