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
//
// Large tensors are drawn in blocks from a quantile table (random_init.h), so make-checkpoint
// writes a ~52 GB k3-proxy-tp8 in about a minute on 16 cores; k3-tiny's bytes are unchanged.
#include "checkpoint/random_init.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

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
constexpr int kQuantileBits = 16;
constexpr int kQuantiles = 1 << kQuantileBits;

core::Rng stream_for(const ParamSpec& spec, uint64_t seed) {
  return core::Rng(seed).fork(core::Rng::hash(spec.value_name.c_str()));
}

double linear_std(const ParamSpec& spec, InitStyle style) {
  if (style == InitStyle::realistic) return kRealisticLinearStd;
  if (spec.role == ParamRole::embedding) return kSensitiveEmbedStd;
  const double gain = spec.feeds_situ ? kSensitiveSituGain : 1.0;
  return gain / std::sqrt(static_cast<double>(spec.in_features));
}

// [out, in] of a linear-like tensor (the embedding is [V, hidden]).
std::pair<int64_t, int64_t> linear_dims(const ParamSpec& spec) {
  int64_t out = spec.out_features, in = spec.in_features;
  if (spec.role == ParamRole::embedding) out = spec.shapes[0][0], in = spec.shapes[0][1];
  K3_CHECK(out > 0 && in > 0, "random init: '" + spec.name + "' is not a linear-like tensor");
  return {out, in};
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

// Values [begin, end) of a bulk tensor's block `block` (end - begin <= kBulkBlockValues):
// std * quantile, four quantiles per next_u64, lowest 16 bits first.
void bulk_block(const core::Rng& stream, int64_t block, float std, float* out, int64_t count) {
  const float* q = bulk_normal_quantiles();
  core::Rng rng = stream.fork(static_cast<uint64_t>(block));
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const uint64_t u = rng.next_u64();
    out[i] = std * q[u & 0xffff];
    out[i + 1] = std * q[(u >> 16) & 0xffff];
    out[i + 2] = std * q[(u >> 32) & 0xffff];
    out[i + 3] = std * q[u >> 48];
  }
  if (i < count) {
    uint64_t u = rng.next_u64();
    for (; i < count; ++i, u >>= kQuantileBits) out[i] = std * q[u & 0xffff];
  }
}

// n values normal(mean, std) of the tensor whose stream is `stream` (see random_init.h).
std::vector<float> normals(const core::Rng& stream, int64_t n, double mean, double std) {
  std::vector<float> v(static_cast<size_t>(n));
  if (n <= kSequentialMaxValues) {
    core::Rng rng = stream;
    for (float& x : v) x = static_cast<float>(rng.normal(mean, std));
    return v;
  }
  for (int64_t b = 0; b * kBulkBlockValues < n; ++b) {
    const int64_t begin = b * kBulkBlockValues, count = std::min(kBulkBlockValues, n - begin);
    bulk_block(stream, b, static_cast<float>(std), v.data() + begin, count);
    for (int64_t i = begin; i < begin + count; ++i) v[i] += static_cast<float>(mean);
  }
  return v;
}

// n values uniform in [lo, hi): one stream, or one fork per block beyond kSequentialMaxValues.
std::vector<double> uniforms(const core::Rng& stream, int64_t n, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(n));
  core::Rng rng = stream;
  for (int64_t i = 0; i < n; ++i) {
    if (n > kSequentialMaxValues && i % kBulkBlockValues == 0)
      rng = stream.fork(static_cast<uint64_t>(i / kBulkBlockValues));
    v[i] = rng.uniform(lo, hi);
  }
  return v;
}

// E2M1 codes of every value whose float bits end in 16 zero bits (every BF16 value), indexed by
// the upper 16 bits: core::f32_to_fp4_e2m1 itself, tabulated once.
// Tables are built by plain (not constexpr) functions: a lambda initializer is implicitly constexpr,
// and GCC then spends most of this file's compile time trying to evaluate it at compile time.
std::array<uint8_t, 65536> make_fp4_code_table() {
  std::array<uint8_t, 65536> t{};
  for (uint32_t b = 0; b < 65536; ++b) t[b] = core::f32_to_fp4_e2m1(std::bit_cast<float>(b << 16));
  return t;
}

const std::array<uint8_t, 65536>& fp4_code_table() {
  static const std::array<uint8_t, 65536> table = make_fp4_code_table();
  return table;
}

