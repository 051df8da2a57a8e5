// core/fp8.h: FP8 E4M3 (OCP "fn" variant: no inf, S.1111.111 is NaN, max finite 448).
#pragma once
#include <cstdint>

namespace k3::core {

// Saturating encode, round-to-nearest-even: |x| > 448 (and +-inf) give +-448; NaN gives NaN.
uint8_t f32_to_fp8_e4m3(float x);
float fp8_e4m3_to_f32(uint8_t code);
inline float fp8_e4m3_round(float x) { return fp8_e4m3_to_f32(f32_to_fp8_e4m3(x)); }

constexpr float kFp8E4m3Max = 448.0f;

}  // namespace k3::core
