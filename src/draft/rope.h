// draft/rope.h: rotary position embedding of the draft model's 64-wide rope slice (the K3 target
// keeps that slice unrotated; the DSpark drafter is DeepSeek-V3 style and rotates it).
//
// Interleaved ("GPT-J", vLLM is_neox_style=False) pairs: for i in [0, d/2)
//   inv_freq_i = 1 / theta^(2i/d)                          fp32 (powf)
//   angle      = float(position) * inv_freq_i              fp32
//   (x[2i], x[2i+1]) <- (x[2i] cos - x[2i+1] sin,  x[2i] sin + x[2i+1] cos)   fp32 (cosf / sinf)
// then each value is stored as an activation (rounded in bf16 mode). HF DeepSeek-V3 de-interleaves
// q_pe and k_pe before a rotate-half RoPE; that permutes both sides alike, so every q_pe . k_pe
// (all attention sees) equals the interleaved form here.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/common.h"

namespace k3::draft {

// Rotates x[0..dim) in place for `position`. dim must be even.
void apply_rope(float* x, int dim, int64_t position, float theta, kernels::Precision precision);

// Rotate-half ("NeoX", HF Llama) RoPE over a whole head, as the EAGLE-3 draft's attention applies it:
// for i in [0, d/2) the pair (x[i], x[i + d/2]) with
//   inv_freq_i = 1 / theta^(2i/d)   fp32, then Llama-3 scaled when `llama3_factor` > 0 (HF's rule:
//                wavelengths above original/low_freq_factor divided by factor, below
//                original/high_freq_factor kept, smoothly interpolated between)
//   (x[i], x[i+d/2]) <- (x[i] cos - x[i+d/2] sin,  x[i+d/2] cos + x[i] sin)   fp32, rounded as activations.
class RotateHalfRope {
 public:
  RotateHalfRope(int dim, float theta, float llama3_factor = 0.0f, float low_freq_factor = 1.0f,
                 float high_freq_factor = 4.0f, int original_max_position_embeddings = 8192);
  int dim() const { return dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // Rotates x[0..dim) in place for `position`.
  void apply(float* x, int64_t position, kernels::Precision precision) const;

 private:
  int dim_;
  std::vector<float> inv_freq_;
};

}  // namespace k3::draft