// Upper half by bisection on the upper tail: Q(x) = erfc(x / sqrt 2) / 2 = (65535 - i + 0.5) / 2^16
// (the tail probability directly, so it keeps its precision near 1), then mirrored.
std::array<float, kQuantiles> make_normal_quantiles() {
  std::array<float, kQuantiles> t{};
  for (int i = kQuantiles / 2; i < kQuantiles; ++i) {
    const double tail = (kQuantiles - 1 - i + 0.5) / kQuantiles;
    double lo = 0.0, hi = 10.0;
    for (int it = 0; it < 64; ++it) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(mid / std::sqrt(2.0)) > tail ? lo : hi) = mid;
    }
    t[static_cast<size_t>(i)] = static_cast<float>(0.5 * (lo + hi));
    t[static_cast<size_t>(kQuantiles - 1 - i)] = -t[static_cast<size_t>(i)];
  }
  return t;
}

// Bulk tensors of an MXFP4 pair: block by block (a block is a whole number of 32-groups, and a
// row is too, so flat groups are row groups), the block's floats kept in a cache-sized buffer.
void bulk_mxfp4(const core::Rng& stream, int64_t n, float std, uint8_t* packed, uint8_t* scales) {
  std::vector<float> block(static_cast<size_t>(kBulkBlockValues));
  for (int64_t b = 0; b * kBulkBlockValues < n; ++b) {
    const int64_t begin = b * kBulkBlockValues, count = std::min(kBulkBlockValues, n - begin);
    bulk_block(stream, b, std, block.data(), count);
    for (int64_t i = 0; i < count; ++i) block[i] = core::bf16_round(block[i]);
    mxfp4_quantize_groups(block.data(), count, packed + begin / 2, scales + begin / core::kMxfp4Group);
  }
}

}  // namespace

const float* bulk_normal_quantiles() {
  static const std::array<float, kQuantiles> table = make_normal_quantiles();
  return table.data();
}

