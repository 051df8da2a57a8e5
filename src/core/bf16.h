// core/bf16.h: bfloat16 <-> float, round-to-nearest-even, NaN kept NaN (quiet).
#pragma once
#include <bit>
#include <cstdint>

namespace k3::core {

inline uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // RNE: add 0x7fff plus the lowest kept bit; overflow into the exponent rounds to inf.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// The value x takes once stored as bf16.
inline float bf16_round(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

}  // namespace k3::core
