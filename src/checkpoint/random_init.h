// checkpoint/random_init.h: the deterministic random value of every checkpoint tensor
// (spec §14.1 "realistic" and §14.3 "sensitive" inits), used by write_random_checkpoint.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"

namespace k3::checkpoint {

// Fills the bytes of `spec` as written (spec.dtypes[0], spec.shapes[0]). Values come from
// core::Rng(seed).fork(Rng::hash(spec.value_name)), drawn in row-major order, so a tensor's
// bytes depend only on (seed, style, its name, its shape) and never on the writing order.
void fill_random_param(const ParamSpec& spec, const config::K3Config& config, InitStyle style,
                       uint64_t seed, std::span<std::byte> out);

// The float values of a linear-like tensor (linear, embedding, expert weight) before storage:
// [out_features, in_features] row-major, each already rounded to BF16. An MXFP4 expert pair
// quantizes exactly these values. Exposed for tests.
std::vector<float> random_linear_values(const ParamSpec& spec, InitStyle style, uint64_t seed);

// An MXFP4 expert weight (both halves of the pair): each row of random_linear_values
// quantized by core::mxfp4_quantize_row. packed [out, in/2], scales [out, in/32], row-major.
struct Mxfp4Values {
  std::vector<uint8_t> packed, scales;
};
Mxfp4Values random_mxfp4_values(const ParamSpec& spec, InitStyle style, uint64_t seed);

}  // namespace k3::checkpoint
