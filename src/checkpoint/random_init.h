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

// Fills the bytes of `spec` as written (spec.dtypes[0], spec.shapes[0]). A tensor's bytes depend
// only on (seed, style, its name, its shape), never on the writing order or the thread count:
//   * up to kSequentialMaxValues values (every tensor of k3-tiny): one stream
//     core::Rng(seed).fork(Rng::hash(spec.value_name)), one Rng::normal (Box-Muller) per value in
//     row-major order;
//   * larger tensors ("bulk": routed experts and projections at real K3 widths): blocks of
//     kBulkBlockValues row-major values, block b drawn from that stream's fork(b); normals come
//     from a 2^16-entry table of standard-normal quantiles, four per next_u64 (16 bits each) —
//     far cheaper than Box-Muller (docs/perf/kernel-notes.md), and blocks can be filled in
//     parallel. The table holds Phi^-1((i + 0.5) / 2^16): every value is a quantile, the tails
//     stop at +-4.3 sigma.
inline constexpr int64_t kSequentialMaxValues = int64_t{1} << 20;
inline constexpr int64_t kBulkBlockValues = int64_t{1} << 16;
void fill_random_param(const ParamSpec& spec, const config::K3Config& config, InitStyle style, uint64_t seed,
                       std::span<std::byte> out);

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
// The same bytes written straight into packed [out, in/2] and scales [out, in/32] (the writer
// fills both halves of a pair from one draw, without the full-matrix float copy in bulk).
void fill_random_mxfp4(const ParamSpec& spec, InitStyle style, uint64_t seed, std::span<std::byte> packed,
                       std::span<std::byte> scales);

// MXFP4-quantizes n values (n % 32 == 0) group by group into packed [n/2] and scales [n/32]:
// the bytes core::mxfp4_quantize_row gives for each row (a row is a whole number of groups),
// written branch-free so it vectorizes. Throws core::Error on a non-finite value. For tests.
void mxfp4_quantize_groups(const float* values, int64_t n, uint8_t* packed, uint8_t* scales);

// The standard-normal quantile table of the bulk draw (entry i = Phi^-1((i + 0.5) / 65536),
// antisymmetric: entry 65535 - i = -entry i). For tests.
const float* bulk_normal_quantiles();

}  // namespace k3::checkpoint
