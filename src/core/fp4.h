// core/fp4.h: FP4 E2M1 codes and E8M0 scales (OCP MX; compressed-tensors mxfp4-pack-quantized).
#pragma once
#include <cstdint>
#include <span>

namespace k3::core {

// E2M1 magnitudes for codes 0..7; bit 3 is the sign. No inf/NaN.
inline constexpr float kFp4Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float fp4_e2m1_to_f32(uint8_t code) {
  float m = kFp4Magnitudes[code & 7u];
  return (code & 8u) ? -m : m;
}
// Saturating (|x| > 6 -> 6), round-to-nearest-even between representable magnitudes.
// NaN encodes as +0 (E2M1 has no NaN); callers that can see NaN must check first.
uint8_t f32_to_fp4_e2m1(float x);

// E8M0: scale = 2^(e - 127); 0xff is NaN.
float e8m0_to_f32(uint8_t e);

// MXFP4 block size along the input dimension.
inline constexpr int kMxfp4Group = 32;

// Quantizes one row of `in` floats (in % 32 == 0) to packed codes [in/2] (even index in the
// low nibble) and E8M0 scales [in/32]. The scale of a group is the smallest power of two
// with amax/scale <= 6, so no element saturates by more than rounding.
void mxfp4_quantize_row(std::span<const float> in, std::span<uint8_t> packed, std::span<uint8_t> scales);
// Dequantizes one packed row back to floats (exact).
void mxfp4_dequantize_row(std::span<const uint8_t> packed, std::span<const uint8_t> scales, std::span<float> out);

}  // namespace k3::core
