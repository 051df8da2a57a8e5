// checkpoint/random_init.cpp: per-tensor random inits for the random-checkpoint writer.
//
// realistic (spec §14.1): linear/embedding/expert weights N(0, 0.02^2) stored BF16 (RNE);
//   norm weights 1 + N(0, 0.01^2) (KDA o_norm in F32); A_log N(0, 0.3^2) for the first
//   num_heads entries, zero beyond (the stored [head_dim] quirk of spec §4); dt_bias
//   log(expm1(u)), u ~ U(0.001, 0.1) (softplus^-1 of u); e_score_correction_bias
//   N(0, 0.01^2) F32; AttnRes pseudo-queries N(0, 0.02^2); conv weights N(0, 0.25^2) F32.
//
// sensitive (spec §14.3), chosen so activations stay O(1) and the nonlinearities matter:
//   * linear std = gain / sqrt(fan_in) with gain 1, so a unit-RMS input (every linear input
//     is RMS-normed or is such a product) gives unit-RMS outputs: MLA scores have std ~1 and
//     softmaxes are neither uniform nor one-hot, so a wrong scale or a dropped k_pe shows;
//   * gate/up projections feeding SiTU (dense, shared, routed w1/w3) use gain 8: pre-
//     activations have std ~8, so tanh(a/4) saturates often and 25*tanh(c/25) is visibly
//     nonlinear (SwiGLU in place of SiTU would differ by O(1));
//   * embedding N(0, 1): the first AttnRes sources are unit-RMS like later ones;
//   * norm weights 1 + N(0, 0.1^2): an ignored or misplaced norm weight changes outputs ~10%;
//   * AttnRes pseudo-queries N(0, (3/sqrt(hidden))^2): a unit-RMS source scores ~N(0, 3^2),
//     so depth softmaxes are far from uniform and an ignored Mix norm weight shows;
//   * conv weights N(0, 0.5^2) (4 taps keep the conv output O(1)); router bias N(0, 0.1^2),
//     comparable to the spread of sigmoid scores, so the bias changes which experts win;
//   * A_log and dt_bias as realistic (they already span fast and slow decays).
#include "checkpoint/random_init.h"

#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/error.h"
#include "core/fp4.h"
#include "core/rng.h"

