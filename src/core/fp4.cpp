// core/fp4.cpp: FP4 E2M1 / E8M0 codecs and MXFP4 row (de)quantization.
#include "core/fp4.h"

#include <cmath>

#include "core/error.h"

namespace k3::core {

uint8_t f32_to_fp4_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::fabs(x);
  for (uint8_t i = 0; i < 7; ++i) {
    const float mid = 0.5f * (kFp4Magnitudes[i] + kFp4Magnitudes[i + 1]);
    if (a < mid) return sign | i;
    if (a == mid) return sign | ((i % 2 == 0) ? i : static_cast<uint8_t>(i + 1));  // ties to even code
  }
  return sign | 7;  // saturate at 6
}

float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

void mxfp4_quantize_row(std::span<const float> in, std::span<uint8_t> packed,
                        std::span<uint8_t> scales) {
  K3_CHECK(in.size() % kMxfp4Group == 0, "mxfp4: row length must be a multiple of 32");
  K3_CHECK(packed.size() == in.size() / 2 && scales.size() == in.size() / kMxfp4Group,
           "mxfp4: output spans have the wrong size");
  for (size_t g = 0; g < scales.size(); ++g) {
    const float* x = in.data() + g * kMxfp4Group;
    float amax = 0.0f;
    for (int i = 0; i < kMxfp4Group; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    int k = 0;  // scale = 2^k, the smallest power of two with amax / scale <= 6
    if (amax > 0.0f) {
      k = static_cast<int>(std::ceil(std::log2(amax / 6.0f)));
      while (std::ldexp(amax, -k) > 6.0f) ++k;
      while (k > -127 && std::ldexp(amax, -(k - 1)) <= 6.0f) --k;
    }
    if (k < -127) k = -127;
    if (k > 127) k = 127;
    scales[g] = static_cast<uint8_t>(k + 127);
    for (int i = 0; i < kMxfp4Group; i += 2) {
      const uint8_t lo = f32_to_fp4_e2m1(std::ldexp(x[i], -k));
      const uint8_t hi = f32_to_fp4_e2m1(std::ldexp(x[i + 1], -k));
      packed[(g * kMxfp4Group + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void mxfp4_dequantize_row(std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                          std::span<float> out) {
  K3_CHECK(out.size() == packed.size() * 2 && scales.size() * kMxfp4Group == out.size(),
           "mxfp4: spans have inconsistent sizes");
  for (size_t i = 0; i < packed.size(); ++i) {
    const float s = e8m0_to_f32(scales[(2 * i) / kMxfp4Group]);
    out[2 * i] = fp4_e2m1_to_f32(packed[i] & 0xf) * s;
    out[2 * i + 1] = fp4_e2m1_to_f32(packed[i] >> 4) * s;
  }
}

}  // namespace k3::core
