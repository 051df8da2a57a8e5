// draft/rope.cpp: interleaved RoPE (see rope.h for the exact arithmetic).
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

}  // namespace k3::draft
