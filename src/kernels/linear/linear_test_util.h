// kernels/linear/linear_test_util.h: CPU test helpers shared by the tests of ops built on linear
// (kernels/multi_linear, kernels/moe_tail): the reference registry, NaN-poisoned buffers, column
// slices and random weights of each storage kind. Test code only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "core/fp4.h"
#include "core/rng.h"
#include "kernels/registry.h"

namespace k3::kernels::linear_test {

using core::DType;
using core::Tensor;
using core::TensorView;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline Registry& reference_registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    register_reference_ops(*reg);
    return reg;
  }();
  return *r;
}

inline Tensor nan_f32(int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros(DType::f32, {rows, cols});
  std::fill_n(t.data<float>(), rows * cols, kNaN);
  return t;
}

inline TensorView columns(const Tensor& t, int64_t c0, int64_t cols) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape[1] = cols;
  return v;
}

enum class WKind { bf16, f32, mxfp4 };

// Weight [out, in] uniform with std 1/sqrt(in) (outputs O(1), spec §14.3). Fast for the TP8 shard:
// one Rng draw yields four 16-bit uniforms.
inline LinearWeight random_weight(core::Rng& rng, WKind kind, int64_t out, int64_t in) {
  const float half = static_cast<float>(std::sqrt(3.0 / static_cast<double>(in)));
  std::vector<float> v(static_cast<size_t>(out * in));
  for (size_t i = 0; i < v.size(); i += 4) {
    const uint64_t bits = rng.next_u64();
    for (size_t k = 0; k < 4 && i + k < v.size(); ++k)
      v[i + k] = (static_cast<float>((bits >> (16 * k)) & 0xffffu) * (1.0f / 32768.0f) - 1.0f) * half;
  }
  LinearWeight w;
  if (kind == WKind::mxfp4) {
    w.weight = Tensor::zeros(DType::u8, {out, in / 2});
    w.scale = Tensor::zeros(DType::u8, {out, in / 32});
    for (int64_t r = 0; r < out; ++r)
      core::mxfp4_quantize_row({v.data() + r * in, static_cast<size_t>(in)},
                               {w.weight.data<uint8_t>() + r * (in / 2), static_cast<size_t>(in / 2)},
                               {w.scale.data<uint8_t>() + r * (in / 32), static_cast<size_t>(in / 32)});
  } else if (kind == WKind::bf16) {
    w.weight = Tensor::zeros(DType::bf16, {out, in});
    for (size_t i = 0; i < v.size(); ++i) w.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits(v[i]);
  } else {
    w.weight = Tensor::zeros(DType::f32, {out, in});
    std::memcpy(w.weight.data<float>(), v.data(), v.size() * sizeof(float));
  }
  return w;
}

}  // namespace k3::kernels::linear_test
