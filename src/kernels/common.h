// kernels/common.h: what every op shares: precision mode, activation rounding, linear weights.
//
// CPU reference convention: activations are f32 tensors. In Precision::bf16 ("engine mode")
// every value stored between ops is rounded to bf16 at the rounding points of spec §2; in
// Precision::fp32 ("exact mode") nothing is rounded. Weights keep their checkpoint dtype.
#pragma once
#include <cstdint>

#include "core/bf16.h"
#include "core/tensor.h"

namespace k3::kernels {

enum class Precision : uint8_t { bf16, fp32 };

// The value an activation takes when stored between ops.
inline float round_act(float x, Precision p) { return p == Precision::bf16 ? core::bf16_round(x) : x; }

// A linear layer's weight y = x W^T with W [out, in]:
//   dense:  weight bf16 or f32 [out, in], scale undefined;
//   MXFP4:  weight u8 [out, in/2] (two E2M1 codes per byte, even index low nibble) and
//           scale u8 [out, in/32] (E8M0), spec §9.
struct LinearWeight {
  core::Tensor weight;
  core::Tensor scale;
  bool is_mxfp4() const { return scale.defined(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return is_mxfp4() ? weight.dim(1) * 2 : weight.dim(1); }
  // Decodes row r into out[0..in) as f32 (exact for every stored dtype).
  void load_row(int64_t r, float* out) const;
};

// Activation dtypes an op check accepts: f32 everywhere (the CPU convention), and bf16 on the CUDA
// device, where the engine stores activations between ops as bf16 (values rounded at the same
// points; see kernels/cuda_ops.h). CPU implementations only ever see f32.
inline bool is_activation_dtype(const core::TensorView& v) {
  return v.dtype == core::DType::f32 || (v.dtype == core::DType::bf16 && v.device == core::Device::cuda);
}

// Reads element i of a rank-1 bf16 or f32 tensor as f32 (norm weights, biases).
float load_f32(const core::TensorView& v, int64_t i);

}  // namespace k3::kernels