namespace k3::checkpoint {

namespace {

constexpr double kRealisticLinearStd = 0.02;
constexpr double kRealisticNormStd = 0.01;
constexpr double kRealisticQueryStd = 0.02;
constexpr double kRealisticConvStd = 0.25;
constexpr double kRealisticRouterBiasStd = 0.01;
constexpr double kSensitiveSituGain = 8.0;
constexpr double kSensitiveEmbedStd = 1.0;
constexpr double kSensitiveNormStd = 0.1;
constexpr double kSensitiveQueryScale = 3.0;  // times 1/sqrt(hidden)
constexpr double kSensitiveConvStd = 0.5;
constexpr double kSensitiveRouterBiasStd = 0.1;
constexpr double kALogStd = 0.3;
constexpr double kDtLow = 0.001, kDtHigh = 0.1;

core::Rng stream_for(const ParamSpec& spec, uint64_t seed) {
  return core::Rng(seed).fork(core::Rng::hash(spec.value_name.c_str()));
}

double linear_std(const ParamSpec& spec, InitStyle style) {
  if (style == InitStyle::realistic) return kRealisticLinearStd;
  if (spec.role == ParamRole::embedding) return kSensitiveEmbedStd;
  const double gain = spec.feeds_situ ? kSensitiveSituGain : 1.0;
  return gain / std::sqrt(static_cast<double>(spec.in_features));
}

// Stores float values in the written dtype (BF16 with round-to-nearest-even, or F32).
void store(core::DType dtype, const std::vector<float>& values, std::span<std::byte> out) {
  if (dtype == core::DType::f32) {
    K3_CHECK(out.size() == values.size() * 4, "random init: size mismatch");
    std::memcpy(out.data(), values.data(), out.size());
    return;
  }
  K3_CHECK(dtype == core::DType::bf16 && out.size() == values.size() * 2, "random init: size mismatch");
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t b = core::f32_to_bf16_bits(values[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
}

std::vector<float> normals(core::Rng& rng, int64_t n, double mean, double std) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal(mean, std));
  return v;
}

}  // namespace

std::vector<float> random_linear_values(const ParamSpec& spec, InitStyle style, uint64_t seed) {
  int64_t out = spec.out_features, in = spec.in_features;
  if (spec.role == ParamRole::embedding) out = spec.shapes[0][0], in = spec.shapes[0][1];
  K3_CHECK(out > 0 && in > 0, "random init: '" + spec.name + "' is not a linear-like tensor");
  core::Rng rng = stream_for(spec, seed);
  std::vector<float> v = normals(rng, out * in, 0.0, linear_std(spec, style));
  for (float& x : v) x = core::bf16_round(x);
  return v;
}

Mxfp4Values random_mxfp4_values(const ParamSpec& spec, InitStyle style, uint64_t seed) {
  const std::vector<float> w = random_linear_values(spec, style, seed);
  const int64_t rows = spec.out_features, in = spec.in_features;
  K3_CHECK(in % core::kMxfp4Group == 0, "random init: '" + spec.name + "' input width is not a multiple of 32");
  const size_t packed_row = static_cast<size_t>(in / 2), scale_row = static_cast<size_t>(in / core::kMxfp4Group);
  Mxfp4Values q;
  q.packed.resize(packed_row * static_cast<size_t>(rows));
  q.scales.resize(scale_row * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    core::mxfp4_quantize_row({w.data() + r * in, static_cast<size_t>(in)}, {q.packed.data() + r * packed_row, packed_row},
                             {q.scales.data() + r * scale_row, scale_row});
  return q;
}

void fill_random_param(const ParamSpec& spec, const config::K3Config& config, InitStyle style, uint64_t seed,
                       std::span<std::byte> out) {
  const bool sensitive = style == InitStyle::sensitive;
  const core::DType dtype = spec.dtypes[0];
  const int64_t numel = spec.shapes[0].numel();
  core::Rng rng = stream_for(spec, seed);
  switch (spec.role) {
    case ParamRole::embedding:
    case ParamRole::linear:
    case ParamRole::expert_weight:
      store(dtype, random_linear_values(spec, style, seed), out);
      return;
    case ParamRole::expert_packed:
    case ParamRole::expert_scale: {
      const Mxfp4Values q = random_mxfp4_values(spec, style, seed);
      const std::vector<uint8_t>& bytes = spec.role == ParamRole::expert_packed ? q.packed : q.scales;
      K3_CHECK(out.size() == bytes.size(), "random init: MXFP4 size mismatch for '" + spec.name + "'");
      std::memcpy(out.data(), bytes.data(), bytes.size());
      return;
    }
    case ParamRole::norm:
      store(dtype, normals(rng, numel, 1.0, sensitive ? kSensitiveNormStd : kRealisticNormStd), out);
      return;
    case ParamRole::attn_res_query: {
      const double std = sensitive ? kSensitiveQueryScale / std::sqrt(static_cast<double>(config.hidden_size))
                                   : kRealisticQueryStd;
      store(dtype, normals(rng, numel, 0.0, std), out);
      return;
    }
    case ParamRole::kda_conv:
      store(dtype, normals(rng, numel, 0.0, sensitive ? kSensitiveConvStd : kRealisticConvStd), out);
      return;
    case ParamRole::kda_a_log: {
      // Only the first num_heads entries are used (one per head); K3 stores zeros beyond.
      std::vector<float> v(static_cast<size_t>(numel), 0.0f);
      for (int64_t h = 0; h < numel && h < config.kda.num_heads; ++h) v[h] = static_cast<float>(rng.normal(0.0, kALogStd));
      store(dtype, v, out);
      return;
    }
    case ParamRole::kda_dt_bias: {
      std::vector<float> v(static_cast<size_t>(numel));
      for (float& x : v) x = static_cast<float>(std::log(std::expm1(rng.uniform(kDtLow, kDtHigh))));
      store(dtype, v, out);
      return;
    }
    case ParamRole::router_bias:
      store(dtype, normals(rng, numel, 0.0, sensitive ? kSensitiveRouterBiasStd : kRealisticRouterBiasStd), out);
      return;
  }
  throw core::Error("random init: unhandled role for '" + spec.name + "'");
}

}  // namespace k3::checkpoint