void mxfp4_quantize_groups(const float* values, int64_t n, uint8_t* packed, uint8_t* scales) {
  K3_CHECK(n % core::kMxfp4Group == 0, "mxfp4: value count must be a multiple of 32");
  constexpr int G = core::kMxfp4Group;
  const std::array<uint8_t, 65536>& table = fp4_code_table();
  for (int64_t g = 0; g < n / G; ++g) {
    const float* x = values + g * G;
    // |x| as bits: for non-negative floats the integer order is the float order, and every NaN
    // lies above +inf, so one integer max gives amax and finiteness together (and vectorizes).
    int32_t amax_bits = 0;
    for (int i = 0; i < G; ++i) amax_bits = std::max(amax_bits, std::bit_cast<int32_t>(x[i]) & 0x7fffffff);
    const float amax = std::bit_cast<float>(amax_bits);
    if (amax_bits > 0x7f7fffff) {  // inf or NaN
      for (int i = 0; i < G; ++i)
        K3_CHECK(std::isfinite(x[i]), "mxfp4: non-finite value at index " + std::to_string(g * G + i));
    }
    // The scale 2^k of core::mxfp4_quantize_row: the smallest power of two with amax / 2^k <= 6.
    // amax = f * 2^e, f in [0.5, 1), so k is e - 3 or e - 2. From the exponent bits when 2^-k is a
    // normal float (amax >= 2^-100); frexp/ldexp as core does for the tiny rest.
    int k = 0;
    if (amax >= 0x1p-100f) {
      const int e = static_cast<int>((std::bit_cast<uint32_t>(amax) >> 23) & 0xff) - 126;
      k = e - 3;
      if (amax * std::bit_cast<float>(static_cast<uint32_t>(127 - k) << 23) > 6.0f) ++k;
    } else if (amax > 0.0f) {
      int e = 0;
      std::frexp(amax, &e);
      k = e - 3;
      if (std::ldexp(amax, -k) > 6.0f) ++k;
    }
    k = std::clamp(k, -127, 127);
    scales[g] = static_cast<uint8_t>(k + 127);
    // x * 2^-k is exact or correctly rounded, as ldexp(x, -k) is (2^-k is a float for |k| <= 127,
    // a normal one, built from its exponent bits, unless k = 127).
    const float inv = k < 127 ? std::bit_cast<float>(static_cast<uint32_t>(127 - k) << 23) : std::ldexp(1.0f, -k);
    // Scaled values; a BF16 x stays BF16 after the exact power-of-two scaling (unless it becomes
    // subnormal), so its code is a table lookup; any other group takes core's function per value.
    float y[G];
    uint32_t low_bits = 0;
    for (int i = 0; i < G; ++i) {
      y[i] = x[i] * inv;
      low_bits |= std::bit_cast<uint32_t>(y[i]) & 0xffffu;
    }
    uint8_t codes[G];
    if (low_bits == 0) {
      for (int i = 0; i < G; ++i) codes[i] = table[std::bit_cast<uint32_t>(y[i]) >> 16];
    } else {
      for (int i = 0; i < G; ++i) codes[i] = core::f32_to_fp4_e2m1(y[i]);
    }
    uint8_t* p = packed + g * (G / 2);
    for (int i = 0; i < G / 2; ++i) p[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
}

std::vector<float> random_linear_values(const ParamSpec& spec, InitStyle style, uint64_t seed) {
  const auto [out, in] = linear_dims(spec);
  std::vector<float> v = normals(stream_for(spec, seed), out * in, 0.0, linear_std(spec, style));
  for (float& x : v) x = core::bf16_round(x);
  return v;
}

void fill_random_mxfp4(const ParamSpec& spec, InitStyle style, uint64_t seed, std::span<std::byte> packed,
                       std::span<std::byte> scales) {
  const auto [rows, in] = linear_dims(spec);
  K3_CHECK(in % core::kMxfp4Group == 0, "random init: '" + spec.name + "' input width is not a multiple of 32");
  const int64_t n = rows * in;
  K3_CHECK(static_cast<int64_t>(packed.size()) == n / 2 && static_cast<int64_t>(scales.size()) == n / core::kMxfp4Group,
           "random init: MXFP4 size mismatch for '" + spec.name + "'");
  auto* p = reinterpret_cast<uint8_t*>(packed.data());
  auto* s = reinterpret_cast<uint8_t*>(scales.data());
  if (n > kSequentialMaxValues)
    return bulk_mxfp4(stream_for(spec, seed), n, static_cast<float>(linear_std(spec, style)), p, s);
  const std::vector<float> w = random_linear_values(spec, style, seed);
  mxfp4_quantize_groups(w.data(), n, p, s);
}

Mxfp4Values random_mxfp4_values(const ParamSpec& spec, InitStyle style, uint64_t seed) {
  const auto [rows, in] = linear_dims(spec);
  Mxfp4Values q;
  q.packed.resize(static_cast<size_t>(rows * in / 2));
  q.scales.resize(static_cast<size_t>(rows * in / core::kMxfp4Group));
  fill_random_mxfp4(spec, style, seed, std::as_writable_bytes(std::span(q.packed)),
                    std::as_writable_bytes(std::span(q.scales)));
  return q;
}

void fill_random_param(const ParamSpec& spec, const config::K3Config& config, InitStyle style, uint64_t seed,
                       std::span<std::byte> out) {
  const bool sensitive = style == InitStyle::sensitive;
  const core::DType dtype = spec.dtypes[0];
  const int64_t numel = spec.shapes[0].numel();
  const core::Rng stream = stream_for(spec, seed);
  switch (spec.role) {
    case ParamRole::embedding:
    case ParamRole::linear:
    case ParamRole::expert_weight: store(dtype, random_linear_values(spec, style, seed), out); return;
    case ParamRole::expert_packed:
    case ParamRole::expert_scale: {
      const Mxfp4Values q = random_mxfp4_values(spec, style, seed);
      const std::vector<uint8_t>& bytes = spec.role == ParamRole::expert_packed ? q.packed : q.scales;
      K3_CHECK(out.size() == bytes.size(), "random init: MXFP4 size mismatch for '" + spec.name + "'");
      std::memcpy(out.data(), bytes.data(), bytes.size());
      return;
    }
    case ParamRole::norm:
      store(dtype, normals(stream, numel, 1.0, sensitive ? kSensitiveNormStd : kRealisticNormStd), out);
      return;
    case ParamRole::attn_res_query: {
      const double std = sensitive ? kSensitiveQueryScale / std::sqrt(static_cast<double>(config.hidden_size))
                                   : kRealisticQueryStd;
      store(dtype, normals(stream, numel, 0.0, std), out);
      return;
    }
    case ParamRole::kda_conv:
      store(dtype, normals(stream, numel, 0.0, sensitive ? kSensitiveConvStd : kRealisticConvStd), out);
      return;
    case ParamRole::kda_a_log: {
      // Only the first num_heads entries are used (one per head); K3 stores zeros beyond.
      std::vector<float> v(static_cast<size_t>(numel), 0.0f);
      core::Rng rng = stream;
      for (int64_t h = 0; h < numel && h < config.kda.num_heads; ++h)
        v[h] = static_cast<float>(rng.normal(0.0, kALogStd));
      store(dtype, v, out);
      return;
    }
    case ParamRole::kda_dt_bias: {
      const std::vector<double> u = uniforms(stream, numel, kDtLow, kDtHigh);
      std::vector<float> v(u.size());
      for (size_t i = 0; i < u.size(); ++i) v[i] = static_cast<float>(std::log(std::expm1(u[i])));
      store(dtype, v, out);
      return;
    }
    case ParamRole::router_bias:
      store(dtype, normals(stream, numel, 0.0, sensitive ? kSensitiveRouterBiasStd : kRealisticRouterBiasStd), out);
      return;
  }
  throw core::Error("random init: unhandled role for '" + spec.name + "'");
}

}  // namespace k3::checkpoint
