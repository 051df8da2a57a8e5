// kernels/mla/mla_internal.h: helpers shared by the MLA reference forms (not a public API).
//
// Both forms (naive.cpp, absorbed.cpp) read the same dequantised cache and use the same
// softmax, so the only difference between them is where the kv_b product is applied and
// where bf16 rounding happens: that is what the naive-vs-absorbed test checks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mla/mla.h"

namespace k3::kernels::mla_detail {

// The cache as f32 values (f8_e4m3 codes dequantised: fp8(code) * k_scale).
//   c_n  [S, kv_lora], k_pe [S, rope], both dense row-major.
struct DequantCache {
  int64_t positions = 0, kv_lora = 0, rope = 0;
  std::vector<float> c_n;   // [positions, kv_lora]
  std::vector<float> k_pe;  // [positions, rope]
  const float* c_n_row(int64_t j) const { return c_n.data() + j * kv_lora; }
  const float* k_pe_row(int64_t j) const { return k_pe.data() + j * rope; }
};
// Reads cache [S, kv_lora + rope] (f32 or f8_e4m3, rows may be strided) into a DequantCache.
DequantCache dequantize_cache(const core::TensorView& cache, float k_scale, int64_t kv_lora,
                              int64_t rope);

// Per-head slices of kv_b as f32: W_UK[h] [nope, kv_lora] and W_UV[h] [v, kv_lora], row-major.
struct HeadWeights {
  std::vector<float> w_uk, w_uv;
};
HeadWeights load_head_weights(const MlaAttentionArgs& a, int h);

// In-place fp32 softmax over s[0..n): m = max, e_j = expf(s_j - m), Z = sequential sum of e_j,
// p_j = e_j / Z. n >= 1 (a query always sees at least its own position).
void softmax_inplace(float* s, int64_t n);

// True for a defined rank-2 view whose rows are dense (inner stride 1) and do not overlap.
bool is_rows(const core::TensorView& v);
// "f32 [3, 4]" (or "undefined"), for check messages.
std::string describe(const core::TensorView& v);

// Row pointers into the [T, ...] f32 activations (innermost stride 1, row stride strides[0]).
inline const float* row_ptr(const core::TensorView& v, int64_t r) {
  return v.as<const float>() + r * v.strides[0];
}
inline float* mutable_row_ptr(const core::TensorView& v, int64_t r) {
  return v.as<float>() + r * v.strides[0];
}

}  // namespace k3::kernels::mla_detail
