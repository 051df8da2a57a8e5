// draft/rope.cpp: interleaved and rotate-half RoPE (see rope.h for the exact arithmetic).
#include "draft/rope.h"

#include <cmath>

#include "core/error.h"

namespace k3::draft {

void apply_rope(float* x, int dim, int64_t position, float theta, kernels::Precision precision) {
  K3_CHECK(dim > 0 && dim % 2 == 0, "apply_rope: dim must be even and > 0, got " + std::to_string(dim));
  K3_CHECK(position >= 0, "apply_rope: negative position " + std::to_string(position));
  const float pos = static_cast<float>(position);
  for (int i = 0; i < dim / 2; ++i) {
    const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float angle = pos * inv_freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[2 * i], b = x[2 * i + 1];
    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;  // no FMA: -ffp-contract=off anyway
    x[2 * i] = kernels::round_act(ac - bs, precision);
    x[2 * i + 1] = kernels::round_act(as + bc, precision);
  }
}

RotateHalfRope::RotateHalfRope(int dim, float theta, float llama3_factor, float low_freq_factor, float high_freq_factor,
                               int original_max_position_embeddings)
    : dim_(dim) {
  K3_CHECK(dim > 0 && dim % 2 == 0, "RotateHalfRope: dim must be even and > 0, got " + std::to_string(dim));
  const float old_len = static_cast<float>(original_max_position_embeddings);
  const float low_wavelen = old_len / low_freq_factor, high_wavelen = old_len / high_freq_factor;
  for (int i = 0; i < dim / 2; ++i) {
    float f = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    if (llama3_factor > 0.0f) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      if (wavelen > low_wavelen) {
        f /= llama3_factor;
      } else if (wavelen >= high_wavelen) {  // medium frequencies: interpolate
        const float smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        f = (1.0f - smooth) * f / llama3_factor + smooth * f;
      }
    }
    inv_freq_.push_back(f);
  }
}

void RotateHalfRope::apply(float* x, int64_t position, kernels::Precision precision) const {
  K3_CHECK(position >= 0, "RotateHalfRope: negative position " + std::to_string(position));
  const float pos = static_cast<float>(position);
  const int half = dim_ / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = pos * inv_freq_[static_cast<size_t>(i)];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[i], b = x[i + half];
    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
    x[i] = kernels::round_act(ac - bs, precision);
    x[i + half] = kernels::round_act(bc + as, precision);
  }
}

}  // namespace k3::draft
