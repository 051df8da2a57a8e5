// core/fp4.cpp: FP4 E2M1 / E8M0 codecs and MXFP4 row (de)quantization.
#include "core/fp4.h"

#include <cmath>
#include <string>

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

void mxfp4_quantize_row(std::span<const float> in, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  K3_CHECK(in.size() % kMxfp4Group == 0, "mxfp4: row length must be a multiple of 32");
  K3_CHECK(packed.size() == in.size() / 2 && scales.size() == in.size() / kMxfp4Group,
           "mxfp4: output spans have the wrong size");
  for (size_t g = 0; g < scales.size(); ++g) {
    const float* x = in.data() + g * kMxfp4Group;
    float amax = 0.0f;
    for (int i = 0; i < kMxfp4Group; ++i) {
      // fmax would silently skip a NaN (and an inf has no finite scale): reject both.
      K3_CHECK(std::isfinite(x[i]),
               "mxfp4: non-finite value at index " + std::to_string(g * kMxfp4Group + i) + " of the row");
      amax = std::fmax(amax, std::fabs(x[i]));
    }
    int k = 0;  // scale = 2^k, the smallest power of two with amax / scale <= 6
    if (amax > 0.0f) {
      // amax = f * 2^e with f in [0.5, 1), so amax / 2^(e-3) is in [4, 8): k is e-3 or e-2.
      // (frexp, not log2(amax / 6): that underflows to log2(0) = -inf for tiny subnormals.)
      int e = 0;
      std::frexp(amax, &e);
      k = e - 3;
      if (std::ldexp(amax, -k) > 6.0f) ++k;
    }
    if (k < -127) k = -127;  // E8M0's smallest scale; such groups quantize to (near) zero
    if (k > 127) k = 127;
    scales[g] = static_cast<uint8_t>(k + 127);
    for (int i = 0; i < kMxfp4Group; i += 2) {
      const uint8_t lo = f32_to_fp4_e2m1(std::ldexp(x[i], -k));
      const uint8_t hi = f32_to_fp4_e2m1(std::ldexp(x[i + 1], -k));
      packed[(g * kMxfp4Group + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void mxfp4_dequantize_row(std::span<const uint8_t> packed, std::span<const uint8_t> scales, std::span<float> out) {
  K3_CHECK(out.size() == packed.size() * 2 && scales.size() * kMxfp4Group == out.size(),
           "mxfp4: spans have inconsistent sizes");
  constexpr size_t kBytesPerGroup = kMxfp4Group / 2;
  for (size_t g = 0; g < scales.size(); ++g) {
    const float s = e8m0_to_f32(scales[g]);  // once per group of 32
    const uint8_t* in = packed.data() + g * kBytesPerGroup;
    float* o = out.data() + g * kMxfp4Group;
    for (size_t i = 0; i < kBytesPerGroup; ++i) {
      o[2 * i] = fp4_e2m1_to_f32(in[i] & 0xf) * s;
      o[2 * i + 1] = fp4_e2m1_to_f32(in[i] >> 4) * s;
    }
  }
}

}  // namespace k3::core
